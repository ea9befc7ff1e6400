"""Field states that keys of several sections share (no key subtree of its own).

The reason a key has no effect here, or is refused, is written once when the keys of more than one role
give it (the actor's and the critic's optimizers, the roles' copies of ``rollout.n``, ...); a reason
that only one section gives lives beside that section.
"""

from __future__ import annotations

from grpo_dist.config.fields import NoOp


SCHEDULE_LENGTH = NoOp("the schedule always spans the run's steps (trainer.total_training_steps, or total_epochs x "
                       "steps per epoch), as verl's trainer writes here")
ONE_TIMEOUT = NoOp("one collective timeout, actor_rollout_ref.nccl_timeout, covers every FSDP role here",
                   same_as="actor_rollout_ref.nccl_timeout", otherwise="set actor_rollout_ref.nccl_timeout instead")
FSDP2_ONLY = NoOp("grpo_dist trains with FSDP2 (fsdp runs as the same sharding)", values=("fsdp", "fsdp2"),
                  otherwise="the Megatron backend is not built here; use fsdp2 or fsdp")
COPY_OF_N = NoOp("verl's copy of actor_rollout_ref.rollout.n", same_as="actor_rollout_ref.rollout.n",
                 otherwise="set actor_rollout_ref.rollout.n instead")
