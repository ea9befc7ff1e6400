"""What a finished run reports, and the error that ends a run on purpose."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CheckpointSaveError", "RunSummary", "ScoreCounts", "TrainingError"]

#: the share of failed reward scores from which the end of a run warns (1.0: only when every score failed)
FAILED_SCORES_WARNING_SHARE = 0.5


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. repeated non-finite updates); the message says why and what was saved."""


class CheckpointSaveError(TrainingError):
    """A checkpoint could not be written (the disk is full, a folder is not writable); the message
    names the folder and the OS error, and says that the earlier checkpoints are untouched."""


@dataclass
class ScoreCounts:
    """The reward function's scores over a run (training, validation, baselines) and how many of them
    failed (raised, timed out, returned a non-number) and were scored 0 under
    ``reward_model.on_error=zero``; ``first_error`` is the first failure's message."""

    scored: int = 0
    failed: int = 0
    first_error: str | None = None

    def add(self, scored: int, stats: dict[str, float], first_error: str | None = None) -> None:
        self.scored += scored
        self.failed += int(stats.get("reward/num_errors", 0) + stats.get("reward/num_timeouts", 0))
        if self.first_error is None and first_error:
            self.first_error = first_error

    def summary_line(self) -> str | None:
        """The summary's line when scores failed: ``reward errors    64 of 64 scores (100%) failed ...``."""
        if not self.failed:
            return None
        every = "every score" if self.failed == self.scored else f"{self.failed / max(self.scored, 1):.0%}"
        return (f"  {'reward errors':<16} {self.failed} of {self.scored} scores failed ({every}) and were scored 0 "
                "(reward_model.on_error=zero; reward/num_errors, reward/num_timeouts)")

    def warning(self) -> str | None:
        """What the end of a run warns when at least :data:`FAILED_SCORES_WARNING_SHARE` of the scores failed."""
        if not self.failed or self.failed < FAILED_SCORES_WARNING_SHARE * self.scored:
            return None
        share = "every reward score" if self.failed == self.scored else f"{self.failed} of {self.scored} reward scores"
        first = f"; the first: {self.first_error}" if self.first_error else ""
        return (f"{share} of this run failed and was scored 0 (reward_model.on_error=zero), so the policy learned "
                f"from zeros, not from the reward function{first}")


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
    rewards: ScoreCounts = field(default_factory=ScoreCounts)
