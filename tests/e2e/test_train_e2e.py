"""End to end through `python -m grpo_dist.main`: real Ray, real vLLM (CPU), real FSDP2 (gloo)."""

from __future__ import annotations

import math
import time

import pytest
import torch
from safetensors.torch import load_file

from tests.e2e.helpers import read_metrics

pytestmark = pytest.mark.slow

REQUIRED = [
    "actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/kl_loss", "actor/entropy", "actor/grad_norm",
    "actor/lr", "critic/score/mean", "critic/score/max", "critic/score/min", "critic/advantages/mean",
    "response_length/mean", "response_length/max", "response_length/clip_ratio", "prompt_length/mean",
    "timing_s/gen", "timing_s/reward", "timing_s/old_log_prob", "timing_s/ref", "timing_s/adv",
    "timing_s/update_actor", "timing_s/update_weights", "timing_s/step", "perf/throughput",
    "perf/time_per_step", "training/global_step",
]
VAL = "val-core/grpo_dist/reverse/acc/mean@1"


def test_grpo_trains_end_to_end(full_run, tiny_model_dir):
    out, proc = full_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    m = read_metrics(out)
    assert sorted(m) == [0, 1, 2, 3, 4]
    for step in (1, 2, 3, 4):
        r = m[step]
        missing = [k for k in REQUIRED if k not in r]
        assert not missing, f"step {step} lacks {missing}"
        for k in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"):
            assert r[k] is not None and math.isfinite(r[k]), (k, r[k])
        assert r["training/global_step"] == step
    # the dense test reward gives groups with reward variance, so the policy gradient is at work
    assert any(m[s]["critic/score/max"] > m[s]["critic/score/min"] for s in (1, 2, 3, 4))
    assert any(abs(m[s]["actor/pg_loss"]) > 0 for s in (1, 2, 3, 4))
    # validation before training and every test_freq steps
    assert VAL in m[0] and VAL in m[2] and VAL in m[4]

    # checkpoints at save_freq; the policy changed: the final export differs from the initial weights
    assert (out / "global_step_2" / "trainer_state.json").exists()
    final = load_file(str(out / "global_step_4" / "huggingface" / "model.safetensors"))
    init = load_file(str(tiny_model_dir / "model.safetensors"))
    assert set(final) == set(init)
    assert any(not torch.equal(final[k], init[k]) for k in init)
    # what the user sees: the summary and the report
    assert "training finished" in proc.stdout
    assert (out / "report" / "summary.png").exists()


def test_rollout_log_probs_match_the_actors(full_run):
    """With calculate_log_probs, vLLM's probabilities of the sampled tokens are compared with the actor's
    old-log-prob forward (same weights, float32 on both sides): they agree to float rounding."""
    out, proc = full_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = read_metrics(out)
    for step in (1, 2, 3, 4):
        r = m[step]
        assert 0 <= r["training/rollout_probs_diff_mean"] <= r["training/rollout_probs_diff_max"] < 1e-3, (step, r)
        assert r["training/rollout_probs_diff_std"] >= 0


WORKER_PHASES = ("gen", "old_log_prob", "ref", "update_actor", "update_weights")


def test_metrics_time_the_workers_the_weight_sync_and_the_rows(full_run):
    """The benchmark's hooks: each phase's busy time inside the workers (within the driver's time of the
    phase), the weight sync's parts (within the sync) and a wall-clock stamp on every row."""
    out, proc = full_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = read_metrics(out)
    eps = 1e-3
    for step in (1, 2, 3, 4):
        r = m[step]
        for p in WORKER_PHASES:  # 2 mini-batches: the update is off-policy, so old_log_prob runs
            assert 0 < r[f"timing_s/{p}/worker"] <= r[f"timing_s/{p}"] + eps, (step, p)
        parts = [r[f"timing_s/update_weights/{k}"] for k in ("gather", "transfer", "load")]
        assert min(parts) >= 0 and sum(parts) <= r["timing_s/update_weights"] + eps, (step, parts)
        gather, _, load = parts
        assert gather + load <= r["timing_s/update_weights/worker"] + eps
    stamps = [m[step]["time/unix"] for step in sorted(m)]
    assert all(a < b for a, b in zip(stamps, stamps[1:])), stamps
    assert time.time() - 3600 < stamps[0] and stamps[-1] <= time.time()
