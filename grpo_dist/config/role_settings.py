"""Each model role's settings from the configuration: the actor's, the reference's, the critic's and the
reward model's (the dataclasses of ``training/settings.py``), and where their models are."""

from __future__ import annotations

import functools
from dataclasses import replace

from grpo_dist.config.facts import checkpoint_contents, compute_dtype, micro_batch, per_gpu, rollout_correction, step_shape
from grpo_dist.config.schema import GRPOConfig
from grpo_dist.config.states import setting
from grpo_dist.config.reward_sources import RewardSource
from grpo_dist.config.validate import CRITIC_MODEL, critic_fsdp, critic_grad_clip, lora_settings, optimizer_overrides
from grpo_dist.core.policy_loss_registry import PolicyLossParams
from grpo_dist.training.dtypes import dtype_name
from grpo_dist.training.settings import ActorSettings, CriticSettings, RewardModelSettings


def fsdp_dtypes(fsdp, device: str) -> dict:
    """``model_dtype``, ``param_dtype``, ``reduce_dtype`` and ``param_offload`` of an ``fsdp_config`` section:
    the compute dtype is ``mixed_precision.param_dtype`` when set, else ``dtype`` (validation refuses
    the two set differently); ``offload_policy`` is FSDP2's CPU offload, which ``param_offload`` is here."""
    mp = fsdp.mixed_precision
    return dict(model_dtype=dtype_name(fsdp.model_dtype),
                param_dtype=compute_dtype(mp.param_dtype or fsdp.dtype, device),
                reduce_dtype=dtype_name(mp.reduce_dtype),
                param_offload=bool(fsdp.param_offload or fsdp.offload_policy))


def optimizer_fields(cfg: GRPOConfig, key: str, optim, total_training_steps: int) -> dict:
    """The optimizer and learning-rate schedule fields of a model role's settings, from its ``optim``
    section (``key`` names it: the scheduler type is read through its former spelling too)."""
    return dict(
        lr=optim.lr,
        weight_decay=optim.weight_decay,
        betas=tuple(optim.betas),
        lr_warmup_steps=optim.lr_warmup_steps,
        lr_warmup_steps_ratio=optim.lr_warmup_steps_ratio,
        total_training_steps=total_training_steps,
        lr_scheduler_type=setting(cfg, f"{key}.lr_scheduler_type"),
        min_lr_ratio=optim.min_lr_ratio,
        num_cycles=optim.num_cycles,
        zero_indexed_step=optim.zero_indexed_step,
        optimizer=optim.optimizer,
        optimizer_impl=optim.optimizer_impl,
        optimizer_kwargs=optimizer_overrides(optim),
    )


def actor_settings(cfg: GRPOConfig, device: str, total_training_steps: int) -> ActorSettings:
    a = cfg.actor_rollout_ref.actor
    shape = step_shape(cfg)
    clip_low = a.clip_ratio if a.clip_ratio_low is None else a.clip_ratio_low
    clip_high = a.clip_ratio if a.clip_ratio_high is None else a.clip_ratio_high
    mini_per_gpu = a.ppo_mini_batch_size * shape.n // shape.world_size
    rc = rollout_correction(cfg)
    pl = a.policy_loss
    scale = a.loss_scale_factor
    save, load = checkpoint_contents(cfg)
    r = cfg.actor_rollout_ref.rollout
    return ActorSettings(
        ppo_mini_batch_size_per_gpu=mini_per_gpu,
        ppo_micro_batch_size_per_gpu=micro_batch(a.use_dynamic_bsz, per_gpu(
            a.ppo_micro_batch_size, a.ppo_micro_batch_size_per_gpu, shape.world_size)),
        use_dynamic_bsz=a.use_dynamic_bsz,
        ppo_max_token_len_per_gpu=a.ppo_max_token_len_per_gpu,
        ppo_epochs=a.ppo_epochs,
        epochs_in_rows=a.shuffle,
        loss_mode="bypass_mode" if rc.bypass else pl.loss_mode,
        policy_loss=PolicyLossParams.from_section(  # every actor.policy_loss.<name> field, by name
            pl, clip_ratio_low=clip_low, clip_ratio_high=clip_high, clip_ratio_c=a.clip_ratio_c,
            tau_pos=setting(cfg, "actor_rollout_ref.actor.tau_pos"), tau_neg=setting(cfg, "actor_rollout_ref.actor.tau_neg"),
            rollout_correction=rc if rc.bypass else None),
        loss_agg_mode=a.loss_agg_mode,
        norm_constant=float(cfg.actor_rollout_ref.rollout.response_length if scale is None else scale),
        entropy_coeff=a.entropy_coeff,
        use_kl_loss=a.use_kl_loss,
        kl_loss_coef=a.kl_loss_coef,
        kl_loss_type=a.kl_loss_type,
        kl_loss_agg_mode=a.kl_loss_agg_mode,
        temperature=cfg.actor_rollout_ref.rollout.temperature or 1.0,
        grad_clip=setting(cfg, "actor_rollout_ref.actor.grad_clip"),
        **optimizer_fields(cfg, "actor_rollout_ref.actor.optim", a.optim, total_training_steps),
        **fsdp_dtypes(a.fsdp_config, device),
        attn_implementation=cfg.actor_rollout_ref.model.attn_implementation,
        enable_gradient_checkpointing=cfg.actor_rollout_ref.model.enable_gradient_checkpointing,
        max_seq_len=r.prompt_length + r.response_length,
        max_response_len=r.response_length,
        use_remove_padding=a.use_remove_padding,
        use_fused_kernels=cfg.actor_rollout_ref.model.use_fused_kernels,
        logprob_chunk_size=cfg.actor_rollout_ref.model.logprob_chunk_size,
        reshard_after_forward=a.fsdp_config.reshard_after_forward,
        optimizer_offload=a.fsdp_config.optimizer_offload,
        trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code,
        override_config=dict(cfg.actor_rollout_ref.model.override_config) or None,
        save_contents=tuple(p for p in save if p != "hf_model"),
        load_contents=tuple(p for p in load if p != "hf_model"),
        lora=replace(lora_settings(cfg), export_merged="hf_model" in save),
    )


def reference_kwargs(cfg: GRPOConfig, device: str) -> dict:
    """The reference's arguments: its own FSDP2 model, or under LoRA (``adapters_off_of="actor"``) the
    actor's model with its adapters switched off, which loads nothing and computes in the actor's dtype
    (no sharding or offload of its own: only the forward's knobs apply)."""
    r = cfg.actor_rollout_ref.ref
    m = cfg.actor_rollout_ref.model
    forward = dict(use_remove_padding=m.use_remove_padding, use_fused_kernels=m.use_fused_kernels,
                   logprob_chunk_size=m.logprob_chunk_size)
    if lora_settings(cfg).enabled:
        actor_dtype = fsdp_dtypes(cfg.actor_rollout_ref.actor.fsdp_config, device)["param_dtype"]
        return dict(adapters_off_of="actor", param_dtype=actor_dtype, **forward)
    dtypes = fsdp_dtypes(r.fsdp_config, device)
    return dict(
        param_dtype=dtypes["param_dtype"],
        param_offload=dtypes["param_offload"],
        reshard_after_forward=r.fsdp_config.reshard_after_forward,
        attn_implementation=cfg.actor_rollout_ref.model.attn_implementation,
        trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code,
        override_config=dict(cfg.actor_rollout_ref.model.override_config) or None,
        **forward,
    )


def critic_model_path(cfg: GRPOConfig, actor_model_path: str) -> str:
    """The value model's local folder: the actor's (already resolved) when ``critic.model.path`` names
    the actor's model, else ``critic.model.path`` resolved like the actor's (embedded name, hub cache)."""
    if cfg.critic.model.path == cfg.actor_rollout_ref.model.path:
        return actor_model_path
    from grpo_dist import tasks

    return tasks.resolve(cfg.critic.model.path)


def critic_settings(cfg: GRPOConfig, device: str, total_training_steps: int) -> CriticSettings:
    c = cfg.critic
    shape = step_shape(cfg)
    fsdp = critic_fsdp(cfg)
    override = dict(c.model.override_config)
    attn = override.pop("attn_implementation", cfg.actor_rollout_ref.model.attn_implementation)
    scale = c.loss_scale_factor
    W = shape.world_size
    return CriticSettings(
        ppo_mini_batch_size_per_gpu=c.ppo_mini_batch_size * shape.n // W,
        ppo_micro_batch_size_per_gpu=micro_batch(c.use_dynamic_bsz, per_gpu(
            c.ppo_micro_batch_size, c.ppo_micro_batch_size_per_gpu, W)),
        use_dynamic_bsz=c.use_dynamic_bsz,
        ppo_max_token_len_per_gpu=c.ppo_max_token_len_per_gpu,
        forward_micro_batch_size_per_gpu=None if c.use_dynamic_bsz else per_gpu(
            c.forward_micro_batch_size, c.forward_micro_batch_size_per_gpu, W),
        forward_max_token_len_per_gpu=c.forward_max_token_len_per_gpu,
        ppo_epochs=c.ppo_epochs,
        epochs_in_rows=c.shuffle,
        seed=cfg.trainer.seed,
        cliprange_value=c.cliprange_value,
        loss_agg_mode=c.loss_agg_mode,
        norm_constant=float(cfg.actor_rollout_ref.rollout.response_length if scale is None else scale),
        grad_clip=critic_grad_clip(cfg),
        **optimizer_fields(cfg, "critic.optim", c.optim, total_training_steps),
        **fsdp_dtypes(fsdp, device),
        attn_implementation=attn,
        override_config=override,
        enable_gradient_checkpointing=c.model.enable_gradient_checkpointing,
        max_seq_len=cfg.actor_rollout_ref.rollout.prompt_length + cfg.actor_rollout_ref.rollout.response_length,
        max_response_len=cfg.actor_rollout_ref.rollout.response_length,
        use_remove_padding=c.model.use_remove_padding,
        reshard_after_forward=fsdp.reshard_after_forward,
        optimizer_offload=fsdp.optimizer_offload,
        trust_remote_code=c.model.trust_remote_code,
        export_hf="hf_model" in c.checkpoint.save_contents,
        save_contents=tuple(p for p in c.checkpoint.save_contents if p != "hf_model"),
        load_contents=tuple(p for p in c.checkpoint.load_contents if p != "hf_model"),
        lora=lora_settings(cfg, CRITIC_MODEL),
    )


def reward_model_path(source: RewardSource) -> str:
    """A model source's local folder (an embedded name or a hub name resolved like the actor's);
    ``ValueError`` naming the key when it cannot be found."""
    from grpo_dist import tasks

    try:
        return tasks.resolve(source.path)
    except ValueError as exc:
        raise ValueError(f"the reward model ({source.path_key} = {source.path!r}) cannot be found: {exc}") from None


@functools.lru_cache(maxsize=8)
def _tokenizers_differ(a: str, b: str, trust_remote_code: bool) -> bool:
    """Whether the tokenizers of two local folders tokenize differently (vocabulary or chat template);
    a folder without tokenizer files reads the other's token ids, so they count as the same."""
    from transformers import AutoTokenizer

    try:
        ta = AutoTokenizer.from_pretrained(a, trust_remote_code=trust_remote_code)
        tb = AutoTokenizer.from_pretrained(b, trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return False
    return ta.get_vocab() != tb.get_vocab() or getattr(ta, "chat_template", None) != getattr(tb, "chat_template", None)


def reward_model_reencodes(cfg: GRPOConfig, rm_path: str, policy_tokenizer_path: str) -> str | None:
    """The folder of the policy's tokenizer to decode responses with when the reward model reads its
    own tokens (``reward_model.model.input_tokenizer`` set and the two tokenizers differ); None when
    the reward model reads the policy's token ids as they are."""
    tok = cfg.reward_model.model.input_tokenizer
    if not tok:
        return None
    from grpo_dist import tasks

    path = policy_tokenizer_path if tok == cfg.actor_rollout_ref.model.path else tasks.resolve(tok)
    return path if _tokenizers_differ(path, rm_path, cfg.reward_model.model.trust_remote_code) else None


def reward_model_settings(cfg: GRPOConfig, source: RewardSource, device: str, rm_path: str,
                          policy_tokenizer_path: str) -> RewardModelSettings:
    """A model source's settings: its own ranks, micro-batch and whether iterative RL trains it; the rest
    from the ``reward_model.*`` settings every reward model of the run shares."""
    rm, it = cfg.reward_model, cfg.reward_model.iterative
    fsdp = rm.model.fsdp_config
    world = source.world_size  # its own pool's ranks, or the training ranks it shares
    override = dict(rm.model.override_config)
    attn = override.pop("attn_implementation", cfg.actor_rollout_ref.model.attn_implementation)
    reencode = reward_model_reencodes(cfg, rm_path, policy_tokenizer_path)
    return RewardModelSettings(
        micro_batch_size_per_gpu=None if rm.use_dynamic_bsz else source.micro_batch_size_per_gpu,
        use_dynamic_bsz=rm.use_dynamic_bsz,
        forward_max_token_len_per_gpu=rm.forward_max_token_len_per_gpu,
        reencode=reencode is not None,
        input_tokenizer_path=reencode,
        max_length=rm.max_length,
        trainable=source.trained,
        mini_batch_size_per_gpu=-(-it.mini_batch_size // world),
        update_micro_batch_size_per_gpu=it.micro_batch_size_per_gpu,
        epochs=it.epochs,
        lr=it.lr,
        weight_decay=it.weight_decay,
        betas=tuple(it.betas),
        grad_clip=it.grad_clip,
        seed=cfg.trainer.seed,
        model_dtype=fsdp.model_dtype,
        param_dtype=compute_dtype(fsdp.dtype, device),
        reduce_dtype="float32",
        attn_implementation=attn,
        override_config=override,
        reshard_after_forward=fsdp.reshard_after_forward,
        param_offload=fsdp.param_offload,
        trust_remote_code=rm.model.trust_remote_code,
    )


def forward_batching(section, world_size: int) -> tuple[int | None, int | None]:
    """``(micro_batch_size, max_token_len)`` of a no-grad log-prob forward from a config section with
    verl's ``log_prob_micro_batch_size_per_gpu`` (or the former global ``log_prob_micro_batch_size``) /
    ``log_prob_use_dynamic_bsz`` / ``log_prob_max_token_len_per_gpu`` keys (rollout: the old-log-prob
    forward; ref: the reference's); at most one of the two is set, neither: all of a rank's rows at once."""
    if section.log_prob_use_dynamic_bsz:
        return None, section.log_prob_max_token_len_per_gpu
    return per_gpu(section.log_prob_micro_batch_size, section.log_prob_micro_batch_size_per_gpu, world_size), None


def reward_worker_kwargs(cfg: GRPOConfig, tokenizer_path: str) -> dict:
    """The rule-based reward worker's constructor arguments: the tokenizer, the custom reward function,
    its scoring processes and how a failing call is limited and judged."""
    rm = cfg.reward_model
    return dict(tokenizer_path=tokenizer_path, trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code,
                custom_path=setting(cfg, "custom_reward_function.path"),
                custom_name=setting(cfg, "custom_reward_function.name") or "compute_score",
                num_workers=setting(cfg, "reward_model.num_workers"), timeout_s=rm.timeout_s, on_error=rm.on_error)
