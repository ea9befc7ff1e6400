"""Tensor-parallel rollout: which ranks form one engine, and which prompts each engine gets.

With ``actor_rollout_ref.rollout.tensor_model_parallel_size = tp`` the rollout ranks are grouped into
engines of ``tp`` consecutive ranks (:func:`tp_groups`). Every rank of a group holds one shard of the
same vLLM engine; all of them are given the same prompts (vLLM's external-launcher executor runs the
same requests in every process of the group) and the first rank's outputs are used
(:func:`engine_shares`). Plain Python: no torch, no vLLM.
"""

from __future__ import annotations

from typing import Sequence, TypeVar

T = TypeVar("T")


def tp_groups(world_size: int, tp: int) -> list[list[int]]:
    """The rollout ranks grouped into tensor-parallel engines: ``world_size / tp`` groups of ``tp``
    consecutive ranks (``[[0, 1], [2, 3], ...]`` for ``tp=2``); every rank of a group holds a shard of
    the same engine. With ``tp=1`` every rank is its own engine.

    Consecutive ranks share a node whenever ``tp`` divides the ranks per node (checked by validation),
    so an engine never spans nodes.
    """
    if tp < 1 or world_size < 1 or world_size % tp:
        raise ValueError(f"{world_size} rollout rank(s) cannot be grouped into tensor-parallel engines of {tp}")
    return [list(range(start, start + tp)) for start in range(0, world_size, tp)]


def engine_of(rank: int, tp: int) -> int:
    """The engine (group index) rollout rank ``rank`` belongs to."""
    return rank // tp


def init_args(addresses: Sequence[tuple[str, int]], tp: int) -> list[tuple[int, str, int]]:
    """Each rank's ``(tp_rank, master_addr, master_port)`` for building its shard: its place in its
    group, and the rendezvous its group's first rank offered (``addresses[r]`` is rank r's offer)."""
    tp_groups(len(addresses), tp)  # checks the grouping
    out = []
    for rank in range(len(addresses)):
        host, port = addresses[rank - rank % tp]
        out.append((rank % tp, host, int(port)))
    return out


def engine_shares(shares: Sequence[T], tp: int) -> list[T]:
    """Per-rank arguments from per-engine ones: every rank of engine ``g`` gets ``shares[g]`` (the
    external-launcher executor needs the same requests in every process of an engine)."""
    return [share for share in shares for _ in range(tp)]


def engine_outputs(outputs: Sequence[T], tp: int) -> list[T]:
    """Per-engine results from per-rank ones: the first rank's of each engine (its ranks all return
    the same responses)."""
    if len(outputs) % tp:
        raise ValueError(f"{len(outputs)} rank outputs do not make whole engines of {tp}")
    return list(outputs[::tp])
