"""Fully asynchronous training (``async_training.*``): whether the mode is on, and its numbers with verl's
defaults filled in (:class:`FullyAsyncSettings`). The driver's schedule is :mod:`grpo_dist.trainer.fully_async`."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from grpo_dist.config.schema import VERL_ASYNC_DEFAULTS, GRPOConfig

__all__ = ["FullyAsyncSettings", "chunk_prompts", "fully_async_note", "fully_async_on", "fully_async_settings", "normalize_fully_async",
           "rollout_total_steps"]


def _given(section: Any) -> bool:
    """Whether any leaf under ``section`` (a dataclass of null-default keys) was given."""
    for f in fields(section):
        value = getattr(section, f.name)
        if (_given(value) if is_dataclass(value) else value is not None):
            return True
    return False


def fully_async_on(cfg: GRPOConfig) -> bool:
    """Whether fully asynchronous training is on: any ``async_training.*`` key given (all default to null)."""
    return _given(cfg.async_training)


def _value(cfg: GRPOConfig, key: str) -> Any:
    value = getattr(cfg.async_training, key)
    return VERL_ASYNC_DEFAULTS[key] if value is None else value


def chunk_prompts(cfg: GRPOConfig) -> int:
    """Prompts of one chunk (one training step): ``require_batches x actor.ppo_mini_batch_size``."""
    return int(_value(cfg, "require_batches")) * cfg.actor_rollout_ref.actor.ppo_mini_batch_size


@dataclass(frozen=True)
class FullyAsyncSettings:
    """The fully asynchronous schedule's numbers (verl's defaults filled in).

    Attributes:
        staleness_threshold: ``s`` in the admission bound.
        trigger: ``trigger_parameter_sync_step``: steps between weight syncs.
        chunk_prompts: prompts per chunk (``require_batches x ppo_mini_batch_size``); a step trains one chunk.
        old_from_rollout: the engines' sampling log-probs are the old log-probs (``use_rollout_log_probs`` and
            not ``compute_prox_log_prob``).
        partial_rollout: a sync interrupts the responses being generated and the new weights finish them
            (:mod:`grpo_dist.rollout.partial`); False: a sync waits for the chunks being generated.
        partial_off: why ``partial_rollout=true`` has no effect here (None: it has, or it was not asked for).
    """

    staleness_threshold: float
    trigger: int
    chunk_prompts: int
    old_from_rollout: bool
    partial_rollout: bool
    partial_off: str | None = None

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
    if not fully_async_on(cfg) or cfg.rollout.total_rollout_steps is None:
        return None
    return cfg.rollout.total_rollout_steps // chunk_prompts(cfg)


def fully_async_note(fa: FullyAsyncSettings) -> str:
    """The line of fully asynchronous training in the start-up plan (``--check``) and at start-up."""
    old = ("the engines' sampling log-probs are the old log-probs" if fa.old_from_rollout
           else "the actor recomputes the old log-probs")
    if fa.partial_rollout:
        partial = ("partial rollouts: a sync interrupts the responses being generated and the new weights finish "
                   "them (each token keeps the version and log-prob it was sampled with; results then depend on "
                   "timing: partial_rollout=false for a run a resume repeats exactly)")
    elif fa.partial_off is not None:
        partial = f"partial_rollout has no effect {fa.partial_off}: a sync waits for the chunks being generated"
    else:
        partial = "a sync waits for the chunks being generated"
    return (f"fully asynchronous: a step trains one chunk of {fa.chunk_prompts} prompts; weights synced every "
            f"{fa.trigger} step(s); after a sync at most {fa.max_ahead} chunk(s) generated ahead (staleness_threshold "
            f"{fa.staleness_threshold:g}), so a chunk is at most {fa.max_ahead - 1} update(s) old; {old}; {partial}")


def normalize_fully_async(cfg: GRPOConfig) -> GRPOConfig:
    """In the mode, ``data.train_batch_size`` (verl's scripts set it to 0: unused) becomes the chunk's prompts, so
    every size derived from a step's batch (mini-batches, engine shares, memory) is the chunk's."""
    if fully_async_on(cfg) and cfg.actor_rollout_ref.actor.ppo_mini_batch_size > 0:
        cfg.data.train_batch_size = chunk_prompts(cfg)
    return cfg
