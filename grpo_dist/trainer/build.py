"""Map the configuration onto the numbers each library piece takes (no config objects below here)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from grpo_dist.config.roles import needs_reward_model, reference_is_reset, reward_model_trained  # noqa: F401
from grpo_dist.config.schema import GRPOConfig
from grpo_dist.config.states import setting
from grpo_dist.config.validate import (  # noqa: F401
    critic_enabled,
    critic_fsdp,
    critic_grad_clip,
    data_parallel_size,
    needs_reference,
    overlong_buffer,
    reward_model_micro_batch,
    reward_model_spec,
    reward_model_world_size,
    rollout_correction_params,
)
from grpo_dist.core.policy_loss import PolicyLossParams
from grpo_dist.core.rollout_correction import RolloutCorrectionParams
from grpo_dist.rollout.base import SamplingSettings
from grpo_dist.trainer.dynamic_sampling import DynamicSampling, SingleBatch
from grpo_dist.training.dtypes import dtype_name
from grpo_dist.training.settings import ActorSettings, CriticSettings, RewardModelSettings


def choose_device(name: str, cluster_gpus: float) -> str:
    """The workers' device kind, ``"cuda"`` or ``"cpu"``, from ``trainer.device`` and what the Ray
    cluster offers (the driver itself may have no GPU)."""
    if name == "auto":
        return "cuda" if cluster_gpus > 0 or torch.cuda.is_available() else "cpu"
    if name == "cuda" and cluster_gpus <= 0:
        raise ValueError("trainer.device = 'cuda' is not valid here: the Ray cluster has no GPUs; run it where the GPUs "
                         "are (`--check` validates it for them on any machine), or use trainer.device=cpu")
    return name


def compute_dtype(name: str, device: str) -> str:
    """A dtype setting (``auto`` or a name, verl's short names too) as the long name used on ``device``."""
    if name != "auto":
        return dtype_name(name)
    return "bfloat16" if device == "cuda" else "float32"


def fsdp_dtypes(fsdp, device: str) -> dict:
    """``model_dtype``, ``param_dtype``, ``reduce_dtype`` and ``param_offload`` of an ``fsdp_config`` section:
    the compute dtype is ``mixed_precision.param_dtype`` when set, else ``dtype`` (validation refuses
    the two set differently); ``offload_policy`` is FSDP2's CPU offload, which ``param_offload`` is here."""
    mp = fsdp.mixed_precision
    return dict(model_dtype=dtype_name(fsdp.model_dtype),
                param_dtype=compute_dtype(mp.param_dtype or fsdp.dtype, device),
                reduce_dtype=dtype_name(mp.reduce_dtype),
                param_offload=bool(fsdp.param_offload or fsdp.offload_policy))


def per_gpu(global_size: int | None, per_gpu_size: int | None, world_size: int) -> int | None:
    """verl's two spellings of a micro-batch size: ``*_per_gpu``, or the former global size divided by the
    data-parallel ranks (validation refuses both set, and a global size below the rank count)."""
    return per_gpu_size if global_size is None else global_size // world_size


def cpu_half_precision_warning(cfg: GRPOConfig, device: str) -> str | None:
    """A warning when a CPU run computes in bfloat16/float16 on a CPU without native support for it.

    On CPUs with AVX512-BF16 or AMX, bfloat16 compute is the fast path (matmuls ~4x float32 on the
    2-core benchmark machine, the large benchmark's step ~2x; docs/benchmarks.md); elsewhere oneDNN
    emulates it and it is slower than float32. Checked on the driver's machine, which for a CPU run is
    one of the workers' (clusters are assumed to be of one CPU type).
    """
    if device != "cpu":
        return None
    dtypes = {compute_dtype(cfg.actor_rollout_ref.actor.fsdp_config.dtype, device),
              compute_dtype(cfg.actor_rollout_ref.rollout.dtype, device)}
    half = sorted(d for d in dtypes if d in ("bfloat16", "float16"))
    if not half:
        return None
    native = {"bfloat16": torch.ops.mkldnn._is_mkldnn_bf16_supported(),
              "float16": torch.ops.mkldnn._is_mkldnn_fp16_supported()}
    slow = [d for d in half if not native[d]]
    if not slow:
        return None
    return (f"this CPU has no native {'/'.join(slow)} arithmetic (torch CPU capability "
            f"{torch.backends.cpu.get_cpu_capability()}): it is emulated and slower than float32; "
            f"actor_rollout_ref.actor.fsdp_config.dtype=float32 actor_rollout_ref.rollout.dtype=float32 "
            f"(or auto) would be faster")


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
        lr=a.optim.lr,
        weight_decay=a.optim.weight_decay,
        betas=tuple(a.optim.betas),
        lr_warmup_steps=a.optim.lr_warmup_steps,
        lr_warmup_steps_ratio=a.optim.lr_warmup_steps_ratio,
        total_training_steps=total_training_steps,
        lr_scheduler_type=setting(cfg, "actor_rollout_ref.actor.optim.lr_scheduler_type"),
        min_lr_ratio=a.optim.min_lr_ratio,
        num_cycles=a.optim.num_cycles,
        zero_indexed_step=a.optim.zero_indexed_step,
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
    )


def reference_kwargs(cfg: GRPOConfig, device: str) -> dict:
    r = cfg.actor_rollout_ref.ref
    dtypes = fsdp_dtypes(r.fsdp_config, device)
    return dict(
        param_dtype=dtypes["param_dtype"],
        param_offload=dtypes["param_offload"],
        reshard_after_forward=r.fsdp_config.reshard_after_forward,
        attn_implementation=cfg.actor_rollout_ref.model.attn_implementation,
        trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code,
        override_config=dict(cfg.actor_rollout_ref.model.override_config) or None,
        use_remove_padding=cfg.actor_rollout_ref.model.use_remove_padding,
        use_fused_kernels=cfg.actor_rollout_ref.model.use_fused_kernels,
        logprob_chunk_size=cfg.actor_rollout_ref.model.logprob_chunk_size,
    )


def micro_batch(use_dynamic_bsz: bool, size: int | None) -> int | str | None:
    """The settings' micro-batch size of a ``ppo_micro_batch_size_per_gpu`` key: unused with
    ``use_dynamic_bsz``; null means ``"auto"`` (grpo_dist.training.memory)."""
    if use_dynamic_bsz:
        return None
    return "auto" if size is None else size


def needs_critic(cfg: GRPOConfig) -> bool:
    return critic_enabled(cfg)


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
        lr=c.optim.lr,
        weight_decay=c.optim.weight_decay,
        betas=tuple(c.optim.betas),
        lr_warmup_steps=c.optim.lr_warmup_steps,
        lr_warmup_steps_ratio=c.optim.lr_warmup_steps_ratio,
        total_training_steps=total_training_steps,
        lr_scheduler_type=setting(cfg, "critic.optim.lr_scheduler_type"),
        min_lr_ratio=c.optim.min_lr_ratio,
        num_cycles=c.optim.num_cycles,
        zero_indexed_step=c.optim.zero_indexed_step,
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
    )


def reward_model_path(cfg: GRPOConfig) -> str:
    """The reward model's local folder (an embedded name or a hub name resolved like the actor's);
    ``ValueError`` naming the key when it cannot be found."""
    from grpo_dist import tasks

    spec = reward_model_spec(cfg)
    try:
        return tasks.resolve(spec.path)
    except ValueError as exc:
        raise ValueError(f"the reward model ({spec.path_key} = {spec.path!r}) cannot be found: {exc}") from None


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


def reward_model_settings(cfg: GRPOConfig, device: str, rm_path: str, policy_tokenizer_path: str) -> RewardModelSettings:
    rm, it = cfg.reward_model, cfg.reward_model.iterative
    fsdp = rm.model.fsdp_config
    world = reward_model_world_size(cfg)  # its own pool's ranks, or the training ranks it shares
    override = dict(rm.model.override_config)
    attn = override.pop("attn_implementation", cfg.actor_rollout_ref.model.attn_implementation)
    reencode = reward_model_reencodes(cfg, rm_path, policy_tokenizer_path)
    return RewardModelSettings(
        micro_batch_size_per_gpu=None if rm.use_dynamic_bsz else reward_model_micro_batch(cfg),
        use_dynamic_bsz=rm.use_dynamic_bsz,
        forward_max_token_len_per_gpu=rm.forward_max_token_len_per_gpu,
        reencode=reencode is not None,
        input_tokenizer_path=reencode,
        max_length=rm.max_length,
        trainable=it.enable,
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


def actor_update_due(finished_steps: int, critic_warmup: int) -> bool:
    """Whether the step now running updates the actor (``trainer.critic_warmup``).

    verl counts steps from 1 (``global_steps`` is 1 during the first step) and updates the actor when
    ``critic_warmup <= global_steps``. Here ``finished_steps`` (the driver's ``global_step``) counts
    the steps already done, so the running step is verl's ``finished_steps + 1``: the actor updates
    when ``finished_steps + 1 >= critic_warmup``. Steps 1 .. critic_warmup - 1 train only the critic;
    0 and 1 both mean no warm-up.
    """
    return finished_steps + 1 >= critic_warmup


def forward_batching(section, world_size: int) -> tuple[int | None, int | None]:
    """``(micro_batch_size, max_token_len)`` of a no-grad log-prob forward from a config section with
    verl's ``log_prob_micro_batch_size_per_gpu`` (or the former global ``log_prob_micro_batch_size``) /
    ``log_prob_use_dynamic_bsz`` / ``log_prob_max_token_len_per_gpu`` keys (rollout: the old-log-prob
    forward; ref: the reference's); at most one of the two is set, neither: all of a rank's rows at once."""
    if section.log_prob_use_dynamic_bsz:
        return None, section.log_prob_max_token_len_per_gpu
    return per_gpu(section.log_prob_micro_batch_size, section.log_prob_micro_batch_size_per_gpu, world_size), None


def rollout_correction(cfg: GRPOConfig) -> RolloutCorrectionParams:
    """``algorithm.rollout_correction.*``, parsed."""
    return rollout_correction_params(cfg)


def rollout_log_probs(cfg: GRPOConfig) -> bool:
    """Whether the rollout returns its log-probs: ``rollout.calculate_log_probs``, or on by itself
    when the rollout correction needs them (weights, rejection or bypass mode)."""
    return cfg.actor_rollout_ref.rollout.calculate_log_probs or rollout_correction(cfg).changes_training


def on_policy(cfg: GRPOConfig) -> bool:
    """Whether the update is one optimizer step on fresh samples (one mini-batch, one epoch, no KL in
    the reward, not bypass mode): then the old policy IS the current one (ratio 1) and the actor needs
    no old log-probs."""
    return (step_shape(cfg).num_mini_batches == 1 and cfg.actor_rollout_ref.actor.ppo_epochs == 1
            and not cfg.algorithm.use_kl_in_reward and not rollout_correction(cfg).bypass)


def old_log_prob_forward(cfg: GRPOConfig) -> bool:
    """Whether a step runs the actor's old-log-prob forward (``timing_s/old_log_prob``): off-policy
    updates need it; on-policy ones too when the rollout returns its log-probs, to compare them with
    the trainer's (``training/rollout_probs_diff_*``, ``rollout_corr/*``) and for the rollout
    correction. Never in bypass mode (the rollout's log-probs stand in)."""
    return not rollout_correction(cfg).bypass and (not on_policy(cfg) or rollout_log_probs(cfg))


def train_sampling(cfg: GRPOConfig, seed: int | None = None) -> SamplingSettings:
    r = cfg.actor_rollout_ref.rollout
    return SamplingSettings(
        n=r.n, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_tokens=r.response_length,
        do_sample=r.do_sample, seed=seed, logprobs=rollout_log_probs(cfg),
    )


def baseline_sampling(cfg: GRPOConfig) -> SamplingSettings:
    """One greedy response per prompt: the baseline rollout of estimators that need one (ReMax)."""
    return SamplingSettings.greedy(cfg.actor_rollout_ref.rollout.response_length)


def prompts_per_draw(cfg: GRPOConfig) -> int:
    """Prompts drawn from the data at a time: ``data.gen_batch_size`` (default train_batch_size) with
    dynamic sampling, else ``data.train_batch_size``."""
    d = cfg.data
    return (d.gen_batch_size or d.train_batch_size) if cfg.algorithm.filter_groups.enable else d.train_batch_size


def step_sampling(cfg: GRPOConfig) -> DynamicSampling | SingleBatch:
    """How a step gets its responses: DAPO's refill loop (``algorithm.filter_groups``) or one batch."""
    fg = cfg.algorithm.filter_groups
    if not fg.enable:
        return SingleBatch()
    return DynamicSampling(train_batch_size=cfg.data.train_batch_size, metric=fg.metric,
                           max_num_gen_batches=fg.max_num_gen_batches, on_exhausted=fg.on_exhausted,
                           mini_batch_prompts=cfg.actor_rollout_ref.actor.ppo_mini_batch_size)


def val_sampling(cfg: GRPOConfig) -> SamplingSettings:
    r = cfg.actor_rollout_ref.rollout
    v = r.val_kwargs
    greedy = not v.do_sample or v.temperature == 0
    return SamplingSettings(
        n=v.n, temperature=0.0 if greedy else v.temperature, top_p=v.top_p, top_k=v.top_k,
        max_tokens=r.response_length, do_sample=not greedy, seed=None, logprobs=False,
    )


def reward_decoder(cfg: GRPOConfig, tokenizer: Any) -> dict | None:
    """How the reward worker decodes responses without importing transformers: the driver's tokenizer
    rebuilt from its ``tokenizers`` backend (:func:`grpo_dist.rewards.decoding.decoder_spec`); None
    (the worker loads the tokenizer with transformers) when the tokenizer may run its own code or
    decodes in a way of its own."""
    from grpo_dist.rewards.decoding import decoder_spec

    if cfg.actor_rollout_ref.model.trust_remote_code or cfg.data.trust_remote_code:
        return None
    return decoder_spec(tokenizer)


def engine_kwargs(cfg: GRPOConfig, model_path: str, device: str, kv_gib: float | None = None) -> dict:
    """Constructor arguments of the rollout engine named by actor_rollout_ref.rollout.name (``kv_gib``:
    the CPU KV cache chosen once for the run by :func:`kv_cache_gib`, which the role table passes;
    without it a set size is used as it is and ``auto`` leaves the engine's own default, 1 GiB)."""
    r = cfg.actor_rollout_ref.rollout
    dtype = compute_dtype(r.dtype, device)
    trust = cfg.actor_rollout_ref.model.trust_remote_code
    overrides = dict(cfg.actor_rollout_ref.model.override_config) or None  # the policy's config as the actor builds it
    if r.name == "hf":
        return dict(model_path=model_path, dtype=dtype, device=device, trust_remote_code=trust, config_overrides=overrides)
    return dict(
        model_path=model_path,
        dtype=dtype,
        trust_remote_code=trust,
        hf_overrides=overrides,
        max_model_len=r.max_model_len or (r.prompt_length + r.response_length),
        gpu_memory_utilization=r.gpu_memory_utilization,
        tensor_parallel_size=r.tensor_model_parallel_size,
        max_num_seqs=r.max_num_seqs,
        max_num_batched_tokens=r.max_num_batched_tokens,
        enable_chunked_prefill=r.enable_chunked_prefill,
        extra_kwargs={k: v for k, v in r.engine_kwargs.vllm.items() if v is not None},
        enforce_eager=r.enforce_eager,
        enable_sleep_mode=bool(r.free_cache_engine and device == "cuda"),
        kv_cache_gib=(kv_gib if kv_gib is not None else None if r.kv_cache_gib == "auto" else float(r.kv_cache_gib))
        if device == "cpu" else None,
    )


#: The fields of a model's ``config.json`` that :class:`~grpo_dist.training.memory.ModelShape` reads.
SHAPE_FIELDS = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size",
                "num_key_value_heads", "head_dim", "tie_word_embeddings")


def model_shape(model_path: str, trust_remote_code: bool):
    """The model's :class:`~grpo_dist.training.memory.ModelShape`. Read from ``config.json`` itself
    when it states every field the shape needs under its own name (what transformers' config then
    holds too), so that the run does not wait for transformers' import before it creates the rollout
    workers (~1.5-2 s on the critical path of start-up); otherwise (a field left to the config class's
    default, an aliased name, a nested text config) from ``AutoConfig``."""
    import json
    from pathlib import Path
    from types import SimpleNamespace

    from grpo_dist.training.memory import ModelShape

    try:
        raw = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        raw = None
    if isinstance(raw, dict) and all(raw.get(k) is not None for k in SHAPE_FIELDS):
        return ModelShape.from_config(SimpleNamespace(**{k: raw[k] for k in SHAPE_FIELDS}))
    from transformers import AutoConfig

    return ModelShape.from_config(AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code))


def kv_cache_gib(cfg: GRPOConfig, model_path: str, available: float | None = None) -> tuple[float, str]:
    """The CPU KV cache of each vLLM engine: ``rollout.kv_cache_gib``, or with ``auto`` what
    :func:`grpo_dist.training.memory.auto_kv_cache_gib` picks for one rank's share of a step (at most
    ``max_num_seqs`` sequences at once) from this machine's available memory; and why."""
    r = cfg.actor_rollout_ref.rollout
    if r.kv_cache_gib != "auto":
        return float(r.kv_cache_gib), "set"
    import psutil

    from grpo_dist.training.memory import auto_kv_cache_gib

    ranks = data_parallel_size(cfg)
    per_rank = -(-prompts_per_draw(cfg) * r.n // ranks)
    sequences = max(1, min(r.max_num_seqs, per_rank))
    b = 2 if compute_dtype(r.dtype, "cpu") in ("bfloat16", "float16") else 4
    avail = psutil.virtual_memory().available if available is None else available
    shape = model_shape(model_path, cfg.actor_rollout_ref.model.trust_remote_code)
    return auto_kv_cache_gib(shape, b, sequences=sequences,
                             seq_len=r.max_model_len or (r.prompt_length + r.response_length), available=avail,
                             engines_on_node=cfg.trainer.n_gpus_per_node)


def check_model_fits(cfg: GRPOConfig, model_path: str, tokenizer) -> None:
    """Checks that need the model's config and the tokenizer (cheap: no weights are loaded)."""
    from transformers import AutoConfig

    mc = AutoConfig.from_pretrained(model_path, trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code)
    for key, value in cfg.actor_rollout_ref.model.override_config.items():  # as the actor and engine build it
        setattr(mc, key, value)
    r = cfg.actor_rollout_ref.rollout
    ctx = getattr(mc, "max_position_embeddings", None)
    need = r.prompt_length + r.response_length
    if ctx is not None and need > ctx:
        raise ValueError(
            f"data.max_prompt_length + data.max_response_length = {need} is longer than the model's context "
            f"(max_position_embeddings = {ctx} in {model_path}/config.json); lower one of them"
        )
    vocab = getattr(mc, "vocab_size", None)
    if vocab is not None and len(tokenizer) > vocab:
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {vocab}: they do not belong "
            f"together (data.tokenizer = {cfg.data.tokenizer!r}, actor_rollout_ref.model.path = {model_path!r})"
        )
    tp = r.tensor_model_parallel_size
    heads, kv_heads = getattr(mc, "num_attention_heads", None), getattr(mc, "num_key_value_heads", None)
    if tp > 1 and heads is not None and (heads % tp or (kv_heads and kv_heads % tp and tp % kv_heads)):
        raise ValueError(
            f"actor_rollout_ref.rollout.tensor_model_parallel_size = {tp} does not divide the model's attention heads "
            f"(num_attention_heads = {heads}, num_key_value_heads = {kv_heads} in {model_path}/config.json): each of "
            f"an engine's {tp} ranks holds a whole number of heads; use a divisor of {heads}"
        )
    if needs_reward_model(cfg):
        check_reward_model_fits(cfg, model_path, tokenizer, need)
    if needs_critic(cfg):
        path = critic_model_path(cfg, model_path)
        cc = AutoConfig.from_pretrained(path, trust_remote_code=cfg.critic.model.trust_remote_code)
        ctx, vocab = getattr(cc, "max_position_embeddings", None), getattr(cc, "vocab_size", None)
        if ctx is not None and need > ctx:
            raise ValueError(
                f"data.max_prompt_length + data.max_response_length = {need} is longer than the value model's context "
                f"(max_position_embeddings = {ctx} in {path}/config.json, critic.model.path); lower one of them"
            )
        if vocab is not None and len(tokenizer) > vocab:
            raise ValueError(
                f"the tokenizer has {len(tokenizer)} tokens but the value model's vocab_size is {vocab}: the critic reads "
                f"the actor's token ids, so critic.model.path = {cfg.critic.model.path!r} must share the actor's vocabulary"
            )


def check_reward_model_fits(cfg: GRPOConfig, policy_path: str, tokenizer, need: int) -> None:
    """The reward model's folder can be read and fits the run: its context holds prompt + response;
    when it reads the policy's token ids, its vocabulary covers the policy's tokenizer; a process
    reward model, and iterative RL, read the policy's tokens; its weights hold the trained head it is
    read with (:func:`grpo_dist.training.reward_model.check_reward_head`: names only, no weights are
    read). ``ValueError`` naming the reward model."""
    from transformers import AutoConfig

    spec = reward_model_spec(cfg)
    path = reward_model_path(cfg)
    try:
        mc = AutoConfig.from_pretrained(path, trust_remote_code=cfg.reward_model.model.trust_remote_code)
    except (OSError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ValueError(f"the reward model {path} ({spec.path_key}) cannot be loaded: {type(exc).__name__}: {first}") from None
    reencode = reward_model_reencodes(cfg, path, getattr(tokenizer, "name_or_path", None) or policy_path)
    ctx, vocab = getattr(mc, "max_position_embeddings", None), getattr(mc, "vocab_size", None)
    if ctx is not None and not reencode and need > ctx:
        raise ValueError(
            f"data.max_prompt_length + data.max_response_length = {need} is longer than the reward model's context "
            f"(max_position_embeddings = {ctx} in {path}/config.json, {spec.path_key}); lower one of them"
        )
    if reencode is None and vocab is not None and len(tokenizer) > vocab:
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens but the reward model's vocab_size is {vocab}: the reward model "
            f"reads the actor's token ids, so {spec.path_key} = {spec.path!r} must share the actor's vocabulary "
            "(or give its own tokenizer in its folder and keep reward_model.model.input_tokenizer set)"
        )
    if reencode is not None and (cfg.reward_model.process.enable or cfg.reward_model.iterative.enable):
        what = "a process reward model" if cfg.reward_model.process.enable else "iterative RL"
        raise ValueError(
            f"{what} reads the policy's own tokens, but the reward model {path} has a tokenizer of its own; use a reward "
            "model built on the policy's tokenizer, or set reward_model.model.input_tokenizer=null to feed it the policy's ids"
        )
    from grpo_dist.training.reward_model import check_reward_head

    override = {k: v for k, v in cfg.reward_model.model.override_config.items() if k != "attn_implementation"}
    check_reward_head(path, overrides=override,
                      trust_remote_code=cfg.reward_model.model.trust_remote_code, key=spec.path_key)


#: Each model role's verl keys for Ulysses sequence parallelism (accepted, not built: see their notice).
SEQUENCE_PARALLEL_KEYS = {
    "actor": ("actor_rollout_ref.actor.ulysses_sequence_parallel_size",
              "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size"),
    "reference": ("actor_rollout_ref.ref.ulysses_sequence_parallel_size",
                  "actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size"),
    "critic": ("critic.ulysses_sequence_parallel_size", "critic.model.fsdp_config.ulysses_sequence_parallel_size",
               "critic.fsdp.ulysses_sequence_parallel_size"),
}


def whole_sequence_note(cfg: GRPOConfig, role: str) -> str:
    """What a role's memory note adds when one of its ``ulysses_sequence_parallel_size`` keys is above
    1: the memory choices are sized for whole sequences on every rank (nothing is divided by sp); ""
    otherwise."""
    given = [(key, int(setting(cfg, key) or 1)) for key in SEQUENCE_PARALLEL_KEYS.get(role, ())]
    given = [(key, sp) for key, sp in given if sp > 1]
    if not given:
        return ""
    key, sp = given[0]
    r = cfg.actor_rollout_ref.rollout
    return (f" (sized for whole sequences of up to {r.prompt_length + r.response_length} tokens on every rank: "
            f"{key} = {sp} does not split them here, so a rank needs the memory verl would spread over {sp})")


def startup_lines(compute: str, warning: str | None, device: str, world: int, placement: dict, transport: str,
                  model_notes: dict[str, str] | None = None) -> list[str]:
    """What the run says once its workers are up: ranks, nodes, device, the actor's compute dtype,
    weight-sync transport, what the "auto" memory settings chose (each model role's, and the CPU KV
    cache), and a warning (``cpu_half_precision_warning``) when there is one."""
    lines = [f"{world} rank(s) on {len(set(placement['actor_rank_nodes']))} node(s), device {device}, "
             f"{compute} compute, weight sync {transport}"]
    lines += [f"{role}: {note}" for role, note in (model_notes or {}).items()]
    return lines + ([f"warning: {warning}"] if warning else [])


def local_cpu_run(cfg: GRPOConfig) -> bool:
    """A run on this machine's CPUs: ``trainer.device=cpu`` (or ``auto`` without a GPU here) and no Ray
    cluster to join (``ray_kwargs.ray_init.address``)."""
    t = cfg.trainer
    on_cpu = t.device == "cpu" or (t.device == "auto" and not torch.cuda.is_available())
    return on_cpu and not cfg.ray_kwargs.ray_init.address


def usable_cores(cfg: GRPOConfig) -> int | None:
    """The cores a single-machine run may use: this process's CPU affinity (a batch scheduler or taskset
    narrows it), else the machine's count; at most ``ray_kwargs.ray_init.num_cpus`` when that is set (the
    local Ray cluster gets that many). The one count both ``--check`` and the run use."""
    cores = machine_cores()
    limit = cfg.ray_kwargs.ray_init.num_cpus
    if limit:
        cores = min(cores, int(limit)) if cores else int(limit)
    return cores


def threads_per_rank(cores: int | None, ranks: int) -> int:
    """Intra-op threads of each rank's processes on a single-machine CPU run: the usable cores shared
    out evenly (at least one)."""
    return max(1, (cores or 1) // max(ranks, 1))


def worker_threads(cfg: GRPOConfig, device: str, world: int, cluster_cpus: Callable[[], float]) -> int:
    """Intra-op threads of every worker process: 4 on GPUs (they only launch kernels); on this machine's
    CPUs the rule ``--check`` applies (:func:`usable_cores`, :func:`threads_per_rank`); on a Ray cluster's
    CPUs (``ray_kwargs.ray_init.address``) its CPUs shared out over the ranks."""
    if device != "cpu":
        return 4
    if cfg.ray_kwargs.ray_init.address:
        return max(1, int(cluster_cpus() // max(world, 1)))
    return threads_per_rank(usable_cores(cfg), world)


def check_cpu_ranks(cfg: GRPOConfig, cores: int | None) -> None:
    """A single-machine CPU run starts one training process per rank, each computing with
    :func:`threads_per_rank` threads of the ``cores`` usable (:func:`usable_cores`): more ranks than
    cores would leave a rank less than one core, which only oversubscribes them and multiplies the
    memory (64 ranks on 2 cores ran the machine out of memory in minutes). ``ValueError`` naming the keys
    and the largest setting that fits. Runs on a Ray cluster (``ray_kwargs.ray_init.address``), on GPUs,
    or with an unknown core count are not checked here."""
    t = cfg.trainer
    if not local_cpu_run(cfg) or not cores:
        return
    ranks = data_parallel_size(cfg)
    if ranks > cores:
        gpu_hint = ("; for a GPU cluster, set trainer.device=cuda: `--check` then validates for its GPUs on any machine"
                    if t.device == "auto" else "")
        raise ValueError(
            f"trainer.nnodes x trainer.n_gpus_per_node = {t.nnodes} x {t.n_gpus_per_node} = {ranks} CPU ranks, but this "
            f"machine has {cores} cores this process may use (its CPU affinity): every rank is a training process with at least one "
            f"thread of its own and its own memory; use at most trainer.n_gpus_per_node={max(1, cores // max(t.nnodes, 1))}"
            " here (the batch sizes must stay divisible by it), or run on a Ray cluster (ray_kwargs.ray_init.address)"
            + gpu_hint
        )


def machine_notes(cfg: GRPOConfig, cores: int | None) -> list[str]:
    """What ``--check`` says about this machine besides the plan: the threads of a single-machine CPU run,
    or, for ``trainer.device=cuda`` on a machine without a GPU, that it checked for the GPUs the
    configuration names (the run itself must start where they are)."""
    t = cfg.trainer
    if local_cpu_run(cfg) and cores:
        ranks = data_parallel_size(cfg)
        return [f"{ranks} CPU rank(s) x {threads_per_rank(cores, ranks)} thread(s) on the {cores} core(s) this process "
                "may use (its CPU affinity)"]
    if t.device == "cuda" and not torch.cuda.is_available():
        return [f"this machine has no GPU: checked for the cluster the config names (trainer.nnodes x "
                f"trainer.n_gpus_per_node = {t.nnodes} x {t.n_gpus_per_node} GPUs); the run must start where they are "
                "(on a Ray cluster with GPUs: ray_kwargs.ray_init.address)"]
    return []


# ---- memory of a single-machine CPU run ---------------------------------------------------------
#: Resident memory of one worker process before it holds a model (Python, torch, transformers; measured
#: 0.40 GiB on the 2-core machine): a floor, so the estimate stays below what the run really needs.
PROCESS_BASE_GIB = 0.35
#: Warn when the estimate passes this share of the available memory (refuse only above all of it).
MEMORY_WARN_SHARE = 0.8
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_SAFETENSORS_DTYPE_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
                            "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def model_parameter_count(model_dir: str) -> int | None:
    """Parameters of the model in ``model_dir``, read from its safetensors headers (no weights are
    loaded; a tied embedding is stored, and counted, once); None when the folder has none."""
    import json
    import struct
    from pathlib import Path

    files = sorted(Path(model_dir).glob("*.safetensors")) if Path(model_dir).is_dir() else []
    if not files:
        return None
    total = 0
    try:
        for f in files:
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
            for name, entry in header.items():
                if name == "__metadata__":
                    continue
                count = 1
                for d in entry["shape"]:
                    count *= int(d)
                total += count
    except (OSError, ValueError, KeyError, struct.error):
        return None
    return total


def cpu_memory_estimate(cfg: GRPOConfig, ranks: int, params: int, critic_params: int | None = None) -> tuple[float, str]:
    """A floor on the resident memory (GiB) a single-machine CPU run of ``ranks`` ranks needs, and its
    breakdown in words. Counted: the actor's master weights, gradients and Adam's two moments (4 x
    ``fsdp_config.model_dtype``'s bytes per parameter, sharded over the ranks by FSDP2, so counted once in all); the reference's
    weights (sharded, when a KL term is used); the critic's like the actor's; one full copy of the
    weights in every rank's rollout engine plus its KV cache (``rollout.kv_cache_gib``; 1 GiB for
    ``auto``, which sizes the cache from the memory left; vLLM only); ``PROCESS_BASE_GIB`` per worker process and for the driver. Not counted:
    activations, the full weights gathered for weight sync and checkpoints, Ray's own processes."""
    a = cfg.actor_rollout_ref
    gib = 2.0**30
    actor_b = _DTYPE_BYTES.get(a.actor.fsdp_config.model_dtype, 4)  # master weights, their gradients, Adam
    rollout_b = _DTYPE_BYTES.get(compute_dtype(a.rollout.dtype, "cpu"), 4)
    parts = [("actor (weights, gradients, Adam)", 4 * actor_b * params / gib)]
    processes = 2  # actor + rollout per rank
    if needs_reference(cfg):
        parts.append(("reference", _DTYPE_BYTES.get(compute_dtype(a.actor.fsdp_config.dtype, "cpu"), 4) * params / gib))
        processes += 1
    if needs_critic(cfg):
        cp = critic_params if critic_params is not None else params
        parts.append(("critic", 4 * _DTYPE_BYTES.get(critic_fsdp(cfg).model_dtype, 4) * cp / gib))
        processes += 1
    kv_set = a.rollout.kv_cache_gib
    kv = (1.0 if kv_set in (None, "auto") else float(kv_set)) if a.rollout.name == "vllm" else 0.0
    parts.append((f"{ranks} rollout engine(s) (weights + {kv:g} GiB KV cache each)", ranks * (rollout_b * params / gib + kv)))
    parts.append((f"{ranks * processes + 2} processes", (ranks * processes + 2) * PROCESS_BASE_GIB))
    total = sum(v for _, v in parts)
    return total, ", ".join(f"{name} {v:.1f}" for name, v in parts)


def check_cpu_memory(cfg: GRPOConfig, params: int | None, available_gib: float | None, cores: int | None = None,
                     critic_params: int | None = None) -> str | None:
    """Refuse (``ValueError`` naming the keys and the largest ``trainer.n_gpus_per_node`` that fits)
    a single-machine CPU run whose memory floor (:func:`cpu_memory_estimate`) is above the memory
    available now; a warning (returned) when it is above ``MEMORY_WARN_SHARE`` of it; None otherwise.
    Cluster runs, GPU runs and unknown sizes are not checked."""
    t = cfg.trainer
    on_cpu = t.device == "cpu" or (t.device == "auto" and not torch.cuda.is_available())
    if not on_cpu or cfg.ray_kwargs.ray_init.address or not params or not available_gib:
        return None
    ranks = data_parallel_size(cfg)
    need, parts = cpu_memory_estimate(cfg, ranks, params, critic_params)
    if need <= MEMORY_WARN_SHARE * available_gib:
        return None
    setting = (f"trainer.nnodes x trainer.n_gpus_per_node = {t.nnodes} x {t.n_gpus_per_node} = {ranks} CPU rank(s) of "
               f"a {params / 1e6:.0f} M-parameter model")
    if need <= available_gib:
        return (f"{setting} need at least {need:.1f} GiB of memory ({parts}) of the {available_gib:.1f} GiB available "
                "now: the run may be killed for memory; fewer ranks, a smaller actor_rollout_ref.rollout.kv_cache_gib "
                "or a smaller model leave more room")
    nodes = max(t.nnodes, 1)
    fits = [n for n in range(t.n_gpus_per_node - 1, 0, -1)
            if cpu_memory_estimate(cfg, nodes * n, params, critic_params)[0] <= available_gib
            and (not cores or nodes * n <= cores)]
    fix = (f"use at most trainer.n_gpus_per_node={fits[0]} here (the batch sizes must stay divisible by it)" if fits
           else "even one rank does not fit: lower actor_rollout_ref.rollout.kv_cache_gib, use a smaller model")
    raise ValueError(
        f"{setting} need at least {need:.1f} GiB of memory ({parts}), but this machine has {available_gib:.1f} GiB "
        f"available; {fix}, or run on a Ray cluster (ray_kwargs.ray_init.address)")


def machine_cores() -> int | None:
    """The cores this process may run on (its CPU affinity, which a batch scheduler or taskset narrows),
    else the machine's count."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def available_memory_gib() -> float | None:
    try:
        import psutil
    except ImportError:
        return None
    return psutil.virtual_memory().available / 2**30


def check_cpu_resources(cfg: GRPOConfig, model_path: str) -> str | None:
    """The single-machine CPU checks before anything starts: ranks against the cores this process may
    use (:func:`check_cpu_ranks`) and the memory floor against the memory available
    (:func:`check_cpu_memory`). ``ValueError`` when the run clearly does not fit; a warning (returned)
    when it is close."""
    cores = usable_cores(cfg)
    check_cpu_ranks(cfg, cores)
    if not local_cpu_run(cfg):
        return None
    critic = model_parameter_count(critic_model_path(cfg, model_path)) if needs_critic(cfg) else None
    return check_cpu_memory(cfg, model_parameter_count(model_path), available_memory_gib(), cores, critic)
