"""The derived facts of a run: numbers and switches computed from several keys, each with one name.

Everything else (the role settings, the sampling, the plans, the preflight checks) reads these instead of
recomputing them; :class:`grpo_dist.config.spec.RunSpec` holds the ones every part needs.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_dist.config.fully_async import fully_async_settings
from grpo_dist.config.schema import GRPOConfig
from grpo_dist.config.states import setting
from grpo_dist.config.validate import data_parallel_size, rollout_correction_params, separate_rollout
from grpo_dist.core.rollout_correction_params import RolloutCorrectionParams
from grpo_dist.training.dtypes import dtype_name


def compute_dtype(name: str, device: str) -> str:
    """A dtype setting (``auto`` or a name, verl's short names too) as the long name used on ``device``."""
    if name != "auto":
        return dtype_name(name)
    return "bfloat16" if device == "cuda" else "float32"


def per_gpu(global_size: int | None, per_gpu_size: int | None, world_size: int) -> int | None:
    """verl's two spellings of a micro-batch size: ``*_per_gpu``, or the former global size divided by the
    data-parallel ranks (validation refuses both set, and a global size below the rank count)."""
    return per_gpu_size if global_size is None else global_size // world_size


def micro_batch(use_dynamic_bsz: bool, size: int | None) -> int | str | None:
    """The settings' micro-batch size of a ``ppo_micro_batch_size_per_gpu`` key: unused with
    ``use_dynamic_bsz``; null means ``"auto"`` (grpo_dist.training.memory)."""
    if use_dynamic_bsz:
        return None
    return "auto" if size is None else size


@dataclass(frozen=True)
class StepShape:
    """Sizes of one step derived from the config."""

    train_batch_size: int  # prompts
    n: int  # responses per prompt
    world_size: int  # data-parallel ranks
    num_mini_batches: int

    @property
    def responses(self) -> int:
        return self.train_batch_size * self.n


def step_shape(cfg: GRPOConfig) -> StepShape:
    dp = data_parallel_size(cfg)
    return StepShape(
        train_batch_size=cfg.data.train_batch_size,
        n=cfg.actor_rollout_ref.rollout.n,
        world_size=dp,
        num_mini_batches=cfg.data.train_batch_size // cfg.actor_rollout_ref.actor.ppo_mini_batch_size,
    )


def checkpoint_contents(cfg: GRPOConfig) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(save, load)`` contents of the actor's checkpoints: ``save_contents`` (or its former spelling
    ``checkpoint.contents``) and ``load_contents``, which follows what is saved unless set on its own."""
    c = cfg.actor_rollout_ref.actor.checkpoint
    save = tuple(setting(cfg, "actor_rollout_ref.actor.checkpoint.save_contents"))
    load = tuple(c.load_contents)
    return save, (save if list(load) == list(c.save_contents) else load)


def prompts_per_draw(cfg: GRPOConfig) -> int:
    """Prompts drawn from the data at a time: ``data.gen_batch_size`` (default train_batch_size) with
    dynamic sampling, else ``data.train_batch_size``."""
    d = cfg.data
    return (d.gen_batch_size or d.train_batch_size) if cfg.algorithm.filter_groups.enable else d.train_batch_size


def rollout_correction(cfg: GRPOConfig) -> RolloutCorrectionParams:
    """``algorithm.rollout_correction.*``, parsed."""
    return rollout_correction_params(cfg)


def rollout_log_probs(cfg: GRPOConfig) -> bool:
    """Whether the rollout returns its log-probs: ``rollout.calculate_log_probs``, or on by itself
    when the rollout correction needs them (weights, rejection or bypass mode)."""
    return (cfg.actor_rollout_ref.rollout.calculate_log_probs or rollout_correction(cfg).changes_training
            or old_log_probs_from_rollout(cfg))


def old_log_probs_from_rollout(cfg: GRPOConfig) -> bool:
    """Whether the engines' sampling log-probs are the update's old log-probs: rollout correction's bypass mode,
    or fully asynchronous training with ``use_rollout_log_probs`` (and not ``compute_prox_log_prob``)."""
    fa = fully_async_settings(cfg)
    return rollout_correction(cfg).bypass or (fa is not None and fa.old_from_rollout)


def on_policy(cfg: GRPOConfig) -> bool:
    """Whether the update is one optimizer step on fresh samples (one mini-batch, one epoch, no KL in
    the reward, not bypass mode, samples of the current policy: not one-step-off): then the old policy IS
    the current one (ratio 1) and the actor needs no old log-probs."""
    return (step_shape(cfg).num_mini_batches == 1 and cfg.actor_rollout_ref.actor.ppo_epochs == 1
            and not cfg.algorithm.use_kl_in_reward and not rollout_correction(cfg).bypass
            and not separate_rollout(cfg))


def old_log_prob_forward(cfg: GRPOConfig) -> bool:
    """Whether a step runs the actor's old-log-prob forward (``timing_s/old_log_prob``): off-policy
    updates need it; on-policy ones too when the rollout returns its log-probs, to compare them with
    the trainer's (``training/rollout_probs_diff_*``, ``rollout_corr/*``) and for the rollout
    correction. Never when the rollout's log-probs stand in (:func:`old_log_probs_from_rollout`)."""
    return not old_log_probs_from_rollout(cfg) and (not on_policy(cfg) or rollout_log_probs(cfg))
