"""Fully asynchronous training (``async_training.*``, verl's fully_async_policy) at chunk granularity, on the
one-step-off machinery (:mod:`grpo_dist.trainer.one_step_off`).

A *chunk* is ``require_batches x ppo_mini_batch_size`` prompts x ``rollout.n`` responses; training step ``k``
trains chunk ``k``. The rollout's own engines generate chunks ahead of the trainer, first in first out, each
with the weights they hold (its *version*: the policy's updates then), with step ``k``'s prompts and sampling
seed, so the data drawn is the synchronous loop's. Weights go to the engines every ``trigger`` steps
(``trigger_parameter_sync_step``), after the chunks being generated are finished (generation is not
interrupted). Which chunks may start is verl's freshness rule (:class:`Admission`): after a sync the engines
may start at most

    B = floor((1 + staleness_threshold) x trigger)

chunks less those generated and not yet trained (carried over the sync). So at most ``B`` chunks are ahead of
the trainer, and a chunk started after the sync at version ``v`` is trained by step ``v + B``: its sample age
(the policy's updates since ``v``) is at most ``B - 1``. ``staleness_threshold=0, trigger=1`` (``B = 1``) is the
synchronous loop (generate, train, sync); ``staleness_threshold=1, trigger=1`` (``B = 2``) is one-step-off.

A checkpoint holds every chunk generated ahead (:data:`QUEUE_FILE`, waiting for those being generated) with
their versions, and the admission's state; a resume trains on them first, so a stopped and resumed run trains
on exactly the chunks an uninterrupted one does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from grpo_dist.trainer.one_step_off import RolloutAhead, load_ahead

__all__ = ["QUEUE_FILE", "Admission", "load_chunks", "save_chunks"]

QUEUE_FILE = "rollout_queue.pt"
"""The checkpoint's file holding the chunks generated ahead (fully asynchronous training)."""


@dataclass
class Admission:
    """verl's freshness rule: how many chunks the engines may still start before the next weight sync.

    Attributes:
        bound: ``B = floor((1 + staleness_threshold) x trigger)``, the most chunks ahead of the trainer.
        allowed: chunks that may still be started until the next sync.
    """

    bound: int
    allowed: int = 0

    def synced(self, carried: int) -> None:
        """The engines got new weights while ``carried`` chunks were generated and not yet trained."""
        self.allowed = max(0, self.bound - carried)

    def may_start(self) -> bool:
        return self.allowed > 0

    def started(self) -> None:
        assert self.allowed > 0, "a chunk was started beyond the staleness bound"
        self.allowed -= 1


def save_chunks(chunks: list[RolloutAhead], directory: str | os.PathLike) -> None:
    """Write ``chunks`` (waiting for those being generated), in order, into a checkpoint folder."""
    torch.save({"chunks": [c.state() for c in chunks]}, Path(directory) / QUEUE_FILE)


def load_chunks(directory: str | os.PathLike) -> list[RolloutAhead]:
    """The chunks a checkpoint holds for its next steps, in order (:func:`save_chunks`; a one-step-off
    checkpoint's single batch, :data:`grpo_dist.trainer.one_step_off.AHEAD_FILE`, is read too); [] when none."""
    path = Path(directory) / QUEUE_FILE
    if not path.exists():
        single = load_ahead(directory)
        return [single] if single is not None else []
    return [RolloutAhead.from_state(saved) for saved in torch.load(path, weights_only=False)["chunks"]]
