"""End to end through `python -m grpo_dist.main`: real Ray, real vLLM (CPU), real FSDP2 (gloo)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]

REQUIRED = [
    "actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/kl_loss", "actor/entropy", "actor/grad_norm",
    "actor/lr", "critic/score/mean", "critic/score/max", "critic/score/min", "critic/advantages/mean",
    "response_length/mean", "response_length/max", "response_length/clip_ratio", "prompt_length/mean",
    "timing_s/gen", "timing_s/reward", "timing_s/old_log_prob", "timing_s/ref", "timing_s/adv",
    "timing_s/update_actor", "timing_s/update_weights", "timing_s/step", "perf/throughput",
    "perf/time_per_step", "training/global_step",
]


def run_main(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "grpo_dist.main", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def base_args(model: Path, data: dict, out: Path, steps: int) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={data['train']}",
        f"data.val_files={data['test']}",
        "data.train_batch_size=4",
        "data.val_batch_size=64",
        "data.max_response_length=8",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        "trainer.n_gpus_per_node=2",
        "trainer.device=cpu",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=2",
        "trainer.logger=[console,file]",
        "trainer.progress_bar=false",
        f"trainer.default_local_dir={out}",
    ]


def test_grpo_trains_end_to_end(tiny_model_dir, reverse_data, tmp_path):
    out = tmp_path / "run"
    proc = run_main(base_args(tiny_model_dir, reverse_data, out, steps=3))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]

    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        missing = [k for k in REQUIRED if k not in r]
        assert not missing, f"step {r['step']} lacks {missing}"
        for k in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"):
            assert r[k] is not None and math.isfinite(r[k]), (k, r[k])
        assert r["training/global_step"] == r["step"]
    # validation before training and on test_freq steps
    assert any(k.startswith("val-core/grpo_dist/reverse/acc/mean@1") for k in rows[0])
    assert any("val-core/grpo_dist/reverse/acc/mean@1" in r for r in steps if r["step"] == 2)

    # the policy changed: the final Hugging Face export differs from the initial weights
    ckpt = out / "global_step_3"
    assert (ckpt / "trainer_state.json").exists()
    final = load_file(str(ckpt / "huggingface" / "model.safetensors"))
    init = load_file(str(tiny_model_dir / "model.safetensors"))
    assert set(final) == set(init)
    assert any(not torch.equal(final[k], init[k]) for k in init)
    # the summary and the report
    assert "training finished" in proc.stdout
    assert (out / "report" / "summary.png").exists()
