"""The rendezvous of a single-machine run listens on the loopback interface only."""

from __future__ import annotations

import psutil
import torch
import torch.distributed as dist

from tests.distributed._dist_helpers import run_ranks

LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def _listening_after_all_reduce(rank: int, world_size: int) -> tuple[float, list[str]]:
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)  # gloo's connections are up
    dist.barrier()
    ips = [c.laddr.ip for c in psutil.Process().net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    dist.barrier()
    return float(t), ips


def test_two_ranks_on_one_machine_listen_on_loopback_only():
    results = run_ranks(_listening_after_all_reduce, 2)
    assert [total for total, _ in results] == [3.0, 3.0]
    assert results[0][1], "rank 0 serves the rendezvous store"
    for rank, (_, ips) in enumerate(results):
        assert set(ips) <= LOOPBACK, f"rank {rank} listens on {ips}"


def _weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"embed.weight": torch.randn(7, 5, generator=g), "norm.weight": torch.randn(5, generator=g),
            "head.weight": torch.randn(3, 5, generator=g).to(torch.bfloat16)}


def _broadcast_buckets(rank: int, world_size: int) -> dict[str, torch.Tensor]:
    """Rank 0 plays the actor's rank 0, the others rollout ranks: a side group of their own (its own store, apart
    from the default group these processes also belong to) carries every bucket."""
    from grpo_dist.distributed.process_group import free_port, open_side_group
    from grpo_dist.rollout.weight_sync import pack, plan_buckets, receive, send, unpack

    where = [("127.0.0.1", free_port("127.0.0.1")) if rank == 0 else None]
    dist.broadcast_object_list(where, src=0)
    group = open_side_group(backend="gloo", rank=rank, size=world_size, master_addr=where[0][0],
                            master_port=where[0][1], timeout_s=60.0)
    assert group.size() == world_size and group.rank() == rank
    weights = _weights(seed=3)
    buckets = plan_buckets(((n, tuple(t.shape), t.dtype) for n, t in weights.items()), bucket_bytes=64)
    got = {}
    for bucket in buckets:
        if rank == 0:
            send(pack(bucket, weights, "cpu"), group)
        else:
            got.update((n, t.clone()) for n, t in unpack(bucket, receive(bucket, group)))
    dist.barrier()  # the default group is untouched by the side group's traffic
    return got


def test_the_weight_sync_broadcast_group_carries_every_bucket_to_every_receiver():
    results = run_ranks(_broadcast_buckets, 3)
    want = _weights(seed=3)
    assert results[0] == {}
    for got in results[1:]:
        assert set(got) == set(want)
        for name, t in want.items():
            assert got[name].dtype == t.dtype and torch.equal(got[name], t), name
