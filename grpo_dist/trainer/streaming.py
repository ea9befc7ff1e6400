"""Streamed groups: fully asynchronous training with partial rollouts trains on groups as they finish, instead of
waiting for a chunk's longest response.

The freshness rule still admits whole chunks (:class:`~grpo_dist.trainer.fully_async.Admission`: ``C`` prompts
each, drawn and seeded as the step of the same number would), but the engines hand over every *group* (a
prompt's ``n`` responses) as soon as it has finished, whatever its chunk, and a step trains on ``C`` groups:

- every group that is *due*: of a chunk started with the engines at version ``v`` where ``P - v >= B - 1``
  (``P`` the policy's version, ``B`` the most chunks ahead): the step waits for these, so no group is trained
  more than ``B - 1`` updates after the version that began it (the bound chunk-by-chunk training keeps);
- then, up to ``C``, the oldest finished groups (oldest chunk first, then prompt order).

So a response that takes long holds up a step only once its chunk is due; until then the steps train on the
groups that finished. The due groups never number more than ``C``: after the sync at version ``v``, taken
after step ``s`` (``s = v`` plus the critic's warm-up steps), at most ``(s + B) C`` groups were ever started
with versions up to ``v`` (the freshness rule), the steps before step ``t`` trained ``(t - 1) C`` of them, and a
chunk of version ``v <= P - B + 1`` had ``s <= t - B``.

Without partial rollouts a sync waits for the chunks being generated, one at a time, and a step trains its own
chunk (the run repeats exactly); with them nothing is repeatable bit for bit (where a pause lands depends on
timing), so the groups may as well come as they finish.

A checkpoint first lets every group started finish (they all join the pool), then stores the pool, one
:class:`~grpo_dist.trainer.one_step_off.RolloutAhead` per chunk holding its groups not yet trained (the same file
as chunk by chunk); a resume puts them back in the pool.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from grpo_dist.batch import Batch
from grpo_dist.rollout.tp import engine_outputs
from grpo_dist.trainer.one_step_off import RolloutAhead
from grpo_dist.workers.common import unwrap_timed

__all__ = ["Group", "GroupStream", "StreamedChunk", "StreamedRollout", "started_versions"]


@dataclass
class StreamedChunk:
    """A chunk whose groups the engines generate and hand over one by one.

    Attributes:
        step: the step whose prompts and seed it has (it is the ``step``-th chunk started).
        epoch: the sampler's epoch its prompts were drawn in.
        version: the policy version the engines held when it started.
        prompts: its prompt rows, one per prompt (``uid`` ``s{step - 1}-{i}``).
        offsets: the first prompt of each engine's share.
        left: the prompts whose group has not been handed over.
    """

    step: int
    epoch: int
    version: int
    prompts: Batch
    offsets: list[int]
    left: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        if not self.left:
            self.left = set(range(len(self.prompts)))


@dataclass
class Group:
    """A finished group: prompt ``index`` of the chunk of ``step``, its ``n`` rows in ``batch``."""

    step: int
    index: int
    epoch: int
    version: int
    batch: Batch

    @property
    def order(self) -> tuple[int, int]:
        return self.step, self.index


class GroupStream:
    """The chunks being generated and the finished groups not yet trained (the module doc).

    Args:
        per_step: ``C``, the groups a step trains on (a chunk's prompts).
        due_age: ``B - 1``: a group whose chunk started this many updates ago is due.
    """

    def __init__(self, per_step: int, due_age: int) -> None:
        self.per_step, self.due_age = per_step, due_age
        self.chunks: dict[str, StreamedChunk] = {}
        self.pool: list[Group] = []

    def started(self, chunk_id: str, chunk: StreamedChunk) -> None:
        if chunk_id in self.chunks:
            raise ValueError(f"chunk {chunk_id!r} was started already")
        self.chunks[chunk_id] = chunk

    def arrived(self, chunk_id: str, index: int, batch: Batch) -> None:
        """Prompt ``index`` of chunk ``chunk_id`` finished: its rows ``batch`` join the pool."""
        chunk = self.chunks[chunk_id]
        if index not in chunk.left:
            raise ValueError(f"group {index} of chunk {chunk_id!r} arrived twice (or was never started)")
        chunk.left.discard(index)
        self.pool.append(Group(chunk.step, index, chunk.epoch, chunk.version, batch))
        if not chunk.left:
            del self.chunks[chunk_id]

    @property
    def pending(self) -> int:
        """Groups started and not yet handed over."""
        return sum(len(c.left) for c in self.chunks.values())

    def chunks_ahead(self) -> int:
        """The chunks' worth of groups started and not yet trained (rounded up): what the freshness rule
        counts as carried over a sync."""
        return math.ceil((self.pending + len(self.pool)) / self.per_step)

    def ready(self, policy_version: int) -> bool:
        """Whether a step may take its groups now: every due group is here and there are ``C`` of them."""
        due = policy_version - self.due_age
        return len(self.pool) >= self.per_step and not any(c.left for c in self.chunks.values() if c.version <= due)

    def take(self) -> list[Group]:
        """The step's ``C`` groups, oldest first (every due one among them: they are the oldest)."""
        self.pool.sort(key=lambda g: g.order)
        taken, self.pool = self.pool[:self.per_step], self.pool[self.per_step:]
        return taken

    @property
    def epoch(self) -> int | None:
        """The epoch of the oldest group not yet trained (None when none)."""
        oldest = [g.order + (g.epoch,) for g in self.pool] + [(c.step, min(c.left), c.epoch) for c in self.chunks.values()]
        return min(oldest)[2] if oldest else None

    # ------------------------------------------------------------------ checkpoints
    def saved_chunks(self) -> list[RolloutAhead]:
        """The pool (every group started has arrived: a checkpoint drains first) as one finished
        :class:`RolloutAhead` per chunk, oldest first."""
        assert not self.pending, "a checkpoint of streamed groups waits for every group started"
        out = []
        for step in sorted({g.step for g in self.pool}):
            groups = sorted((g for g in self.pool if g.step == step), key=lambda g: g.index)
            out.append(RolloutAhead(step=step, epoch=groups[0].epoch, version=groups[0].version, finish=None,
                                    _result=(Batch.concat([g.batch for g in groups]), 0.0)))
        return out

    def load(self, chunks: list[RolloutAhead], n: int) -> None:
        """Put a checkpoint's chunks (:meth:`saved_chunks`, or a chunk-by-chunk run's whole chunks) in the pool."""
        for chunk in chunks:
            batch, _ = chunk.result()
            for rows in batch.split(n):
                index = int(str(rows.non_tensors["uid"][0]).rsplit("-", 1)[1])
                self.pool.append(Group(chunk.step, index, chunk.epoch, chunk.version, rows))


def started_versions(groups: list[Group]) -> torch.Tensor:
    """Each row's chunk version ``[B]`` (the version its group began with)."""
    return torch.tensor([g.version for g in groups for _ in range(len(g.batch))], dtype=torch.long)


class StreamedRollout:
    """The driver's side of streamed groups: starts chunks on the rollout's engines and fetches their finished
    groups into a :class:`GroupStream` (the workers' ``start_chunk`` / ``start_agent_chunk`` and ``take_groups``).

    Args:
        rollout: the rollout's worker group (``tp`` consecutive ranks per engine).
        to_batch: ``(prompt rows, output) -> batch`` of a group (the step's batch layout).
        per_step, due_age: as :class:`GroupStream`'s.
        poll_s: how long one fetch waits for a group to finish before the step looks again.
    """

    def __init__(self, rollout, *, tp: int, to_batch, per_step: int, due_age: int, poll_s: float = 0.5) -> None:
        self.rollout, self.tp, self.to_batch, self.poll_s = rollout, tp, to_batch, poll_s
        self.groups = GroupStream(per_step, due_age)

    def start(self, chunk_id: str, *, step: int, epoch: int, version: int, prompts: Batch, method: str,
              per_rank: list[tuple]) -> None:
        """Start the chunk of ``step`` (its ``prompts``; ``per_rank``: the generation call's arguments, one share per
        engine) on the engines, which hold policy ``version``; returns at once."""
        start = "start_agent_chunk" if method == "run_agents" else "start_chunk"
        self.rollout.call(start, per_rank=[(chunk_id, *args, version) for args in per_rank])
        shares = [len(args[0]) for args in per_rank[::self.tp]]
        offsets = [sum(shares[:e]) for e in range(len(shares))]
        self.groups.started(chunk_id, StreamedChunk(step, epoch, version, prompts, offsets))

    def fetch(self, wait_s: float) -> float:
        """Move the groups finished on the engines into the pool, waiting up to ``wait_s`` for one when none has;
        the busiest engine's seconds since the last fetch. Every process of a tensor-parallel engine hands over
        what its first process handed over."""
        ranks, tp = len(self.rollout), self.tp
        taken, busy_s = unwrap_timed(self.rollout.call(
            "take_groups", per_rank=[(None, wait_s) if r % tp == 0 else ([], 0.0) for r in range(ranks)]))
        if tp > 1:
            self.rollout.call("take_groups", per_rank=[
                ([(c, i) for c, i, _ in taken[r - r % tp]] if r % tp else [], 0.0) for r in range(ranks)])
        for engine, groups in enumerate(engine_outputs(taken, tp)):
            for chunk_id, i, output in groups:
                chunk = self.groups.chunks[chunk_id]
                index = chunk.offsets[engine] + i
                self.groups.arrived(chunk_id, index, self.to_batch(chunk.prompts.reorder([index]), output))
        return busy_s

    def next_batch(self, policy_version: int) -> tuple[Batch, float, torch.Tensor]:
        """A step's groups (waiting for them) as one batch, oldest first; the engines' busy seconds meanwhile; and
        each row's chunk version ``[B]``."""
        busy_s = self.fetch(0.0)  # (the groups finished by now compete by age with those in the pool)
        while not self.groups.ready(policy_version):
            busy_s += self.fetch(self.poll_s)
        taken = self.groups.take()
        return Batch.concat([g.batch for g in taken]), busy_s, started_versions(taken)

    def drain(self) -> float:
        """Wait until every group started is in the pool (the engines are then idle); their busy seconds."""
        busy_s = 0.0
        while self.groups.pending:
            busy_s += self.fetch(self.poll_s)
        return busy_s
