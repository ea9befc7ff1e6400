"""The reward worker decodes responses with the ``tokenizers`` library alone (grpo_dist.rewards.decoding),
giving the texts transformers' ``batch_decode`` gives, and without importing transformers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_dist.rewards.decoding import FastDecoder, decoder_spec

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model_dir, tmp_path_factory):
    """The tiny test model's tokenizer (as AutoTokenizer loads it: transformers rebuilds it by model
    type) with an added plain token and an added special token, saved and loaded again."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.add_tokens(["<think>"])
    tok.add_special_tokens({"additional_special_tokens": ["<|tool|>"]})
    out = tmp_path_factory.mktemp("tok_added")
    tok.save_pretrained(out)
    (out / "config.json").write_text((Path(tiny_model_dir) / "config.json").read_text())
    return AutoTokenizer.from_pretrained(out)


def sequences(tok) -> list[list[int]]:
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    special = [tok.convert_tokens_to_ids(t) for t in ("<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>",
                                                     "<|tool|>")]
    think = tok.convert_tokens_to_ids("<think>")
    return [
        enc("hello world"),
        enc(" two  spaces\nand a newline\n\n") + [special[3], special[1]],
        [special[2]] + enc("assistant\n") + [think] + enc("why ?") + [special[4]] + enc("don 't .") + [special[0]],
        [],
        [think, think],
        special,
        enc("a , b ! c ? 're") + [special[1]],
    ]


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_the_fast_decoder_gives_the_texts_of_transformers(tiny_tokenizer, skip_special_tokens):
    ids_B = sequences(tiny_tokenizer)
    fast = FastDecoder(decoder_spec(tiny_tokenizer))
    expected = tiny_tokenizer.batch_decode(ids_B, skip_special_tokens=skip_special_tokens)
    assert fast.batch_decode(ids_B, skip_special_tokens=skip_special_tokens) == expected
    if skip_special_tokens:  # the added special token goes, the added plain one stays
        assert "<|tool|>" not in "".join(expected) and "<think>" in expected[2]


def _wordpiece(clean_up: bool, bpe: bool = False):
    """A fast tokenizer over a tiny word vocabulary: WordPiece (its clean-up applies) or BPE (transformers
    skips the clean-up for BPE)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "[SEP]", "hello", ",", "world", ".", "don", "'", "t", "?", "s", "n't"]
    vocab = {w: i for i, w in enumerate(words)}
    if bpe:
        backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="[UNK]"))
    else:
        backend = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
        backend.decoder = decoders.WordPiece()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", sep_token="[SEP]",
                                   clean_up_tokenization_spaces=clean_up)


@pytest.mark.parametrize(("clean_up", "bpe"), [(True, False), (False, False), (True, True)])
def test_the_fast_decoder_cleans_up_spaces_as_transformers_does(clean_up, bpe):
    tok = _wordpiece(clean_up, bpe)
    ids_B = [[2, 3, 4, 5, 1], [6, 7, 8, 9], [4, 11, 3, 7, 10]]
    expected = tok.batch_decode(ids_B, skip_special_tokens=True)
    assert FastDecoder(decoder_spec(tok)).batch_decode(ids_B, skip_special_tokens=True) == expected
    if clean_up and not bpe:
        assert expected[0] == "hello, world."  # the clean-up did apply: the comparison covers it


def test_a_tokenizer_that_decodes_its_own_way_gets_no_spec(tiny_tokenizer):
    """Classes that override decoding (remote code, slow tokenizers) keep transformers' decoding."""
    from transformers import PreTrainedTokenizerFast

    class Shouting(PreTrainedTokenizerFast):
        def _decode(self, token_ids, skip_special_tokens=False, **kwargs):
            return super()._decode(token_ids, skip_special_tokens=skip_special_tokens, **kwargs).upper()

    tok = _wordpiece(False)
    assert decoder_spec(Shouting(tokenizer_object=tok.backend_tokenizer)) is None
    assert decoder_spec(object()) is None
    assert decoder_spec(tiny_tokenizer) is not None


def test_the_reward_worker_scores_without_importing_transformers(tiny_tokenizer, tmp_path):
    """The reward worker built with a decoder spec scores the same texts, in a process that never
    imports transformers."""
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(decoder_spec(tiny_tokenizer)))
    ids_B = sequences(tiny_tokenizer)[:3]
    R = max(len(ids) for ids in ids_B)
    rows = [ids + [0] * (R - len(ids)) for ids in ids_B]
    mask = [[1] * len(ids) + [0] * (R - len(ids)) for ids in ids_B]
    texts = tiny_tokenizer.batch_decode(ids_B, skip_special_tokens=True)
    fn = tmp_path / "fn.py"
    fn.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                  "    return float(solution_str == ground_truth)\n")
    code = f"""
import json, sys
import torch
from grpo_dist.workers.reward import RewardWorker
cls = RewardWorker.__ray_metadata__.modified_class
w = cls(tokenizer_path="/nonexistent", trust_remote_code=False, custom_path={str(fn)!r}, custom_name="compute_score",
        num_workers=0, timeout_s=None, on_error="raise")
w.load_tokenizer(json.loads(open({str(spec_file)!r}).read()))
r = w.compute(torch.tensor({rows!r}), torch.tensor({mask!r}), ["s"] * 3, {texts!r}, [None] * 3, True, False)
w.close()
print(json.dumps({{"scores": r.scores_B.tolist(), "transformers": sorted(m for m in sys.modules if m.startswith("transformers"))}}))
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["scores"] == [1.0, 1.0, 1.0]  # each response decoded to transformers' text
    assert out["transformers"] == []


@pytest.mark.parametrize("remote", ["", "actor_rollout_ref.model.trust_remote_code=true", "data.trust_remote_code=true"])
def test_the_reward_worker_gets_the_decoder_unless_the_tokenizer_runs_its_own_code(tiny_tokenizer, remote):
    from grpo_dist.config.loader import compose, to_typed
    from grpo_dist.config import sampling
    from grpo_dist.config.spec import resolve
    from grpo_dist.trainer.roles import ROLES, RoleContext

    cfg = to_typed(compose([remote] if remote else []))
    spec = sampling.reward_decoder(cfg, tiny_tokenizer)
    assert (spec is None) == bool(remote)
    calls = []

    class Group:  # the reward worker's group, as the role's set-up sees it
        def submit(self, method, *args):
            calls.append((method, args))
            return ["ref"]

    role = next(r for r in ROLES if r.name == "reward")
    assert role.setup(RoleContext(resolve(cfg), "cpu", "/m", "/t", 10, 1, 1, reward_decoder=spec), Group()) == ["ref"]
    assert calls == [("load_tokenizer", (spec,))]
