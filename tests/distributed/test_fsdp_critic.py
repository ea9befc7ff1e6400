"""FSDP2 critic on gloo: values at the right positions (against a plain Hugging Face forward, padded
and packed), GAE + value-loss update invariant to the micro-batch cut, to packing and to 1 vs 2 ranks, the update fits the returns,
sharded checkpoints (exact resume, also on another world size), and the Hugging Face export, which a
critic then loads with its trained head.

Two spawned jobs do the work (2 ranks, then 1 rank) and return plain results; module-scoped fixtures
run each once and the tests assert on them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_dist.core.losses import LOSS_AGG_MODES
from tests.distributed._dist_helpers import make_batch, rows, run_ranks

# Adam's first step moves most weights by ~lr; with this lr float rounding stays far below the change
LR = 1e-5
GAMMA, LAM = 1.0, 0.95
MODES = ("token-mean", "seq-mean-token-mean")


def settings(**overrides):
    from grpo_dist.training.settings import CriticSettings

    base = dict(lr=LR, grad_clip=1.0, weight_decay=0.01, norm_constant=8.0, seed=7, cliprange_value=0.5)
    base.update(overrides)
    return CriticSettings(**base)


def scored_batch(seed: int) -> dict[str, torch.Tensor]:
    """8 responses with an outcome score (0 or 1) on their last token."""
    data = make_batch(seed, rows=8)
    del data["advantages"]
    g = torch.Generator().manual_seed(seed + 50)
    score_B = torch.randint(0, 2, (8,), generator=g).float()
    last_B = data["response_mask"].sum(-1).long() - 1
    rewards = torch.zeros_like(data["response_mask"])
    rewards[torch.arange(8), last_B] = score_B
    data["token_level_rewards"] = rewards
    return data


def with_gae(data: dict[str, torch.Tensor], values: torch.Tensor) -> dict[str, torch.Tensor]:
    """The driver's step: values in, GAE's advantages and returns out (on the whole batch)."""
    from grpo_dist.core.advantages import AdvantageInputs, AdvantageParams, compute_gae_advantage

    inputs = AdvantageInputs(token_level_rewards_BT=data["token_level_rewards"],
                             response_mask_BT=data["response_mask"], values_BT=values)
    adv, ret = compute_gae_advantage(inputs, AdvantageParams(gamma=GAMMA, lam=LAM))
    return dict(data, values=values, advantages=adv, returns=ret)


def sharded_rows(data, *, num_mini_batches: int, rank: int, world_size: int):
    from grpo_dist.training.micro_batches import rank_shard_indices

    n = data["responses"].shape[0]
    return rows(data, rank_shard_indices(n, num_mini_batches=num_mini_batches, rank=rank, world_size=world_size))


def full_params(critic) -> dict[str, torch.Tensor]:
    """Collective: every parameter gathered from its shards."""
    return {name: p.full_tensor().detach().clone() for name, p in critic.model.named_parameters()}


def cross_rank_config(mode: str, world_size: int):
    """The same update on 1 and 2 ranks: 2 mini-batches, 2 epochs. 1 rank: padded forwards of 3 rows and
    micro-batches of 1 row; 2 ranks: packed forwards and micro-batches by token budget."""
    common = dict(loss_agg_mode=mode, ppo_epochs=2)
    if world_size == 1:
        return settings(ppo_mini_batch_size_per_gpu=4, ppo_micro_batch_size_per_gpu=1,
                        forward_micro_batch_size_per_gpu=3, **common)
    return settings(ppo_mini_batch_size_per_gpu=2, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=40,
                    forward_max_token_len_per_gpu=20, use_remove_padding=True, **common)


def gae_and_update(critic, data, *, rank: int, world_size: int, num_mini_batches: int) -> dict:
    """Values of the whole batch (every rank passes all rows: the call is collective), GAE, then the
    update on this rank's share."""
    values = critic.compute_values(data)
    step = with_gae(data, values)
    metrics = critic.update_critic(sharded_rows(step, num_mini_batches=num_mini_batches, rank=rank,
                                                world_size=world_size))
    return {"values": values, "advantages": step["advantages"], "returns": step["returns"], "metrics": metrics,
            "params": full_params(critic)}


# ---------------------------------------------------------------------------------------------
# the spawned jobs
# ---------------------------------------------------------------------------------------------
def job_two_ranks(rank: int, world_size: int, model_dir: str, ckpt_dir: str, export_dir: str) -> dict:
    from transformers import AutoModelForTokenClassification

    from grpo_dist.training.critic import FSDPCritic

    out: dict = {}
    make = lambda s, path=model_dir: FSDPCritic(path, s, rank=rank, world_size=world_size, device="cpu")  # noqa: E731

    # GAE + value loss on 2 ranks (compared with 1 rank in the other job)
    data = scored_batch(1)
    out["cross"] = {mode: gae_and_update(make(cross_rank_config(mode, world_size)), data, rank=rank,
                                         world_size=world_size, num_mini_batches=2) for mode in MODES}

    # values at the positions that predict the response tokens, against a plain forward of the same
    # model (a new head drawn from the same seed); rank 0 long rows, rank 1 short ones
    lp = make_batch(7, rows=8, prompt_lengths=[6] * 4 + [2] * 4, response_lengths=[8] * 4 + [2] * 4)
    mine = sharded_rows(lp, num_mini_batches=1, rank=rank, world_size=world_size)
    critic = make(settings(use_dynamic_bsz=True, forward_max_token_len_per_gpu=16))
    values = critic.compute_values(mine)
    by_count = make(settings(forward_micro_batch_size_per_gpu=3)).compute_values(mine)
    packed = make(settings(use_dynamic_bsz=True, forward_max_token_len_per_gpu=16, use_remove_padding=True)).compute_values(mine)
    torch.manual_seed(7)
    plain = AutoModelForTokenClassification.from_pretrained(model_dir, num_labels=1, dtype=torch.float32).eval()
    with torch.no_grad():
        head = plain(input_ids=mine["input_ids"], attention_mask=mine["attention_mask"],
                     position_ids=mine["position_ids"]).logits[..., 0]
    R = mine["responses"].shape[1]
    m = mine["response_mask"].bool()
    want = head[:, -R - 1 : -1]
    out["positions"] = {
        "err_budget": (values - want)[m].abs().max().item(),
        "err_count": (by_count - want)[m].abs().max().item(),
        "err_packed": (packed - want)[m].abs().max().item(),
        "packed_outside_mask": packed[~m].abs().max().item() if (~m).any() else 0.0,
        "shifted_err": (values - head[:, -R:])[m].abs().max().item(),  # one position later: must differ
        "outside_mask": values[~m].abs().max().item() if (~m).any() else 0.0,
    }

    # checkpoint: A updates on batch 1, saves (with a Hugging Face export), updates on batch 2; B loads
    # A's checkpoint and updates on batch 2; C updates on batch 2 from scratch (the checkpoint matters)
    resume = settings(ppo_mini_batch_size_per_gpu=2, ppo_micro_batch_size_per_gpu=1, lr_scheduler_type="cosine",
                      total_training_steps=4, min_lr_ratio=0.1, export_hf=True)
    b1, b2 = scored_batch(3), scored_batch(4)
    a = make(resume)
    gae_and_update(a, b1, rank=rank, world_size=world_size, num_mini_batches=2)
    a.save_checkpoint(ckpt_dir)
    saved_values = a.compute_values(lp)
    a_run = gae_and_update(a, b2, rank=rank, world_size=world_size, num_mini_batches=2)
    b = make(resume)
    b.load_checkpoint(ckpt_dir)
    b_run = gae_and_update(b, b2, rank=rank, world_size=world_size, num_mini_batches=2)
    c_run = gae_and_update(make(resume), b2, rank=rank, world_size=world_size, num_mini_batches=2)
    out["resume"] = {
        "continuous": a_run["params"], "resumed": b_run["params"], "fresh": c_run["params"],
        "lr": (a_run["metrics"]["critic/lr"], b_run["metrics"]["critic/lr"], c_run["metrics"]["critic/lr"]),
        "update_count": (a.update_count, b.update_count),
    }
    # a critic built from the export (another seed: a new head would differ) gives the saved values
    from_export = make(settings(seed=99), path=str(Path(ckpt_dir) / "huggingface"))
    out["export"] = {"saved_values": saved_values, "loaded_values": from_export.compute_values(lp)}
    a.export_hf(export_dir)
    out["export"]["final_params"] = a_run["params"]
    return out


def job_one_rank(rank: int, world_size: int, model_dir: str, ckpt_dir: str) -> dict:
    from grpo_dist.training.critic import FSDPCritic

    out: dict = {}
    make = lambda s: FSDPCritic(model_dir, s, rank=rank, world_size=world_size, device="cpu")  # noqa: E731

    # micro-batch invariance: one mini-batch of 8 rows cut three ways (by count, by token budget, by
    # count with gradient checkpointing), values computed in three cuts too
    data = scored_batch(1)
    cuts = {
        "micro1": dict(ppo_micro_batch_size_per_gpu=1, forward_micro_batch_size_per_gpu=1),
        "dynamic": dict(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=20, forward_max_token_len_per_gpu=30),
        "micro4_checkpointing": dict(ppo_micro_batch_size_per_gpu=4, enable_gradient_checkpointing=True),
        "micro4_packed": dict(ppo_micro_batch_size_per_gpu=4, forward_micro_batch_size_per_gpu=3, use_remove_padding=True),
        "dynamic_packed": dict(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=20, forward_max_token_len_per_gpu=30,
                               use_remove_padding=True),
    }
    out["invariance"] = {}
    for mode in LOSS_AGG_MODES:
        for cut, kw in cuts.items():
            critic = make(settings(loss_agg_mode=mode, ppo_mini_batch_size_per_gpu=8, **kw))
            out["invariance"][(mode, cut)] = gae_and_update(critic, data, rank=rank, world_size=world_size,
                                                            num_mini_batches=1)

    out["cross"] = {mode: gae_and_update(make(cross_rank_config(mode, world_size)), data, rank=rank,
                                         world_size=world_size, num_mini_batches=2) for mode in MODES}

    # the update fits the returns: repeated steps on the same responses (values refreshed each time,
    # as the driver does) lower the value loss and raise the explained variance
    from grpo_dist.core.value import explained_variance

    critic = make(settings(lr=3e-3, ppo_micro_batch_size_per_gpu=4))
    fit = {"vf_loss": [], "explained_variance": []}
    for _ in range(8):
        values = critic.compute_values(data)
        step = with_gae(data, values)
        fit["explained_variance"].append(explained_variance(values, step["returns"], data["response_mask"]))
        fit["vf_loss"].append(critic.update_critic(step)["critic/vf_loss"])
    out["fit"] = fit

    # a non-finite return skips the optimizer step and is counted
    critic = make(settings(ppo_micro_batch_size_per_gpu=4))
    step = with_gae(data, critic.compute_values(data))
    step["returns"] = step["returns"].clone()
    step["returns"][0, 0] = float("nan")
    before = full_params(critic)
    metrics = critic.update_critic(step)
    out["nonfinite"] = {"metrics": metrics, "unchanged": all(torch.equal(before[k], v) for k, v in full_params(critic).items())}

    # the 2-rank checkpoint loaded on 1 rank continues like the 2-rank run
    resume = settings(ppo_mini_batch_size_per_gpu=4, ppo_micro_batch_size_per_gpu=2, lr_scheduler_type="cosine",
                      total_training_steps=4, min_lr_ratio=0.1)
    critic = make(resume)
    critic.load_checkpoint(ckpt_dir)
    out["resumed_on_one_rank"] = gae_and_update(critic, scored_batch(4), rank=rank, world_size=world_size,
                                                num_mini_batches=2)["params"]
    return out


# ---------------------------------------------------------------------------------------------
_FAILED_JOBS: dict[str, BaseException] = {}


def _run_once(name: str, fn, *args):
    """Run a job; when it failed before in this session, fail at once instead of re-running it."""
    if name in _FAILED_JOBS:
        pytest.fail(f"job {name} failed earlier in this session (see the first error)", pytrace=False)
    try:
        return fn(*args)
    except BaseException as exc:
        _FAILED_JOBS[name] = exc
        raise


@pytest.fixture(scope="module")
def two_rank(fsdp_model_dir, tmp_path_factory):
    base = tmp_path_factory.mktemp("critic_two_rank")
    ckpt, export = base / "ckpt", base / "hf_export"
    results = _run_once("two_rank", run_ranks, job_two_ranks, 2, str(fsdp_model_dir), str(ckpt), str(export))
    return {"ranks": results, "ckpt": ckpt, "export": export}


@pytest.fixture(scope="module")
def one_rank(fsdp_model_dir, two_rank):
    return _run_once("one_rank", run_ranks, job_one_rank, 1, str(fsdp_model_dir), str(two_rank["ckpt"]))[0]


@pytest.fixture(scope="module")
def initial_weights(fsdp_model_dir):
    from safetensors.torch import load_file

    return load_file(str(Path(fsdp_model_dir) / "model.safetensors"))


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b) and a, "parameter names differ or are empty"
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def moved(params: dict[str, torch.Tensor], initial: dict[str, torch.Tensor]) -> float:
    """How far the backbone moved from the checkpoint (the head is new, so not compared)."""
    common = [k for k in params if k in initial]
    assert common, "no backbone parameter shares a name with the checkpoint"
    return max((params[k] - initial[k]).abs().max().item() for k in common)


# ---------------------------------------------------------------------------------------------
def test_values_are_read_where_the_response_tokens_are_predicted(two_rank):
    for r in two_rank["ranks"]:
        p = r["positions"]
        assert p["err_budget"] < 1e-5 and p["err_count"] < 1e-5 and p["err_packed"] < 1e-5
        assert p["packed_outside_mask"] == 0.0
        assert p["shifted_err"] > 1e-3, "the next position's output is a different value"
        assert p["outside_mask"] == 0.0


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_gae_and_value_update_do_not_depend_on_micro_batching(one_rank, initial_weights, mode):
    runs = {cut: r for (m, cut), r in one_rank["invariance"].items() if m == mode}
    ref = runs["micro1"]
    assert ref["metrics"]["critic/grad_norm"] > 1e-3
    for cut in ("dynamic", "micro4_checkpointing", "micro4_packed", "dynamic_packed"):
        got = runs[cut]
        for key in ("values", "advantages", "returns"):
            torch.testing.assert_close(got[key], ref[key], rtol=1e-5, atol=1e-6)
        assert max_diff(got["params"], ref["params"]) < 1e-6, cut
        for key in ("critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm"):
            assert got["metrics"][key] == pytest.approx(ref["metrics"][key], rel=1e-5, abs=1e-7), (cut, key)
    assert moved(ref["params"], initial_weights) > 5e-6


def test_value_loss_aggregation_modes_differ(one_rank):
    """The invariance test compares modes that really are different losses."""
    norms = {m: one_rank["invariance"][(m, "micro1")]["metrics"]["critic/grad_norm"] for m in LOSS_AGG_MODES}
    assert len({round(v, 6) for v in norms.values()}) == len(LOSS_AGG_MODES), norms


@pytest.mark.parametrize("mode", MODES)
def test_two_ranks_equal_one_rank(one_rank, two_rank, initial_weights, mode):
    single = one_rank["cross"][mode]
    r0, r1 = (r["cross"][mode] for r in two_rank["ranks"])
    assert r0["metrics"] == r1["metrics"], "metrics must be identical on all ranks"
    torch.testing.assert_close(r0["values"], single["values"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(r0["returns"], single["returns"], rtol=1e-5, atol=1e-6)
    for key in ("critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm"):
        assert r0["metrics"][key] == pytest.approx(single["metrics"][key], rel=1e-5, abs=1e-7), key
    assert max_diff(r0["params"], single["params"]) < 1e-6
    assert max_diff(r0["params"], r1["params"]) == 0.0
    assert moved(r0["params"], initial_weights) > 5e-6


def test_the_update_fits_the_returns(one_rank):
    fit = one_rank["fit"]
    assert fit["vf_loss"][-1] < 0.5 * fit["vf_loss"][0], fit["vf_loss"]
    assert fit["explained_variance"][-1] > fit["explained_variance"][0] + 0.2, fit["explained_variance"]


def test_nonfinite_gradient_skips_the_critic_step(one_rank):
    r = one_rank["nonfinite"]
    assert r["metrics"]["critic/grad_norm_nonfinite_count"] == 1.0
    assert r["unchanged"]


def test_checkpoint_round_trip(two_rank, one_rank):
    res = two_rank["ranks"][0]["resume"]
    assert res["update_count"] == (2, 2)
    lr_a, lr_b, lr_c = res["lr"]
    assert lr_a == pytest.approx(lr_b) and lr_c == pytest.approx(LR) and lr_a < LR  # cosine, second step
    assert max_diff(res["resumed"], res["continuous"]) < 1e-7
    assert max_diff(res["fresh"], res["continuous"]) > 2e-6  # the checkpoint matters
    # loaded on another world size (DCP reshards), the run continues the same way
    assert max_diff(one_rank["resumed_on_one_rank"], res["continuous"]) < 1e-6


def test_a_saved_value_model_loads_with_its_head(two_rank, fsdp_model_dir):
    """The critic's Hugging Face export is a token-classification model with one label: transformers
    loads it as saved, and a critic built from it (critic.model.path) gives the saved values, head
    included, whatever its seed."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    ex = two_rank["ranks"][0]["export"]
    torch.testing.assert_close(ex["loaded_values"], ex["saved_values"], rtol=0, atol=1e-6)
    export: Path = two_rank["export"]
    config = AutoConfig.from_pretrained(export)
    assert config.num_labels == 1 and config.architectures == ["Qwen2ForTokenClassification"]
    model = AutoModelForTokenClassification.from_pretrained(export)
    assert max_diff(dict(model.state_dict()), ex["final_params"]) == 0.0
