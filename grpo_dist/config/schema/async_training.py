"""``async_training.*``: verl's fully asynchronous trainer (its ``fully_async_ppo_trainer.yaml``), built here on the
one-step-off machinery: chunks admitted under the staleness bound, their groups streamed to the trainer with partial
rollouts (docs/async.md, :mod:`grpo_dist.trainer.fully_async`, :mod:`grpo_dist.trainer.streaming`).

Every key defaults to null, meaning "not given": the mode is on as soon as any ``async_training.*`` key is
given (verl users change only the module name, so verl's config name, which would select the mode, is lost),
and a key left null takes verl's default (written in its help and in :data:`VERL_ASYNC_DEFAULTS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from grpo_dist.config.fields import F, NoOp, Refused, S

VERL_ASYNC_DEFAULTS = {
    "staleness_threshold": 0.1, "trigger_parameter_sync_step": 4, "require_batches": 1, "partial_rollout": True,
    "use_rollout_log_probs": True, "compute_prox_log_prob": False, "use_trainer_do_validate": False,
    "compute_advantage_in_rollout": False,
}
"""verl's defaults of the keys honoured or documented here, taken when the mode is on and a key is null."""

_SYNC_CARRIES = ("the weights reach the rollout's own ranks through the bucketed weight sync "
                 "(actor_rollout_ref.rollout.checkpoint_engine.backend: Ray's object store, or a broadcast with nccl); "
                 "verl's checkpoint engine is not needed for that")


@dataclass
class AsyncCheckpointEngineConfig:
    """verl's checkpoint engine (faster parameter sync between its trainer and rollouter)."""

    enable: Optional[bool] = F(None, "use verl's checkpoint engine for the weight sync (verl: true)", NoOp(_SYNC_CARRIES))
    device_buffer_size_M: Optional[int] = F(None, "its device buffer in MB (verl: 4096)", NoOp(_SYNC_CARRIES))
    overlap_broadcast_and_consume: Optional[bool] = F(
        None, "pipeline broadcasting and loading the weights (verl: false)", NoOp(_SYNC_CARRIES))


@dataclass
class AsyncTrainingConfig:
    """Fully asynchronous training; on when any key here is given (null = not given, verl's default)."""

    staleness_threshold: Optional[float] = F(
        None, "how stale samples may be: after a weight sync the rollout may start at most "
              "floor((1 + staleness_threshold) x trigger_parameter_sync_step) chunks, less those generated and not yet "
              "trained (verl: 0.1)")
    trigger_parameter_sync_step: Optional[int] = F(
        None, "training steps (one chunk each) between weight syncs into the rollout engines (verl: 4)")
    require_batches: Optional[int] = F(
        None, "ppo mini-batches per training step: a chunk is require_batches x ppo_mini_batch_size prompts x "
              "rollout.n responses (verl: 1)")
    partial_rollout: Optional[bool] = F(
        None, "interrupt the responses being generated at a weight sync and finish them with the new weights, each "
              "token keeping the version and log-prob it was sampled with; results then depend on timing (where a "
              "sync lands); in agent loops (rollout.mode=async) the trajectories' requests are interrupted and their "
              "tool calls go on; a step then trains on the groups (a prompt's rollout.n responses) as they finish, "
              "oldest first, waiting only for those of a chunk at the staleness bound; needs the vLLM engine (rollout "
              "tensor parallelism included), else a sync waits for the chunks being generated and a step trains its "
              "own chunk, as with false (verl: true)")
    use_rollout_log_probs: Optional[bool] = F(
        None, "train with the engines' sampling log-probs as the old log-probs (requested from the engines by "
              "itself); false: the actor recomputes them (verl: true)")
    compute_prox_log_prob: Optional[bool] = F(
        None, "recompute the old (proximal) log-probs with the actor even with use_rollout_log_probs (verl: false)")
    use_trainer_do_validate: Optional[bool] = F(
        None, "validate on the trainer's side (verl: false)",
        NoOp("validation always runs here on the rollout engines, after they finish the chunks they are generating "
             "and get the current policy"))
    checkpoint_engine: AsyncCheckpointEngineConfig = S(AsyncCheckpointEngineConfig, "verl's checkpoint engine")
    compute_advantage_in_rollout: Optional[bool] = F(
        None, "compute advantages on the rollout side (verl: false)",
        Refused("advantages are computed by the driver when a chunk is trained; leave it false", accept=(None, False)))


_NO_FILTER = ("verl's sample filters of fully asynchronous training are not built here (every finished group is trained); "
              "leave verl's default, its dummy filter that keeps every sample")


@dataclass
class AsyncFilterConfig:
    """verl's ``filter`` section (fully asynchronous training's sample filter)."""

    filter_function_path: str = F("verl/experimental/fully_async_policy/utils/filter/dummy_filter.py",
                                   "file of the filter function (verl's dummy filter keeps every sample)",
                                   Refused(_NO_FILTER))
    filter_function_name: str = F("dummy_filter", "the filter function's name", Refused(_NO_FILTER))
    trajectories_per_request: Optional[int] = F(None, "trajectories the trainer takes per request",
                                                NoOp("a step takes a chunk's worth of groups: require_batches x ppo_mini_batch_size prompts"))
    avg_trajectories_per_sample: Optional[int] = F(None, "expected trajectories per prompt (verl: rollout.n)",
                                                   NoOp("a chunk's prompts each have rollout.n responses"))


@dataclass
class SuperSampleConfig:
    """verl's ``super_sample`` section (grouping finished samples before training)."""

    filter_function_path: str = F("verl/experimental/fully_async_policy/utils/super_sample/default_super_sample.py",
                                  "file of the grouping function", Refused(_NO_FILTER.replace("dummy filter that keeps "
                                  "every sample", "default grouping")))
    filter_function_name: str = F("default_super_sample_func", "the grouping function's name",
                                  Refused(_NO_FILTER.replace("dummy filter that keeps every sample", "default grouping")))
