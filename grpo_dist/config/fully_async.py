"""Fully asynchronous training: whether the mode is on, and its numbers with verl's defaults filled in
(:class:`FullyAsyncSettings`). The driver's schedule is :mod:`grpo_dist.trainer.fully_async`.

verl spells the mode two ways, and both select it here:

- its fully_async_policy recipe: any ``async_training.*`` key given, with ``actor_rollout_ref.hybrid_engine=false``
  and the top-level ``rollout.nnodes`` / ``rollout.n_gpus_per_node``;
- its v1 trainer's ``trainer.v1.trainer_mode=separate_async`` (with ``trainer.use_v1``, verl's default), with the
  standalone rollout devices ``actor_rollout_ref.rollout.nnodes`` / ``n_gpus_per_node``. A step trains its batch
  (``data.train_batch_size = parameter_sync_step x ppo_mini_batch_size``, verl's invariant: one update per
  mini-batch), the weights go to the engines after every step, and ``num_warmup_batches`` batches are generated
  beyond the one being trained, with partial rollouts (verl's v1 client always resumes aborted requests): the
  fully_async_policy schedule with ``require_batches = parameter_sync_step``, ``trigger_parameter_sync_step = 1``
  and ``staleness_threshold = num_warmup_batches``. verl's v1 trains each mini-batch as soon as it is sampled;
  here the step's mini-batches are trained when its whole batch is there (docs/async.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from grpo_dist.config.schema import VERL_ASYNC_DEFAULTS, GRPOConfig

__all__ = ["V1_SEPARATE_ASYNC", "FullyAsyncSettings", "async_training_given", "chunk_prompts", "fully_async_note", "fully_async_on",
           "fully_async_settings", "normalize_fully_async", "rollout_total_steps", "v1_separate_async"]

V1_SEPARATE_ASYNC = "trainer.v1.separate_async"


def _given(section: Any) -> bool:
    """Whether any leaf under ``section`` (a dataclass of null-default keys) was given."""
    for f in fields(section):
        value = getattr(section, f.name)
        if (_given(value) if is_dataclass(value) else value is not None):
            return True
    return False


def v1_separate_async(cfg: GRPOConfig) -> bool:
    """Whether verl's v1 ``separate_async`` trainer mode is asked for (``trainer.use_v1`` and
    ``trainer.v1.trainer_mode=separate_async``)."""
    return bool(cfg.trainer.use_v1) and cfg.trainer.v1.trainer_mode == "separate_async"


def async_training_given(cfg: GRPOConfig) -> bool:
    """Whether any ``async_training.*`` key was given (all default to null): the fully_async_policy spelling."""
    return _given(cfg.async_training)


def fully_async_on(cfg: GRPOConfig) -> bool:
    """Whether fully asynchronous training is on: any ``async_training.*`` key given, or verl's v1
    ``separate_async`` mode."""
    return async_training_given(cfg) or v1_separate_async(cfg)


def _value(cfg: GRPOConfig, key: str) -> Any:
    value = getattr(cfg.async_training, key)
    return VERL_ASYNC_DEFAULTS[key] if value is None else value


def chunk_prompts(cfg: GRPOConfig) -> int:
    """Prompts of one chunk (one training step): ``require_batches x actor.ppo_mini_batch_size``
    (v1 ``separate_async``: ``parameter_sync_step x actor.ppo_mini_batch_size``)."""
    batches = (cfg.trainer.v1.separate_async.parameter_sync_step if v1_separate_async(cfg)
               else _value(cfg, "require_batches"))
    return int(batches) * cfg.actor_rollout_ref.actor.ppo_mini_batch_size


@dataclass(frozen=True)
class FullyAsyncSettings:
    """The fully asynchronous schedule's numbers (verl's defaults filled in).

    Attributes:
        staleness_threshold: ``s`` in the admission bound.
        trigger: ``trigger_parameter_sync_step``: steps between weight syncs.
        chunk_prompts: prompts per chunk (``require_batches x ppo_mini_batch_size``); a step trains one chunk.
        old_from_rollout: the engines' sampling log-probs are the old log-probs (``use_rollout_log_probs`` and
            not ``compute_prox_log_prob``; v1 ``separate_async``: ``algorithm.rollout_correction.bypass_mode``, as
            verl's v1 trainer decides; otherwise the actor recomputes them with the step's starting weights).
        partial_rollout: a sync interrupts the responses being generated and the new weights finish them
            (:mod:`grpo_dist.rollout.partial`); False: a sync waits for the chunks being generated.
        partial_off: why ``partial_rollout=true`` has no effect here (None: it has, or it was not asked for).
        spelling: ``async_training`` or ``trainer.v1.separate_async``: the keys that asked for the mode, for
            what the run says about it.
        age_limit: the most updates a trained chunk may lag (v1: ``trainer.v1.sampler.max_off_policy_threshold``,
            validated against ``max_ahead - 1``; the driver checks every chunk, a resumed queue's included);
            None: no limit beyond the admission's.
    """

    staleness_threshold: float
    trigger: int
    chunk_prompts: int
    old_from_rollout: bool
    partial_rollout: bool
    partial_off: str | None = None
    spelling: str = "async_training"
    age_limit: int | None = None

    @property
    def max_ahead(self) -> int:
        """Chunks the rollout may hold ahead of the trainer after a sync (generated or being generated, not
        trained): ``floor((1 + staleness_threshold) x trigger)``; never below ``trigger``. A chunk is then
        trained at most ``max_ahead - 1`` policy updates after the version that sampled it."""
        return max(self.trigger, math.floor(round((1 + self.staleness_threshold) * self.trigger, 9)))


def fully_async_settings(cfg: GRPOConfig) -> FullyAsyncSettings | None:
    """The mode's settings, or None when it is off."""
    if not fully_async_on(cfg):
        return None
    partial_off = _partial_off(cfg)
    if v1_separate_async(cfg):
        return FullyAsyncSettings(
            staleness_threshold=float(cfg.trainer.v1.separate_async.num_warmup_batches), trigger=1,
            chunk_prompts=chunk_prompts(cfg), old_from_rollout=bool(cfg.algorithm.rollout_correction.bypass_mode),
            partial_rollout=partial_off is None, partial_off=partial_off, spelling=V1_SEPARATE_ASYNC,
            age_limit=int(cfg.trainer.v1.sampler.max_off_policy_threshold))
    return FullyAsyncSettings(
        staleness_threshold=float(_value(cfg, "staleness_threshold")),
        trigger=int(_value(cfg, "trigger_parameter_sync_step")),
        chunk_prompts=chunk_prompts(cfg),
        old_from_rollout=bool(_value(cfg, "use_rollout_log_probs")) and not _value(cfg, "compute_prox_log_prob"),
        partial_rollout=bool(_value(cfg, "partial_rollout")) and partial_off is None,
        partial_off=partial_off if _value(cfg, "partial_rollout") else None,
    )


def _partial_off(cfg: GRPOConfig) -> str | None:
    """Why partial rollouts cannot run with this rollout (None: they can): they need the vLLM engine."""
    r = cfg.actor_rollout_ref.rollout
    if r.name != "vllm":
        return f"with rollout.name={r.name} (the vLLM engine interrupts requests)"
    return None


def rollout_total_steps(cfg: GRPOConfig) -> int | None:
    """The run's steps from ``rollout.total_rollout_steps`` (prompts) in the mode: that // the chunk's prompts;
    None when the mode is off or the key is not given (the trainer's keys decide)."""
    if not fully_async_on(cfg) or v1_separate_async(cfg) or cfg.rollout.total_rollout_steps is None:
        return None
    return cfg.rollout.total_rollout_steps // chunk_prompts(cfg)


def fully_async_note(fa: FullyAsyncSettings) -> str:
    """The line of fully asynchronous training in the start-up plan (``--check``) and at start-up."""
    old = ("the engines' sampling log-probs are the old log-probs" if fa.old_from_rollout
           else "the actor recomputes the old log-probs")
    if fa.partial_rollout:
        exact = ("as with verl's v1 client" if fa.spelling == V1_SEPARATE_ASYNC
                 else "partial_rollout=false for a run a resume repeats exactly")
        partial = ("partial rollouts: a sync interrupts the responses being generated and the new weights finish "
                   f"them (each token keeps the version and log-prob it was sampled with), and a step trains the groups "
                   f"as they finish, oldest first, waiting only for those of a chunk at the bound (results then depend "
                   f"on timing: {exact})")
    elif fa.partial_off is not None:
        partial = f"partial_rollout has no effect {fa.partial_off}: a sync waits for the chunks being generated"
    else:
        partial = "a sync waits for the chunks being generated"
    if fa.spelling == V1_SEPARATE_ASYNC:
        return (f"separate_async (verl's v1 trainer mode): a step trains its batch of {fa.chunk_prompts} prompts, generated "
                f"on the rollout's own devices; weights synced after every step; at most {fa.max_ahead} batch(es) "
                f"generated ahead (num_warmup_batches {fa.max_ahead - 1}), so a batch is at most {fa.max_ahead - 1} "
                f"update(s) old; {old}; {partial}")
    return (f"fully asynchronous: a step trains one chunk of {fa.chunk_prompts} prompts; weights synced every "
            f"{fa.trigger} step(s); after a sync at most {fa.max_ahead} chunk(s) generated ahead (staleness_threshold "
            f"{fa.staleness_threshold:g}), so a chunk is at most {fa.max_ahead - 1} update(s) old; {old}; {partial}")


def normalize_fully_async(cfg: GRPOConfig) -> GRPOConfig:
    """In the mode, ``data.train_batch_size`` (verl's scripts set it to 0: unused) becomes the chunk's prompts, so
    every size derived from a step's batch (mini-batches, engine shares, memory) is the chunk's. (v1
    ``separate_async`` keeps it: there it is the step's batch, checked against the chunk.)"""
    if fully_async_on(cfg) and not v1_separate_async(cfg) and cfg.actor_rollout_ref.actor.ppo_mini_batch_size > 0:
        cfg.data.train_batch_size = chunk_prompts(cfg)
    return cfg
