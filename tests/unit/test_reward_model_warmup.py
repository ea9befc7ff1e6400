"""The starting reward model's data and training (grpo_dist/training/reward_model_warmup.py) on a tiny
random policy: every label is the verifier's verdict on the response (or its prefix, or an edited copy)
at the right token, and the trained folder loads as a one-output reward model."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_dist.tasks.reverse import make_prompt


@pytest.fixture(scope="module")
def prompts(tiny_model_dir):
    from transformers import AutoTokenizer

    from grpo_dist.data.dataset import tokenize_prompt

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    return tok, [(list(tokenize_prompt(tok, make_prompt(d))), "grpo_dist/reverse", d[::-1], {}) for d in ("123", "4567", "90")]


def ground_truth_of(rows, prompts, b):
    P = rows["input_ids"].shape[1] - rows["responses"].shape[1]
    ids = rows["input_ids"][b, :P][rows["attention_mask"][b, :P].bool()].tolist()
    return next(truth for p, _, truth, _ in prompts if p == ids)


@pytest.mark.parametrize("every_prefix, edits", [(False, 0), (True, 1)])
def test_labels_are_the_verifiers_verdicts(tiny_model_dir, prompts, every_prefix, edits):
    from grpo_dist.training.reward_model_warmup import sample_and_label

    tok, items = prompts
    def verifier(source, text, truth, extra):  # varies along a response, and needs the right ground truth
        return float(len(text) % 2 == 0) if truth in {d[::-1] for d in ("123", "4567", "90")} else math.nan

    rows = sample_and_label(tiny_model_dir, items, verifier, n=2, max_new_tokens=6, every_prefix=every_prefix,
                            edits_per_response=edits, seed=1)
    assert rows["rm_targets"].shape[0] == len(items) * 2 * (1 + edits)
    lengths = rows["response_mask"].sum(-1).long()
    for b in range(rows["rm_targets"].shape[0]):
        truth = ground_truth_of(rows, items, b)
        labelled = torch.isfinite(rows["rm_targets"][b]).nonzero().flatten().tolist()
        want = list(range(lengths[b])) if every_prefix else ([lengths[b] - 1] if lengths[b] else [])
        assert labelled == [int(t) for t in want]
        for t in labelled:
            text = tok.decode(rows["responses"][b, : t + 1].tolist(), skip_special_tokens=True)
            assert rows["rm_targets"][b, t].item() == verifier("", text, truth, None)
    assert 0 < torch.nan_to_num(rows["rm_targets"], nan=0.0).sum() < torch.isfinite(rows["rm_targets"]).sum()


def test_a_trained_folder_loads_as_a_reward_model(tiny_model_dir, prompts, tmp_path):
    from grpo_dist.training.reward_model import check_reward_head, reward_head_config
    from grpo_dist.training.reward_model_warmup import sample_and_label, train_reward_model

    tok, items = prompts
    # the verifier accepts responses starting with a digit: both labels occur in a random policy's samples
    rows = sample_and_label(tiny_model_dir, items, lambda s, text, truth, e: float(text[:1].isdigit()), n=4,
                            max_new_tokens=4, seed=0)
    report = train_reward_model(tiny_model_dir, tmp_path / "rm", rows, steps=3, batch_size=4, lr=1e-3, seed=0)
    assert set(report) == {"accuracy_before", "accuracy_after", "positives", "samples", "seconds"}
    assert report["samples"] == 12
    assert reward_head_config(tmp_path / "rm") == {"num_labels": 1}
    check_reward_head(tmp_path / "rm")  # the warm-up's new head is saved: the folder is accepted as a reward model
    assert (tmp_path / "rm" / "tokenizer.json").read_bytes() == (tiny_model_dir / "tokenizer.json").read_bytes()
