"""The actor -> rollout weight-sync protocol (grpo_dist.trainer.weight_sync) with stand-in groups:
the order of the calls, what each rollout rank is sent under each transport, and the timings."""

from __future__ import annotations

import pytest

from grpo_dist.trainer.weight_sync import WeightSync, choose_transport
from grpo_dist.workers.common import Timed


class FakeGroup:
    """Records calls; answers them with ``answer(method, rank, args)`` wrapped as the workers do."""

    def __init__(self, name: str, ranks: int, answer, log: list, busy_s: float = 0.0) -> None:
        self.name, self.ranks, self.answer, self.log, self.busy_s = name, ranks, answer, log, busy_s

    def __len__(self) -> int:
        return self.ranks

    def call(self, method, *args, per_rank=None):
        out = []
        for r in range(self.ranks):
            a = per_rank[r] if per_rank is not None else args
            self.log.append((self.name, method, r, a))
            value = self.answer(method, r, a)
            out.append(value if method in ("gpu_uuid", "sync_end", "address") else Timed(value, self.busy_s))
        return out

    def call_later(self, method, *args, per_rank=None):
        out = self.call(method, *args, per_rank=per_rank)
        return lambda: out


class FakeBucket(str):
    """A bucket's name standing in for its layout; each is 100 bytes."""

    nbytes = 100


#: One sync of two buckets as rank 0 of each group sees it: planning, wake-up, then per bucket the gather (all
#: ranks) with the load (all ranks), the engines' finish and the actor's clean-up.
TWO_BUCKETS = [("actor", "sync_begin"), ("rollout", "wake_up"),
               ("actor", "sync_bucket"), ("rollout", "load_bucket"),
               ("actor", "sync_bucket"), ("rollout", "load_bucket"),
               ("rollout", "finish_load"), ("actor", "sync_end")]


def make(ranks: int, buckets: list[str], transport: str, uuids=None):
    log: list = []
    buckets = [FakeBucket(b) for b in buckets]

    def actor_answer(method, rank, args):
        if method == "sync_begin":
            return buckets
        if method == "sync_bucket":
            i, tr = args
            assert tr == transport
            if tr == "broadcast":
                return None, 0.25 if rank == 0 else 0.0
            payload = f"ipc-r{rank}-b{i}" if tr == "cuda_ipc" else ([f"ref-b{i}"] if rank == 0 else None)
            return payload, 0.25 if rank == 0 else 0.0
        if method == "gpu_uuid":
            return (uuids or {}).get(("actor", rank))
        if method == "address":
            return (f"10.0.0.{rank}", 29500 + rank)
        return None

    def rollout_answer(method, rank, args):
        if method == "gpu_uuid":
            return (uuids or {}).get(("rollout", rank))
        if method == "load_bucket" and transport == "broadcast":
            return 0.125  # the seconds it waited for the broadcast bytes
        return None

    actor = FakeGroup("actor", ranks, actor_answer, log, busy_s=1.0)
    rollout = FakeGroup("rollout", ranks, rollout_answer, log, busy_s=0.5)
    return actor, rollout, log


def test_object_store_sends_rank0_reference_to_every_rollout_rank_bucket_by_bucket():
    actor, rollout, log = make(2, ["b0", "b1"], "object_store")
    sync = WeightSync(actor, rollout, transport="object_store", dtype="bfloat16", bucket_bytes=1024)
    timings = sync()
    assert sync.last_bytes == 200  # what each engine was sent: both buckets
    # planning with the dtype and size, wake-up, then per bucket: gather (all ranks) before load (all ranks)
    assert log[0] == ("actor", "sync_begin", 0, ("bfloat16", 1024))
    order = [(g, m) for g, m, r, _ in log if r == 0]
    assert order == TWO_BUCKETS
    loads = [(r, a) for g, m, r, a in log if m == "load_bucket"]
    assert loads == [(0, ("b0", "ref-b0")), (1, ("b0", "ref-b0")), (0, ("b1", "ref-b1")), (1, ("b1", "ref-b1"))]
    # gather: plan 1.0 + 2 buckets x (1.0 busy - 0.25 put); load: 2 buckets x 0.5 + finish 0.5
    assert timings["update_weights/gather"] == pytest.approx(2.5)
    assert timings["update_weights/load"] == pytest.approx(1.5)
    assert timings["update_weights/worker"] == pytest.approx(2.5 + 0.5 + 0.5 + 1.5)
    assert timings["update_weights/transfer"] >= 0.0


def test_cuda_ipc_sends_each_rollout_rank_its_own_actor_rank_handle():
    actor, rollout, log = make(2, ["b0"], "cuda_ipc")
    WeightSync(actor, rollout, transport="cuda_ipc", dtype="bfloat16", bucket_bytes=1)()
    loads = [(r, a) for g, m, r, a in log if m == "load_bucket"]
    assert loads == [(0, ("b0", "ipc-r0-b0")), (1, ("b0", "ipc-r1-b0"))]


def test_transport_is_cuda_ipc_only_when_every_rank_pair_shares_a_gpu():
    same = {("actor", 0): "G0", ("rollout", 0): "G0", ("actor", 1): "G1", ("rollout", 1): "G1"}
    actor, rollout, _ = make(2, [], "cuda_ipc", uuids=same)
    assert choose_transport(actor, rollout, "cuda") == "cuda_ipc"
    assert choose_transport(actor, rollout, "cpu") == "object_store"
    crossed = dict(same) | {("rollout", 1): "G0"}
    actor, rollout, _ = make(2, [], "cuda_ipc", uuids=crossed)
    assert choose_transport(actor, rollout, "cuda") == "object_store"


def test_rejects_unknown_transport_and_empty_buckets():
    actor, rollout, _ = make(1, [], "object_store")
    with pytest.raises(ValueError, match="object_store"):
        WeightSync(actor, rollout, transport="nccl", dtype="float32", bucket_bytes=1)
    with pytest.raises(ValueError, match="bucket_bytes"):
        WeightSync(actor, rollout, transport="object_store", dtype="float32", bucket_bytes=0)


def test_broadcast_opens_one_group_of_actor_rank0_and_every_rollout_rank_and_loads_alongside_the_gather():
    actor, rollout, log = make(2, ["b0", "b1"], "broadcast")
    sync = WeightSync(actor, rollout, transport="broadcast", dtype="bfloat16", bucket_bytes=1024, device="cpu",
                      timeout_s=30.0)
    assert sync.label == "broadcast over gloo"
    sync.prepare()
    sync.prepare()  # the group is opened once
    opens = [(g, r, a) for g, m, r, a in log if m == "open_sync_group"]
    # actor rank 0 hosts it at its own address as rank 0 (every actor rank is called; only rank 0 joins),
    # the rollout ranks join as 1 and 2 of a group of 3
    assert opens == [("actor", 0, ("10.0.0.0", 29500, 3, "gloo", 30.0)), ("actor", 1, ("10.0.0.0", 29500, 3, "gloo", 30.0)),
                     ("rollout", 0, ("10.0.0.0", 29500, 1, 3, "gloo", 30.0)),
                     ("rollout", 1, ("10.0.0.0", 29500, 2, 3, "gloo", 30.0))]
    del log[:]
    timings = sync()
    assert sync.last_bytes == 200
    # per bucket the actor's gather starts and the rollout ranks' loads run alongside (they receive the
    # broadcast): each rollout rank gets the bucket's layout and the transport's name, no payload
    order = [(g, m) for g, m, r, _ in log if r == 0]
    assert order == TWO_BUCKETS
    loads = [(r, a) for g, m, r, a in log if m == "load_bucket"]
    assert loads == [(0, ("b0", "broadcast")), (1, ("b0", "broadcast")), (0, ("b1", "broadcast")),
                     (1, ("b1", "broadcast"))]
    # gather: plan 1.0 + 2 x (1.0 - 0.25 broadcast); load: 2 x (0.5 busy - 0.125 waiting for the bytes) + 0.5
    assert timings["update_weights/gather"] == pytest.approx(2.5)
    assert timings["update_weights/load"] == pytest.approx(1.25)
    assert timings["update_weights/worker"] == pytest.approx(2.5 + 0.5 + 0.5 + 1.25)


def test_nccl_backend_broadcasts_unless_the_engine_shares_the_actors_gpu():
    same = {("actor", 0): "G0", ("rollout", 0): "G0"}
    actor, rollout, _ = make(1, [], "broadcast", uuids=same)
    assert choose_transport(actor, rollout, "cuda", "nccl") == "cuda_ipc"  # NCCL cannot span one GPU twice
    assert choose_transport(actor, rollout, "cpu", "nccl") == "broadcast"
    assert choose_transport(actor, rollout, "cpu", "naive") == "object_store"
    apart = {("actor", 0): "G0", ("rollout", 0): "G1"}
    actor, rollout, _ = make(1, [], "broadcast", uuids=apart)
    assert choose_transport(actor, rollout, "cuda", "nccl") == "broadcast"
    assert choose_transport(actor, rollout, "cuda", "naive") == "object_store"
    assert WeightSync(actor, rollout, transport="broadcast", dtype="float32", bucket_bytes=1,
                      device="cuda").label == "broadcast over nccl"
    with pytest.raises(ValueError, match="naive, nccl"):
        choose_transport(actor, rollout, "cpu", "hccl")


def test_a_failed_side_of_the_broadcast_is_raised_without_waiting_for_the_other():
    """The rollout ranks wait in the broadcast for actor rank 0; when the actor's gather fails, its error is
    raised at once (not after the rollout's deadline), and a broken link on one side gives way to the peer's
    own failure when it follows."""
    import threading
    import time as _time

    from grpo_dist.distributed.worker_group import WorkerError, collect_together

    stuck = threading.Event()

    def never():  # a side blocked in the broadcast
        stuck.wait(30)
        return ["late"]

    def fails():
        raise RuntimeError("actor worker rank 0 failed during sync_bucket: out of memory")

    t0 = _time.monotonic()
    with pytest.raises(RuntimeError, match="out of memory"):
        collect_together(fails, never)
    assert _time.monotonic() - t0 < 5

    def broken():
        raise WorkerError("rollout worker rank 0 failed during load_bucket: Connection closed", kind="lost",
                          broken_link=True)

    def dies_after():
        _time.sleep(0.3)
        raise RuntimeError("actor worker rank 0 failed during sync_bucket: its process died")

    with pytest.raises(RuntimeError, match="its process died"):
        collect_together(dies_after, broken)
    stuck.set()
    assert collect_together(lambda: [1], lambda: [2]) == [[1], [2]]
