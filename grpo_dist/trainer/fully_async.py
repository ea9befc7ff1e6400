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

from grpo_dist.batch import Batch
from grpo_dist.core.diagnostics import off_policy_metrics, partial_metrics
from grpo_dist.trainer.one_step_off import RolloutAhead, load_ahead

__all__ = ["QUEUE_FILE", "Admission", "check_sample_age", "chunk_metrics", "load_chunks", "save_chunks"]

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


def check_sample_age(age: int, limit: int | None, *, step: int) -> None:
    """Refuse to train step ``step`` on samples ``age`` updates old when that passes ``limit`` (verl v1's
    ``trainer.v1.sampler.max_off_policy_threshold``; None: no limit but the freshness rule's)."""
    if limit is not None and age > limit:
        raise RuntimeError(f"the chunk of step {step} was sampled {age} updates ago, beyond "
                           f"trainer.v1.sampler.max_off_policy_threshold={limit}; no group is dropped here: raise "
                           "the threshold, or resume with the settings that wrote the checkpoint")


def chunk_metrics(batch: Batch, started_B: torch.Tensor, *, policy_version: int, chunks_ahead: int,
                  stale_samples: int) -> dict[str, float]:
    """The metrics of a trained chunk (or of streamed groups) whose rows' chunks began at versions ``started_B``
    ``[B]``, trained by ``policy_version``: ``training/sample_age`` (the oldest row's updates since), verl's
    ``fully_async/queue_size`` (here ``chunks_ahead``: chunks started and not trained) and
    ``fully_async/count/*``, and from each token's version (``rollout_versions`` with partial rollouts, else
    its chunk's) verl's ``fully_async/partial/*`` and ``training/off_policy/*``."""
    oldest = int(started_B.min())
    m = {"training/sample_age": float(policy_version - oldest), "fully_async/queue_size": float(chunks_ahead),
         "fully_async/count/stale_samples_processed": float(stale_samples),
         "fully_async/count/current_param_version": float(policy_version)}
    versions = batch["rollout_versions"] if "rollout_versions" in batch else None
    if versions is not None:  # partial rollouts: responses whose tokens more than one version sampled
        m.update(partial_metrics(versions))
    else:  # every token sampled by its chunk's version
        versions = started_B.unsqueeze(1)
    m.update(off_policy_metrics(versions.long(), current=policy_version, started=oldest))
    return m


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
