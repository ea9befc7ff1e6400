"""What a run reads before its workers start (files, tokenizer, dataset, Ray), read once, up front.

The driver's loop reads its own plan (:mod:`grpo_dist.config.driver_plan`); the workers' settings come
from :mod:`grpo_dist.config.role_settings` through the role table. Both are built from the run's
specification (:mod:`grpo_dist.config.spec`), so building them reads every key that has an effect (a
test checks that no honoured key goes unread, ``tests/unit/test_key_walk.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grpo_dist.config.roles import bundles
from grpo_dist.config.schema import GRPOConfig
from grpo_dist.config.schema.trainer import DUMP_DIR_FIELDS
from grpo_dist.config.states import setting
from grpo_dist.config.validate import external_libs

__all__ = ["LaunchPlan", "ResumeSettings", "launch_plan"]


@dataclass(frozen=True)
class ResumeSettings:
    """``trainer.resume_mode`` / ``resume_from_path`` / ``default_local_dir`` (for ``checkpoint.resume_target``)."""

    default_local_dir: str
    resume_mode: str
    resume_from_path: str | None


@dataclass(frozen=True)
class LaunchPlan:
    """What a run reads before its workers start."""

    model: str
    """``actor_rollout_ref.model.path`` (an embedded name, a hub name or a folder; resolved at start)."""
    tokenizer: str | None
    """``data.tokenizer``, else ``actor_rollout_ref.model.tokenizer_path``; None: the model's own."""
    tokenizer_trust_remote_code: bool
    chat_template: str | None
    """``actor_rollout_ref.model.custom_chat_template``: replaces the tokenizer's template."""
    train_files: Any
    val_files: Any
    dataset: dict
    """Keyword arguments of ``PromptDataset.from_files`` (prompt column, lengths, truncation, the
    reward column, chat-template arguments)."""
    train_max_samples: int
    val_max_samples: int
    sample_seed: int | None
    sample_shuffle: bool
    custom_reward: tuple[str, str] | None
    """``(path, function name)`` of a custom reward function."""
    reward_trial: dict
    """``reward_model.timeout_s`` and ``.on_error``: how the custom function's trial call is limited and judged."""
    out_dir: str
    dump_dirs: dict[str, str]
    """The folders of generation dumps by their key (``trainer.rollout_data_dir``, ``.validation_data_dir``; those
    set): made at start, so that a folder this user cannot write stops the run before any worker starts."""
    ray_init: dict
    """Keyword arguments of ``distributed.worker_group.init_ray``."""
    timeline_file: str | None
    device: str
    """``trainer.device`` (auto | cpu | cuda), decided against the cluster once Ray runs."""
    resume: ResumeSettings
    """Where the run resumes from (chosen and verified before any worker starts)."""
    preemption_grace_s: float
    """``trainer.preemption_grace_s``: how long after a SIGTERM a step may still finish and save."""
    loggers: Any
    """``trainer.logger`` as given (a name or a list of names; their packages are checked at start)."""
    log_level: str = "quiet"
    """``trainer.log_level``, or ``GRPO_DIST_LOG_LEVEL`` when set (:mod:`grpo_dist.utils.run_log`)."""
    noop_notes: tuple[str, ...] = field(default=())
    """Keys given a value with no effect here, with the reason (printed once at start-up)."""
    external_libs: tuple[str, ...] = ()
    """The modules verl's ``external_lib`` keys name (:func:`grpo_dist.config.validate.external_libs`): imported by
    the driver before it reads the model, and by the model and rollout workers before they build theirs."""


def launch_plan(cfg: GRPOConfig) -> LaunchPlan:
    d, model, t, ri = cfg.data, cfg.actor_rollout_ref.model, cfg.trainer, cfg.ray_kwargs.ray_init
    from grpo_dist.config.states import noop_notes
    from grpo_dist.utils.run_log import log_level

    rf = setting(cfg, "custom_reward_function.path")
    env = ri.runtime_env
    return LaunchPlan(
        model=model.path,
        tokenizer=d.tokenizer or model.tokenizer_path,
        tokenizer_trust_remote_code=bool(model.trust_remote_code or d.trust_remote_code),
        chat_template=model.custom_chat_template,
        train_files=d.train_files,
        val_files=d.val_files,
        dataset=dict(prompt_key=d.prompt_key, max_prompt_length=d.max_prompt_length,
                     filter_overlong_prompts=d.filter_overlong_prompts, truncation=d.truncation,
                     skip_bad_rows=d.skip_bad_rows, reward_fn_key=d.reward_fn_key,
                     chat_template_kwargs=dict(d.apply_chat_template_kwargs)),
        train_max_samples=d.train_max_samples,
        val_max_samples=d.val_max_samples,
        sample_seed=d.seed,
        sample_shuffle=d.shuffle,
        custom_reward=(rf, setting(cfg, "custom_reward_function.name") or "compute_score") if rf else None,
        reward_trial=dict(timeout_s=cfg.reward_model.timeout_s, on_error=cfg.reward_model.on_error),
        out_dir=t.default_local_dir,
        dump_dirs={f"trainer.{k}": getattr(t, k) for k in DUMP_DIR_FIELDS if getattr(t, k)},
        ray_init=dict(address=ri.address, num_cpus=ri.num_cpus, include_dashboard=ri.include_dashboard,
                      min_cpus=bundles(cfg),  # a bundle of one CPU per rank of every pool
                      runtime_env=dict(py_executable=env.py_executable, env_vars=dict(env.env_vars),
                                       working_dir=env.working_dir)),
        timeline_file=cfg.ray_kwargs.timeline_json_file,
        device=t.device,
        resume=ResumeSettings(t.default_local_dir, t.resume_mode, t.resume_from_path),
        preemption_grace_s=t.preemption_grace_s,
        loggers=t.logger,
        log_level=log_level(t.log_level),
        noop_notes=tuple(noop_notes(cfg)),
        external_libs=external_libs(cfg),
    )
