"""The step's token-level rewards, between the reward stage and the advantage estimator.

``token_level_rewards`` = ``token_level_scores``, minus the KL penalty to the reference when
``algorithm.use_kl_in_reward`` (the in-reward KL controller then advances by the step's responses,
as verl's does); and when the rollout engine returned its log-probs, the trainer's and the engine's
probabilities are compared (``training/rollout_probs_diff_*``) and the rollout correction applied
(``rollout_corr/*``: importance weights and rejection, when set).
"""

from __future__ import annotations

from grpo_dist.batch import Batch
from grpo_dist.core.diagnostics import rollout_probs_diff
from grpo_dist.core.kl import apply_kl_penalty
from grpo_dist.core.rollout_correction import RolloutCorrectionParams
from grpo_dist.trainer.rollout_correction import apply_rollout_correction

__all__ = ["token_level_rewards"]


def token_level_rewards(batch: Batch, *, kl_ctrl, use_kl_in_reward: bool, kl_penalty: str,
                        rc: RolloutCorrectionParams) -> dict[str, float]:
    """Write ``token_level_rewards`` [B, R] into ``batch`` (and the rollout correction's weights or
    rejections); return the metrics: ``actor/reward_kl_penalty{,_coeff}`` with KL in the reward,
    ``training/rollout_probs_diff_*`` and ``rollout_corr/*`` with the engine's log-probs."""
    m: dict[str, float] = {}
    batch["token_level_rewards"] = batch["token_level_scores"]
    if use_kl_in_reward:
        batch["token_level_rewards"], kl = apply_kl_penalty(
            batch["token_level_scores"], batch["old_log_probs"], batch["ref_log_prob"], batch["response_mask"],
            kl_coef=kl_ctrl.value, kind=kl_penalty)
        m.update({"actor/reward_kl_penalty": kl, "actor/reward_kl_penalty_coeff": kl_ctrl.value})
        # the controller advances by the step's responses (verl: the batch size, as in TRL)
        kl_ctrl.update(kl, n_steps=len(batch))
    if "rollout_log_probs" in batch and not rc.bypass:  # the trainer's log-probs vs the engine's
        m.update(rollout_probs_diff(batch["rollout_log_probs"], batch["old_log_probs"], batch["response_mask"]))
        m.update(apply_rollout_correction(batch, rc))  # rollout_corr/*; weights and rejection if set
    return m
