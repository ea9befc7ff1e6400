"""Running `python -m grpo_dist.main` from the tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_main(args: list[str], timeout: int = 900, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m grpo_dist.main args``, attached to the session's Ray cluster (tests/shared_ray.py) unless
    ``env`` says where Ray is (``RAY_ADDRESS``; ``LOCAL_RAY``: a local instance of the run's own) or the
    arguments do (``ray_kwargs.ray_init.address``)."""
    from tests import shared_ray

    env = env or {}
    own = "RAY_ADDRESS" in env or any(a.startswith("ray_kwargs.ray_init.address=") for a in args)
    cluster = {} if own else shared_ray.client_env()
    env = dict(os.environ, PYTHONUNBUFFERED="1", **cluster, **env)
    return subprocess.run([sys.executable, "-m", "grpo_dist.main", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def base_args(model: Path, data: dict, out: Path, steps: int) -> list[str]:
    """A tiny run: 4 prompts x 4 responses per step, 2 mini-batches, 2 CPU ranks."""
    return [
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={data.get('small_train', data['train'])}",
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
        "trainer.logger=[console,file]",
        "trainer.progress_bar=false",
        f"trainer.default_local_dir={out}",
    ]


def read_metrics(out: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows}
