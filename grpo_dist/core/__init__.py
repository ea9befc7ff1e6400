"""Pure GRPO/PPO math: advantage estimators, policy losses (and their registry), loss aggregation,
the critic's value loss, KL estimators, rollout correction, group filtering, learning-rate
schedules, diagnostics (the rollout-vs-actor probability gap), and the reward model's loss and
replay share.

Depends on torch only (no torch.distributed, Ray, vLLM or Hydra) and on nothing else in grpo_dist.
"""

from grpo_dist.core import advantages, group_filter, kl, losses, policy_loss, value
from grpo_dist.core.advantages import (
    AdvantageInputs,
    AdvantageParams,
    AdvEstimatorFn,
    AdvEstimatorSpec,
    compute_gae_advantage,
    compute_grpo_advantage,
    compute_gpg_advantage,
    compute_grpo_passk_advantage,
    compute_grpo_process_advantage,
    compute_opo_advantage,
    compute_reinforce_plus_plus_advantage,
    compute_reinforce_plus_plus_baseline_advantage,
    compute_remax_advantage,
    compute_rloo_advantage,
    get_adv_estimator,
    list_adv_estimators,
    masked_whiten,
    register_adv_estimator,
    scores_from_token_rewards,
)
from grpo_dist.core.diagnostics import rollout_probs_diff
from grpo_dist.core.group_filter import groups_with_spread
from grpo_dist.core.kl import (
    KL_ALIASES,
    KL_KINDS,
    STRAIGHT_THROUGH_KL_ALIASES,
    STRAIGHT_THROUGH_KL_KINDS,
    AdaptiveKLController,
    FixedKLController,
    KLController,
    apply_kl_penalty,
    canonical_kl_kind,
    kl_full,
    kl_penalty,
    make_kl_controller,
)
from grpo_dist.core.losses import (
    ALL_LOSS_AGG_MODES,
    LOSS_AGG_MODES,
    UNNORMALISED_LOSS_AGG_MODES,
    AggSpec,
    agg_loss,
    entropy_from_logits,
    global_counts,
    logprobs_from_logits,
    masked_mean,
    ppo_clip_policy_loss,
)
from grpo_dist.core.policy_loss import (
    RESERVED_METRIC_NAMES,
    PolicyLossFn,
    PolicyLossParams,
    PolicyLossSpec,
    bypass_mode_policy_loss,
    cispo_policy_loss,
    clip_cov_policy_loss,
    dppo_kl_policy_loss,
    dppo_tv_policy_loss,
    dro_policy_loss,
    geo_mean_policy_loss,
    get_policy_loss,
    gpg_policy_loss,
    gspo_policy_loss,
    kl_cov_policy_loss,
    list_policy_losses,
    register_policy_loss,
    sapo_policy_loss,
    vanilla_policy_loss,
)
from grpo_dist.core.reward_model import labelled_bce, replay_count, verifier_agreement
from grpo_dist.core.rollout_correction import (
    RejectionCriterion,
    RolloutCorrectionParams,
    correct,
    importance_weights,
    mismatch_metrics,
    rejection_mask,
)
from grpo_dist.core.schedules import LR_SCHEDULER_TYPES, LRMultiplier, lr_lambda, resolve_warmup_steps
from grpo_dist.core.value import explained_variance, value_loss

# a module with its own __all__ is exported whole; the others list what the package exports of them
__all__ = [
    *advantages.__all__,
    *losses.__all__,
    *policy_loss.__all__,
    *value.__all__,
    *kl.__all__,
    *group_filter.__all__,
    # rollout correction
    "RolloutCorrectionParams",
    "RejectionCriterion",
    "importance_weights",
    "rejection_mask",
    "mismatch_metrics",
    "correct",
    # learning-rate schedules
    "LR_SCHEDULER_TYPES",
    "LRMultiplier",
    "lr_lambda",
    "resolve_warmup_steps",
    # diagnostics
    "rollout_probs_diff",
    # reward models
    "labelled_bce",
    "verifier_agreement",
    "replay_count",
]
