"""How a worker group names a failure when one rank dies while the others are in a call with it: the
survivors' calls fail too (their collective breaks) and may reach the driver first. With a real local
Ray and stand-in actors that fail the way gloo ranks do: the dead rank is the one named, as lost (a
rerun helps), and no call's error is left for Ray to print as a traceback after the run's message."""

from __future__ import annotations

import gc
import os
import time

import pytest
import ray

from grpo_dist.distributed import worker_group
from grpo_dist.distributed.worker_group import ResourcePlan, WorkerError, WorkerGroup, create_placement_groups, \
    remove_placement_groups


@pytest.fixture
def group(local_ray):
    """Two ranks of a stand-in worker whose ``step(plan)`` does what ``plan[rank]`` says."""

    class Rank:
        def __init__(self, *, rank: int) -> None:
            self.rank = rank

        def step(self, plan: dict) -> int:
            what, after_s = plan[self.rank]
            time.sleep(after_s)
            if what == "die":
                os._exit(1)
            if what == "reset":  # what gloo raises in a rank whose peer's process went away
                raise RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:17818: "
                                   "Connection reset by peer")
            if what == "raise":
                raise ValueError("a bad value in this rank's own data")
            return self.rank

    plan = ResourcePlan(1, 2, "cpu", cpus_per_rank=1.0)
    pgs = create_placement_groups(plan)
    g = WorkerGroup("actor", ray.remote(Rank), plan, pgs, num_cpus=0.5, init_kwargs=lambda r: {"rank": r})
    try:
        yield g
    finally:
        g.kill()
        remove_placement_groups(pgs)


def failure(group: WorkerGroup, plan: dict) -> tuple[str, str]:
    """(kind, message) of the call's WorkerError; the exception (and the frames holding the call's
    references) is dropped on return, as when the driver has printed it and shuts down."""
    try:
        group.call("step", plan)
    except WorkerError as exc:
        assert exc.rerun_helps is (exc.kind != "raised")
        return exc.kind, str(exc)
    raise AssertionError(f"step {plan} did not fail")


def unhandled_errors_printed(caplog, capfd) -> str:
    """What Ray logged (to the driver's stderr, in a run) of call errors nobody fetched, once the
    references are gone."""
    gc.collect()
    time.sleep(1.0)
    text = caplog.text + capfd.readouterr().err
    return "\n".join(line for line in text.splitlines() if "Unhandled error" in line)


def test_the_dead_rank_is_named_when_its_peer_fails_first(group, caplog, capfd):
    kind, msg = failure(group, {0: ("reset", 0.0), 1: ("die", 1.0)})
    assert kind == "lost"
    assert msg.startswith("actor worker rank 1 failed during step: ActorDiedError"), msg
    # the survivor's error was fetched, not left for Ray to print after the run's message
    assert not unhandled_errors_printed(caplog, capfd)


def test_a_broken_connection_with_no_dead_rank_found_is_still_lost(group, monkeypatch, caplog, capfd):
    monkeypatch.setattr(worker_group, "PEER_GRACE_S", 1.0)
    t0 = time.monotonic()
    kind, msg = failure(group, {0: ("reset", 0.0), 1: ("raise", 4.0)})  # rank 1 is busy past the grace
    assert time.monotonic() - t0 < 3.5
    assert kind == "lost"
    assert "actor worker rank 0 failed during step: RuntimeError" in msg
    assert "Connection reset by peer" in msg and "another rank, or a rollout engine" in msg
    # rank 1's call, abandoned, raises later: Ray does not print it after the run's message
    time.sleep(4.0)
    assert not unhandled_errors_printed(caplog, capfd)


def test_an_error_of_the_ranks_own_stays_an_error_to_fix(group):
    with pytest.raises(WorkerError) as err:
        group.call("step", {0: ("raise", 0.0), 1: ("ok", 0.0)})
    assert err.value.kind == "raised" and not err.value.rerun_helps
    assert isinstance(err.value.cause, ValueError)
    assert str(err.value).startswith("actor worker rank 0 failed during step: ValueError: a bad value")
