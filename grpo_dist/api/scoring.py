"""Scoring and advantages: ``reward_fn`` on a rollout's completions (checked: one finite number per
completion), and the registered estimator's advantages from those rewards.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import torch

from grpo_dist.api.sampling import Rollout
from grpo_dist.core.advantages import AdvantageInputs, AdvantageParams, AdvEstimatorSpec

RewardFn = Callable[[list[Any], list[Any]], Sequence[float]]


def score_rollout(rollout: Rollout, reward_fn: RewardFn, *, tokenizer: Any, prompt_texts: list[str] | None) -> torch.Tensor:
    """``reward_fn(completions, prompts)`` on the rollout: a float32 CPU tensor [B]. Token ids without
    padding, or with a tokenizer strings (completions decoded without special tokens; prompts as
    given in ``prompt_texts``, else decoded)."""
    completions: list[Any] = rollout.completions()
    prompts: list[Any] = rollout.prompts()
    if tokenizer is not None:
        completions = tokenizer.batch_decode([c.tolist() for c in completions], skip_special_tokens=True)
        if prompt_texts is not None:
            prompts = [prompt_texts[g] for g in rollout.group_ids.tolist()]
        else:
            prompts = tokenizer.batch_decode([p.tolist() for p in prompts], skip_special_tokens=True)
    rewards = reward_fn(completions, prompts)
    return check_rewards(rewards, len(rollout))


def check_rewards(rewards: Any, count: int) -> torch.Tensor:
    """One finite real number per completion, as a float32 CPU tensor [count]; ``ValueError`` otherwise.

    A list, tuple, 1-D tensor or array of Python or numpy numbers (bools count as 0/1)."""
    if isinstance(rewards, torch.Tensor) and rewards.dim() != 1:
        raise ValueError(f"reward_fn must return {count} numbers, got a tensor of shape {tuple(rewards.shape)}")
    if hasattr(rewards, "tolist") and not isinstance(rewards, (list, tuple)):
        rewards = rewards.tolist()
    if not isinstance(rewards, (list, tuple)):
        raise ValueError(f"reward_fn must return a list of {count} numbers, got {type(rewards).__name__}")
    if len(rewards) != count:
        raise ValueError(f"reward_fn returned {len(rewards)} rewards for {count} completions: one number per completion")
    out = []
    for i, v in enumerate(rewards):
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            v = v.item()
        if not isinstance(v, numbers.Real):
            raise ValueError(f"reward_fn returned {v!r} ({type(v).__name__}) for completion {i}: rewards must be numbers")
        if not math.isfinite(v):
            raise ValueError(f"reward_fn returned {v} for completion {i}: rewards must be finite")
        out.append(float(v))
    return torch.tensor(out, dtype=torch.float32)


def advantages(estimator: AdvEstimatorSpec, rollout: Rollout, rewards_B: torch.Tensor, *,
               norm_adv_by_std: bool) -> torch.Tensor:
    """The estimator's advantages [B, R] (float32) of the rollout's completions, each reward placed on
    its completion's last token (the trainer's ``token_level_scores``) and each completion grouped
    with the others of its prompt (``index_B`` = ``group_ids``). ``rewards_B`` is on the rollout's device."""
    B, R = rollout.responses.shape
    mask_BR = rollout.response_mask
    scores_BR = torch.zeros(B, R, device=rewards_B.device)
    last_B = (mask_BR.sum(-1).long() - 1).clamp(min=0)
    scores_BR[torch.arange(B, device=rewards_B.device), last_B] = rewards_B
    inputs = AdvantageInputs(token_level_rewards_BT=scores_BR, response_mask_BT=mask_BR,
                             index_B=rollout.group_ids.tolist())
    advantages_BR, _ = estimator(inputs, AdvantageParams(norm_adv_by_std=norm_adv_by_std))
    return advantages_BR.float()
