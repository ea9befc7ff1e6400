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


# ------------------------------------------------------------------------------ the broadcast weight sync
def sync_workers():
    """Stand-ins for the actor's rank 0 and the rollout ranks around the real broadcast pieces
    (the gloo side group; grpo_dist.rollout.weight_sync's pack/send/receive/unpack), defined here so Ray ships them by
    value; ``die`` names the method in which the worker's process exits (as a killed one does)."""
    from grpo_dist.workers.common import timed

    def weights():
        import torch

        g = torch.Generator().manual_seed(0)
        return {"embed": torch.randn(64, 8, generator=g), "norm": torch.randn(100, generator=g)}

    class Actor:
        def __init__(self, *, rank: int, die: str = "") -> None:
            self.rank, self.die, self.group, self.weights = rank, die, None, weights()

        def address(self):
            from grpo_dist.distributed.process_group import free_port

            return "127.0.0.1", free_port("127.0.0.1")

        def open_sync_group(self, addr, port, size, backend, timeout_s):
            from grpo_dist.distributed.process_group import open_side_group

            self.group = open_side_group(backend=backend, rank=0, size=size, master_addr=addr, master_port=port,
                                         timeout_s=timeout_s)

        @timed
        def sync_begin(self, dtype, bucket_bytes):
            from grpo_dist.rollout.weight_sync import plan_buckets

            self.buckets = plan_buckets(((n, tuple(t.shape), t.dtype) for n, t in self.weights.items()), bucket_bytes)
            return self.buckets

        @timed
        def sync_bucket(self, index, transport):
            from grpo_dist.rollout.weight_sync import pack, send

            if self.die == "sync_bucket":
                time.sleep(1.0)  # the receivers are waiting in the broadcast by now
                os._exit(1)
            t0 = time.perf_counter()
            send(pack(self.buckets[index], self.weights, "cpu"), self.group)
            return None, time.perf_counter() - t0

        def sync_end(self):
            pass

        def adapter_config(self):
            return None

    class Rollout:
        def __init__(self, *, rank: int, die: str = "") -> None:
            self.rank, self.die, self.group, self.got = rank, die, None, {}

        def open_sync_group(self, addr, port, rank, size, backend, timeout_s):
            from grpo_dist.distributed.process_group import open_side_group

            self.group = open_side_group(backend=backend, rank=rank, size=size, master_addr=addr, master_port=port,
                                         timeout_s=timeout_s)

        @timed
        def wake_up(self):
            pass

        @timed
        def load_bucket(self, bucket, payload):
            from grpo_dist.rollout.weight_sync import receive, unpack

            assert payload == "broadcast"
            if self.die == "load_bucket":
                os._exit(1)
            t0 = time.perf_counter()
            flat = receive(bucket, self.group)
            waited = time.perf_counter() - t0
            self.got.update((name, t.clone()) for name, t in unpack(bucket, flat))
            return waited

        @timed
        def finish_load(self):
            pass

        def received(self):
            return self.got

    return Actor, Rollout, weights


@pytest.fixture
def sync_groups(local_ray):
    """``make(actor_die, rollout_die_rank)``: an actor group of one rank and a rollout group of two, each in a
    placement group of its own."""
    Actor, Rollout, _ = sync_workers()
    made = []

    def make(actor_die: str = "", rollout_die_rank: int | None = None):
        a_plan, r_plan = ResourcePlan(1, 1, "cpu", cpus_per_rank=0.5), ResourcePlan(1, 2, "cpu", cpus_per_rank=0.5)
        a_pgs, r_pgs = create_placement_groups(a_plan), create_placement_groups(r_plan)
        actor = WorkerGroup("actor", ray.remote(Actor), a_plan, a_pgs, num_cpus=0.25,
                            init_kwargs=lambda r: {"rank": r, "die": actor_die})
        rollout = WorkerGroup("rollout", ray.remote(Rollout), r_plan, r_pgs, num_cpus=0.25,
                              init_kwargs=lambda r: {"rank": r, "die": "load_bucket" if r == rollout_die_rank else ""})
        made.append((actor, rollout, a_pgs + r_pgs))
        return actor, rollout

    try:
        yield make
    finally:
        for actor, rollout, pgs in made:
            actor.kill()
            rollout.kill()
            remove_placement_groups(pgs)


def _broadcast_sync(actor, rollout):
    from grpo_dist.trainer.weight_sync import WeightSync

    sync = WeightSync(actor, rollout, transport="broadcast", dtype="float32", bucket_bytes=1024, device="cpu",
                      timeout_s=60.0)
    sync.prepare()
    return sync


def test_the_broadcast_sync_delivers_every_bucket_to_every_rollout_rank(sync_groups):
    import torch

    actor, rollout = sync_groups()
    sync = _broadcast_sync(actor, rollout)
    timings = sync()
    assert sync.last_bytes == (64 * 8 + 100) * 4 and timings["update_weights/load"] >= 0
    want = sync_workers()[2]()
    for got in rollout.call("received"):
        assert set(got) == set(want) and all(torch.equal(got[n], want[n]) for n in want)


@pytest.mark.parametrize("who", ["rollout", "actor"])
def test_a_death_on_either_side_of_the_broadcast_is_named_at_once(sync_groups, who, caplog, capfd):
    """A rollout rank killed as the bucket is broadcast, or the actor's rank 0 killed while the rollout ranks wait
    in the broadcast: the dead process is the one named (lost: a rerun helps), within seconds, not when the
    other side's collective times out (60 s here), and no survivor's error is left for Ray to print."""
    actor, rollout = sync_groups(actor_die="sync_bucket" if who == "actor" else "",
                                 rollout_die_rank=1 if who == "rollout" else None)
    sync = _broadcast_sync(actor, rollout)
    t0 = time.monotonic()
    with pytest.raises(WorkerError) as info:
        sync()
    assert time.monotonic() - t0 < 30
    msg = str(info.value)
    assert info.value.kind == "lost", msg
    named = "rollout worker rank 1 failed during load_bucket" if who == "rollout" else "actor worker rank 0 failed during sync_bucket"
    assert msg.startswith(named) and "ActorDiedError" in msg, msg
    del info
    assert not unhandled_errors_printed(caplog, capfd)
