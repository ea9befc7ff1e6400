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
