"""How the reward sources' scores make the reward: one weighted sum for every run.

:func:`weighted_sum` is the rule (the run's sources and their weights: :mod:`grpo_dist.config.reward_sources`)::

    reward[...] = sum over sources s with w_s != 0 of  w_s * score_s[...]

over per-response scores ``[B]`` or per-token scores ``[B, R]`` (outcome scores on the last response
token, step scores on the tokens that end a step). A source with weight 0 is left out of the sum (it
may still be computed for its metrics, or as iterative RL's labels).

verl's keys name the weights of the run with one reward model (``reward_model.combine``,
:class:`RewardCombine`):

- ``verl`` (default, verl's behaviour): the reward model's score is the reward; when a custom reward
  function is set (``custom_reward_function.path``), the function's score is the reward instead.
- ``weighted``: ``rm_weight * rm + rule_weight * rule`` (either weight may be 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the configuration reads this module's rule without torch
    import torch

__all__ = ["COMBINE_MODES", "RewardCombine", "weighted_sum"]

COMBINE_MODES: tuple[str, ...] = ("verl", "weighted")


@dataclass(frozen=True)
class RewardCombine:
    """The combination rule of a run.

    Attributes:
        mode: one of :data:`COMBINE_MODES`.
        rm_weight, rule_weight: the weights of ``weighted``.
        custom_function: whether a custom reward function is set (``verl`` mode then takes its score).
    """

    mode: str = "verl"
    rm_weight: float = 1.0
    rule_weight: float = 1.0
    custom_function: bool = False

    def __post_init__(self) -> None:
        if self.mode not in COMBINE_MODES:
            raise ValueError(f"combine mode {self.mode!r} unknown; valid: {', '.join(COMBINE_MODES)}")

    @property
    def weights(self) -> tuple[float, float]:
        """``(reward model's weight, rule score's weight)`` of this rule in :func:`weighted_sum`."""
        if self.mode == "verl":
            return (0.0, 1.0) if self.custom_function else (1.0, 0.0)
        return float(self.rm_weight), float(self.rule_weight)


def weighted_sum(parts: list[tuple[float, torch.Tensor]]) -> torch.Tensor:
    """``sum_s w_s * X_s`` over ``parts = [(w_s, X_s), ...]`` (all the same shape, [B] or [B, R]), in float32,
    leaving out the terms with ``w_s == 0``; zeros (on the scores' device) when every weight is 0.
    ``ValueError`` when the shapes differ or ``parts`` is empty."""
    if not parts:
        raise ValueError("no scores to combine")
    shape = parts[0][1].shape
    for _, x in parts:
        if x.shape != shape:
            raise ValueError(f"scores of shapes {tuple(shape)} and {tuple(x.shape)} cannot be combined")
    out = None
    for w, x in parts:
        if w == 0:
            continue
        term = x.float() if w == 1 else w * x.float()
        out = term.clone() if out is None else out + term
    return out if out is not None else parts[0][1].float().new_zeros(shape)
