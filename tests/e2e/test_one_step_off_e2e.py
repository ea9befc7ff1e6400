"""One-step-off-policy through `python -m grpo_dist.main` (real Ray, vLLM on CPU, FSDP2): with
``actor_rollout_ref.hybrid_engine=false`` the rollout engine runs on a rank of its own (one core) and generates
the next batch while the actor (the other core) trains on the current one. The embedded task learns, and a
run resumed from a mid-run checkpoint (which holds the batch generated ahead) trains exactly as the
uninterrupted one. Fully asynchronous training (``async_training.*``) on the same two ranks learns too, with
chunks no older than its staleness bound allows."""

from __future__ import annotations

import math
import os
import shutil

import pytest

from tests.e2e.helpers import base_args, read_metrics, run_main
from tests.e2e.test_resume_e2e import COMPARE

pytestmark = pytest.mark.slow
VAL = "val-core/grpo_dist/reverse/acc/mean@1"
# the engines' sampling log-probs as the old log-probs (rollout correction's bypass mode), as verl's one-step-off
# config sets: with the actor's recomputed ones and no correction the run learns about half as much per sample, and
# how much depends on the machine's base model (docs/async.md, "What staleness costs in learning")
ONE_STEP_OFF = ["actor_rollout_ref.hybrid_engine=false", "trainer.n_gpus_per_node=1", "rollout.nnodes=1",
                "rollout.n_gpus_per_node=1", "trainer.total_training_steps=10", "trainer.test_freq=10",
                "trainer.save_freq=5", "trainer.progress_bar=false", "trainer.logger=[console,file]",
                "algorithm.rollout_correction.bypass_mode=true"]


def test_one_step_off_learns_and_resumes_exactly(embedded_model, tmp_path):
    out = tmp_path / "run"
    proc = run_main(ONE_STEP_OFF + [f"trainer.default_local_dir={out}"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    m = read_metrics(out)
    # the default job's task and model, the step overlapped with generation: held-out accuracy rises as in
    # the synchronous run (measured on 3 seeds: 0.10 -> 0.38 in 10 steps with bypass mode, 0.44 colocated)
    assert m[10][VAL] > m[0][VAL] + 0.1, (m[0][VAL], m[10][VAL])
    # every step after the first trains on samples of the policy one update behind, never older
    assert [m[s]["training/sample_age"] for s in range(1, 11)] == [0.0] + [1.0] * 9
    # the weights reach the rollout's own rank across processes (no colocated IPC), between batches
    assert "weight sync object_store" in proc.stdout
    assert all(m[s]["perf/weight_sync_bytes"] > 0 for s in range(2, 10))
    # generation overlaps the update: after the first step the driver waits for less than the engine worked
    waits = sum(m[s]["timing_s/wait_prev_gen"] for s in range(2, 11))
    gens = sum(m[s]["timing_s/gen/worker"] for s in range(2, 11))
    assert waits < 0.5 * gens, (waits, gens)
    # the mid-run checkpoint holds the batch generated for step 6
    assert (out / "global_step_5" / "rollout_ahead.pt").is_file()

    # resumed from step 5: the saved batch is trained on at step 6, the rest as before
    resumed_from_step_equals(ONE_STEP_OFF, out, m, tmp_path, ["training/sample_age"])


def resumed_from_step_equals(args: list[str], out, m: dict[int, dict], tmp_path, keys: list[str], *, at: int = 5,
                             last: int = 10) -> None:
    """A run started from a copy of ``out``'s checkpoint of step ``at`` (which holds what was generated ahead) trains
    the steps after it up to ``last`` as the uninterrupted run ``m`` did: the compared metrics and ``keys`` equal
    step for step."""
    part = tmp_path / "part"
    part.mkdir()
    shutil.copytree(out / f"global_step_{at}", part / f"global_step_{at}")
    proc = run_main(args + [f"trainer.default_local_dir={part}"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert f"resumed from {part / f'global_step_{at}'} (step {at})" in proc.stdout
    b = read_metrics(part)
    assert sorted(b) == list(range(at + 1, last + 1))
    for step in range(at + 1, last + 1):
        for k in COMPARE + keys:
            if k in m[step]:
                assert math.isclose(m[step][k], b[step][k], rel_tol=1e-4, abs_tol=1e-6), (step, k, m[step][k], b[step][k])
    assert math.isclose(m[last][VAL], b[last][VAL], abs_tol=1e-9)


# 20 steps: samples up to two updates old teach less per step, and how fast the run climbs depends on the machine's
# base model (on a 2-core AMD EPYC machine: 0.125 -> 0.195 after 10 steps, 0.305 after 20; docs/async.md)
FULLY_ASYNC = ["actor_rollout_ref.hybrid_engine=false", "trainer.n_gpus_per_node=1", "rollout.nnodes=1",
               "rollout.n_gpus_per_node=1", "trainer.total_training_steps=20", "trainer.test_freq=10",
               "trainer.progress_bar=false", "trainer.logger=[console,file]",
               "async_training.staleness_threshold=0.5", "async_training.trigger_parameter_sync_step=2",
               "async_training.require_batches=2", "trainer.save_freq=15",
               "async_training.partial_rollout=false"]  # a sync waits for the chunks: the run does not depend on timing


def test_fully_async_learns_within_its_staleness_bound(embedded_model, tmp_path):
    """The default job in fully asynchronous mode (chunks of 2 x 16 prompts, the default step's batch; weights
    synced every 2 steps; at most floor(1.5 x 2) = 3 chunks ahead): it learns, no chunk is older than the bound
    allows, and a run resumed from a checkpoint holding chunks ahead trains as the uninterrupted one."""
    out = tmp_path / "run"
    proc = run_main(FULLY_ASYNC + [f"trainer.default_local_dir={out}"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "fully asynchronous: a step trains one chunk of 32 prompts" in proc.stdout
    m = read_metrics(out)
    assert m[10][VAL] > m[0][VAL] and m[20][VAL] > m[0][VAL] + 0.1, (m[0][VAL], m[10][VAL], m[20][VAL])
    ages = [m[s]["training/sample_age"] for s in range(1, 21)]
    assert max(ages) <= 2 and ages[0] == 0.0 and max(ages) == 2, ages
    # the engines got the weights every 2 steps only: a sync's bytes appear on steps 2, 4, ..., 18
    assert [s for s in range(1, 21) if "perf/weight_sync_bytes" in m[s]] == list(range(2, 20, 2))
    assert all(0 <= m[s]["trainer/idle_ratio"] <= 1 for s in range(1, 21))
    # the step-15 checkpoint holds the chunks generated ahead (16 and 17, of the policy after step 14)
    assert (out / "global_step_15" / "rollout_queue.pt").is_file()

    # resumed from step 15: those chunks are trained first, nothing is generated twice, the run as before
    resumed_from_step_equals(FULLY_ASYNC, out, m, tmp_path, ["training/sample_age", "fully_async/queue_size"],
                             at=15, last=20)


@pytest.mark.parametrize("mode", ["v1-sync", "async-tp2"])
def test_partial_rollouts_interrupt_generation_at_every_sync(mode, tiny_model_dir, reverse_data, tmp_path):
    """verl's default, partial rollouts, where generation takes longer than a step: a random model (it rarely
    says EOS) writing up to 192 tokens (64 on the tensor-parallel engine), on chunks of 4 prompts x 4, with the engine's own calls
    (``v1-sync``, in the spelling of verl's v1 trainer: ``trainer.v1.trainer_mode=separate_async`` with one batch
    generated ahead and its standalone rollout devices ``actor_rollout_ref.rollout.*``) and through agent loops
    (``async``, as verl's fully asynchronous scripts run, in their ``async_training.*`` spelling) on a
    tensor-parallel engine of two processes (``tp2``: the loops run in lock step on both and every iteration is
    agreed). The rollout pool generates in the background; a sync after every step interrupts the responses in
    flight, and the new weights finish them; a validation every 2 steps runs between the engine's iterations
    (the chunks pause around it). Every trained chunk reports verl's ``fully_async/partial/*``: responses holding
    tokens of two versions, never more than the staleness bound lets a chunk lag (1 version). (Agent loops on a
    one-process engine: the same worker calls without the agreement; their server is tested on the real engine
    in tests/e2e/test_rollout_vllm.py.)"""
    out = tmp_path / "run"
    steps = 4
    model, env, extra = tiny_model_dir, None, [f"actor_rollout_ref.rollout.mode={'async' if 'async' in mode else 'sync'}"]
    if mode == "async-tp2":  # one training rank and two rollout ranks: three processes
        from grpo_dist.tasks.reverse import VOCAB
        from grpo_dist.utils.tiny_model import build_tiny_model
        from tests import shared_ray

        model = build_tiny_model(tmp_path / "model", vocab=VOCAB, hidden_size=128, num_layers=2, num_heads=2,
                                 num_kv_heads=2, head_dim=64, intermediate_size=128, max_position_embeddings=256,
                                 seed=0)  # an attention head per process of the engine
        env = shared_ray.client_env()
        if env:  # on a cluster the run does not count this machine's cores (three processes share two here)
            extra.append(f"ray_kwargs.ray_init.address={env['RAY_ADDRESS']}")
        elif len(os.sched_getaffinity(0)) < 3:
            pytest.skip("three ranks need three cores, or the session's Ray cluster")
        extra += ["actor_rollout_ref.hybrid_engine=false", "rollout.nnodes=1", "rollout.n_gpus_per_node=2",
                  "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "async_training.staleness_threshold=1",
                  "async_training.trigger_parameter_sync_step=1", "async_training.require_batches=2"]
        length = 64  # three processes on two cores: the engine is slow enough for the syncs to find it busy
    else:  # a step: parameter_sync_step 2 mini-batches of 2 prompts (base_args' batch of 4), then a sync
        extra += ["trainer.v1.trainer_mode=separate_async", "trainer.v1.separate_async.num_warmup_batches=1",
                  "trainer.v1.separate_async.parameter_sync_step=2", "actor_rollout_ref.rollout.nnodes=1",
                  "actor_rollout_ref.rollout.n_gpus_per_node=1"]
        length = 192
    args = base_args(model, reverse_data, out, steps) + [
        "trainer.n_gpus_per_node=1", f"data.max_response_length={length}", "trainer.test_freq=2", *extra]
    proc = run_main(args, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "partial rollouts: a sync interrupts the responses being generated" in proc.stdout
    assert ("separate_async (verl's v1 trainer mode)" in proc.stdout) is (mode == "v1-sync")
    m = read_metrics(out)
    assert [s for s in m if any(k.startswith("val-core/") for k in m[s])] == [0, 2, 4]
    trained = range(1, steps + 1)
    for s in trained:
        assert m[s]["fully_async/partial/max_partial_span"] <= 1 and m[s]["training/sample_age"] <= 1
        assert m[s]["response_length/mean"] > 20  # long responses: the engine is busy at a sync
    assert [s for s in trained if "fully_async/partial/interrupted" in m[s]] == list(range(1, steps))
    assert sum(m[s]["fully_async/partial/interrupted"] for s in range(1, steps)) > 0
    assert sum(m[s]["fully_async/partial/total_partial_num"] for s in trained) > 0
    assert max(m[s]["fully_async/partial/max_partial_span"] for s in trained) == 1
    # verl's v1 names for the same: a response sampled across two versions, none lagging more than the bound
    assert max(m[s]["training/off_policy/trajectory_spans/max"] for s in trained) == 2
    assert all(m[s]["training/off_policy/trajectory_staleness_worst/max"] <= 1 for s in trained)
