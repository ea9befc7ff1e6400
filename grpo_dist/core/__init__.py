"""Pure GRPO/PPO math: advantage estimators, policy losses (and their registry), loss aggregation,
the critic's value loss, KL estimators, learning-rate schedules, and diagnostics (the rollout-vs-actor
probability gap).

Depends on torch only (no torch.distributed, Ray, vLLM or Hydra) and on nothing else in grpo_dist.
"""

from grpo_dist.core.advantages import (
    AdvEstimatorFn,
    AdvEstimatorSpec,
    compute_gae_advantage,
    compute_grpo_advantage,
    compute_grpo_process_advantage,
    compute_reinforce_plus_plus_advantage,
    compute_rloo_advantage,
    get_adv_estimator,
    list_adv_estimators,
    masked_whiten,
    register_adv_estimator,
    scores_from_token_rewards,
)
from grpo_dist.core.diagnostics import rollout_probs_diff
from grpo_dist.core.kl import (
    KL_ALIASES,
    KL_KINDS,
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
    LOSS_AGG_MODES,
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
    get_policy_loss,
    list_policy_losses,
    register_policy_loss,
    vanilla_policy_loss,
)
from grpo_dist.core.schedules import LR_SCHEDULER_TYPES, LRMultiplier, lr_lambda, resolve_warmup_steps
from grpo_dist.core.value import explained_variance, value_loss

__all__ = [
    # advantages
    "AdvEstimatorFn",
    "AdvEstimatorSpec",
    "register_adv_estimator",
    "get_adv_estimator",
    "list_adv_estimators",
    "scores_from_token_rewards",
    "masked_whiten",
    "compute_grpo_advantage",
    "compute_rloo_advantage",
    "compute_reinforce_plus_plus_advantage",
    "compute_gae_advantage",
    "compute_grpo_process_advantage",
    # losses
    "LOSS_AGG_MODES",
    "AggSpec",
    "agg_loss",
    "global_counts",
    "masked_mean",
    "ppo_clip_policy_loss",
    "entropy_from_logits",
    "logprobs_from_logits",
    # policy-loss registry
    "PolicyLossParams",
    "PolicyLossFn",
    "PolicyLossSpec",
    "RESERVED_METRIC_NAMES",
    "register_policy_loss",
    "get_policy_loss",
    "list_policy_losses",
    "vanilla_policy_loss",
    # the critic
    "value_loss",
    "explained_variance",
    # learning-rate schedules
    "LR_SCHEDULER_TYPES",
    "LRMultiplier",
    "lr_lambda",
    "resolve_warmup_steps",
    # kl
    "KL_KINDS",
    "KL_ALIASES",
    "canonical_kl_kind",
    "kl_penalty",
    "kl_full",
    "FixedKLController",
    "AdaptiveKLController",
    "KLController",
    "make_kl_controller",
    "apply_kl_penalty",
    # diagnostics
    "rollout_probs_diff",
]
