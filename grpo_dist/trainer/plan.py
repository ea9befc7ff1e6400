"""Everything a run takes from its configuration, read once, up front.

:func:`launch_plan` is what ``trainer/run.py`` needs before Ray starts (files, tokenizer, dataset,
Ray); :func:`driver_plan` is what the driver's loop needs (sizes, sampling, the algorithm's numbers,
checkpoints, logging); the workers' settings come from the role table (``trainer/roles.py``). Neither
the loop nor the start-up code reads the configuration afterwards, so that building these plans and
the workers' settings reads every key that has an effect (a test checks that no honoured key goes
unread, ``tests/unit/test_key_walk.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grpo_dist.config.schema import GRPOConfig
from grpo_dist.config.states import setting
from grpo_dist.config.roles import bundles
from grpo_dist.config.validate import overlong_buffer
from grpo_dist.core.rollout_correction import RolloutCorrectionParams
from grpo_dist.rewards.shaping import OverlongBuffer
from grpo_dist.rollout.base import SamplingSettings
from grpo_dist.trainer import build
from grpo_dist.trainer.dynamic_sampling import DynamicSampling, SingleBatch
from grpo_dist.trainer.iterative import IterativeSettings
from grpo_dist.rewards.combine import RewardCombine

__all__ = ["LaunchPlan", "DriverPlan", "ResumeSettings", "launch_plan", "driver_plan", "total_steps"]


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
    )


@dataclass(frozen=True)
class DriverPlan:
    """What the driver's loop uses, derived from the configuration."""

    shape: build.StepShape
    total_steps: int
    # data
    prompts_per_draw: int
    data_seed: int | None
    data_shuffle: bool
    max_prompt_length: int
    response_length: int
    val_batch_size: int | None
    # sampling
    step_sampling: DynamicSampling | SingleBatch
    train_sampling: SamplingSettings
    baseline_sampling: SamplingSettings
    val_sampling: SamplingSettings
    rollout_seed: int
    rollout_tp: int
    """``rollout.tensor_model_parallel_size``: ranks per rollout engine (prompts go to engines)."""
    free_cache_engine: bool
    # the algorithm
    estimator: str
    gamma: float
    lam: float
    norm_adv_by_std: bool
    use_kl_in_reward: bool
    kl_penalty: str
    kl_ctrl: tuple[str, float, float, int]
    """``(type, kl_coef, target_kl, horizon)`` of the in-reward KL controller."""
    use_kl_loss: bool
    rollout_correction: RolloutCorrectionParams
    rollout_log_probs: bool
    on_policy: bool
    """One optimizer step on fresh samples: no old log-probs needed (``build.on_policy``)."""
    old_logp_forward: bool
    """Whether a step runs the actor's old-log-prob forward (``build.old_log_prob_forward``)."""
    overlong: OverlongBuffer | None
    # learned reward model (reward_model.*)
    reward_combine: RewardCombine
    """How a reward model's and the rule-based scores make the reward (``reward_model.combine``)."""
    process_separator: str | None
    """A process reward model's step separator; None: an outcome reward model (or none)."""
    iterative: IterativeSettings | None
    """Iterative RL's numbers (``reward_model.iterative.*``); None when it is off."""
    reset_reference: bool
    """Iterative RL resets the reference to the policy after each reward-model update."""
    reference_dtype: str
    """The reference's compute dtype (what a reset sends)."""
    # forwards and updates
    old_logp_batching: tuple[int | None, int | None]
    ref_logp_batching: tuple[int | None, int | None]
    logit_temperature: float
    actor_mini_batch_prompts: int
    actor_epochs: int
    actor_shuffle: tuple[int, int] | None
    """``(ppo_epochs, data_loader_seed)`` when ``actor.shuffle``, for ``trainer.updates.sharded_update``."""
    critic_mini_batch_prompts: int
    critic_shuffle: tuple[int, int] | None
    balance_batch: bool
    critic_warmup: int
    # weight sync
    sync_dtype: str
    sync_bucket_bytes: int
    # the loop, checkpoints, logging
    max_consecutive_nonfinite_steps: int
    checkpoint_root: str
    export_hf_every_checkpoint: bool
    max_ckpt_to_keep: int | None
    loggers: Any
    project_name: str
    experiment_name: str
    progress_bar: bool
    val_before_train: bool
    val_only: bool
    log_val_generations: int
    test_freq: int
    save_freq: int
    compute_dtype: str
    startup_warning: str | None


def total_steps(cfg: GRPOConfig, steps_per_epoch: int) -> int:
    """``trainer.total_training_steps`` when set, else ``total_epochs`` x steps per epoch (verl's rule)."""
    t = cfg.trainer
    return t.total_training_steps or t.total_epochs * steps_per_epoch


def driver_plan(cfg: GRPOConfig, device: str, train_size: int) -> DriverPlan:
    """The driver's plan for ``train_size`` training prompts on ``device`` (cpu | cuda)."""
    d, arr, alg, t = cfg.data, cfg.actor_rollout_ref, cfg.algorithm, cfg.trainer
    actor, rollout, critic = arr.actor, arr.rollout, cfg.critic
    shape = build.step_shape(cfg)
    per_draw = build.prompts_per_draw(cfg)
    kc = alg.kl_ctrl
    save, _load = build.checkpoint_contents(cfg)
    rmc = cfg.reward_model
    it = rmc.iterative
    return DriverPlan(
        shape=shape,
        total_steps=total_steps(cfg, train_size // per_draw if per_draw else 0),
        prompts_per_draw=per_draw,
        data_seed=d.seed,
        data_shuffle=d.shuffle,
        max_prompt_length=d.max_prompt_length,
        response_length=rollout.response_length,
        val_batch_size=d.val_batch_size,
        step_sampling=build.step_sampling(cfg),
        train_sampling=build.train_sampling(cfg),
        baseline_sampling=build.baseline_sampling(cfg),
        val_sampling=build.val_sampling(cfg),
        rollout_seed=rollout.seed,
        rollout_tp=rollout.tensor_model_parallel_size,
        free_cache_engine=rollout.free_cache_engine,
        estimator=alg.adv_estimator,
        gamma=alg.gamma,
        lam=alg.lam,
        norm_adv_by_std=alg.norm_adv_by_std_in_grpo,
        use_kl_in_reward=alg.use_kl_in_reward,
        kl_penalty=alg.kl_penalty,
        kl_ctrl=(kc.type, kc.kl_coef, kc.target_kl, kc.horizon),
        use_kl_loss=actor.use_kl_loss,
        rollout_correction=build.rollout_correction(cfg),
        rollout_log_probs=build.rollout_log_probs(cfg),
        on_policy=build.on_policy(cfg),
        old_logp_forward=build.old_log_prob_forward(cfg),
        overlong=overlong_buffer(cfg),
        reward_combine=RewardCombine(rmc.combine, rmc.rm_weight, rmc.rule_weight, bool(cfg.custom_reward_function.path)),
        process_separator=rmc.process.step_separator if rmc.process.enable else None,
        iterative=IterativeSettings(
            steps_per_iteration=it.steps_per_iteration, replay_fraction=it.replay_fraction,
            heldout_fraction=it.heldout_fraction, buffer_size=it.buffer_size, mini_batch_size=it.mini_batch_size,
            world_size=build.reward_model_world_size(cfg), seed=t.seed, label_threshold=it.label_threshold)
        if build.reward_model_trained(cfg) else None,
        reset_reference=it.reset_reference,
        reference_dtype=build.reference_kwargs(cfg, device)["param_dtype"],
        old_logp_batching=build.forward_batching(rollout, shape.world_size),
        ref_logp_batching=build.forward_batching(arr.ref, shape.world_size),
        logit_temperature=rollout.temperature or 1.0,
        actor_mini_batch_prompts=actor.ppo_mini_batch_size,
        actor_epochs=actor.ppo_epochs,
        actor_shuffle=(actor.ppo_epochs, actor.data_loader_seed) if actor.shuffle else None,
        critic_mini_batch_prompts=critic.ppo_mini_batch_size,
        critic_shuffle=(critic.ppo_epochs, critic.data_loader_seed) if critic.shuffle else None,
        balance_batch=t.balance_batch,
        critic_warmup=t.critic_warmup,
        sync_dtype=build.compute_dtype(rollout.dtype, device),
        sync_bucket_bytes=int(rollout.checkpoint_engine.update_weights_bucket_megabytes) * 2**20,
        max_consecutive_nonfinite_steps=t.max_consecutive_nonfinite_steps,
        checkpoint_root=t.default_local_dir,
        export_hf_every_checkpoint="hf_model" in save,
        max_ckpt_to_keep=t.max_actor_ckpt_to_keep,
        loggers=t.logger,
        project_name=t.project_name,
        experiment_name=t.experiment_name,
        progress_bar=t.progress_bar,
        val_before_train=t.val_before_train,
        val_only=t.val_only,
        log_val_generations=t.log_val_generations,
        test_freq=t.test_freq,
        save_freq=t.save_freq,
        compute_dtype=build.compute_dtype(actor.fsdp_config.dtype, device),
        startup_warning=build.cpu_half_precision_warning(cfg, device),
    )
