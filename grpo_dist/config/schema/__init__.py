"""The configuration schema: verl's key tree as typed dataclasses.

This package is the single source of every default. ``conf/grpo_trainer.yaml`` and
``docs/configuration.md`` are generated from it (``python -m grpo_dist.config.docgen``) and a
test keeps them in step, so a default can never be written in two places that drift.

Each field carries its one-line help text in ``metadata["help"]``; the generator writes it as the
YAML comment. Defaults follow verl's ``ppo_trainer.yaml`` except where the no-argument run must be
the embedded CPU job (data files, model, sizes, estimator, KL loss, device, logger); those
differences are listed in ``VERL_DEFAULT_DIFFERENCES`` and in the generated reference.

Cross-key rules (divisibility, ranges, files that must exist) live in ``validate.py``; both raise
:class:`ConfigError`, whose message is printed as is.

One module per section, as verl splits its config by role: :mod:`~.data` (``data``),
:mod:`~.model`, :mod:`~.actor`, :mod:`~.ref` and :mod:`~.rollout` (``actor_rollout_ref``'s four
roles, joined in :mod:`~.actor_rollout_ref`), :mod:`~.critic`, :mod:`~.algorithm`, :mod:`~.reward`
(``reward_model``, ``reward``, ``custom_reward_function``), :mod:`~.trainer` and
:mod:`~.ray_kwargs`; :mod:`~.common` holds the field states several sections share and
:mod:`~.notes` the documentation tables. verl's sections for features not built here are in
:mod:`grpo_dist.config.sections`. This module defines the root, :class:`GRPOConfig`, and
re-exports every section's names, so ``from grpo_dist.config.schema import X`` is the one import
the rest of the package uses; the submodules import each other directly, never from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from grpo_dist.config.fields import F, ConfigError, Honoured, NoOp, Refused, S
from grpo_dist.config.schema.actor import (
    TEXT_MODELS,
    ActorConfig,
    CheckpointConfig,
    FSDPConfig,
    OptimConfig,
    PolicyLossConfig,
)
from grpo_dist.config.schema.actor_rollout_ref import ActorRolloutRefConfig
from grpo_dist.config.schema.algorithm import (
    AlgorithmConfig,
    FilterGroupsConfig,
    KLCtrlConfig,
    PFPPOConfig,
    RolloutCorrectionConfig,
)
from grpo_dist.config.schema.async_training import (
    VERL_ASYNC_DEFAULTS,
    AsyncCheckpointEngineConfig,
    AsyncFilterConfig,
    AsyncTrainingConfig,
    SuperSampleConfig,
)
from grpo_dist.config.schema.common import COPY_OF_N, FSDP2_ONLY, ONE_TIMEOUT, SCHEDULE_LENGTH
from grpo_dist.config.schema.critic import (
    CRITIC_READS_ACTOR_IDS,
    CriticCheckpointConfig,
    CriticConfig,
    CriticFSDPConfig,
    CriticModelConfig,
    CriticOptimConfig,
)
from grpo_dist.config.schema.data import BATCH_CONTENTS, DATA_SPEED, TEXT_ONLY, DataConfig
from grpo_dist.config.schema.model import ModelConfig
from grpo_dist.config.schema.notes import INTERPOLATED_HELP, VERL_DEFAULT_DIFFERENCES
from grpo_dist.config.schema.ray_kwargs import RayInitConfig, RayKwargsConfig
from grpo_dist.config.schema.ref import RefConfig, RefFSDPConfig
from grpo_dist.config.schema.reward import (
    CustomRewardFunctionConfig,
    OverlongBufferConfig,
    RewardConfig,
    RewardKwargsConfig,
    RewardModelConfig,
    RewardModelModelConfig,
    RewardRewardModelConfig,
    RMFSDPConfig,
    RMIterativeConfig,
    RMProcessConfig,
    RMWrapPolicyConfig,
)
from grpo_dist.config.schema.rollout import (
    ENGINE_SPEED,
    AgentConfig,
    CustomAsyncServerConfig,
    EngineKwargsConfig,
    MultiTurnConfig,
    RolloutConfig,
    ValKwargsConfig,
)
from grpo_dist.config.schema.trainer import DEFAULT_TRAIN_FILES, VERL_TOTAL_EPOCHS, TrainerConfig
from grpo_dist.config.sections.engine import UNUSED_WITHOUT
from grpo_dist.config.sections.features import (
    DistillationConfig,
    EarlyRewardManagerConfig,
    SandboxFusionConfig,
    SkipConfig,
    TransferQueueConfig,
    sandbox_section,
)
from grpo_dist.config.sections.profiler import GlobalProfilerConfig, global_profiler_section


@dataclass
class RolloutPoolConfig:
    """The rollout's own devices with ``actor_rollout_ref.hybrid_engine=false`` (verl's top-level ``rollout``
    section of its one-step-off and fully asynchronous recipes); unused with the hybrid engine."""

    nnodes: int = F(1, "nodes of the rollout's own devices (with actor_rollout_ref.hybrid_engine=false)")
    n_gpus_per_node: int = F(1, "devices per node of the rollout's own (with trainer.device=cpu: rollout ranks per node, "
                                "one core each)")
    total_rollout_steps: Optional[int] = F(
        None, "fully asynchronous training (async_training.*): prompts to generate in the whole run; training steps "
              "= total_rollout_steps / (require_batches x ppo_mini_batch_size); null: trainer.total_training_steps / "
              "total_epochs decide (verl: 100)")
    test_freq: Optional[int] = F(
        None, "fully asynchronous training: validate every N weight syncs (every N x trigger_parameter_sync_step "
              "steps); null: trainer.test_freq (verl: 1)")


@dataclass
class GRPOConfig:
    data: DataConfig = S(DataConfig, "prompt data")
    actor_rollout_ref: ActorRolloutRefConfig = S(ActorRolloutRefConfig, "policy, reference and rollout")
    critic: CriticConfig = S(CriticConfig, "the critic: a value model trained alongside the policy (PPO with GAE)")
    algorithm: AlgorithmConfig = S(AlgorithmConfig, "advantage estimation and KL in reward")
    reward_model: RewardModelConfig = S(RewardModelConfig, "reward scoring")
    reward: RewardConfig = S(RewardConfig, "reward arguments (verl's newer section)")
    custom_reward_function: CustomRewardFunctionConfig = S(CustomRewardFunctionConfig, "a user-supplied reward function")
    trainer: TrainerConfig = S(TrainerConfig, "the training loop")
    rollout: RolloutPoolConfig = S(RolloutPoolConfig, "the rollout's own devices (actor_rollout_ref.hybrid_engine=false)")
    async_training: AsyncTrainingConfig = S(AsyncTrainingConfig, "fully asynchronous training (verl's fully_async_policy); "
                                            "on when any key here is given; needs actor_rollout_ref.hybrid_engine=false")
    filter: AsyncFilterConfig = S(AsyncFilterConfig, "verl's sample filter of fully asynchronous training (not built here)")
    super_sample: SuperSampleConfig = S(SuperSampleConfig, "verl's sample grouping of fully asynchronous training "
                                        "(not built here)")
    ray_kwargs: RayKwargsConfig = S(RayKwargsConfig, "Ray")
    reward_manager: EarlyRewardManagerConfig = S(EarlyRewardManagerConfig, "the reward manager (verl's early-2026 section)")
    sandbox_fusion: SandboxFusionConfig = sandbox_section("verl's top-level section")
    global_profiler: GlobalProfilerConfig = global_profiler_section()
    distillation: DistillationConfig = S(DistillationConfig, "on-policy distillation (not built here: accepted only off)",
                                         NoOp(UNUSED_WITHOUT.format("distillation.enabled")))
    transfer_queue: TransferQueueConfig = S(TransferQueueConfig, "verl's transfer queue (not built here: accepted only off)",
                                            NoOp(UNUSED_WITHOUT.format("transfer_queue.enable")))
    skip: SkipConfig = S(SkipConfig, "replaying cached stages (not built here: accepted only off)",
                         NoOp(UNUSED_WITHOUT.format("skip.<stage>.enable")))


__all__ = [
    "AsyncCheckpointEngineConfig",
    "AsyncFilterConfig",
    "AsyncTrainingConfig",
    "SuperSampleConfig",
    "VERL_ASYNC_DEFAULTS",
    # field declarations and the error type (grpo_dist.config.fields)
    "ConfigError",
    "F",
    "Honoured",
    "NoOp",
    "Refused",
    "S",
    # field states
    "BATCH_CONTENTS",
    "COPY_OF_N",
    "CRITIC_READS_ACTOR_IDS",
    "DATA_SPEED",
    "ENGINE_SPEED",
    "FSDP2_ONLY",
    "ONE_TIMEOUT",
    "SCHEDULE_LENGTH",
    "TEXT_MODELS",
    "TEXT_ONLY",
    # the root and its sections, in key order
    "GRPOConfig",
    "DataConfig",
    "ActorRolloutRefConfig",
    "ModelConfig",
    "ActorConfig",
    "PolicyLossConfig",
    "OptimConfig",
    "FSDPConfig",
    "CheckpointConfig",
    "RefConfig",
    "RefFSDPConfig",
    "RolloutConfig",
    "ValKwargsConfig",
    "EngineKwargsConfig",
    "MultiTurnConfig",
    "AgentConfig",
    "CustomAsyncServerConfig",
    "CriticConfig",
    "CriticModelConfig",
    "CriticOptimConfig",
    "CriticFSDPConfig",
    "CriticCheckpointConfig",
    "AlgorithmConfig",
    "KLCtrlConfig",
    "RolloutCorrectionConfig",
    "FilterGroupsConfig",
    "PFPPOConfig",
    "RewardModelConfig",
    "RewardModelModelConfig",
    "RMFSDPConfig",
    "RMWrapPolicyConfig",
    "RMProcessConfig",
    "RMIterativeConfig",
    "RewardConfig",
    "RewardKwargsConfig",
    "OverlongBufferConfig",
    "RewardRewardModelConfig",
    "CustomRewardFunctionConfig",
    "TrainerConfig",
    "RayKwargsConfig",
    "RayInitConfig",
    # the default job and the documentation tables
    "DEFAULT_TRAIN_FILES",
    "VERL_TOTAL_EPOCHS",
    "INTERPOLATED_HELP",
    "VERL_DEFAULT_DIFFERENCES",
]
