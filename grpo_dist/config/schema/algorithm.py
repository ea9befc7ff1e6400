"""``algorithm.*``: advantage estimation, the in-reward KL penalty (``kl_ctrl``), rollout
correction, dynamic sampling (``filter_groups``) and verl's PF-PPO keys (accepted only off)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from grpo_dist.config.fields import F, S
from grpo_dist.config.sections.engine import off_feature
from grpo_dist.core.advantage_registry import list_adv_estimators


@dataclass
class KLCtrlConfig:
    type: str = F("fixed", "KL-in-reward controller: fixed | adaptive")
    kl_coef: float = F(0.001, "initial coefficient of the KL penalty in the reward")
    horizon: int = F(10000, "adaptive controller horizon")
    target_kl: float = F(0.1, "adaptive controller target KL")


@dataclass
class RolloutCorrectionConfig:
    rollout_is: Optional[str] = F(None, "importance weights against the rollout engine's log-probs: null | token | sequence")
    rollout_is_threshold: Any = F(
        2.0, "a number u > 1: truncate the weights at u (TIS); a band 'lo_hi' (quoted, e.g. \"0.5_2.0\"): weight 0 outside it (IcePop)"
    )
    rollout_rs: Optional[str] = F(
        None, "rejection sampling, comma-separated: token_k1|k2|k3, seq_sum_k1|k2|k3, seq_mean_k1|k2|k3, seq_max_k2|k3; null = off"
    )
    rollout_rs_threshold: Any = F(
        None, "rejection thresholds, one per rollout_rs option or one shared: k1 options a ratio band 'lo_hi' or u (the band 1/u..u), others an upper bound"
    )
    bypass_mode: bool = F(False, "use the rollout log-probs as the old log-probs (no old-log-prob forward); correction in the loss")
    loss_type: str = F("ppo_clip", "bypass mode's loss: ppo_clip (PPO clip against the rollout policy) | reinforce (-w * A * logp)")
    rollout_is_batch_normalize: bool = F(False, "divide the importance weights by their batch mean")


@dataclass
class FilterGroupsConfig:
    enable: bool = F(False, "dynamic sampling (DAPO): drop prompts whose responses all score the same, generate more")
    metric: Optional[str] = F(
        "acc", "what must differ within a prompt's responses: acc | score (the reward function's score) | seq_reward | "
        "seq_final_reward (null, verl's default, is accepted while filter_groups is off)")
    max_num_gen_batches: int = F(0, "most generation batches per step; <= 0 = no limit")
    on_exhausted: str = F("error", "at max_num_gen_batches with too few prompts: error | train (on the prompts kept, whole mini-batches)")
    max_inflight_gen_batches: int = F(1, "generation batches in flight at once (verl's asynchronous refill)", off_feature(
        "generating several batches ahead", "batches are generated one after another; leave it at 1"))


@dataclass
class PFPPOConfig:
    reweight_method: str = F("pow", "how responses are reweighted by reward: pow | max_min | max_random")
    weight_pow: float = F(2.0, "exponent of the pow method")


@dataclass
class AlgorithmConfig:
    adv_estimator: str = F("grpo", "advantage estimator: " + " | ".join(list_adv_estimators()) + " (docs/algorithms.md)")
    norm_adv_by_std_in_grpo: bool = F(True, "divide group-relative advantages by the group std (false = Dr. GRPO)")
    gamma: float = F(1.0, "discount factor (gae, reinforce_plus_plus)")
    lam: float = F(1.0, "GAE lambda")
    use_kl_in_reward: bool = F(False, "subtract a KL penalty from the reward (PPO style) instead of/besides the KL loss")
    kl_penalty: str = F("kl", "KL estimator of the in-reward penalty: kl | abs | mse | low_var_kl")
    kl_ctrl: KLCtrlConfig = S(KLCtrlConfig, "coefficient control of the in-reward KL penalty")
    rollout_correction: RolloutCorrectionConfig = S(
        RolloutCorrectionConfig, "rollout correction: importance weights and rejection against the rollout engine's log-probs"
    )
    filter_groups: FilterGroupsConfig = S(FilterGroupsConfig, "dynamic sampling (DAPO's group filtering)")
    use_pf_ppo: bool = F(False, "policy filtration (PF-PPO): after the advantages, resample the step's responses with "
                                "replacement weighted by their rewards (as verl: with adv_estimator=gae only)")
    pf_ppo: PFPPOConfig = S(PFPPOConfig, "PF-PPO's weighting (read with algorithm.use_pf_ppo)")
