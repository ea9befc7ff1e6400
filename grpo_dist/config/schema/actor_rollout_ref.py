"""``actor_rollout_ref``: the section joining the policy's roles (its own keys ``hybrid_engine`` and
``nccl_timeout``; ``model``, ``actor``, ``ref`` and ``rollout`` have a module each)."""

from __future__ import annotations

from dataclasses import dataclass

from grpo_dist.config.fields import F, Refused, S
from grpo_dist.config.schema.actor import ActorConfig
from grpo_dist.config.schema.model import ModelConfig
from grpo_dist.config.schema.ref import RefConfig
from grpo_dist.config.schema.rollout import RolloutConfig


@dataclass
class ActorRolloutRefConfig:
    hybrid_engine: bool = F(True, "colocate actor, reference and rollout of a rank on one device", Refused(
        "the split placement (actor, reference and rollout on separate devices) is not built; the roles of a rank "
        "always share its device: use true"))
    nccl_timeout: int = F(600, "seconds a collective of the actor, reference or critic may wait before it fails")
    model: ModelConfig = S(ModelConfig, "the policy model")
    actor: ActorConfig = S(ActorConfig, "the policy update")
    ref: RefConfig = S(RefConfig, "the frozen reference policy (created only when a KL term is used)")
    rollout: RolloutConfig = S(RolloutConfig, "response generation")
