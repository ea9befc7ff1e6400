"""What a finished run reports, and the error that ends a run on purpose."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CheckpointSaveError", "RunSummary", "TrainingError"]


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. repeated non-finite updates); the message says why and what was saved."""


class CheckpointSaveError(TrainingError):
    """A checkpoint could not be written (the disk is full, a folder is not writable); the message
    names the folder and the OS error, and says that the earlier checkpoints are untouched."""


@dataclass
class RunSummary:
    """Steps run (from ``first_step``), wall time and tokens of the training loop, validation before
    and after, the last checkpoint and the output folder."""

    steps: int = 0
    first_step: int = 0
    wall_s: float = 0.0
    tokens: int = 0
    val_before: dict[str, float] = field(default_factory=dict)
    val_after: dict[str, float] = field(default_factory=dict)
    last_checkpoint: str | None = None
    out_dir: str = ""
    val_only: bool = False  # trainer.val_only: validated at step ``steps`` and stopped
