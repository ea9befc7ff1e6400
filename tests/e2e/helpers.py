"""Running `python -m grpo_dist.main` from the tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _main(args: list[str], env: dict | None) -> tuple[list[str], dict]:
    """The command and environment of ``python -m grpo_dist.main args``: attached to the session's cluster, the
    driver is forked from the session's warm process (tests/warm_workers.py), as the run's workers are."""
    from tests import shared_ray

    env = env or {}
    own = "RAY_ADDRESS" in env or any(a.startswith("ray_kwargs.ray_init.address=") for a in args)
    cluster = {} if own else shared_ray.client_env()
    python = [sys.executable] if own else shared_ray.driver_command()
    return [*python, "-m", "grpo_dist.main", *args], dict(os.environ, PYTHONUNBUFFERED="1", **cluster, **env)


def run_main(args: list[str], timeout: int = 900, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m grpo_dist.main args``, attached to the session's Ray cluster (tests/shared_ray.py) unless
    ``env`` says where Ray is (``RAY_ADDRESS``; ``LOCAL_RAY``: a local instance of the run's own) or the
    arguments do (``ray_kwargs.ray_init.address``)."""
    command, env = _main(args, env)
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def start_main(args: list[str], env: dict | None = None) -> subprocess.Popen:
    """``python -m grpo_dist.main args`` started and left running (its output in pipes, as text), attached to Ray
    as :func:`run_main`'s run is."""
    command, env = _main(args, env)
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def worker_process(out: Path, title: str):
    """A running run's worker process whose title (command line) holds ``title`` (``ray::RolloutWorker``,
    ``ray::ModelWorker``: a rank's process of the model roles), as a ``psutil.Process``: one of the processes the
    run's ``startup.json`` lists, so this run's, on a cluster shared with other runs too. The file is written once
    the workers have started."""
    import psutil

    found = []
    for name, p in json.loads((out / "startup.json").read_text())["processes"].items():
        try:
            process = psutil.Process(p["pid"])
            if any(title in part for part in process.cmdline()):
                found.append((name, process))
        except psutil.Error:  # gone meanwhile
            continue
    if not found:
        raise AssertionError(f"no {title} process among those of {out / 'startup.json'}")
    return sorted(found, key=lambda f: f[0])[0][1]


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
