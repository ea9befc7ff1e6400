"""Stopping on request: SIGTERM (what Slurm and Kubernetes send before they kill a job) ends the run
at the next step boundary, after saving a checkpoint, with one message; a second SIGTERM stops at once.

The scheduler's grace period (Slurm's ``--signal``/``KillWait``, Kubernetes'
``terminationGracePeriodSeconds``) must cover one step plus one checkpoint save; the cluster templates
in ``scripts/`` set it.
"""

from __future__ import annotations

import signal
from types import FrameType

from grpo_dist.trainer.summary import TrainingError

__all__ = ["StopRequested", "StopSignal"]


class StopRequested(TrainingError):
    """The run stopped because it was asked to (SIGTERM), after saving."""


class StopSignal:
    """Set by the SIGTERM handler (:meth:`install`), read by the training loop at step boundaries."""

    def __init__(self) -> None:
        self.requested: str | None = None

    def install(self) -> None:
        """Handle SIGTERM in this (the main) thread: the first asks for a stop, the second interrupts."""
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = signal.Signals(signum).name

    def raise_if_requested(self, step: int, checkpoint: str | None) -> None:
        if self.requested:
            raise StopRequested(
                f"stopped on {self.requested} after step {step}; saved {checkpoint}: rerun the same command to resume"
            )
