"""LoRA through `python -m grpo_dist.main` (real Ray, vLLM on CPU, FSDP2 on 2 gloo ranks): the actor trains
adapters, the reference is its base model (adapters off, same process), and the merged weights synced into
vLLM sample what the actor computes."""

from __future__ import annotations

import math

import pytest

from tests.e2e.conftest import RESUME_ARGS, epoch_data
from tests.e2e.helpers import base_args, read_metrics, run_main

pytestmark = pytest.mark.slow


def test_lora_trains_and_vllm_samples_the_merged_policy(tiny_model_dir, reverse_data, tmp_path):
    out = tmp_path / "run"
    data = epoch_data(reverse_data, tmp_path)
    args = base_args(tiny_model_dir, data, out, steps=3) + RESUME_ARGS[:1] + [
        "actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16",
        "actor_rollout_ref.model.target_modules=all-linear", "actor_rollout_ref.actor.optim.lr=1e-2",
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.rollout.calculate_log_probs=true",
        "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.save_freq=-1",
    ]
    proc = run_main(args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    m = read_metrics(out)
    for step in (1, 2, 3):
        r = m[step]
        for k in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm"):
            assert math.isfinite(r[k]), (step, k, r[k])
        # after every sync of the merged weights, vLLM's probabilities are the actor's (float rounding)
        assert 0 <= r["training/rollout_probs_diff_max"] < 1e-3, (step, r["training/rollout_probs_diff_max"])
    # the adapters moved the policy away from the reference (the base model with the adapters off)
    assert m[3]["actor/kl_loss"] > 0
