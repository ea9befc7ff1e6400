"""How a learned reward model's scores and the rule-based (or custom function's) scores make the reward.

Modes (``reward_model.combine``):

- ``verl`` (default, verl's behaviour): the reward model's score is the reward; when a custom reward
  function is set (``custom_reward_function.path``), the function's score is the reward instead.
- ``weighted``: ``rm_weight * rm + rule_weight * rule`` (either weight may be 0).

Scores are combined where they lie: per response ``[B]``, or per token ``[B, R]`` (outcome scores on
the last response token, step scores on the tokens that end a step). The rule side is None when no
rule score was computed (``verl`` mode without a custom function).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["COMBINE_MODES", "RewardCombine", "combine_scores"]

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
    def uses_rule(self) -> bool:
        """Whether the reward reads the rule-based (or custom) score."""
        if self.mode == "verl":
            return self.custom_function
        return self.rule_weight != 0

    @property
    def uses_rm(self) -> bool:
        """Whether the reward reads the reward model's score."""
        if self.mode == "verl":
            return not self.custom_function
        return self.rm_weight != 0


def combine_scores(rule: RewardCombine, rm_X: torch.Tensor, rule_X: torch.Tensor | None) -> torch.Tensor:
    """The reward from the reward model's scores ``rm_X`` and the rule scores ``rule_X`` (same shape,
    [B] or [B, R]; ``rule_X`` None when not computed) under ``rule`` (module docstring).

    ``ValueError`` when the mode needs the rule scores and ``rule_X`` is None, or the shapes differ.
    """
    if rule.uses_rule and rule_X is None:
        raise ValueError(f"combine mode {rule.mode!r} reads the rule-based scores, and none were computed")
    if rule_X is not None and rule_X.shape != rm_X.shape:
        raise ValueError(f"reward-model scores {tuple(rm_X.shape)} and rule scores {tuple(rule_X.shape)} differ in shape")
    if rule.mode == "verl":
        out = rule_X if rule.custom_function else rm_X
        return out.float().clone()
    out = rule.rm_weight * rm_X.float()
    if rule_X is not None and rule.rule_weight != 0:
        out = out + rule.rule_weight * rule_X.float()
    return out
