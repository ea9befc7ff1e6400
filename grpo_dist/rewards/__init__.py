"""Rewards: rule-based scorers and their registry, user functions loaded by path, batch scoring in
worker processes (a general :class:`TaskPool` underneath), and the rewards of a batch of generated
responses: decoded, scored and placed on tokens (:class:`BatchRewarder`).

``BatchRewarder``, ``RewardResult`` and ``place_scores_on_last_token`` are imported lazily so that
reward worker processes, which import this package, do not pay for importing torch.
"""

from grpo_dist.rewards.custom import CustomRewardFn, load_custom_reward_fn
from grpo_dist.rewards.manager import RewardError, RewardScorer
from grpo_dist.rewards.pool import TaskOutcome, TaskPool
from grpo_dist.rewards.scorers import (
    DEFAULT_REGISTRY,
    ScorerRegistry,
    default_compute_score,
    get_scorer,
    gsm8k_score,
    math_score,
    register_scorer,
)

__all__ = [
    "BatchRewarder",
    "DEFAULT_REGISTRY",
    "CustomRewardFn",
    "RewardError",
    "RewardResult",
    "RewardScorer",
    "ScorerRegistry",
    "TaskOutcome",
    "TaskPool",
    "default_compute_score",
    "get_scorer",
    "gsm8k_score",
    "load_custom_reward_fn",
    "math_score",
    "place_scores_on_last_token",
    "register_scorer",
]


def __getattr__(name):
    if name == "place_scores_on_last_token":
        from grpo_dist.rewards.tokens import place_scores_on_last_token

        return place_scores_on_last_token
    if name in ("BatchRewarder", "RewardResult"):
        from grpo_dist.rewards import rewarder

        return getattr(rewarder, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
