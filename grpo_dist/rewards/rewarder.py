"""Rewards for a batch of generated responses: decode, score, place the scores on tokens.

:class:`BatchRewarder` turns response token ids into texts (special tokens skipped), has a
:class:`~grpo_dist.rewards.manager.RewardScorer` score them, and returns the scores per response
and, when asked, per token: the outcome score on the last response token, or with process
supervision each step's reward on the token that ends the step
(:func:`~grpo_dist.rewards.tokens.place_step_rewards`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from grpo_dist.rewards.manager import RewardScorer
from grpo_dist.rewards.tokens import place_scores_on_last_token, place_step_rewards


@dataclass
class RewardResult:
    """The rewards of one batch of B responses (R = padded response length).

    Attributes:
        scores_B: [B] float32, one score per response.
        token_level_scores_BR: [B, R] float32, the rewards on tokens (zero elsewhere); None unless
            asked for with ``token_level``.
        step_end_mask_BR: [B, R] float32, 1 on the tokens that end a step; None unless asked for
            with ``step_rewards``.
        stats: what the scorer counted (``reward/num_errors``, ``reward/num_timeouts``).
        first_error: with ``reward_model.on_error=zero``, the message of the batch's first failed
            sample (function, file and line, sample); None when none failed.
        extra: the scorer's extra values (verl's ``reward_extra_info``): for each key other than ``score``
            that a dict result had, and ``acc`` for number results, B values (None where a sample had no such
            key; :meth:`~grpo_dist.rewards.manager.RewardScorer.score_batch`).
    """

    scores_B: torch.Tensor
    token_level_scores_BR: torch.Tensor | None
    step_end_mask_BR: torch.Tensor | None
    stats: dict[str, float]
    first_error: str | None = None
    extra: dict[str, list] = field(default_factory=dict)


class BatchRewarder:
    """Decodes a batch of responses with ``tokenizer`` and scores them with ``scorer``."""

    def __init__(self, tokenizer: Any, scorer: RewardScorer) -> None:
        self.tokenizer = tokenizer
        self.scorer = scorer

    def decode(self, ids_B: Sequence[Sequence[int]]) -> list[str]:
        """The texts the scorer sees: special tokens skipped, the tokenizer's own clean-up setting. Step
        ends are found by decoding prefixes of the responses with this same call."""
        return self.tokenizer.batch_decode([list(ids) for ids in ids_B], skip_special_tokens=True)

    def compute(
        self,
        responses_BR: torch.Tensor,
        response_mask_BR: torch.Tensor,
        data_sources: Sequence[str],
        ground_truths: Sequence[Any],
        extra_infos: Sequence[dict | None],
        *,
        token_level: bool,
        step_rewards: bool,
        optional_steps: bool = False,
    ) -> RewardResult:
        """Score B responses.

        Args:
            responses_BR: [B, R] token ids of the responses (padded).
            response_mask_BR: [B, R] 1 on response tokens (need not be contiguous), 0 on padding.
            data_sources, ground_truths, extra_infos: B each, as the scorer takes them.
            token_level: also return ``token_level_scores_BR``.
            step_rewards: process supervision (needs ``token_level``): the reward function returns
                ``{"score": ..., "step_rewards": [one per line]}`` and each step's reward goes on the
                token that ends the step; ``step_end_mask_BR`` marks those tokens.
            optional_steps: with ``step_rewards``, a function that returns no step rewards is not an
                error: its score goes on the last token and ``step_end_mask_BR`` is None.
        """
        if responses_BR.dim() != 2 or responses_BR.shape != response_mask_BR.shape:
            raise ValueError(f"expected responses and response mask of the same shape [B, R], got "
                             f"{tuple(responses_BR.shape)} and {tuple(response_mask_BR.shape)}")
        if step_rewards and not token_level:
            raise ValueError("step_rewards=True places rewards on tokens; it needs token_level=True")
        ids_B = [ids[m.bool()].tolist() for ids, m in zip(responses_BR, response_mask_BR)]
        texts_B = self.decode(ids_B)
        scores, extra, stats = self.scorer.score_batch(list(data_sources), texts_B, list(ground_truths),
                                                       list(extra_infos))
        scores_B = torch.tensor(scores, dtype=torch.float32)
        token_level_BR = step_end_BR = None
        if step_rewards and optional_steps and "step_rewards" not in extra:
            step_rewards = False
        if step_rewards:
            per_step = extra["step_rewards"] if "step_rewards" in extra else [None] * len(texts_B)
            token_level_BR, step_end_BR = place_step_rewards(per_step, texts_B, ids_B, response_mask_BR, self.decode)
        elif token_level:
            token_level_BR = place_scores_on_last_token(scores_B, response_mask_BR)
        return RewardResult(scores_B=scores_B, token_level_scores_BR=token_level_BR,
                            step_end_mask_BR=step_end_BR, stats={k: float(v) for k, v in stats.items()},
                            first_error=self.scorer.last_problem, extra=extra)
