"""When the step now running does what: the schedule of a synchronous run's updates."""

from __future__ import annotations


def actor_update_due(finished_steps: int, critic_warmup: int) -> bool:
    """Whether the step now running updates the actor (``trainer.critic_warmup``).

    verl counts steps from 1 (``global_steps`` is 1 during the first step) and updates the actor when
    ``critic_warmup <= global_steps``. Here ``finished_steps`` (the driver's ``global_step``) counts
    the steps already done, so the running step is verl's ``finished_steps + 1``: the actor updates
    when ``finished_steps + 1 >= critic_warmup``. Steps 1 .. critic_warmup - 1 train only the critic;
    0 and 1 both mean no warm-up.
    """
    return finished_steps + 1 >= critic_warmup
