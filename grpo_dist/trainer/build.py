"""Map the configuration onto the numbers each library piece takes (no config objects below here)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from grpo_dist.config.schema import GRPOConfig
from grpo_dist.config.validate import (  # noqa: F401
    critic_enabled,
    critic_fsdp,
    critic_grad_clip,
    data_parallel_size,
    overlong_buffer,
    reward_model_micro_batch,
    reward_model_spec,
    rollout_correction_params,
)
from grpo_dist.core.rollout_correction import RolloutCorrectionParams
from grpo_dist.rollout.base import SamplingSettings
from grpo_dist.trainer.dynamic_sampling import DynamicSampling, SingleBatch
from grpo_dist.training.settings import ActorSettings, CriticSettings, RewardModelSettings


def choose_device(name: str, cluster_gpus: float) -> str:
    """The workers' device kind, ``"cuda"`` or ``"cpu"``, from ``trainer.device`` and what the Ray
    cluster offers (the driver itself may have no GPU)."""
    if name == "auto":
        return "cuda" if cluster_gpus > 0 or torch.cuda.is_available() else "cpu"
    if name == "cuda" and cluster_gpus <= 0:
        raise ValueError("trainer.device = 'cuda' is not valid here: the Ray cluster has no GPUs; use trainer.device=cpu")
    return name


def compute_dtype(name: str, device: str) -> str:
    if name != "auto":
        return name
    return "bfloat16" if device == "cuda" else "float32"


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


def actor_settings(cfg: GRPOConfig, device: str, total_training_steps: int) -> ActorSettings:
    a = cfg.actor_rollout_ref.actor
    shape = step_shape(cfg)
    clip_low = a.clip_ratio if a.clip_ratio_low is None else a.clip_ratio_low
    clip_high = a.clip_ratio if a.clip_ratio_high is None else a.clip_ratio_high
    mini_per_gpu = a.ppo_mini_batch_size * shape.n // shape.world_size
    rc = rollout_correction(cfg)
    pl = a.policy_loss
    return ActorSettings(
        ppo_mini_batch_size_per_gpu=mini_per_gpu,
        ppo_micro_batch_size_per_gpu=None if a.use_dynamic_bsz else a.ppo_micro_batch_size_per_gpu,
        use_dynamic_bsz=a.use_dynamic_bsz,
        ppo_max_token_len_per_gpu=a.ppo_max_token_len_per_gpu,
        ppo_epochs=a.ppo_epochs,
        shuffle=a.shuffle,
        seed=cfg.trainer.seed,
        loss_mode="bypass_mode" if rc.bypass else pl.loss_mode,
        clip_ratio_low=clip_low,
        clip_ratio_high=clip_high,
        clip_ratio_c=a.clip_ratio_c,
        clip_cov_ratio=pl.clip_cov_ratio,
        clip_cov_lb=pl.clip_cov_lb,
        clip_cov_ub=pl.clip_cov_ub,
        kl_cov_ratio=pl.kl_cov_ratio,
        ppo_kl_coef=pl.ppo_kl_coef,
        rollout_correction=rc if rc.bypass else None,
        loss_agg_mode=a.loss_agg_mode,
        norm_constant=float(cfg.actor_rollout_ref.rollout.response_length),
        entropy_coeff=a.entropy_coeff,
        use_kl_loss=a.use_kl_loss,
        kl_loss_coef=a.kl_loss_coef,
        kl_loss_type=a.kl_loss_type,
        temperature=cfg.actor_rollout_ref.rollout.temperature or 1.0,
        grad_clip=a.grad_clip,
        lr=a.optim.lr,
        weight_decay=a.optim.weight_decay,
        betas=tuple(a.optim.betas),
        lr_warmup_steps=a.optim.lr_warmup_steps,
        lr_warmup_steps_ratio=a.optim.lr_warmup_steps_ratio,
        total_training_steps=total_training_steps,
        lr_scheduler_type=a.optim.lr_scheduler_type,
        min_lr_ratio=a.optim.min_lr_ratio,
        model_dtype=a.fsdp_config.model_dtype,
        param_dtype=compute_dtype(a.fsdp_config.dtype, device),
        reduce_dtype="float32",
        attn_implementation=cfg.actor_rollout_ref.model.attn_implementation,
        enable_gradient_checkpointing=cfg.actor_rollout_ref.model.enable_gradient_checkpointing,
        use_remove_padding=cfg.actor_rollout_ref.model.use_remove_padding,
        reshard_after_forward=a.fsdp_config.reshard_after_forward,
        param_offload=a.fsdp_config.param_offload,
        optimizer_offload=a.fsdp_config.optimizer_offload,
        trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code,
    )


def reference_kwargs(cfg: GRPOConfig, device: str) -> dict:
    r = cfg.actor_rollout_ref.ref
    return dict(
        param_dtype=compute_dtype(cfg.actor_rollout_ref.actor.fsdp_config.dtype, device),
        param_offload=r.fsdp_config.param_offload,
        reshard_after_forward=r.fsdp_config.reshard_after_forward,
        attn_implementation=cfg.actor_rollout_ref.model.attn_implementation,
        trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code,
        use_remove_padding=cfg.actor_rollout_ref.model.use_remove_padding,
    )


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
    return CriticSettings(
        ppo_mini_batch_size_per_gpu=c.ppo_mini_batch_size * shape.n // shape.world_size,
        ppo_micro_batch_size_per_gpu=None if c.use_dynamic_bsz else c.ppo_micro_batch_size_per_gpu,
        use_dynamic_bsz=c.use_dynamic_bsz,
        ppo_max_token_len_per_gpu=c.ppo_max_token_len_per_gpu,
        forward_micro_batch_size_per_gpu=None if c.use_dynamic_bsz else c.forward_micro_batch_size_per_gpu,
        forward_max_token_len_per_gpu=c.forward_max_token_len_per_gpu,
        ppo_epochs=c.ppo_epochs,
        shuffle=c.shuffle,
        seed=cfg.trainer.seed,
        cliprange_value=c.cliprange_value,
        loss_agg_mode=c.loss_agg_mode,
        norm_constant=float(cfg.actor_rollout_ref.rollout.response_length),
        grad_clip=critic_grad_clip(cfg),
        lr=c.optim.lr,
        weight_decay=c.optim.weight_decay,
        betas=tuple(c.optim.betas),
        lr_warmup_steps=c.optim.lr_warmup_steps,
        lr_warmup_steps_ratio=c.optim.lr_warmup_steps_ratio,
        total_training_steps=total_training_steps,
        lr_scheduler_type=c.optim.lr_scheduler_type,
        min_lr_ratio=c.optim.min_lr_ratio,
        model_dtype=fsdp.model_dtype,
        param_dtype=compute_dtype(fsdp.dtype, device),
        reduce_dtype="float32",
        attn_implementation=attn,
        override_config=override,
        enable_gradient_checkpointing=c.model.enable_gradient_checkpointing,
        reshard_after_forward=fsdp.reshard_after_forward,
        param_offload=fsdp.param_offload,
        optimizer_offload=fsdp.optimizer_offload,
        trust_remote_code=c.model.trust_remote_code,
        export_hf="hf_model" in c.checkpoint.save_contents,
    )


def needs_reward_model(cfg: GRPOConfig) -> bool:
    """Whether the run scores with a learned reward model (either spelling of its switch)."""
    return reward_model_spec(cfg).enable


def reward_model_trained(cfg: GRPOConfig) -> bool:
    """Whether the reward model is trained during the run (iterative RL): it is then checkpointed."""
    return needs_reward_model(cfg) and cfg.reward_model.iterative.enable


def reference_is_reset(cfg: GRPOConfig) -> bool:
    """Whether iterative RL resets the reference to the policy: its weights are then checkpointed."""
    return reward_model_trained(cfg) and cfg.reward_model.iterative.reset_reference and needs_reference(cfg)


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
    world = step_shape(cfg).world_size
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


def forward_batching(section) -> tuple[int | None, int | None]:
    """``(micro_batch_size, max_token_len)`` of a no-grad log-prob forward from a config section with
    verl's ``log_prob_micro_batch_size_per_gpu`` / ``log_prob_use_dynamic_bsz`` /
    ``log_prob_max_token_len_per_gpu`` keys (rollout: the old-log-prob forward; ref: the reference's);
    at most one of the two is set, neither: all of a rank's rows at once."""
    if section.log_prob_use_dynamic_bsz:
        return None, section.log_prob_max_token_len_per_gpu
    return section.log_prob_micro_batch_size_per_gpu, None


def rollout_correction(cfg: GRPOConfig) -> RolloutCorrectionParams:
    """``algorithm.rollout_correction.*``, parsed."""
    return rollout_correction_params(cfg)


def rollout_log_probs(cfg: GRPOConfig) -> bool:
    """Whether the rollout returns its log-probs: ``rollout.calculate_log_probs``, or on by itself
    when the rollout correction needs them (weights, rejection or bypass mode)."""
    return cfg.actor_rollout_ref.rollout.calculate_log_probs or rollout_correction(cfg).changes_training


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


def needs_reference(cfg: GRPOConfig) -> bool:
    return cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward


def engine_kwargs(cfg: GRPOConfig, model_path: str, device: str) -> dict:
    """Constructor arguments of the rollout engine named by actor_rollout_ref.rollout.name."""
    r = cfg.actor_rollout_ref.rollout
    dtype = compute_dtype(r.dtype, device)
    if r.name == "hf":
        return dict(model_path=model_path, dtype=dtype, device=device)
    return dict(
        model_path=model_path,
        dtype=dtype,
        max_model_len=r.max_model_len or (r.prompt_length + r.response_length),
        gpu_memory_utilization=r.gpu_memory_utilization,
        tensor_parallel_size=r.tensor_model_parallel_size,
        max_num_seqs=r.max_num_seqs,
        max_num_batched_tokens=r.max_num_batched_tokens,
        enforce_eager=r.enforce_eager,
        enable_sleep_mode=bool(r.free_cache_engine and device == "cuda"),
        kv_cache_gib=r.kv_cache_gib if device == "cpu" else None,
    )


def check_model_fits(cfg: GRPOConfig, model_path: str, tokenizer) -> None:
    """Checks that need the model's config and the tokenizer (cheap: no weights are loaded)."""
    from transformers import AutoConfig

    mc = AutoConfig.from_pretrained(model_path, trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code)
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
    reward model, and iterative RL, read the policy's tokens. ``ValueError`` naming the reward model."""
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


def startup_lines(cfg: GRPOConfig, device: str, world: int, placement: dict, transport: str) -> list[str]:
    """What the run says once its workers are up: ranks, nodes, device, compute dtype, weight-sync
    transport, and a warning when half precision on this CPU would be slow."""
    dtype = compute_dtype(cfg.actor_rollout_ref.actor.fsdp_config.dtype, device)
    lines = [f"{world} rank(s) on {len(set(placement['actor_rank_nodes']))} node(s), device {device}, "
             f"{dtype} compute, weight sync {transport}"]
    slow = cpu_half_precision_warning(cfg, device)
    return lines + ([f"warning: {slow}"] if slow else [])


def check_cpu_ranks(cfg: GRPOConfig, cores: int | None) -> None:
    """A single-machine CPU run starts one training process per rank, each computing with its own
    threads: more ranks than the machine has cores only oversubscribe them and multiply the memory
    (64 ranks on 2 cores ran the machine out of memory in minutes). ``ValueError`` naming the keys and
    the largest setting that fits. Runs on a Ray cluster (``ray_kwargs.ray_init.address``), on GPUs, or
    with an unknown core count are not checked here."""
    t = cfg.trainer
    on_cpu = t.device == "cpu" or (t.device == "auto" and not torch.cuda.is_available())
    if not on_cpu or cfg.ray_kwargs.ray_init.address or not cores:
        return
    ranks = data_parallel_size(cfg)
    if ranks > cores:
        raise ValueError(
            f"trainer.nnodes x trainer.n_gpus_per_node = {t.nnodes} x {t.n_gpus_per_node} = {ranks} CPU ranks, but this "
            f"machine has {cores} cores: every rank is a training process with its own threads and memory; use at "
            f"most trainer.n_gpus_per_node={max(1, cores // max(t.nnodes, 1))} here (the batch sizes must stay "
            "divisible by it), or run on a Ray cluster (ray_kwargs.ray_init.address)"
        )
