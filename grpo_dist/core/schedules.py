"""Learning-rate schedules: the multiplier of the peak learning rate at each scheduler step.

Pure Python (no torch): :class:`LRMultiplier` is the callable a ``torch.optim.lr_scheduler.LambdaLR``
takes, and :data:`LR_SCHEDULER_TYPES` is the one list of schedule names that the actor and the
configuration validation (``actor_rollout_ref.actor.optim.lr_scheduler_type``) both read.

The schedule steps once per training step (one ``update_policy`` call), AFTER the update, as in verl:
scheduler step ``s`` is the multiplier used by the ``s``-th update (counting from 0).
"""


import math
from dataclasses import dataclass

__all__ = ["LR_SCHEDULER_TYPES", "check_schedule", "resolve_warmup_steps", "lr_lambda", "LRMultiplier"]

LR_SCHEDULER_TYPES: tuple[str, ...] = ("constant", "cosine")
"""Names of the schedules after warm-up (``actor_rollout_ref.actor.optim.lr_scheduler_type``)."""


def check_schedule(kind: str, *, total_steps: int, min_lr_ratio: float) -> None:
    """``ValueError`` unless ``kind`` is one of :data:`LR_SCHEDULER_TYPES`, ``min_lr_ratio`` is in
    [0, 1], and a ``cosine`` schedule has a length (``total_steps > 0``). The one check of a schedule's
    numbers: the actor's and the critic's settings and :class:`LRMultiplier` call it."""
    if kind not in LR_SCHEDULER_TYPES:
        raise ValueError(f"lr_scheduler_type {kind!r} unknown; valid: {list(LR_SCHEDULER_TYPES)}")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
    if kind == "cosine" and total_steps <= 0:
        raise ValueError("lr_scheduler_type='cosine' needs total_training_steps > 0")


def resolve_warmup_steps(lr_warmup_steps: int | None, ratio: float, total_training_steps: int) -> int:
    """Warm-up length in scheduler steps (verl's rule).

    ``lr_warmup_steps`` when it is ``>= 0``; otherwise (``-1`` or ``None``)
    ``int(ratio * total_training_steps)``. ``ValueError`` when ``ratio`` is outside [0, 1], or when a
    positive ratio is given without ``total_training_steps > 0``.
    """
    if lr_warmup_steps is not None and lr_warmup_steps >= 0:
        return int(lr_warmup_steps)
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"lr_warmup_steps_ratio must be in [0, 1], got {ratio}")
    if ratio > 0 and total_training_steps <= 0:
        raise ValueError("lr_warmup_steps_ratio > 0 needs total_training_steps > 0 (or set lr_warmup_steps)")
    return int(ratio * max(total_training_steps, 0))


def lr_lambda(step: int, *, kind: str, warmup_steps: int, total_steps: int, min_lr_ratio: float,
              num_cycles: float = 0.5, zero_indexed_step: bool = True) -> float:
    """LR multiplier at scheduler step ``step`` (verl's ``get_{constant,cosine}_schedule_with_warmup``).

    constant: ``step / max(1, warmup)`` while ``step < warmup``, then 1.
    (The scheduler steps AFTER each update, so with ``warmup > 0`` the first update runs at
    multiplier 0 and ``actor/lr`` reports the LR the update used.)
    cosine: with ``s = step`` (``step + 1`` when not ``zero_indexed_step``), warm-up
    ``min_lr_ratio + (1 - min_lr_ratio) * s / max(1, warmup)``, then
    ``max(min_lr_ratio, c * cos(2 pi * num_cycles * progress) + i)`` with ``c = (1 - min_lr_ratio) / 2``,
    ``i = (1 + min_lr_ratio) / 2``, ``progress = (s - warmup) / max(1, total - warmup)``;
    ``num_cycles = 0.5`` is one half cosine from 1 down to ``min_lr_ratio``.

    ``kind`` must be one of :data:`LR_SCHEDULER_TYPES` (:func:`check_schedule`).
    """
    if kind == "constant":
        return float(step) / float(max(1, warmup_steps)) if step < warmup_steps else 1.0
    assert kind == "cosine", kind
    if not zero_indexed_step:
        step += 1
    if step < warmup_steps:
        return min_lr_ratio + (1.0 - min_lr_ratio) * float(step) / float(max(1, warmup_steps))
    progress = float(step - warmup_steps) / float(max(1, total_steps - warmup_steps))
    coef, intercept = (1.0 - min_lr_ratio) * 0.5, (1.0 + min_lr_ratio) * 0.5
    return max(min_lr_ratio, math.cos(math.pi * 2.0 * num_cycles * progress) * coef + intercept)


@dataclass
class LRMultiplier:
    """:func:`lr_lambda` with its parameters bound: ``LambdaLR(optimizer, LRMultiplier(...))``.

    An object rather than a closure so that it pickles, and so that ``LambdaLR.state_dict()`` saves
    its fields (``kind``, ``warmup_steps``, ``total_steps``, ``min_lr_ratio``) with a checkpoint.
    """

    kind: str
    warmup_steps: int
    total_steps: int
    min_lr_ratio: float
    num_cycles: float = 0.5
    zero_indexed_step: bool = True

    def __post_init__(self) -> None:
        check_schedule(self.kind, total_steps=self.total_steps, min_lr_ratio=self.min_lr_ratio)

    def __call__(self, step: int) -> float:
        return lr_lambda(
            step,
            kind=self.kind,
            warmup_steps=self.warmup_steps,
            total_steps=self.total_steps,
            min_lr_ratio=self.min_lr_ratio,
            num_cycles=self.num_cycles,
            zero_indexed_step=self.zero_indexed_step,
        )
