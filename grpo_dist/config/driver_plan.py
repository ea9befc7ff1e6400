"""What the driver's loop uses (sizes, sampling, the algorithm's numbers, checkpoints, logging), derived
from the configuration once; the loop reads no configuration afterwards."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpo_dist.agents.settings import AgentSettings
from grpo_dist.config import facts
from grpo_dist.config.facts import StepShape, compute_dtype
from grpo_dist.config.fully_async import FullyAsyncSettings, fully_async_settings, rollout_total_steps
from grpo_dist.config.preflight import cpu_half_precision_warning
from grpo_dist.config.role_settings import forward_batching, reference_kwargs
from grpo_dist.config.sampling import FilterGroups, baseline_sampling, step_sampling, train_sampling, val_sampling
from grpo_dist.config.schema import GRPOConfig
from grpo_dist.config.validate import lora_settings, overlong_buffer, separate_rollout, single_response_grpo
from grpo_dist.core.rollout_correction_params import RolloutCorrectionParams
from grpo_dist.rewards.shaping import OverlongBuffer
from grpo_dist.rollout.base import SamplingSettings

__all__ = ["DriverPlan", "IterativeSettings", "cpu_lora_sync_warning", "driver_plan", "single_response_warning",
           "stale_ratio_warning", "total_steps"]


def single_response_warning(cfg: GRPOConfig) -> str | None:
    """The start-up warning of GRPO with one response per prompt (``validate.single_response_grpo``)."""
    if not single_response_grpo(cfg):
        return None
    return ("actor_rollout_ref.rollout.n=1 with GRPO: every group holds one response, so its advantage is its raw "
            "score (as verl computes it: a group of one has mean 0, std 1), with no baseline; GRPO needs n >= 2 to "
            "compare responses")


def stale_ratio_warning(cfg: GRPOConfig) -> str | None:
    """The start-up warning of training on stale samples with nothing correcting for it: the rollout on devices of
    its own (samples up to ``max_age`` updates old), the old log-probs recomputed by the actor (so PPO's ratio is
    taken against the policy that trains, not the one that sampled), and no rollout correction weights or
    rejection. Measured on the default task (docs/async.md): one-step-off learned 0.32 held-out accuracy in 20
    steps this way, 0.53 with ``bypass_mode=true``, 0.66 colocated (3 seeds each)."""
    if not separate_rollout(cfg) or facts.old_log_probs_from_rollout(cfg):
        return None
    fa = fully_async_settings(cfg)
    max_age = 1 if fa is None else fa.max_ahead - 1
    rc = facts.rollout_correction(cfg)
    if max_age == 0 or rc.is_level is not None or rc.rejection:
        return None
    return (f"samples are trained up to {max_age} update(s) after the weights that sampled them, and the actor "
            "recomputes the old log-probs, so PPO's ratio does not correct for the policy that sampled them (this "
            "learned much less per sample on the default task: docs/async.md); set "
            "algorithm.rollout_correction.bypass_mode=true (the engines' log-probs as the old ones, as verl's "
            "one-step-off config does) or algorithm.rollout_correction.rollout_is=token")


def cpu_lora_sync_warning(cfg: GRPOConfig, device: str) -> str | None:
    """The start-up warning of LoRA adapters synced alone (``lora.merge=false``, verl's default) to vLLM engines on
    the CPU: vLLM's CPU build runs the adapters as extra work in every layer at every decoding step, and it
    generated 3-4x slower than the same model merged (measured: docs/lora.md, "The sync mode's cost in
    generation")."""
    if device != "cpu" or cfg.actor_rollout_ref.rollout.name != "vllm":
        return None
    lora = lora_settings(cfg)
    if lora.rank == 0 or lora.merge:
        return None
    return ("vLLM's CPU build generates through LoRA adapters several times slower than with the merged weights "
            "(measured in docs/lora.md); actor_rollout_ref.model.lora.merge=true syncs the merged weights instead "
            "(the whole model at every sync) and samples at the plain model's speed")


@dataclass(frozen=True)
class IterativeSettings:
    steps_per_iteration: int
    replay_fraction: float = 0.1
    heldout_fraction: float = 0.1
    buffer_size: int = 8192
    mini_batch_size: int = 64
    """Rows per reward-model optimizer step over all ranks (rounded up to a multiple of the ranks)."""
    world_size: int = 1
    seed: int = 0
    label_threshold: float | None = 0.5
    """A rule score at or above it is labelled 1, below it 0; None: the score clamped to [0, 1]
    (:func:`grpo_dist.core.reward_model.verifier_labels`; the reward stage writes the labels)."""
    role: str = "reward_model"
    """The role of the reward model it trains (``reward_model.iterative.source``'s)."""

    def __post_init__(self) -> None:
        if self.steps_per_iteration < 1 or self.mini_batch_size < 1 or self.world_size < 1:
            raise ValueError("steps_per_iteration, mini_batch_size and world_size must be >= 1")
        for name in ("replay_fraction", "heldout_fraction"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")


@dataclass(frozen=True)
class DriverPlan:
    """What the driver's loop uses, derived from the configuration."""

    shape: StepShape
    total_steps: int
    # data
    prompts_per_draw: int
    data_seed: int | None
    data_shuffle: bool
    max_prompt_length: int
    response_length: int
    val_batch_size: int | None
    # sampling
    step_sampling: FilterGroups | None
    """DAPO's dynamic sampling (``algorithm.filter_groups``); None: one generation batch per step."""
    train_sampling: SamplingSettings
    baseline_sampling: SamplingSettings
    val_sampling: SamplingSettings
    rollout_seed: int
    rollout_tp: int
    """``rollout.tensor_model_parallel_size``: ranks per rollout engine (prompts go to engines)."""
    agents: AgentSettings | None
    """``rollout.mode=async``: the agent loops each trajectory runs through; None: the engines' batch generation."""
    free_cache_engine: bool
    """The engines give their memory back while the model roles work (colocated only)."""
    one_step_off: bool
    """``actor_rollout_ref.hybrid_engine=false`` without ``async_training.*``: the engines run on a pool of their
    own and generate the next batch while the current one trains (:class:`grpo_dist.trainer.one_step_off.RolloutAhead`)."""
    fully_async: FullyAsyncSettings | None
    """``async_training.*`` given: chunks generated ahead under the staleness bound, weights synced every
    ``trigger`` steps (:mod:`grpo_dist.trainer.fully_async`); None otherwise."""
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
    old_from_rollout: bool
    """The engines' sampling log-probs are the old log-probs (``facts.old_log_probs_from_rollout``)."""
    on_policy: bool
    """One optimizer step on fresh samples: no old log-probs needed (``facts.on_policy``)."""
    old_logp_forward: bool
    """Whether a step runs the actor's old-log-prob forward (``facts.old_log_prob_forward``)."""
    overlong: OverlongBuffer | None
    # learned reward models (reward_model.*, reward.sources); the sources themselves are the spec's
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
    sync_backend: str
    """verl's ``checkpoint_engine.backend``: ``naive`` or ``nccl`` (:func:`grpo_dist.trainer.weight_sync.choose_transport`)."""
    sync_timeout_s: float
    """How long the ``nccl`` backend's broadcasts may wait (``actor_rollout_ref.nccl_timeout``)."""
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
    pf_ppo: tuple[str, float] | None
    """``(reweight_method, weight_pow)`` with ``algorithm.use_pf_ppo`` (:mod:`grpo_dist.core.pf_ppo`), else None."""
    rollout_data_dir: str | None
    """``trainer.rollout_data_dir``: each training step's responses go to ``<folder>/<step>.jsonl`` (:mod:`grpo_dist.trainer.dumps`)."""
    validation_data_dir: str | None
    """``trainer.validation_data_dir``: each validation's responses, the same way."""
    test_freq: int
    save_freq: int
    compute_dtype: str
    startup_warning: str | None


def total_steps(cfg: GRPOConfig, steps_per_epoch: int) -> int:
    """``trainer.total_training_steps`` when set, else ``total_epochs`` x steps per epoch (verl's rule); in fully
    asynchronous training ``rollout.total_rollout_steps`` (prompts), when given, divided by the chunk's prompts."""
    t = cfg.trainer
    from_rollout = rollout_total_steps(cfg)
    if from_rollout is not None:
        return from_rollout
    return t.total_training_steps or t.total_epochs * steps_per_epoch


def driver_plan(spec: Any, device: str, train_size: int) -> DriverPlan:
    """The driver's plan for ``train_size`` training prompts on ``device`` (cpu | cuda): the run
    specification's (:class:`grpo_dist.config.spec.RunSpec`, which calls this) facts as it resolved them, and the loop's other numbers from its configuration."""
    cfg = spec._cfg
    d, arr, alg, t = cfg.data, cfg.actor_rollout_ref, cfg.algorithm, cfg.trainer
    actor, rollout, critic = arr.actor, arr.rollout, cfg.critic
    shape, per_draw = spec.shape, spec.prompts_per_draw
    kc = alg.kl_ctrl
    save, _load = facts.checkpoint_contents(cfg)
    it = cfg.reward_model.iterative
    trained = next((s for s in spec.reward_sources if s.trained), None)
    fa = fully_async_settings(cfg)
    test_freq = t.test_freq
    if fa is not None and cfg.rollout.test_freq is not None:  # every N weight syncs
        test_freq = cfg.rollout.test_freq * fa.trigger if cfg.rollout.test_freq > 0 else -1
    return DriverPlan(
        shape=shape,
        total_steps=total_steps(cfg, train_size // per_draw if per_draw else 0),
        prompts_per_draw=per_draw,
        data_seed=d.seed,
        data_shuffle=d.shuffle,
        max_prompt_length=d.max_prompt_length,
        response_length=rollout.response_length,
        val_batch_size=d.val_batch_size,
        step_sampling=step_sampling(cfg),
        train_sampling=train_sampling(cfg),
        baseline_sampling=baseline_sampling(cfg),
        val_sampling=val_sampling(cfg),
        rollout_seed=spec.rollout_seed,
        rollout_tp=spec.rollout_tp,
        agents=spec.agent_settings,
        free_cache_engine=rollout.free_cache_engine and not separate_rollout(cfg),
        one_step_off=separate_rollout(cfg) and fa is None,
        fully_async=fa,
        estimator=alg.adv_estimator,
        gamma=alg.gamma,
        lam=alg.lam,
        norm_adv_by_std=alg.norm_adv_by_std_in_grpo,
        use_kl_in_reward=alg.use_kl_in_reward,
        kl_penalty=alg.kl_penalty,
        kl_ctrl=(kc.type, kc.kl_coef, kc.target_kl, kc.horizon),
        use_kl_loss=actor.use_kl_loss,
        rollout_correction=facts.rollout_correction(cfg),
        rollout_log_probs=spec.rollout_log_probs,
        old_from_rollout=facts.old_log_probs_from_rollout(cfg),
        on_policy=spec.on_policy,
        old_logp_forward=spec.old_log_prob_forward,
        overlong=overlong_buffer(cfg),
        iterative=IterativeSettings(
            steps_per_iteration=it.steps_per_iteration, replay_fraction=it.replay_fraction,
            heldout_fraction=it.heldout_fraction, buffer_size=it.buffer_size, mini_batch_size=it.mini_batch_size,
            world_size=trained.world_size, seed=t.seed, label_threshold=it.label_threshold, role=trained.role)
        if trained is not None else None,
        reset_reference=it.reset_reference,
        reference_dtype=reference_kwargs(cfg, device)["param_dtype"],
        old_logp_batching=forward_batching(rollout, shape.world_size),
        ref_logp_batching=forward_batching(arr.ref, shape.world_size),
        logit_temperature=rollout.temperature or 1.0,
        actor_mini_batch_prompts=actor.ppo_mini_batch_size,
        actor_epochs=actor.ppo_epochs,
        actor_shuffle=(actor.ppo_epochs, actor.data_loader_seed) if actor.shuffle else None,
        critic_mini_batch_prompts=critic.ppo_mini_batch_size,
        critic_shuffle=(critic.ppo_epochs, critic.data_loader_seed) if critic.shuffle else None,
        balance_batch=t.balance_batch,
        critic_warmup=t.critic_warmup,
        sync_dtype=compute_dtype(rollout.dtype, device),
        sync_bucket_bytes=int(rollout.checkpoint_engine.update_weights_bucket_megabytes) * 2**20,
        sync_backend=rollout.checkpoint_engine.backend,
        sync_timeout_s=float(arr.nccl_timeout),
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
        pf_ppo=(alg.pf_ppo.reweight_method, float(alg.pf_ppo.weight_pow)) if alg.use_pf_ppo else None,
        rollout_data_dir=t.rollout_data_dir or None,
        validation_data_dir=t.validation_data_dir or None,
        test_freq=test_freq,
        save_freq=t.save_freq,
        compute_dtype=compute_dtype(actor.fsdp_config.dtype, device),
        startup_warning="; ".join(w for w in (cpu_half_precision_warning(cfg, device), single_response_warning(cfg),
                                              stale_ratio_warning(cfg), cpu_lora_sync_warning(cfg, device)) if w)
        or None,
    )
