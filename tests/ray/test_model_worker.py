"""The rank's model roles in one Ray process (grpo_dist.workers.models.ModelWorker) behind per-role
WorkerGroup views: calls reach the right role, in submission order, and a lost process names every
role it held. With a real local Ray; the shells are small stand-ins (the real ones load FSDP2 models,
which the end-to-end runs cover)."""

from __future__ import annotations

import os
import time

import pytest
import ray

from grpo_dist.distributed.worker_group import (
    ResourcePlan,
    WorkerError,
    WorkerGroup,
    create_placement_groups,
    remove_placement_groups,
)
from grpo_dist.trainer.roles import ROLES, MODELS, rank_processes
from grpo_dist.trainer.weight_sync import choose_transport
from grpo_dist.workers.models import ModelWorker


def shells():
    """Two stand-in role shells (defined here, so Ray ships them by value)."""

    class Policy:
        def __init__(self, *, rank: int) -> None:
            self.rank, self.seen = rank, []

        def step(self, x: int) -> tuple[str, int, int, int]:
            self.seen.append(x)
            return "policy", self.rank, os.getpid(), x

        def history(self) -> list[int]:
            return list(self.seen)

    class Frozen:
        def __init__(self, *, rank: int) -> None:
            self.rank = rank

        def step(self, x: int) -> tuple[str, int, int, int]:
            return "frozen", self.rank, os.getpid(), -x

    return Policy, Frozen


def gone(actor, timeout_s: float = 30.0) -> None:
    """Wait until Ray reports ``actor`` dead (after ``ray.kill``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=5)
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"the killed actor still answers after {timeout_s} s")


def test_views_route_calls_to_their_role_in_one_process_per_rank(local_ray):
    Policy, Frozen = shells()
    plan = ResourcePlan(1, 2, "cpu", cpus_per_rank=1.0)
    pgs = create_placement_groups(plan)
    try:
        shared = WorkerGroup("models", ray.remote(ModelWorker), plan, pgs, num_cpus=0.5,
                             init_kwargs=lambda r: {"parts": {"policy": (Policy, {"rank": r}),
                                                              "frozen": (Frozen, {"rank": r})}})
        policy = shared.view("policy", roles=["policy", "frozen"])
        frozen = shared.view("frozen", roles=["policy", "frozen"])
        a, b = policy.call("step", 3), frozen.call("step", per_rank=[(1,), (2,)])
        assert [x[:2] for x in a] == [("policy", 0), ("policy", 1)] and [x[3] for x in a] == [3, 3]
        assert [x[:2] for x in b] == [("frozen", 0), ("frozen", 1)] and [x[3] for x in b] == [-1, -2]
        # one process per rank holds both roles; the ranks are two processes
        assert [x[2] for x in a] == [x[2] for x in b] and a[0][2] != a[1][2]
        assert policy.shares_processes_with(frozen) and choose_transport(policy, frozen, "cuda") == "object_store"
        # calls submitted without waiting run in submission order
        refs = [policy.submit("step", i) for i in range(5)]
        policy.collect([r for rs in refs for r in rs], "step")
        assert policy.call("history") == [[3, 0, 1, 2, 3, 4]] * 2
        with pytest.raises(WorkerError, match="no 'critic' role"):
            shared.view("critic", roles=["critic"]).call("step", 0)
        # a lost process stops every role it held, and the message says so
        ray.kill(shared.workers[1], no_restart=True)
        gone(shared.workers[1])  # ray.kill returns before the process is gone: a call right after may still be served
        with pytest.raises(WorkerError) as err:
            frozen.call("step", 1)
        assert err.value.kind == "lost"
        assert "frozen worker rank 1 failed during step" in str(err.value)
        assert "its process also held the policy" in str(err.value)
        policy.kill()
        frozen.kill()  # the processes are gone already: nothing to do
    finally:
        remove_placement_groups(pgs)


def test_every_model_role_shares_one_process_and_the_others_have_their_own():
    per_rank = [r for r in ROLES if r.per_rank]
    processes = rank_processes(per_rank)
    assert processes[0] == (MODELS, [r for r in per_rank if r.model is not None])
    assert [(p, [r.name for r in rs]) for p, rs in processes[1:]] == [(None, ["rollout"])]
    assert rank_processes([r for r in ROLES if r.name in ("rollout", "reward")]) == [
        (None, [r for r in ROLES if r.name == "rollout"])]
