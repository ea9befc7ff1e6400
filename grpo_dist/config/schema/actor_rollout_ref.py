"""``actor_rollout_ref``: the section joining the policy's roles (its own keys ``hybrid_engine`` and
``nccl_timeout``; ``model``, ``actor``, ``ref`` and ``rollout`` have a module each)."""

from __future__ import annotations

from dataclasses import dataclass

from grpo_dist.config.fields import F, S
from grpo_dist.config.schema.actor import ActorConfig
from grpo_dist.config.schema.model import ModelConfig
from grpo_dist.config.schema.ref import RefConfig
from grpo_dist.config.schema.rollout import RolloutConfig


@dataclass
class ActorRolloutRefConfig:
    hybrid_engine: bool = F(True, "true: actor, reference and rollout of a rank share its device and take turns; "
                            "false: the rollout engines run on devices of their own (the top-level rollout.nnodes x "
                            "rollout.n_gpus_per_node) and generate the next batch while the current one trains "
                            "(one-step-off-policy, as verl's one-step-off recipe)")
    nccl_timeout: int = F(600, "seconds a collective of the actor, reference or critic (and a broadcast of the nccl weight "
                                "sync, rollout.checkpoint_engine.backend) may wait before it fails")
    model: ModelConfig = S(ModelConfig, "the policy model")
    actor: ActorConfig = S(ActorConfig, "the policy update")
    ref: RefConfig = S(RefConfig, "the frozen reference policy (created only when a KL term is used)")
    rollout: RolloutConfig = S(RolloutConfig, "response generation")
