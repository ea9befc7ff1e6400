"""FSDP2 actor and reference on gloo: update invariance (micro-batches, ranks; every aggregation mode
and every policy-loss mode that allows it), log-probs against a plain Hugging Face forward, full state
dicts, sharded checkpoints, the HF export, the KL loss.

Two spawned jobs do the work (one with 2 ranks, one with 1 rank) and return plain results; the tests
below assert on them. Module-scoped fixtures run each job once.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from grpo_dist.core.losses import ALL_LOSS_AGG_MODES
from tests.distributed._dist_helpers import make_batch, noise, rows, run_ranks

T = 0.7  # sampling temperature used everywhere: logits must be divided by it
# Adam's first step is ~lr * g / (|g| + eps): most weights move by ~lr, but an element whose gradient
# is ~eps (1e-8, e.g. cancellation in lm_head) turns float rounding of g into a few % of lr. With this
# lr, rounding stays ~1e-7 while the weights move ~1e-5.
LR = 1e-5
BASE_LOGP = -math.log(64.0)  # the untrained model is close to uniform over the 64-token vocabulary
MODES_ABC = ("token-mean", "seq-mean-token-mean")

# Policy-loss modes whose update cannot be micro-batch or rank invariant, and why. Every other
# built-in mode is in LOSS_MODE_CASES (a test checks that the two lists cover the registry).
NOT_INVARIANT = {
    "clip_cov": "chooses the tokens whose gradient is cut by a covariance computed over the rows of one "
                "call, a count of tokens of that call, and a random draw: all change with the micro-batch",
    "kl_cov": "penalises the top-k tokens of a covariance ranking over the rows of one call: the ranking "
              "and k change with the micro-batch",
}


def loss_mode_settings(case: str) -> dict:
    """ActorSettings fields of a loss-mode case ('<mode>' or 'bypass_mode/<loss_type>'). Bypass mode
    gets token importance weights and a per-row rejection (both invariant); its batch-normalised
    weights would not be (a mean over the call's rows) and are not used."""
    from grpo_dist.core.policy_loss import PolicyLossParams
    from grpo_dist.core.rollout_correction import RejectionCriterion, RolloutCorrectionParams

    mode, _, loss_type = case.partition("/")
    if mode.startswith("dppo"):  # thresholds of the probability's move: tokens near 1/64 move by about 1e-3 here
        bound = {"dppo_tv": 0.002, "dppo_kl": 1e-4}[mode]
        return dict(loss_mode=mode, policy_loss=PolicyLossParams(clip_ratio_low=bound, clip_ratio_high=bound))
    if mode != "bypass_mode":  # (dro_beta only read by dro, which needs one)
        return dict(loss_mode=mode, policy_loss=PolicyLossParams(clip_ratio_high=0.28, dro_beta=0.5))
    rc = RolloutCorrectionParams(is_level="token", is_lower=0.8, is_upper=1.25, bypass=True, loss_type=loss_type,
                                 rejection=(RejectionCriterion("seq_mean_k1", 0.95, 1.05),))
    return dict(loss_mode=mode, policy_loss=PolicyLossParams(rollout_correction=rc))


LOSS_MODE_CASES = ("vanilla", "gspo", "gpg", "cispo", "geo_mean", "sapo", "dro", "dppo_tv", "dppo_kl",
                   "bypass_mode/ppo_clip", "bypass_mode/reinforce")
LOSS_MODE_CUTS = {
    "micro1": dict(ppo_micro_batch_size_per_gpu=1),
    "dynamic_packed": dict(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=20, use_remove_padding=True),
}


def loss_mode_batch(case: str, data: dict) -> dict:
    """The update batch of a case: with rollout importance weights for the modes that take them (bypass
    mode computes its own; its old_log_probs stand for the rollout's log-probs)."""
    if case.startswith("bypass_mode"):
        return data
    return dict(data, rollout_is_weights=(0.5 + noise(31, (8, 8), 1.0).abs().clamp(max=1.0)) * data["response_mask"])


def settings(**overrides):
    from grpo_dist.training.settings import ActorSettings

    base = dict(lr=LR, temperature=T, grad_clip=1.0, weight_decay=0.01, norm_constant=8.0)
    base.update(overrides)
    return ActorSettings(**base)


def update_batch(seed: int, *, kl: bool = True) -> dict[str, torch.Tensor]:
    """8 rows with old log-probs near the model's (some ratios clipped) and a reference; some rows are
    agent-loop trajectories with tool tokens inside the response (mask 0), so every invariance below holds
    with such masks too."""
    data = make_batch(seed, rows=8, tool_tokens=True)
    assert bool(((data["response_mask"][:, 2] == 0) & (data["response_mask"][:, 4] == 1)).any())
    data["old_log_probs"] = BASE_LOGP + noise(seed + 100, (8, 8), 0.2)
    if kl:
        data["ref_log_prob"] = data["old_log_probs"] + noise(seed + 200, (8, 8), 0.1)
    return data


def sharded_rows(data, *, num_mini_batches: int, rank: int, world_size: int):
    from grpo_dist.training.micro_batches import rank_shard_indices

    n = data["responses"].shape[0]
    return rows(data, rank_shard_indices(n, num_mini_batches=num_mini_batches, rank=rank, world_size=world_size))


def full_params(actor) -> dict[str, torch.Tensor]:
    """Collective: every parameter gathered from its DTensor shards (on all ranks)."""
    return {name: p.full_tensor().detach().clone() for name, p in actor.model.named_parameters()}


def cross_rank_config(mode: str, world_size: int, **extra):
    """Same update on 1 and 2 ranks: 2 mini-batches, 2 epochs, KL loss and entropy bonus on.
    1 rank cuts padded micro-batches of 1 row; 2 ranks cut by token budget and run packed forwards
    (use_remove_padding) with the fused log-prob head (no logits formed)."""
    common = dict(loss_agg_mode=mode, ppo_epochs=2, use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01, **extra)
    if world_size == 1:
        return settings(ppo_mini_batch_size_per_gpu=4, ppo_micro_batch_size_per_gpu=1, **common)
    return settings(
        ppo_mini_batch_size_per_gpu=2, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=40,
        use_remove_padding=True, use_fused_kernels=True, logprob_chunk_size=5, **common
    )


def shuffled_update(make, data, world_size: int, rank: int) -> dict:
    """actor.shuffle: 2 epochs, each a global permutation of the 8 rows (seeded) cut into 2 mini-batches,
    laid out by the driver's function; the rows hold both epochs (epochs_in_rows)."""
    from grpo_dist.training.micro_batches import epoch_orders, update_layout

    orders = epoch_orders(8, epochs=2, seed=5)
    shares, _ = update_layout(data["attention_mask"].sum(-1).tolist(), num_mini_batches=2, world_size=world_size,
                              balance=False, orders=orders)
    actor = make(dataclasses.replace(cross_rank_config(MODES_ABC[0], world_size), epochs_in_rows=True))
    metrics = actor.update_policy(rows(data, shares[rank]))
    return {"metrics": metrics, "params": actor.state_dict_for_sync(), "orders": orders}


# ---------------------------------------------------------------------------------------------
# the spawned jobs
# ---------------------------------------------------------------------------------------------
def job_two_ranks(rank: int, world_size: int, model_dir: str, ckpt_dir: str, export_dir: str) -> dict:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from grpo_dist.training.actor import FSDPActor
    from grpo_dist.training.micro_batches import make_micro_batches
    from grpo_dist.training.reference import FSDPReference

    out: dict = {}
    make = lambda s: FSDPActor(model_dir, s, rank=rank, world_size=world_size, device="cpu")  # noqa: E731

    # (b) the cross-rank update, data laid out per mini-batch
    data = update_batch(1)
    out["cross"] = {}
    for mode in MODES_ABC:
        actor = make(cross_rank_config(mode, world_size))
        metrics = actor.update_policy(sharded_rows(data, num_mini_batches=2, rank=rank, world_size=world_size))
        out["cross"][mode] = {"metrics": metrics, "params": actor.state_dict_for_sync()}
    # every invariant policy-loss mode: the 2-rank side of the cross-rank comparison
    out["loss_modes"] = {}
    for case in LOSS_MODE_CASES:
        actor = make(cross_rank_config("token-mean", world_size, **loss_mode_settings(case)))
        metrics = actor.update_policy(sharded_rows(loss_mode_batch(case, data), num_mini_batches=2, rank=rank,
                                                   world_size=world_size))
        out["loss_modes"][case] = {"metrics": metrics, "params": actor.state_dict_for_sync()}
    # the same update with trainer.balance_batch's reordering (rows move only inside their mini-batch)
    from grpo_dist.training.micro_batches import balanced_shard_order

    order = balanced_shard_order(data["attention_mask"].sum(-1).tolist(), num_mini_batches=2, world_size=world_size)
    out["balanced_order"] = order
    actor = make(cross_rank_config(MODES_ABC[0], world_size))
    metrics = actor.update_policy(sharded_rows(rows(data, order), num_mini_batches=2, rank=rank, world_size=world_size))
    out["cross_balanced"] = {"metrics": metrics, "params": actor.state_dict_for_sync()}
    out["shuffled"] = shuffled_update(make, data, world_size, rank)

    # (c) compute_log_prob / compute_ref_log_prob vs a plain HF forward; rank 0 gets long rows and
    # rank 1 short ones, so a token budget gives them different micro-batch counts (must be aligned)
    lp_data = make_batch(7, rows=8, prompt_lengths=[6] * 4 + [2] * 4, response_lengths=[8] * 4 + [2] * 4)
    mine = sharded_rows(lp_data, num_mini_batches=1, rank=rank, world_size=world_size)
    out["local_micro_batches"] = len(make_micro_batches(mine["attention_mask"], max_token_len=16))
    actor = make(settings())
    logp, ent = actor.compute_log_prob(mine, max_token_len=16, temperature=T, compute_entropy=True)
    logp_mb2, _ = actor.compute_log_prob(mine, micro_batch_size=3, temperature=T)
    ref = FSDPReference(model_dir, rank=rank, world_size=world_size, device="cpu")
    ref_logp = ref.compute_ref_log_prob(mine, max_token_len=16, temperature=T)
    packed_actor = make(settings(use_remove_padding=True))
    packed_logp, packed_ent = packed_actor.compute_log_prob(mine, max_token_len=16, temperature=T, compute_entropy=True)
    packed_ref = FSDPReference(model_dir, rank=rank, world_size=world_size, device="cpu", use_remove_padding=True,
                               use_fused_kernels=True)
    packed_ref_logp = packed_ref.compute_ref_log_prob(mine, micro_batch_size=3, temperature=T)
    plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = plain(
            input_ids=mine["input_ids"], attention_mask=mine["attention_mask"], position_ids=mine["position_ids"]
        ).logits
    R = mine["responses"].shape[1]
    z = logits[:, -R - 1 : -1].float() / T
    logsm = torch.log_softmax(z, dim=-1)
    want_logp = logsm.gather(-1, mine["responses"].unsqueeze(-1)).squeeze(-1)
    want_ent = -(logsm.exp() * logsm).sum(-1)
    m = mine["response_mask"].bool()
    out["logprob_err"] = {
        "actor_budget": (logp - want_logp)[m].abs().max().item(),
        "actor_count": (logp_mb2 - want_logp)[m].abs().max().item(),
        "reference": (ref_logp - want_logp)[m].abs().max().item(),
        "entropy": (ent - want_ent)[m].abs().max().item(),
        "actor_packed": (packed_logp - want_logp)[m].abs().max().item(),
        "entropy_packed": (packed_ent - want_ent)[m].abs().max().item(),
        "reference_packed": (packed_ref_logp - want_logp)[m].abs().max().item(),
        "temperature_matters": (torch.log_softmax(logits[:, -R - 1 : -1], -1) - logsm).abs().max().item(),
    }

    # (d) the full state dict: rank 0 only, full shapes, equal to the file and to the sharded params
    synced = actor.state_dict_for_sync()
    on_disk = load_file(str(Path(model_dir) / "model.safetensors"))
    out["sync_initial"] = {
        "n_keys": len(synced),
        "keys_match": set(synced) == set(on_disk),
        "equal_file": bool(synced) and all(torch.equal(synced[k], on_disk[k]) for k in on_disk),
        "local_shard_numel": sum(p.to_local().numel() for p in actor.model.parameters()),
        "full_numel": sum(v.numel() for v in synced.values()),
    }
    actor.update_policy(sharded_rows(update_batch(2), num_mini_batches=1, rank=rank, world_size=world_size))
    synced = actor.state_dict_for_sync()
    gathered = full_params(actor)
    out["sync_after_update"] = {
        "equal_sharded": bool(synced) and all(torch.equal(synced[k], gathered[k]) for k in gathered),
        "moved": bool(synced) and max((synced[k] - on_disk[k]).abs().max().item() for k in on_disk),
    }
    # the flat-bucket sync: every rank packs the full weights (cast for the engine), bucket by bucket
    from grpo_dist.rollout.weight_sync import unpack

    buckets = actor.weight_buckets("bfloat16", bucket_bytes=20_000)
    packed = {}
    for b in buckets:
        packed.update({k: v.clone() for k, v in unpack(b, actor.pack_weight_bucket(b))})
    out["buckets"] = {
        "n": len(buckets),
        "packed": packed,
        "equal_full_cast": (not synced) or (set(packed) == set(synced) and all(
            torch.equal(packed[k], synced[k].to(torch.bfloat16)) for k in synced)),
    }

    # (e) checkpoint: A trains on batch 1, saves, trains on batch 2; B loads A's checkpoint and trains
    # on batch 2; C trains on batch 2 from scratch (a control: the checkpoint must matter)
    resume_settings = settings(
        ppo_mini_batch_size_per_gpu=2,
        ppo_micro_batch_size_per_gpu=1,
        use_kl_loss=True,
        lr_scheduler_type="cosine",
        total_training_steps=4,
        min_lr_ratio=0.1,
    )
    b1 = sharded_rows(update_batch(3), num_mini_batches=2, rank=rank, world_size=world_size)
    b2 = sharded_rows(update_batch(4), num_mini_batches=2, rank=rank, world_size=world_size)
    a = make(resume_settings)
    a.update_policy(b1)
    a.save_checkpoint(ckpt_dir)
    a_metrics = a.update_policy(b2)
    a.export_hf(export_dir, tokenizer_path=model_dir)
    b = make(resume_settings)
    b.load_checkpoint(ckpt_dir)
    b_metrics = b.update_policy(b2)
    c = make(resume_settings)
    c_metrics = c.update_policy(b2)
    out["resume"] = {
        "continuous": a.state_dict_for_sync(),
        "resumed": b.state_dict_for_sync(),
        "fresh": c.state_dict_for_sync(),
        "lr": (a_metrics["actor/lr"], b_metrics["actor/lr"], c_metrics["actor/lr"]),
        "update_count": (a.update_count, b.update_count),
    }
    # the same round trip with another optimizer (verl's optim.optimizer and override_optimizer_config):
    # SGD with momentum, whose buffers the checkpoint must carry
    sgd_settings = dataclasses.replace(resume_settings, optimizer="SGD", lr=0.5,
                                       optimizer_kwargs={"momentum": 0.9, "nesterov": True})
    runs = {}
    for name, load in (("continuous", False), ("resumed", True), ("fresh", None)):
        actor = make(sgd_settings)
        if load is False:
            actor.update_policy(b1)
            actor.save_checkpoint(Path(ckpt_dir) / "sgd")
        elif load:
            actor.load_checkpoint(Path(ckpt_dir) / "sgd")
        actor.update_policy(b2)
        runs[name] = actor.state_dict_for_sync()
        runs[f"{name}_optimizer"] = type(actor.optimizer).__name__
        runs[f"{name}_momentum"] = sum(len(st) for st in actor.optimizer.state.values()) > 0
    out["resume_sgd"] = runs
    return out


def job_one_rank(rank: int, world_size: int, model_dir: str, ckpt_dir: str) -> dict:
    from grpo_dist.training.actor import FSDPActor

    out: dict = {}
    make = lambda s: FSDPActor(model_dir, s, rank=rank, world_size=world_size, device="cpu")  # noqa: E731

    # (a) micro-batch invariance: one mini-batch of 8 rows cut three ways, in every aggregation mode
    data = update_batch(1)
    cuts = {
        "micro1": dict(ppo_micro_batch_size_per_gpu=1),
        "micro4": dict(ppo_micro_batch_size_per_gpu=4),
        "dynamic": dict(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=20),
        "micro4_checkpointing": dict(ppo_micro_batch_size_per_gpu=4, enable_gradient_checkpointing=True),
        "micro4_packed": dict(ppo_micro_batch_size_per_gpu=4, use_remove_padding=True),
        "dynamic_packed": dict(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=20, use_remove_padding=True),
        "dynamic_packed_fused": dict(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=20, use_remove_padding=True,
                                     use_fused_kernels=True, logprob_chunk_size=3),
        "micro4_packed_fused_checkpointing": dict(ppo_micro_batch_size_per_gpu=4, use_remove_padding=True,
                                                  use_fused_kernels=True, enable_gradient_checkpointing=True),
        "auto": dict(ppo_micro_batch_size_per_gpu="auto", enable_gradient_checkpointing="auto", max_seq_len=14,
                     max_response_len=8, use_remove_padding=True),
    }
    out["invariance"] = {}
    out["packed_rows"] = {}
    for mode in ALL_LOSS_AGG_MODES:
        for cut, kw in cuts.items():
            actor = make(settings(loss_agg_mode=mode, ppo_mini_batch_size_per_gpu=8, use_kl_loss=True, **kw))
            # the width of every row the model runs on (packed: one row of the micro-batch's real tokens)
            widths: list[tuple[int, int]] = []
            hook = actor.model.get_input_embeddings().register_forward_hook(
                lambda mod, inp, o, widths=widths: widths.append(tuple(inp[0].shape)))
            metrics = actor.update_policy(data)
            hook.remove()
            out["invariance"][(mode, cut)] = {"metrics": metrics, "params": actor.state_dict_for_sync(),
                                              "memory_note": actor.memory_note,
                                              "resolved": (actor.settings.enable_gradient_checkpointing,
                                                           actor.settings.ppo_micro_batch_size_per_gpu,
                                                           actor.settings.use_dynamic_bsz)}
            out["packed_rows"][(mode, cut)] = widths

    # fused vs logits path on a model whose output layer is tied to the input embeddings (SmolLM2's
    # and Qwen2.5-0.5B's layout): the tied weight gets both gradients under FSDP2
    import tempfile

    from tests.distributed._dist_helpers import build_tiny_model

    tied_dir = build_tiny_model(tempfile.mkdtemp(prefix="tied_"), tie_word_embeddings=True)
    out["tied"] = {}
    for name, kw in {"logits": {}, "fused": dict(use_fused_kernels=True, logprob_chunk_size=4)}.items():
        actor = FSDPActor(tied_dir, settings(ppo_mini_batch_size_per_gpu=8, ppo_micro_batch_size_per_gpu=4,
                                             use_kl_loss=True, use_remove_padding=True, entropy_coeff=0.01, **kw),
                          rank=rank, world_size=world_size, device="cpu")
        out["tied"][name] = {"metrics": actor.update_policy(data), "params": actor.state_dict_for_sync()}

    # (b) the 1-rank side of the cross-rank comparison
    out["cross"] = {}
    for mode in MODES_ABC:
        actor = make(cross_rank_config(mode, world_size))
        out["cross"][mode] = {"metrics": actor.update_policy(data), "params": actor.state_dict_for_sync()}
    out["shuffled"] = shuffled_update(make, data, world_size, rank)

    # every invariant policy-loss mode: micro-batch cuts, and the 1-rank side of the cross-rank comparison
    out["loss_modes"] = {}
    for case in LOSS_MODE_CASES:
        batch = loss_mode_batch(case, data)
        for cut, kw in LOSS_MODE_CUTS.items():
            actor = make(settings(ppo_mini_batch_size_per_gpu=8, use_kl_loss=True, **loss_mode_settings(case), **kw))
            out["loss_modes"][(case, cut)] = {"metrics": actor.update_policy(batch), "params": actor.state_dict_for_sync()}
        actor = make(cross_rank_config("token-mean", world_size, **loss_mode_settings(case)))
        out["loss_modes"][(case, "cross")] = {"metrics": actor.update_policy(batch), "params": actor.state_dict_for_sync()}

    # (f) KL loss with ref_log_prob == old_log_probs == the current policy's log-probs
    kl_data = make_batch(5, rows=8)
    actor = make(settings(use_kl_loss=True, kl_loss_coef=0.5, ppo_micro_batch_size_per_gpu=2))
    current, _ = actor.compute_log_prob(kl_data, micro_batch_size=8)
    same = dict(kl_data, old_log_probs=current.clone(), ref_log_prob=current.clone())
    out["kl_same"] = actor.update_policy(same)
    shifted_ref = current + noise(9, tuple(current.shape), 0.3)
    actor = make(settings(use_kl_loss=True, kl_loss_coef=0.5, ppo_micro_batch_size_per_gpu=2))
    out["kl_shifted"] = actor.update_policy(dict(kl_data, old_log_probs=current.clone(), ref_log_prob=shifted_ref))
    x = (shifted_ref - current).clamp(-20, 20)  # low_var_kl at the first step, where logp == old == current
    k3 = (x.exp() - x - 1).clamp(-10, 10)
    mask = kl_data["response_mask"]
    out["kl_shifted_expected"] = float((k3 * mask).sum() / mask.sum())

    # a non-finite gradient skips the optimizer step
    bad = update_batch(6)
    bad["advantages"][0, 0] = float("nan")
    actor = make(settings(ppo_micro_batch_size_per_gpu=4))
    before = actor.state_dict_for_sync()
    metrics = actor.update_policy(bad)
    after = actor.state_dict_for_sync()
    out["nonfinite"] = {
        "metrics": metrics,
        "unchanged": all(torch.equal(before[k], after[k]) for k in before),
        "total": actor.nonfinite_grad_norm_total,
    }

    # the update goes the right way: positive advantages raise the responses' log-probs, and an
    # entropy bonus (no advantage) raises the entropy
    data = make_batch(8, rows=8)
    mask = data["response_mask"].bool()
    actor = make(settings(lr=1e-3))
    before, ent_before = actor.compute_log_prob(data, compute_entropy=True)
    actor.update_policy(dict(data, old_log_probs=before.clone(), advantages=torch.ones(8, 8)))
    after, _ = actor.compute_log_prob(data)
    actor = make(settings(lr=1e-3, entropy_coeff=1.0))
    actor.update_policy(dict(data, old_log_probs=before.clone(), advantages=torch.zeros(8, 8)))
    _, ent_after = actor.compute_log_prob(data, compute_entropy=True)
    out["direction"] = {
        "logp_gain": (after - before)[mask].mean().item(),
        "entropy_gain": (ent_after - ent_before)[mask].mean().item(),
    }

    # on-policy (one mini-batch, one epoch): without old_log_probs the update equals the one given
    # the current policy's own log-probs as old_log_probs; with several mini-batches it is refused
    data = make_batch(11, rows=8)
    data["advantages"] = noise(12, (8, 8), 1.0)
    actor = make(settings(ppo_micro_batch_size_per_gpu=4))
    own, _ = actor.compute_log_prob(data)
    m_with = actor.update_policy(dict(data, old_log_probs=own.clone()))
    p_with = actor.state_dict_for_sync()
    actor = make(settings(ppo_micro_batch_size_per_gpu=4))
    m_without = actor.update_policy(data)
    out["on_policy"] = {"with": m_with, "without": m_without, "diff": max_param_diff(p_with, actor.state_dict_for_sync())}
    try:
        make(settings(ppo_mini_batch_size_per_gpu=4)).update_policy(data)
        out["on_policy"]["refused"] = False
    except ValueError:
        out["on_policy"]["refused"] = True

    # bf16 compute over float32 master weights (FSDP2 mixed precision; the fast path on CPUs with
    # native bf16): log-probs near the float32 ones, weights kept and updated in float32
    data = make_batch(13, rows=8)
    mask = data["response_mask"].bool()
    fp32, _ = make(settings()).compute_log_prob(data, micro_batch_size=4)
    actor = make(settings(param_dtype="bfloat16", lr=1e-3))
    bf16, _ = actor.compute_log_prob(data, micro_batch_size=4)
    actor.update_policy(dict(data, old_log_probs=bf16.clone(), advantages=torch.ones(8, 8)))
    after, _ = actor.compute_log_prob(data, micro_batch_size=4)
    out["bf16"] = {
        "err": (bf16 - fp32)[mask].abs().max().item(),
        "logp_dtype": str(bf16.dtype),
        "master_dtypes": sorted({str(p.dtype) for p in actor.model.parameters()}),
        "logp_gain": (after - bf16)[mask].mean().item(),
    }

    # (e, resharded) the 2-rank checkpoint loaded on 1 rank continues like the 2-rank run
    resume_settings = settings(
        ppo_mini_batch_size_per_gpu=4,
        ppo_micro_batch_size_per_gpu=2,
        use_kl_loss=True,
        lr_scheduler_type="cosine",
        total_training_steps=4,
        min_lr_ratio=0.1,
    )
    actor = make(resume_settings)
    actor.load_checkpoint(ckpt_dir)
    actor.update_policy(update_batch(4))
    out["resumed_on_one_rank"] = actor.state_dict_for_sync()
    return out


# ---------------------------------------------------------------------------------------------
_FAILED_JOBS: dict[str, BaseException] = {}


def _run_once(name: str, fn, *args):
    """Run a job; if it failed before in this session, fail again at once instead of re-running it
    for every test (pytest does not cache a fixture's exception)."""
    if name in _FAILED_JOBS:
        pytest.fail(f"job {name} failed earlier in this session (see the first error)", pytrace=False)
    try:
        return fn(*args)
    except BaseException as exc:
        _FAILED_JOBS[name] = exc
        raise


@pytest.fixture(scope="module")
def two_rank(fsdp_model_dir, tmp_path_factory):
    base = tmp_path_factory.mktemp("two_rank")
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


def max_param_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b) and a, "parameter names differ or are empty"
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ALL_LOSS_AGG_MODES)
def test_update_does_not_depend_on_micro_batching(one_rank, initial_weights, mode):
    runs = {cut: r for (m, cut), r in one_rank["invariance"].items() if m == mode}
    ref = runs["micro1"]
    assert ref["metrics"]["actor/grad_norm"] > 1e-3
    for cut in ("micro4", "dynamic", "micro4_checkpointing", "micro4_packed", "dynamic_packed", "dynamic_packed_fused",
                "micro4_packed_fused_checkpointing", "auto"):
        got = runs[cut]
        assert rel(got["metrics"]["actor/grad_norm"], ref["metrics"]["actor/grad_norm"]) < 1e-5, cut
        assert max_param_diff(got["params"], ref["params"]) < 1e-6, cut
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/pg_clipfrac", "actor/ppo_kl"):
            assert got["metrics"][key] == pytest.approx(ref["metrics"][key], rel=1e-5, abs=1e-7), (cut, key)
    # the update moved the weights far more than the tolerance (not two untouched models compared)
    assert max_param_diff(ref["params"], initial_weights) > 5e-6


def test_packed_micro_batches_stay_within_the_token_budget(one_rank):
    """use_dynamic_bsz counts real tokens: every packed row the model runs on holds at most
    ppo_max_token_len_per_gpu (20) tokens, while the same micro-batches padded would be wider."""
    data = update_batch(1)
    lengths = data["attention_mask"].sum(-1)
    for (mode, cut), widths in one_rank["packed_rows"].items():
        if cut.startswith("dynamic_packed"):
            assert widths and all(b == 1 and n <= 20 for b, n in widths), (cut, widths)
            assert sum(n for _, n in widths) == int(lengths.sum()), "every real token runs exactly once"
        if cut == "dynamic":  # the padded forwards of the same cut: rows x width exceeds the budget
            assert max(b * n for b, n in widths) > 20, widths


def test_auto_memory_settings_resolve_and_say_why(one_rank):
    """A tiny model on this machine: the whole mini-batch fits, checkpointing stays off, and the note
    the driver prints says so; explicit settings leave no note."""
    got = one_rank["invariance"][("token-mean", "auto")]
    assert got["resolved"] == (False, None, False)
    assert got["memory_note"].startswith("micro-batch auto: the whole mini-batch (8 x 14 tokens at most) fits")
    assert "gradient checkpointing auto: off" in got["memory_note"] and "available" in got["memory_note"]
    assert one_rank["invariance"][("token-mean", "micro4")]["memory_note"] is None


def test_fused_head_with_tied_embeddings_equals_the_logits_path(one_rank):
    got, ref = one_rank["tied"]["fused"], one_rank["tied"]["logits"]
    assert ref["metrics"]["actor/grad_norm"] > 1e-3
    for key in ("actor/grad_norm", "actor/pg_loss", "actor/kl_loss", "actor/entropy"):
        assert got["metrics"][key] == pytest.approx(ref["metrics"][key], rel=1e-5, abs=1e-7), key
    assert max_param_diff(got["params"], ref["params"]) < 1e-6


def test_aggregation_modes_differ(one_rank):
    """The invariance test compares modes that really are different losses."""
    norms = {m: one_rank["invariance"][(m, "micro1")]["metrics"]["actor/grad_norm"] for m in ALL_LOSS_AGG_MODES}
    assert len({round(v, 6) for v in norms.values()}) == len(ALL_LOSS_AGG_MODES), norms


@pytest.mark.parametrize("mode", MODES_ABC)
def test_two_ranks_equal_one_rank(one_rank, two_rank, initial_weights, mode):
    single = one_rank["cross"][mode]
    r0, r1 = (r["cross"][mode] for r in two_rank["ranks"])
    assert r0["metrics"] == r1["metrics"], "metrics must be identical on all ranks"
    assert r1["params"] == {}, "state_dict_for_sync returns the weights on rank 0 only"
    for key in ("actor/grad_norm", "actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/pg_clipfrac", "actor/ppo_kl"):
        assert r0["metrics"][key] == pytest.approx(single["metrics"][key], rel=1e-5, abs=1e-7), key
    assert single["metrics"]["actor/pg_clipfrac"] > 0, "the data should clip some ratios"
    assert max_param_diff(r0["params"], single["params"]) < 1e-6
    assert max_param_diff(r0["params"], initial_weights) > 5e-6


def test_loss_mode_cases_cover_every_builtin_mode():
    from grpo_dist.core.policy_loss import BUILTIN_POLICY_LOSSES

    covered = {case.partition("/")[0] for case in LOSS_MODE_CASES}
    assert covered | set(NOT_INVARIANT) == set(BUILTIN_POLICY_LOSSES), "a new mode must be tested or excluded (with why)"
    assert not covered & set(NOT_INVARIANT)


@pytest.mark.parametrize("case", LOSS_MODE_CASES)
def test_every_invariant_loss_mode_gives_the_same_update_for_any_micro_batches_and_ranks(
        one_rank, two_rank, initial_weights, case):
    runs = one_rank["loss_modes"]
    ref = runs[(case, "micro1")]
    assert ref["metrics"]["actor/grad_norm"] > 1e-3
    keys = [k for k in ref["metrics"] if k not in ("actor/lr", "actor/grad_norm_nonfinite_count")]
    for cut in LOSS_MODE_CUTS:
        got = runs[(case, cut)]
        assert max_param_diff(got["params"], ref["params"]) < 1e-6, cut
        for key in keys:
            assert got["metrics"][key] == pytest.approx(ref["metrics"][key], rel=1e-5, abs=1e-7), (cut, key)
    assert max_param_diff(ref["params"], initial_weights) > 5e-6
    # 1 rank (micro-batches of 1 row) vs 2 ranks (token budget, shuffled, packed): 2 mini-batches, 2 epochs
    single = runs[(case, "cross")]
    r0, r1 = (r["loss_modes"][case] for r in two_rank["ranks"])
    assert r0["metrics"] == r1["metrics"]
    for key in keys:
        assert r0["metrics"][key] == pytest.approx(single["metrics"][key], rel=1e-5, abs=1e-7), key
    assert max_param_diff(r0["params"], single["params"]) < 1e-6
    if case.startswith("dppo"):  # the trust region cut some tokens and kept others
        assert 0 < single["metrics"]["actor/pg_clipfrac"] < 1, single["metrics"]
    if case.startswith("bypass_mode"):  # the correction did something: some rows rejected, some weights truncated
        m = single["metrics"]
        assert 0 < m["actor/rollout_corr/rollout_rs_masked_fraction"] < 1, m
        assert m["actor/rollout_corr/rollout_is_ratio_fraction_high"] > 0, m


def test_loss_modes_are_different_updates(one_rank):
    """The invariance test compares modes that really are different losses."""
    norms = {case: one_rank["loss_modes"][(case, "micro1")]["metrics"]["actor/grad_norm"] for case in LOSS_MODE_CASES}
    assert len({round(v, 6) for v in norms.values()}) == len(LOSS_MODE_CASES), sorted(norms.items(), key=lambda kv: kv[1])


def test_balanced_rank_shards_give_the_same_update(one_rank, two_rank):
    """trainer.balance_batch reorders rows inside each mini-batch: 2 ranks with balanced shards make the
    same update as 1 rank with the rows in their original order."""
    r0 = two_rank["ranks"][0]
    assert r0["balanced_order"] != list(range(len(r0["balanced_order"]))), "the batch should need balancing"
    single = one_rank["cross"][MODES_ABC[0]]
    got = r0["cross_balanced"]
    for key in ("actor/grad_norm", "actor/pg_loss", "actor/kl_loss", "actor/entropy"):
        assert got["metrics"][key] == pytest.approx(single["metrics"][key], rel=1e-5, abs=1e-7), key
    assert max_param_diff(got["params"], single["params"]) < 1e-6


def test_global_shuffle_is_the_same_update_on_any_rank_count(one_rank, two_rank):
    """actor.shuffle permutes the whole step's rows every epoch (rows move between mini-batches): the
    update then differs from the unshuffled one, and is the same on 2 ranks as on 1."""
    single, got = one_rank["shuffled"], two_rank["ranks"][0]["shuffled"]
    orders = single["orders"]
    assert orders[0] != orders[1] and sorted(orders[0][:4]) != [0, 1, 2, 3], "rows should move between mini-batches"
    for key in ("actor/grad_norm", "actor/pg_loss", "actor/kl_loss", "actor/entropy"):
        assert got["metrics"][key] == pytest.approx(single["metrics"][key], rel=1e-5, abs=1e-7), key
    assert max_param_diff(got["params"], single["params"]) < 1e-6
    assert max_param_diff(single["params"], one_rank["cross"][MODES_ABC[0]]["params"]) > 1e-7


def test_compute_log_prob_matches_plain_hf_forward(two_rank):
    r0, r1 = two_rank["ranks"]
    assert r0["local_micro_batches"] != r1["local_micro_batches"], "ranks should need different micro-batch counts"
    for r in (r0, r1):
        err = r["logprob_err"]
        assert err["actor_budget"] < 1e-5
        assert err["actor_count"] < 1e-5
        assert err["reference"] < 1e-5
        assert err["entropy"] < 1e-5
        assert err["actor_packed"] < 1e-5 and err["entropy_packed"] < 1e-5 and err["reference_packed"] < 1e-5
        assert err["temperature_matters"] > 1e-2


def test_state_dict_for_sync_is_full_and_current(two_rank, fsdp_model_dir):
    r0, r1 = two_rank["ranks"]
    s0, s1 = r0["sync_initial"], r1["sync_initial"]
    assert s1["n_keys"] == 0
    assert s0["keys_match"] and s0["equal_file"]
    assert s0["local_shard_numel"] < s0["full_numel"], "the model should be sharded over the 2 ranks"
    assert r0["sync_after_update"]["equal_sharded"]
    assert r0["sync_after_update"]["moved"] > 5e-6


def test_weight_buckets_hold_the_full_cast_weights_on_every_rank(two_rank):
    r0, r1 = two_rank["ranks"]
    b0, b1 = r0["buckets"], r1["buckets"]
    assert b0["n"] > 1, "the small bucket size should split the model into several buckets"
    assert b0["equal_full_cast"]
    assert set(b0["packed"]) == set(b1["packed"])
    assert all(v.dtype == torch.bfloat16 for v in b0["packed"].values())
    assert all(torch.equal(b0["packed"][k], b1["packed"][k]) for k in b0["packed"])


def test_checkpoint_round_trip(two_rank, one_rank):
    res = two_rank["ranks"][0]["resume"]
    assert res["update_count"] == (2, 2)
    lr_a, lr_b, lr_c = res["lr"]
    assert lr_a == pytest.approx(lr_b) and lr_c == pytest.approx(LR) and lr_a < LR  # cosine, step 1
    assert max_param_diff(res["resumed"], res["continuous"]) < 1e-7
    assert max_param_diff(res["fresh"], res["continuous"]) > 2e-6  # the checkpoint matters
    # loaded on a different world size (DCP reshards), the run continues the same way
    assert max_param_diff(one_rank["resumed_on_one_rank"], res["continuous"]) < 1e-6


def test_another_optimizer_is_built_and_resumes_exactly(two_rank):
    """optim.optimizer=SGD with override_optimizer_config (momentum, nesterov): the actor builds it, and its
    momentum buffers go through the checkpoint (a resumed run continues as the uninterrupted one)."""
    res, adamw = two_rank["ranks"][0]["resume_sgd"], two_rank["ranks"][0]["resume"]
    assert {res[f"{k}_optimizer"] for k in ("continuous", "resumed", "fresh")} == {"SGD"}
    assert res["continuous_momentum"] and res["resumed_momentum"]
    assert max_param_diff(res["resumed"], res["continuous"]) < 1e-7
    assert max_param_diff(res["fresh"], res["continuous"]) > 2e-6  # the checkpoint (weights and momentum) matters
    assert max_param_diff(res["continuous"], adamw["continuous"]) > 2e-6  # not AdamW's update


def test_export_hf_loads_in_transformers(two_rank, fsdp_model_dir):
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    export: Path = two_rank["export"]
    assert (export / "config.json").exists() and (export / "model.safetensors").exists()
    model = AutoModelForCausalLM.from_pretrained(export)
    want = two_rank["ranks"][0]["resume"]["continuous"]
    got = {k: v for k, v in model.state_dict().items()}
    assert max_param_diff(got, want) == 0.0
    assert model.config.to_dict()["dtype"] == "float32"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (export / name).read_bytes() == (Path(fsdp_model_dir) / name).read_bytes(), name
    tok = PreTrainedTokenizerFast.from_pretrained(export)
    assert tok("t5 t7")["input_ids"] == [5, 7]


def test_kl_loss_is_zero_when_reference_equals_policy(one_rank):
    same, shifted = one_rank["kl_same"], one_rank["kl_shifted"]
    assert abs(same["actor/kl_loss"]) < 1e-8
    assert abs(same["actor/ppo_kl"]) < 1e-6
    assert same["actor/pg_clipfrac"] == 0.0
    assert shifted["actor/kl_loss"] == pytest.approx(one_rank["kl_shifted_expected"], rel=1e-4)
    assert shifted["actor/kl_loss"] > 1e-3


def test_nonfinite_grad_norm_skips_the_step(one_rank):
    r = one_rank["nonfinite"]
    assert not math.isfinite(r["metrics"]["actor/grad_norm"])
    assert r["metrics"]["actor/grad_norm_nonfinite_count"] == 1.0
    assert r["unchanged"] and r["total"] == 1


def test_update_direction(one_rank):
    """Positive advantages make the sampled responses likelier; the entropy bonus raises entropy."""
    d = one_rank["direction"]
    assert d["logp_gain"] > 1e-3
    assert d["entropy_gain"] > 1e-4


def test_bf16_compute_keeps_float32_master_weights(one_rank):
    r = one_rank["bf16"]
    assert r["master_dtypes"] == ["torch.float32"]
    assert r["logp_dtype"] == "torch.float32"  # log-probs are returned in float32
    assert 0 < r["err"] < 0.1, "bf16 log-probs should be near, but not bit-equal to, the float32 ones"
    assert r["logp_gain"] > 1e-3


def test_on_policy_update_needs_no_old_log_probs(one_rank):
    r = one_rank["on_policy"]
    assert r["diff"] < 1e-6
    assert rel(r["with"]["actor/grad_norm"], r["without"]["actor/grad_norm"]) < 1e-5
    assert r["without"]["actor/pg_clipfrac"] == 0.0 and r["without"]["actor/ppo_kl"] == 0.0
    assert r["refused"], "several mini-batches without old_log_probs must be refused"
