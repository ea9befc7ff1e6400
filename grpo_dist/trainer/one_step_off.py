"""One-step-off-policy training (``actor_rollout_ref.hybrid_engine=false``): the next step's batch is generated
on the rollout's own devices while the current one trains.

The policy's versions count the actor's updates (``v`` after ``v`` updates). Step ``k`` (1-based), with the
policy at version ``v_k`` (``k - 1`` without a critic warm-up):

1. wait for step ``k``'s batch (started during step ``k - 1``; at the first step, and after a resume that
   holds none, it is started now);
2. the engines are idle: send them the policy ``v_k`` unless they hold it, then start step ``k + 1``'s
   batch (its prompts drawn from the sampler now, in the order the synchronous loop draws them; its
   sampling seed is step ``k + 1``'s);
3. score, old log-probs, reference, advantages, update (-> ``v_k + 1``) while the engines generate.

So a step trains on samples of the policy one update behind (its ``training/sample_age`` is 1; 0 at the
first step), as verl's one-step-off recipe does, and the step takes about the longer of generation and
training instead of their sum. Validation first lets the engines finish the batch they generate and then
sends them the current policy (the next step then needs no sync), so validating does not change what is
trained. A checkpoint waits for the batch being generated and saves it (:data:`AHEAD_FILE`, tokens and
their sampling log-probs); a resume trains on it next, so stopping and resuming trains on exactly the
batches an uninterrupted run does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from grpo_dist.batch import Batch

__all__ = ["AHEAD_FILE", "RolloutAhead", "load_ahead"]

AHEAD_FILE = "rollout_ahead.pt"
"""The checkpoint's file holding the batch generated for the next step (one-step-off-policy)."""


@dataclass
class RolloutAhead:
    """A generation batch started before the step that trains on it.

    Attributes:
        step: the (1-based) step that trains on it.
        epoch: the sampler's epoch its prompts were drawn in.
        version: the policy version the engines sampled it with.
        finish: waits for the engines and returns ``(batch, busy seconds)``; called once.
    """

    step: int
    epoch: int
    version: int
    finish: Callable[[], tuple[Batch, float]] | None
    _result: tuple[Batch, float] | None = field(default=None, repr=False)

    @property
    def done(self) -> bool:
        """Whether the batch is here (the engines are free)."""
        return self._result is not None

    def result(self) -> tuple[Batch, float]:
        """The batch and the slowest engine's busy seconds, waiting for the engines the first time."""
        if self._result is None:
            assert self.finish is not None
            self._result, self.finish = self.finish(), None
        return self._result

    def save(self, directory: str | os.PathLike) -> None:
        """Write the finished batch (waiting for it) into a checkpoint folder."""
        torch.save(self.state(), Path(directory) / AHEAD_FILE)

    def state(self) -> dict[str, Any]:
        """The finished batch (waiting for it) with its step, epoch and version, as a checkpoint stores it."""
        batch, _ = self.result()
        saved = {"tensors": batch.tensors.to_dict(), "non_tensors": {k: list(v) for k, v in batch.non_tensors.items()},
                 "meta": dict(batch.meta)}
        return {"step": self.step, "epoch": self.epoch, "version": self.version, "batch": saved}

    @classmethod
    def from_state(cls, saved: dict[str, Any]) -> RolloutAhead:
        """A finished batch back from :meth:`state`."""
        b = saved["batch"]
        batch = Batch.from_dict(b["tensors"], b["non_tensors"], b["meta"])
        return cls(step=int(saved["step"]), epoch=int(saved["epoch"]), version=int(saved["version"]),
                   finish=None, _result=(batch, 0.0))


def load_ahead(directory: str | os.PathLike) -> RolloutAhead | None:
    """The batch a checkpoint holds for its next step (:meth:`RolloutAhead.save`), or None."""
    path = Path(directory) / AHEAD_FILE
    if not path.exists():
        return None
    return RolloutAhead.from_state(torch.load(path, weights_only=False))
