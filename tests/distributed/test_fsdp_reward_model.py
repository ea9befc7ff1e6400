"""FSDP2 reward model on gloo: its scores equal a plain Hugging Face forward of the same model on the same
tokens (the outcome score at the last valid token, and the score at every response token, which is
where a process reward model is read at step ends), for folders saved as sequence classifiers (Qwen2
and Llama) and as token classifiers; training on verifier labels lowers the loss, does not depend on
the micro-batch size or the number of ranks, and resumes exactly from a checkpoint; a reference reset
to another model's weights makes the reference that model.

Two spawned jobs (2 ranks, then 1 rank) do the work; module-scoped fixtures run each once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.distributed._dist_helpers import VOCAB, build_tiny_model, make_batch, rows, run_ranks

LR = 1e-5  # as the critic test: float rounding stays far below one Adam step


def settings(**overrides):
    from grpo_dist.training.settings import RewardModelSettings

    base = dict(seed=3, lr=LR, grad_clip=1.0, weight_decay=0.0)
    base.update(overrides)
    return RewardModelSettings(**base)


def save_classifier(directory: Path, kind: str, *, arch: str = "qwen2", seed: int = 0) -> Path:
    """A tiny reward model saved with AutoModelFor{Sequence,Token}Classification and one label (random
    head with a non-zero bias for the token classifier), with the helper's tokenizer."""
    from transformers import (AutoModelForSequenceClassification, AutoModelForTokenClassification, AutoTokenizer,
                              LlamaConfig, Qwen2Config)

    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=1, num_key_value_heads=1,
                  head_dim=64, intermediate_size=128, num_labels=1, pad_token_id=0, tie_word_embeddings=False)
    config = Qwen2Config(**common) if arch == "qwen2" else LlamaConfig(**common)
    cls = AutoModelForSequenceClassification if kind == "sequence" else AutoModelForTokenClassification
    model = cls.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or name.startswith("score"):
                p.normal_(0.0, 0.5)
    model.save_pretrained(directory)
    tok_dir = build_tiny_model(directory.parent / f"{directory.name}_tok")
    AutoTokenizer.from_pretrained(tok_dir).save_pretrained(directory)
    return directory


def with_reward_head(src: Path, directory: Path, *, seed: int = 3) -> Path:
    """``src``'s causal-LM backbone saved as a one-label token classifier with a new head drawn here
    (a reward model's folder must hold its head: a causal LM's is refused at load)."""
    from transformers import AutoModelForTokenClassification

    torch.manual_seed(seed)
    AutoModelForTokenClassification.from_pretrained(src, num_labels=1).save_pretrained(directory)
    return directory


def labelled_batch(seed: int, n: int = 8) -> dict[str, torch.Tensor]:
    """Responses labelled 1 when their first token id is even (something a model can learn), the
    label on the last response token; one row also gets labels at two inner tokens (process)."""
    data = make_batch(seed, rows=n)
    del data["advantages"]
    last_B = data["response_mask"].sum(-1).long() - 1
    targets = torch.full_like(data["response_mask"], float("nan"))
    labels = (data["responses"][:, 0] % 2 == 0).float()
    targets[torch.arange(n), last_B] = labels
    if last_B[0] >= 2:
        targets[0, 0], targets[0, 1] = 1.0, 0.0
    data["rm_targets"] = targets
    return data


def plain_scores(model_dir: str, kind: str, data: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A plain transformers forward of each row's real tokens, one row at a time: the sequence
    classifier's pooled logit (outcome), and the score of every prefix that ends with a response token
    (the sequence classifier on that prefix, or the token classifier's output there)."""
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

    cls = AutoModelForSequenceClassification if kind == "sequence" else AutoModelForTokenClassification
    model = cls.from_pretrained(model_dir, dtype=torch.float32).eval()
    R = data["responses"].shape[1]
    P = data["input_ids"].shape[1] - R
    last, token = torch.zeros(len(data["input_ids"])), torch.zeros(len(data["input_ids"]), R)
    with torch.no_grad():
        for b in range(len(data["input_ids"])):
            ids = data["input_ids"][b][data["attention_mask"][b].bool()].unsqueeze(0)
            n_resp = int(data["response_mask"][b].sum())
            n_prompt = ids.shape[1] - n_resp
            if kind == "sequence":
                last[b] = model(input_ids=ids).logits[0, 0]
                for t in range(n_resp):
                    token[b, t] = model(input_ids=ids[:, : n_prompt + t + 1]).logits[0, 0]
            else:
                out = model(input_ids=ids).logits[0, :, 0]
                last[b] = out[-1]
                token[b, :n_resp] = out[n_prompt:]
    assert P >= 1
    return {"last": last, "token": token}


def full_params(rm) -> dict[str, torch.Tensor]:
    return {name: p.full_tensor().detach().clone() for name, p in rm.model.named_parameters()}


def update_share(rm, data, *, rank: int, world_size: int, num_mini_batches: int) -> dict:
    from grpo_dist.training.micro_batches import rank_shard_indices

    n = data["responses"].shape[0]
    mine = rows(data, rank_shard_indices(n, num_mini_batches=num_mini_batches, rank=rank, world_size=world_size))
    metrics = rm.update(mine)
    return {"metrics": metrics, "params": full_params(rm)}


# ---------------------------------------------------------------------------------------------
def job_two_ranks(rank: int, world_size: int, dirs: dict, ckpt_dir: str) -> dict:
    from grpo_dist.training.micro_batches import rank_shard_indices
    from grpo_dist.training.reference import FSDPReference
    from grpo_dist.training.reward_model import FSDPRewardModel

    make = lambda path, s: FSDPRewardModel(path, s, rank=rank, world_size=world_size, device="cpu")  # noqa: E731
    out: dict = {"scores": {}}
    data = make_batch(11, rows=8, prompt_lengths=[6, 2, 4, 1, 6, 3, 5, 2], response_lengths=[8, 2, 5, 1, 3, 8, 6, 4])
    mine = rows(data, rank_shard_indices(8, num_mini_batches=1, rank=rank, world_size=world_size))
    for name in ("qwen2_sequence", "llama_sequence", "qwen2_token"):
        by_budget = make(dirs[name], settings(use_dynamic_bsz=True, forward_max_token_len_per_gpu=20)).compute_scores(mine)
        by_count = make(dirs[name], settings(micro_batch_size_per_gpu=3)).compute_scores(mine)
        out["scores"][name] = {"budget": by_budget, "count": by_count, "rows": mine}

    # training on 2 ranks (compared with 1 rank), with a checkpoint: A trains on batch 1, saves, trains
    # on batch 2; B loads A's checkpoint and trains on batch 2; C trains on batch 2 from scratch
    cross = settings(trainable=True, mini_batch_size_per_gpu=2, update_micro_batch_size_per_gpu=1, epochs=2)
    out["cross"] = update_share(make(dirs["causal_rm"], cross), labelled_batch(1), rank=rank, world_size=world_size,
                                num_mini_batches=2)
    b1, b2 = labelled_batch(3), labelled_batch(4)
    a = make(dirs["causal_rm"], cross)
    update_share(a, b1, rank=rank, world_size=world_size, num_mini_batches=2)
    a.save_checkpoint(ckpt_dir)
    a_run = update_share(a, b2, rank=rank, world_size=world_size, num_mini_batches=2)
    b = make(dirs["causal_rm"], cross)
    b.load_checkpoint(ckpt_dir)
    b_run = update_share(b, b2, rank=rank, world_size=world_size, num_mini_batches=2)
    c_run = update_share(make(dirs["causal_rm"], cross), b2, rank=rank, world_size=world_size, num_mini_batches=2)
    out["resume"] = {"continuous": a_run["params"], "resumed": b_run["params"], "fresh": c_run["params"],
                     "update_count": (a.update_count, b.update_count)}

    # a reference reset: the reference of model A given model B's full weights computes B's log-probs
    from transformers import AutoModelForCausalLM

    other = AutoModelForCausalLM.from_pretrained(dirs["causal_other"], dtype=torch.float32)
    ref = FSDPReference(dirs["causal"], rank=rank, world_size=world_size, device="cpu", param_dtype="float32")
    before = ref.compute_ref_log_prob(mine)
    ref.load_full_weights({k: v.clone() for k, v in other.state_dict().items()})
    want = FSDPReference(dirs["causal_other"], rank=rank, world_size=world_size, device="cpu",
                         param_dtype="float32").compute_ref_log_prob(mine)
    out["reset"] = {"before": before, "after": ref.compute_ref_log_prob(mine), "want": want,
                    "mask": mine["response_mask"]}
    try:
        ref.load_full_weights({k: v for k, v in list(other.state_dict().items())[1:]})
        out["reset"]["partial_error"] = ""
    except ValueError as exc:
        out["reset"]["partial_error"] = str(exc)
    return out


def job_one_rank(rank: int, world_size: int, dirs: dict, ckpt_dir: str) -> dict:
    from grpo_dist.training.reward_model import FSDPRewardModel

    make = lambda s: FSDPRewardModel(dirs["causal_rm"], s, rank=rank, world_size=world_size, device="cpu")  # noqa: E731
    out: dict = {"invariance": {}, "causal_refused": "loaded"}
    try:  # a causal LM's folder has no reward head
        FSDPRewardModel(dirs["causal"], settings(), rank=rank, world_size=world_size, device="cpu")
    except ValueError as exc:
        out["causal_refused"] = str(exc)
    data = labelled_batch(1)
    for cut, micro in (("micro1", 1), ("micro3", 3), ("whole", None)):
        rm = make(settings(trainable=True, mini_batch_size_per_gpu=8, update_micro_batch_size_per_gpu=micro))
        out["invariance"][cut] = update_share(rm, data, rank=rank, world_size=world_size, num_mini_batches=1)
    cross = settings(trainable=True, mini_batch_size_per_gpu=4, update_micro_batch_size_per_gpu=3, epochs=2)
    out["cross"] = update_share(make(cross), data, rank=rank, world_size=world_size, num_mini_batches=2)

    # repeated updates on the same labelled responses lower the loss and reach agreement
    rm = make(settings(trainable=True, lr=3e-3))
    fit = []
    for _ in range(12):
        m = rm.update(data)
        fit.append((m["reward_model/train_loss"], m["reward_model/train_accuracy"]))
    out["fit"] = fit

    # rows without labels (the padding of a short mini-batch) change nothing
    padded = {k: torch.cat([v, v[:2]]) for k, v in data.items()}
    padded["rm_targets"][-2:] = float("nan")
    rm_a, rm_b = make(settings(trainable=True, mini_batch_size_per_gpu=10)), make(settings(trainable=True, mini_batch_size_per_gpu=8))
    out["padding"] = {"padded": update_share(rm_a, padded, rank=rank, world_size=world_size, num_mini_batches=1)["params"],
                      "plain": update_share(rm_b, data, rank=rank, world_size=world_size, num_mini_batches=1)["params"]}

    # the 2-rank checkpoint continues the same way on 1 rank
    rm = make(settings(trainable=True, mini_batch_size_per_gpu=4, update_micro_batch_size_per_gpu=1, epochs=2))
    rm.load_checkpoint(ckpt_dir)
    out["resumed_on_one_rank"] = update_share(rm, labelled_batch(4), rank=rank, world_size=world_size,
                                              num_mini_batches=2)["params"]
    return out


# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("reward_models")
    return {
        "causal": str(build_tiny_model(base / "causal")),
        "causal_other": str(build_tiny_model(base / "causal_other", seed=1)),
        "causal_rm": str(with_reward_head(base / "causal", base / "causal_rm")),
        "qwen2_sequence": str(save_classifier(base / "qwen2_sequence", "sequence")),
        "llama_sequence": str(save_classifier(base / "llama_sequence", "sequence", arch="llama")),
        "qwen2_token": str(save_classifier(base / "qwen2_token", "token")),
    }


@pytest.fixture(scope="module")
def two_rank(dirs, tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("rm_ckpt") / "ckpt"
    return {"ranks": run_ranks(job_two_ranks, 2, dirs, str(ckpt)), "ckpt": ckpt}


@pytest.fixture(scope="module")
def one_rank(dirs, two_rank):
    return run_ranks(job_one_rank, 1, dirs, str(two_rank["ckpt"]))[0]


def max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b) and a
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["qwen2_sequence", "llama_sequence", "qwen2_token"])
def test_scores_equal_a_plain_hugging_face_forward(two_rank, dirs, name):
    kind = "token" if name.endswith("token") else "sequence"
    for r in two_rank["ranks"]:
        got = r["scores"][name]
        want = plain_scores(dirs[name], kind, got["rows"])
        mask = got["rows"]["response_mask"].bool()
        for cut in ("budget", "count"):
            torch.testing.assert_close(got[cut]["last_B"], want["last"], rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(got[cut]["token_scores_BR"][mask], want["token"][mask], rtol=1e-4, atol=1e-5)
            assert got[cut]["token_scores_BR"][~mask].abs().max().item() == 0.0
        # the outcome score is the one at the last response token, and the scores vary along the response
        last_t = mask.sum(-1) - 1
        torch.testing.assert_close(got["budget"]["token_scores_BR"][torch.arange(len(last_t)), last_t], want["last"],
                                   rtol=1e-4, atol=1e-5)
        assert want["token"][mask].std() > 1e-3


def test_a_sequence_classifier_folder_keeps_its_head_without_a_bias(dirs):
    from grpo_dist.training.reward_model import reward_head_config

    assert reward_head_config(dirs["qwen2_sequence"]) == {"num_labels": 1, "token_classification_bias": False}
    assert reward_head_config(dirs["qwen2_token"]) == {"num_labels": 1}
    assert reward_head_config(dirs["causal"]) == {"num_labels": 1}


def test_folders_that_hold_their_head_pass_the_start_up_check(dirs):
    from grpo_dist.training.reward_model import check_reward_head

    for name in ("qwen2_sequence", "llama_sequence", "qwen2_token", "causal_rm"):
        check_reward_head(dirs[name])
    with pytest.raises(ValueError, match="holds no trained reward head"):
        check_reward_head(dirs["causal"])


def test_a_causal_lm_folder_is_refused_at_load(one_rank, dirs):
    """Without a head in the folder the reward model would score with a random one: the load refuses it."""
    out = one_rank["causal_refused"]
    assert out.startswith(f"{dirs['causal']} holds no trained head for Qwen2ForTokenClassification: score.bias, "
                          "score.weight missing"), out


def test_training_does_not_depend_on_micro_batching(one_rank, dirs):
    runs = one_rank["invariance"]
    ref = runs["micro1"]
    assert ref["metrics"]["reward_model/grad_norm"] > 1e-3
    for cut in ("micro3", "whole"):
        assert max_diff(runs[cut]["params"], ref["params"]) < 1e-6, cut
        for key in ("reward_model/train_loss", "reward_model/train_accuracy", "reward_model/grad_norm"):
            assert runs[cut]["metrics"][key] == pytest.approx(ref["metrics"][key], rel=1e-5, abs=1e-7), (cut, key)


def test_two_ranks_train_as_one(one_rank, two_rank):
    single = one_rank["cross"]
    r0, r1 = (r["cross"] for r in two_rank["ranks"])
    assert r0["metrics"] == r1["metrics"]
    for key in ("reward_model/train_loss", "reward_model/train_accuracy", "reward_model/grad_norm"):
        assert r0["metrics"][key] == pytest.approx(single["metrics"][key], rel=1e-5, abs=1e-7), key
    assert max_diff(r0["params"], single["params"]) < 1e-6
    assert max_diff(r0["params"], r1["params"]) == 0.0


def test_training_lowers_the_loss_and_learns_the_labels(one_rank):
    losses = [loss for loss, _ in one_rank["fit"]]
    assert losses[-1] < 0.5 * losses[0], losses
    assert one_rank["fit"][-1][1] == 1.0


def test_unlabelled_padding_rows_change_nothing(one_rank):
    assert max_diff(one_rank["padding"]["padded"], one_rank["padding"]["plain"]) < 1e-6


def test_checkpoint_round_trip(two_rank, one_rank):
    res = two_rank["ranks"][0]["resume"]
    assert res["update_count"] == (2, 2)
    assert max_diff(res["resumed"], res["continuous"]) < 1e-7
    assert max_diff(res["fresh"], res["continuous"]) > 2e-6  # the checkpoint matters
    assert max_diff(one_rank["resumed_on_one_rank"], res["continuous"]) < 1e-6


def test_a_reset_reference_computes_the_new_models_log_probs(two_rank):
    for r in two_rank["ranks"]:
        reset = r["reset"]
        m = reset["mask"].bool()
        torch.testing.assert_close(reset["after"][m], reset["want"][m], rtol=1e-5, atol=1e-5)
        assert (reset["before"][m] - reset["want"][m]).abs().max() > 1e-3  # the two models differ
        assert "weights missing" in reset["partial_error"]
