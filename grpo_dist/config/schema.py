"""The configuration schema: verl's key tree as typed dataclasses.

This module is the single source of every default. ``conf/grpo_trainer.yaml`` and
``docs/configuration.md`` are generated from it (``python -m grpo_dist.config.docgen``) and a
test keeps them in step, so a default can never be written in two places that drift.

Each field carries its one-line help text in ``metadata["help"]``; the generator writes it as the
YAML comment. Defaults follow verl's ``ppo_trainer.yaml`` except where the no-argument run must be
the embedded CPU job (data files, model, sizes, estimator, KL loss, device, logger); those
differences are listed in ``VERL_DEFAULT_DIFFERENCES`` and in the generated reference.

Cross-key rules (divisibility, ranges, files that must exist) live in ``validate.py``; both raise
:class:`ConfigError`, whose message is printed as is.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, make_dataclass
from types import UnionType
from typing import Any, Dict, List, Optional, Union, get_type_hints

from omegaconf import II, OmegaConf

from grpo_dist.config.fields import F, ConfigError, Honoured, NoOp, Refused, S  # noqa: F401 - re-exported
from grpo_dist.config.sections.engine import (
    ENTROPY_CHUNKED,
    FSDP_INTERNAL,
    SPEED_ONLY,
    ULYSSES,
    UNUSED_WITHOUT,
    CheckpointEngineConfig,
    DisaggregationConfig,
    FSDPEngineKeys,
    FusedKernelOptions,
    LayerNameMapConfig,
    LoraConfig,
    MegatronOptimKeys,
    MTPConfig,
    QATConfig,
    RouterReplayConfig,
    PrometheusConfig,
    TiledMLPConfig,
    TraceConfig,
    layer_name_map_section,
    load_weight_field,
    lora_section,
    megatron_section,
    mtp_section,
    off_feature,
    qat_section,
    router_replay_section,
)
from grpo_dist.config.sections.features import (
    MANAGER_NAME,
    MANAGER_SOURCE,
    DistillationConfig,
    EarlyRewardManagerConfig,
    RewardCustomFunctionConfig,
    RewardManagerConfig,
    RuntimeEnvConfig,
    CustomClassConfig,
    SamplerClassConfig,
    SkipConfig,
    TrainerV1Config,
    TransferQueueConfig,
    SandboxFusionConfig,
    custom_class_section,
    sandbox_section,
)
from grpo_dist.config.sections.profiler import GlobalProfilerConfig, ProfilerConfig, global_profiler_section, profiler_section
from grpo_dist.core.advantages import list_adv_estimators
from grpo_dist.core.losses import ALL_LOSS_AGG_MODES, LOSS_AGG_MODES
from grpo_dist.core.policy_loss import BUILTIN_POLICY_LOSSES, PolicyLossParams, policy_loss_keys
from grpo_dist.core.schedules import LR_SCHEDULER_TYPES
from grpo_dist.data import TRUNCATION_MODES
from grpo_dist.rollout import ENGINES
from grpo_dist.tasks.reverse import DEFAULT_JOB_STEPS


# --------------------------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------------------------
SCHEDULE_LENGTH = NoOp("the schedule always spans the run's steps (trainer.total_training_steps, or total_epochs x "
                       "steps per epoch), as verl's trainer writes here")
ADAMW_ONLY = Refused("optimizers other than torch's AdamW are not built here; weight_decay, betas and lr are AdamW's settings")
ONE_TIMEOUT = NoOp("one collective timeout, actor_rollout_ref.nccl_timeout, covers every FSDP role here",
                   same_as="actor_rollout_ref.nccl_timeout", otherwise="set actor_rollout_ref.nccl_timeout instead")
FSDP2_ONLY = NoOp("grpo_dist trains with FSDP2 (fsdp runs as the same sharding)", values=("fsdp", "fsdp2"),
                  otherwise="the Megatron backend is not built here; use fsdp2 or fsdp")
COPY_OF_N = NoOp("verl's copy of actor_rollout_ref.rollout.n", same_as="actor_rollout_ref.rollout.n",
                 otherwise="set actor_rollout_ref.rollout.n instead")
TEXT_MODELS = NoOp("grpo_dist trains text models: there is no vision tower")
NO_SUCH_LOSS = NoOp("read only by verl's sapo and dro policy losses, which are not built here (policy_loss.loss_mode refuses them)")
ENGINE_SPEED = NoOp("a speed or memory setting of the rollout engine; the samples are the same")
CRITIC_READS_ACTOR_IDS = NoOp("the critic reads the actor's token ids (its prompts are never templated on their own)")
LORA_ONLY = NoOp("read only with LoRA (lora_rank > 0), which is accepted only off here")
BATCH_CONTENTS = NoOp("grpo_dist's batch always carries what its stages read (token ids, masks, the reward columns)")
DATA_SPEED = NoOp("prompts are read and tokenized once in the driver; this changes only verl's loading speed")
TEXT_ONLY = NoOp("grpo_dist trains text models: image, video and audio columns are not read")


@dataclass
class DataConfig:
    tokenizer: Optional[str] = F(None, "tokenizer path; null = actor_rollout_ref.model.tokenizer_path, else the model's own")
    train_files: Any = F(
        "builtin:reverse/train",  # DEFAULT_TRAIN_FILES
        "training prompts: a parquet/jsonl path or a list of them, in verl's row format ('builtin:' = embedded task)",
    )
    val_files: Any = F(
        "builtin:reverse/test",
        "validation prompts: a parquet/jsonl path or list; null = no validation",
    )
    prompt_key: str = F("prompt", "column holding the prompt (a list of chat messages, or a string)")
    reward_fn_key: str = F(
        "data_source",
        "column handed to the reward function as its data_source (and so choosing the rule-based scorer); "
        "validation metrics are still grouped by the data_source column",
    )
    max_prompt_length: int = F(64, "longest prompt in tokens (after the chat template)")
    max_response_length: int = F(24, "longest response in tokens")
    train_batch_size: int = F(32, "prompts per training step; responses per step = train_batch_size x rollout.n")
    gen_batch_size: Optional[int] = F(
        None, "prompts per generation batch of dynamic sampling (algorithm.filter_groups); null = train_batch_size; unused without it"
    )
    val_batch_size: Optional[int] = F(None, "prompts per validation batch; null = the whole validation set at once")
    shuffle: bool = F(True, "shuffle the training prompts every epoch (seeded by data.seed)")
    seed: Optional[int] = F(42, "seed of the prompt shuffling (and of train_max_samples' choice); null = a fresh seed, kept with checkpoints")
    filter_overlong_prompts: bool = F(False, "drop prompts longer than max_prompt_length instead of applying truncation")
    truncation: str = F("error", "prompt longer than max_prompt_length: " + " | ".join(TRUNCATION_MODES))
    skip_bad_rows: bool = F(False, "skip malformed data rows (and count them) instead of stopping with an error")
    return_raw_chat: bool = F(True, "keep the raw chat messages in the batch", BATCH_CONTENTS)
    return_full_prompt: bool = F(False, "keep the templated prompt text in the batch", BATCH_CONTENTS)
    return_raw_input_ids: bool = F(False, "keep the prompt ids before the chat template", BATCH_CONTENTS)
    train_max_samples: int = F(-1, "use at most this many training rows (a seeded random choice when data.shuffle); -1 = all")
    val_max_samples: int = F(-1, "use at most this many validation rows (chosen as for train_max_samples); -1 = all")
    trust_remote_code: bool = F(False, "allow the tokenizer's own Python code to run (as does actor_rollout_ref.model.trust_remote_code)")
    apply_chat_template_kwargs: Dict[str, Any] = F(
        {}, "extra arguments of the tokenizer's apply_chat_template (e.g. +data.apply_chat_template_kwargs.enable_thinking=false)"
    )
    validation_shuffle: bool = F(False, "shuffle the validation prompts", NoOp(
        "validation scores every prompt and reports means, which do not depend on the order"))
    dataloader_num_workers: int = F(8, "processes loading batches", DATA_SPEED)
    filter_overlong_prompts_workers: int = F(1, "processes filtering long prompts", DATA_SPEED)
    use_shm: bool = F(False, "copy the data files to shared memory first", DATA_SPEED)
    image_key: str = F("images", "column of a row's images", TEXT_ONLY)
    video_key: str = F("videos", "column of a row's videos", TEXT_ONLY)
    audio_key: str = F("audios", "column of a row's audio", TEXT_ONLY)
    image_patch_size: int = F(14, "vision patch size", TEXT_ONLY)
    mm_processor_kwargs: Dict[str, Any] = F({}, "arguments of the multimodal processor", TEXT_ONLY)
    return_multi_modal_inputs: bool = F(True, "keep the processor's multimodal inputs in the batch", TEXT_ONLY)
    tool_config_path: Optional[str] = F(None, "tool definitions for multi-turn rollouts", Refused(
        "tools for multi-turn rollouts (actor_rollout_ref.rollout.multi_turn.*) are not built here; leave it null"))
    function_tool_path: Optional[str] = F(None, "Python tools for multi-turn rollouts", Refused(
        "tools for multi-turn rollouts (actor_rollout_ref.rollout.multi_turn.*) are not built here; leave it null"))
    custom_cls: CustomClassConfig = custom_class_section(
        "dataset", "write the data in verl's row format (parquet or jsonl with prompt, data_source, reward_model)")
    datagen: CustomClassConfig = custom_class_section(
        "data generator (verl early 2026)", "generate the data beforehand into parquet or jsonl files")
    sampler: SamplerClassConfig = S(SamplerClassConfig, "a custom batch sampler (verl early 2026; not built here: null only)",
                                    off_feature("a custom (curriculum) sampler", "data.shuffle and data.seed choose the order"))


# --------------------------------------------------------------------------------------------
# actor_rollout_ref
# --------------------------------------------------------------------------------------------
@dataclass
class ModelConfig:
    path: str = F("builtin:tiny-reverse", "Hugging Face model directory (or hub-cache name) of the policy and reference")
    enable_gradient_checkpointing: Any = F(
        "auto",
        "recompute activations in the backward pass to save memory: true | false | auto (on only when a micro-batch's "
        "estimated activations would not fit in the rank's memory; the start-up line says what was chosen)",
    )
    use_remove_padding: bool = F(
        True,
        "run the actor's and reference's forwards on the real tokens only, packed into one row per "
        "micro-batch with per-sequence boundaries (same results as the padded path, less compute)",
    )
    use_fused_kernels: bool = F(
        False,
        "compute log-probs and entropy from the final hidden states and the output layer a chunk of positions at a "
        "time, without forming the [tokens, vocabulary] logits (same results, less memory for large vocabularies)",
    )
    logprob_chunk_size: Optional[int] = F(
        None, "positions per chunk of the output layer's log-softmax (per matmul with use_fused_kernels); null = chosen from the vocabulary size"
    )
    trust_remote_code: bool = F(False, "allow the model directory's own Python code to run when loading it")
    attn_implementation: str = F("auto", "attention kernel: auto (sdpa, or flash_attention_2 on CUDA when installed) | sdpa | eager | flash_attention_2")
    tokenizer_path: Optional[str] = F(None, "tokenizer folder; null = data.tokenizer, else the model's own")
    custom_chat_template: Optional[str] = F(None, "a Jinja chat template used instead of the tokenizer's own; null = the tokenizer's")
    override_config: Dict[str, Any] = F(
        {}, "fields set on the policy's Hugging Face config before it is built (e.g. max_position_embeddings): by the "
        "actor, the reference and the rollout engine (vLLM's hf_overrides); the Hugging Face export writes them too")
    hf_config_path: Optional[str] = F(None, "a Hugging Face config folder other than the model's", Refused(
        "a config from another folder is not built here; put the config.json beside the weights (model.path)"))
    external_lib: Optional[str] = F(None, "a Python module imported before the model is built", Refused(
        "importing a module into every worker is not built here; use trust_remote_code=true for model code "
        "shipped with the model folder"))
    fused_kernel_options: FusedKernelOptions = S(FusedKernelOptions, "options of verl's fused kernels", ENTROPY_CHUNKED)
    use_liger: bool = F(False, "Liger kernels for the model's layers", SPEED_ONLY)
    use_shm: bool = F(False, "copy the model to shared memory before loading", SPEED_ONLY)
    enable_activation_offload: bool = F(False, "offload activations to the CPU in the backward", SPEED_ONLY)
    tiled_mlp: TiledMLPConfig = S(TiledMLPConfig, "tiled MLP computation (memory)", SPEED_ONLY)
    lora_rank: int = F(0, "LoRA rank (verl's early layout); 0 = full fine-tuning", off_feature(
        "LoRA", "full fine-tuning is what runs; set it to 0"))
    lora_alpha: int = F(16, "LoRA alpha (early layout)", LORA_ONLY)
    target_modules: Any = F("all-linear", "modules that get LoRA adapters (early layout)", LORA_ONLY)
    exclude_modules: Optional[Any] = F(None, "modules that get none", LORA_ONLY)
    lora_adapter_path: Optional[str] = F(None, "pretrained LoRA adapter to start from", LORA_ONLY)
    lora: LoraConfig = lora_section()
    mtp: MTPConfig = mtp_section()


@dataclass
class OptimConfig(MegatronOptimKeys):
    lr: float = F(5e-4, "peak learning rate of AdamW")
    weight_decay: float = F(0.01, "AdamW weight decay")
    betas: List[float] = F([0.9, 0.999], "AdamW betas")
    lr_warmup_steps: int = F(-1, "linear warm-up steps; -1 = use lr_warmup_steps_ratio")
    lr_warmup_steps_ratio: float = F(0.0, "warm-up steps as a fraction of the total training steps")
    lr_scheduler_type: str = F("constant", "schedule after warm-up: " + " | ".join(LR_SCHEDULER_TYPES))
    min_lr_ratio: float = F(0.0, "cosine schedule floor as a fraction of lr")
    total_training_steps: int = F(-1, "schedule length; verl's trainer writes the run's step count here", SCHEDULE_LENGTH)
    clip_grad: float = F(1.0, "clip the global gradient norm to this value",
                         Honoured(alias_of="actor_rollout_ref.actor.grad_clip"))
    warmup_style: Optional[str] = F(None, "verl's former name of lr_scheduler_type; null = unset",
                                    Honoured(alias_of=".lr_scheduler_type"))
    num_cycles: float = F(0.5, "waves of the cosine schedule (0.5 = one half cosine down to min_lr_ratio)")
    zero_indexed_step: bool = F(True, "the cosine schedule counts steps from 0 (false: from 1)")
    optimizer: str = F("AdamW", "optimizer class", ADAMW_ONLY)
    optimizer_impl: str = F("torch.optim", "module of the optimizer class", ADAMW_ONLY)
    override_optimizer_config: Optional[Dict[str, Any]] = F(None, "extra optimizer arguments", ADAMW_ONLY)


@dataclass
class FSDPConfig(FSDPEngineKeys):
    param_offload: bool = F(False, "keep parameters in CPU memory between uses")
    optimizer_offload: bool = F(False, "keep optimizer state in CPU memory")
    reshard_after_forward: bool = F(True, "free gathered parameters after the forward pass (ZeRO-3 style)")
    model_dtype: str = F("float32", "dtype of the master weights: float32 | bfloat16 (verl's fp32 | bf16 too)")
    dtype: str = F("auto", "compute (mixed-precision) dtype: auto (bfloat16 on CUDA, float32 on CPU) | float32 | bfloat16 | float16")


@dataclass
class CheckpointConfig:
    save_contents: List[str] = F(
        ["model", "optimizer", "extra"],
        "what a checkpoint holds: model, optimizer, extra (LR schedule, RNG, counters), hf_model (a Hugging Face "
        "export too); the run's position (step, data order) is always saved",
    )
    load_contents: List[str] = F(
        II("actor_rollout_ref.actor.checkpoint.save_contents"),
        "what resume restores: model (needed), optimizer, extra; what is left out starts fresh; default: save_contents",
    )
    contents: Optional[List[str]] = F(
        None, "grpo_dist's former name of save_contents; null = unset",
        Honoured(alias_of="actor_rollout_ref.actor.checkpoint.save_contents"))
    async_save: bool = F(False, "write checkpoints in the background", NoOp(
        "checkpoints are written at the step boundary; the files are the same"))
    strict: bool = F(True, "refuse a checkpoint whose weights do not match the model", NoOp(
        "loading is always strict here", values=(True,), otherwise="a checkpoint must match the model (strict=true)"))


def _policy_loss_config() -> type:
    """``actor_rollout_ref.actor.policy_loss``, generated from the loss parameters' one declaration:
    ``loss_mode``, then one key per :func:`~grpo_dist.core.policy_loss.policy_loss_keys` field of
    :class:`~grpo_dist.core.policy_loss.PolicyLossParams` (its type, default and help, in declaration
    order), then verl's ``dro_beta`` (no loss here reads it). A new loss parameter declared there
    becomes a key here, in conf/ and in docs/configuration.md with no edit of this module."""
    hints = get_type_hints(PolicyLossParams)
    params = [
        (f.name, _config_type(hints[f.name]), F(f.default if f.default is not MISSING else f.default_factory(),
                                                f.metadata["help"]))
        for f in policy_loss_keys()
    ]
    loss_mode = F(
        "vanilla",
        "policy-loss mode: " + " | ".join(m for m in BUILTIN_POLICY_LOSSES if m != "bypass_mode")
        + ", or a mode registered with grpo_dist.core.policy_loss.register_policy_loss"
        + " (vanilla: the PPO clipped surrogate with clip-higher and dual clip; docs/algorithms.md)",
    )
    dro_beta = F(None, "DRO's quadratic log-ratio penalty", NO_SUCH_LOSS)
    cls = make_dataclass("PolicyLossConfig", [("loss_mode", str, loss_mode), *params, ("dro_beta", Optional[float], dro_beta)])
    cls.__module__ = __name__  # importable (pickled with the configuration) as grpo_dist.config.schema.PolicyLossConfig
    return cls


def _config_type(tp: Any) -> Any:
    """``tp`` as OmegaConf reads it (``X | None`` written as ``Optional[X]``)."""
    return Union[tp.__args__] if isinstance(tp, UnionType) else tp


PolicyLossConfig = _policy_loss_config()


@dataclass
class ActorConfig:
    strategy: str = F("fsdp2", "training backend: fsdp2 (fsdp is accepted as an alias)", FSDP2_ONLY)
    ppo_mini_batch_size: int = F(16, "prompts per optimizer step (x rollout.n responses); a global size over all ranks")
    ppo_micro_batch_size_per_gpu: Optional[int] = F(
        None, "responses per forward/backward on one rank (a memory knob: the update does not depend on it); null = auto: the "
        "whole mini-batch when its estimated activations fit in the rank's memory, else cut by a token budget that fits"
    )
    use_dynamic_bsz: bool = F(False, "cut micro-batches by token budget (ppo_max_token_len_per_gpu) instead of by count")
    ppo_max_token_len_per_gpu: int = F(16384, "token budget of one micro-batch when use_dynamic_bsz is on")
    ppo_epochs: int = F(1, "passes over each step's responses")
    shuffle: bool = F(
        False, "shuffle the step's responses before cutting them into mini-batches, anew every ppo epoch (a global "
        "permutation seeded by data_loader_seed, the same for any number of ranks)")
    data_loader_seed: int = F(42, "seed of the mini-batch shuffle (actor.shuffle)")
    clip_ratio: float = F(0.2, "PPO clip range epsilon (both sides unless clip_ratio_low/high are set)")
    clip_ratio_low: Optional[float] = F(None, "lower clip range; null = clip_ratio")
    clip_ratio_high: Optional[float] = F(None, "upper clip range (clip-higher); null = clip_ratio")
    clip_ratio_c: float = F(3.0, "dual-clip constant bounding the loss of negative-advantage tokens; must be > 1")
    loss_agg_mode: str = F(
        "token-mean", "loss aggregation: " + " | ".join(ALL_LOSS_AGG_MODES) + " (seq-mean-token-sum-norm: Dr. GRPO)"
    )
    entropy_coeff: float = F(0.0, "entropy bonus coefficient")
    use_kl_loss: bool = F(True, "add beta x KL(policy || reference) to the loss (GRPO); needs the reference model")
    kl_loss_coef: float = F(0.001, "beta, the coefficient of the KL loss")
    kl_loss_type: str = F("low_var_kl", "KL estimator: kl (k1) | abs | mse (k2) | low_var_kl (k3) | k1+ | k3+ (value of k1/k3, gradient of k2)")
    kl_loss_agg_mode: Optional[str] = F(
        None,
        "aggregation of the KL loss over the mini-batch: " + " | ".join(ALL_LOSS_AGG_MODES)
        + "; null = loss_agg_mode (as verl does). Not a verl key: token-mean under a seq-mean-token-sum policy "
        "term is the GRPO paper's loss (the in-process API's default)",
    )
    grad_clip: float = F(1.0, "clip the global gradient norm to this value")
    ppo_micro_batch_size: Optional[int] = F(
        None, "verl's former global micro-batch size: ppo_micro_batch_size_per_gpu = this / data-parallel ranks; null = unset")
    use_remove_padding: bool = F(II("actor_rollout_ref.model.use_remove_padding"),
                                 "packed forwards in the actor (default: model.use_remove_padding)")
    loss_scale_factor: Optional[float] = F(
        None, "divisor of loss_agg_mode=seq-mean-token-sum-norm; null = the response length (rollout.response_length)")
    rollout_n: int = F(II("actor_rollout_ref.rollout.n"), "verl's copy of rollout.n", COPY_OF_N)
    use_fused_kernels: bool = F(False, "verl's fused log-prob/entropy kernels in the actor", ENTROPY_CHUNKED)
    use_torch_compile: bool = F(True, "torch.compile the actor's log-prob functions", SPEED_ONLY)
    ulysses_sequence_parallel_size: int = F(1, "Ulysses sequence-parallel ranks", ULYSSES)
    entropy_checkpointing: bool = F(False, "recompute the entropy in the backward", ENTROPY_CHUNKED)
    entropy_from_logits_with_chunking: bool = F(False, "compute the entropy in chunks", ENTROPY_CHUNKED)
    entropy_from_logits_chunk_size: int = F(2048, "positions per entropy chunk", ENTROPY_CHUNKED)
    calculate_entropy: bool = F(False, "compute the entropy even without an entropy bonus", NoOp(
        "actor/entropy is always computed and logged here"))
    calculate_sum_pi_squared: bool = F(False, "compute sum_v pi_v^2 per token (verl's optimal-baseline estimators)",
                                       off_feature("sum_v pi_v^2 per token", "leave it off"))
    sum_pi_squared_checkpointing: bool = F(False, "recompute sum_v pi_v^2 in the backward (verl early 2026)", NoOp(
        "read only with calculate_sum_pi_squared, which is accepted only off here"))
    use_prefix_grouper: bool = F(False, "share the prompt's forward among a group's responses", SPEED_ONLY)
    pad_to_length: bool = F(False, "pad packed sequences to fixed lengths", SPEED_ONLY)
    freeze_vision_tower: bool = F(False, "freeze a vision-language model's vision tower", TEXT_MODELS)
    tau_pos: float = F(1.0, "SAPO's temperature for positive advantages", NO_SUCH_LOSS)
    tau_neg: float = F(1.05, "SAPO's temperature for negative advantages", NO_SUCH_LOSS)
    policy_loss: PolicyLossConfig = S(PolicyLossConfig, "the policy-loss function")
    optim: OptimConfig = S(OptimConfig, "optimizer and learning-rate schedule")
    fsdp_config: FSDPConfig = S(FSDPConfig, "FSDP2 sharding and precision")
    checkpoint: CheckpointConfig = S(CheckpointConfig, "checkpoint contents")
    profiler: ProfilerConfig = profiler_section("actor")
    qat: QATConfig = qat_section()
    router_replay: RouterReplayConfig = router_replay_section()
    megatron: Dict[str, Any] = megatron_section("actor")
    load_weight: bool = load_weight_field("actor")


@dataclass
class RefFSDPConfig(FSDPEngineKeys):
    param_offload: bool = F(False, "keep the reference model's parameters in CPU memory between uses")
    reshard_after_forward: bool = F(True, "free gathered parameters after the forward pass")
    dtype: str = F(II("actor_rollout_ref.actor.fsdp_config.dtype"),
                   "compute dtype of the reference: auto | float32 | bfloat16 | float16; default: the actor's")
    model_dtype: str = F("float32", "dtype the reference's weights are loaded in", NoOp(
        "the reference is frozen: it is held in its compute dtype (fsdp_config.dtype); a master copy only matters "
        "for training", values=("float32", "fp32", "bfloat16", "bf16", "float16", "fp16"), otherwise="use a dtype name"))
    optimizer_offload: bool = F(False, "keep optimizer state in CPU memory", NoOp("the reference has no optimizer"))
    forward_only: bool = F(True, "engine built without an optimizer (verl sets it per role)", NoOp(
        "an engine flag verl sets per role; grpo_dist's roles know whether they train", values=(True,),
        otherwise="leave it at verl's value for the reference (true)"))


@dataclass
class RefConfig:
    log_prob_micro_batch_size_per_gpu: Optional[int] = F(
        None, "responses per reference forward on one rank; null = auto: as many as the rank's memory holds (all of them on small jobs)"
    )
    log_prob_use_dynamic_bsz: bool = F(II("actor_rollout_ref.actor.use_dynamic_bsz"),
                                       "cut reference forwards by token budget; default: the actor's use_dynamic_bsz")
    log_prob_max_token_len_per_gpu: int = F(II("actor_rollout_ref.actor.ppo_max_token_len_per_gpu"),
                                            "token budget of one reference forward; default: the actor's ppo_max_token_len_per_gpu")
    log_prob_micro_batch_size: Optional[int] = F(
        None, "verl's former global size: log_prob_micro_batch_size_per_gpu = this / data-parallel ranks; null = unset")
    fsdp_config: RefFSDPConfig = S(RefFSDPConfig, "FSDP2 settings of the reference model")
    strategy: str = F(II("actor_rollout_ref.actor.strategy"), "training backend of the reference; default: the actor's", FSDP2_ONLY)
    rollout_n: int = F(II("actor_rollout_ref.rollout.n"), "verl's copy of rollout.n", COPY_OF_N)
    use_torch_compile: bool = F(True, "torch.compile the reference's log-prob functions", SPEED_ONLY)
    ulysses_sequence_parallel_size: int = F(1, "Ulysses sequence-parallel ranks", ULYSSES)
    entropy_checkpointing: bool = F(False, "recompute the entropy in the backward", ENTROPY_CHUNKED)
    entropy_from_logits_with_chunking: bool = F(False, "compute the entropy in chunks", ENTROPY_CHUNKED)
    entropy_from_logits_chunk_size: int = F(2048, "positions per entropy chunk", ENTROPY_CHUNKED)
    pad_to_length: bool = F(False, "pad packed sequences to fixed lengths", SPEED_ONLY)
    profiler: ProfilerConfig = profiler_section("reference")
    router_replay: RouterReplayConfig = router_replay_section()
    megatron: Dict[str, Any] = megatron_section("reference")
    load_weight: bool = load_weight_field("reference")


@dataclass
class ValKwargsConfig:
    n: int = F(1, "samples per validation prompt")
    temperature: float = F(0.0, "validation sampling temperature (0 = greedy)")
    top_p: float = F(1.0, "validation nucleus sampling")
    top_k: int = F(-1, "validation top-k (-1 = off)")
    do_sample: bool = F(False, "sample during validation (false = greedy)")


@dataclass
class EngineKwargsConfig:
    vllm: Dict[str, Any] = F(
        {}, "keyword arguments added to vLLM's LLM(...) (e.g. swap_space, enable_prefix_caching); null values are dropped"
    )
    sglang: Dict[str, Any] = F({}, "SGLang's engine arguments", off_feature(
        "SGLang as a rollout engine", "use rollout.name=vllm (its arguments: engine_kwargs.vllm); leave it {}"))
    trtllm: Dict[str, Any] = F({}, "TensorRT-LLM's engine arguments", off_feature(
        "TensorRT-LLM as a rollout engine", "use rollout.name=vllm (its arguments: engine_kwargs.vllm); leave it {}"))


_MULTI_TURN_ONLY = NoOp("read only by multi-turn rollouts (rollout.multi_turn.enable), which are accepted only off here")


@dataclass
class MultiTurnConfig:
    enable: bool = F(False, "multi-turn rollouts with tools or interactions", off_feature(
        "a multi-turn rollout (tools, interactions)", "single-turn rollouts run with rollout.mode=sync or async; leave it false"))
    max_assistant_turns: Optional[int] = F(None, "assistant turns per multi-turn rollout", _MULTI_TURN_ONLY)
    tool_config_path: Optional[str] = F(None, "tools of multi-turn rollouts", _MULTI_TURN_ONLY)
    function_tool_path: Optional[str] = F(None, "function tools of multi-turn rollouts", _MULTI_TURN_ONLY)
    max_user_turns: Optional[int] = F(None, "user turns per multi-turn rollout", _MULTI_TURN_ONLY)
    max_parallel_calls: int = F(1, "tool calls run at once", _MULTI_TURN_ONLY)
    max_tool_response_length: int = F(256, "longest tool response kept", _MULTI_TURN_ONLY)
    tool_response_truncate_side: str = F("middle", "where a long tool response is cut", _MULTI_TURN_ONLY)
    interaction_config_path: Optional[str] = F(None, "interactions of multi-turn rollouts", _MULTI_TURN_ONLY)
    use_inference_chat_template: bool = F(False, "chat template of multi-turn inference", _MULTI_TURN_ONLY)
    tokenization_sanity_check_mode: str = F("strict", "tokenization check of multi-turn rollouts", _MULTI_TURN_ONLY)
    format: str = F("hermes", "the tool-call format", _MULTI_TURN_ONLY)
    num_repeat_rollouts: Optional[int] = F(None, "repeated multi-turn rollouts", _MULTI_TURN_ONLY)


@dataclass
class CustomAsyncServerConfig:
    path: Optional[str] = F(None, "file of a custom async rollout server", off_feature(
        "a custom async rollout server", "leave it null"))
    name: Optional[str] = F(None, "class of a custom async rollout server", off_feature(
        "a custom async rollout server", "leave it null"))


@dataclass
class AgentConfig:
    num_workers: int = F(8, "verl's agent-loop workers (any value >= 1)", NoOp(
        "a parallelism knob of verl's async server; single-turn rollouts here run on the rollout ranks' engines"))
    default_agent_loop: str = F("single_turn_agent", "the agent loop", Refused(
        "agent loops other than verl's single-turn one (tool_agent needs multi-turn rollouts) are not built here; "
        "use single_turn_agent",
        accept=("single_turn_agent",)))
    agent_loop_config_path: Optional[str] = F(None, "custom agent loops", off_feature("custom agent loops", "leave it null"))
    custom_async_server: CustomAsyncServerConfig = S(CustomAsyncServerConfig, "a custom async rollout server")


@dataclass
class RolloutConfig:
    name: str = F("vllm", "rollout engine: " + " | ".join(ENGINES) + " (" + "; ".join(f"{e.name}: {e.help}" for e in ENGINES.values()) + ")",
                  Honoured(refuse=(
                      ("sglang", "the SGLang engine is not built here; use vllm (the same sampling) or hf"),
                      ("trtllm", "the TensorRT-LLM engine is not built here; use vllm (the same sampling) or hf"))))
    mode: str = F("sync", "sync | async (verl's agent-loop mode)", NoOp(
        "for single-turn rollouts verl's agent-loop mode gives the same responses as sync; both run the same "
        "generation path here", values=("sync", "async"), otherwise="use sync or async"))
    n: int = F(8, "responses sampled per prompt (the GRPO group size)")
    temperature: float = F(1.0, "sampling temperature")
    top_p: float = F(1.0, "nucleus sampling")
    top_k: int = F(-1, "top-k sampling (-1 = off)")
    do_sample: bool = F(True, "sample (false = greedy)")
    prompt_length: int = II("data.max_prompt_length")
    response_length: int = II("data.max_response_length")
    dtype: str = F("auto", "engine dtype: auto (bfloat16 on CUDA, float32 on CPU) | float32 | bfloat16 | float16")
    gpu_memory_utilization: float = F(0.5, "fraction of device memory the engine may take")
    kv_cache_gib: Any = F(
        "auto", "KV-cache size in GiB of each vLLM engine on CPU (vLLM's VLLM_CPU_KVCACHE_SPACE), or auto: enough for a "
        "rank's share of a step (x1.25) within 25 % of the node's available memory shared by its engines, at most 8 GiB"
    )
    tensor_model_parallel_size: int = F(
        1,
        "ranks per rollout engine: each group of this many consecutive ranks of a node runs one vLLM engine, a "
        "shard on each (vLLM's external launcher); the step's prompts are split over the engines; 1 = an engine per rank",
    )
    max_num_seqs: int = F(1024, "most sequences the engine batches at once")
    max_num_batched_tokens: int = F(8192, "most tokens the engine schedules in one iteration")
    enable_chunked_prefill: bool = F(
        True,
        "let vLLM prefill long prompts in chunks (passed to vLLM on GPU; always off on CPU, where chunked prefill "
        "breaks per-request sampling seeds)",
    )
    max_model_len: Optional[int] = F(None, "engine context length; null = prompt_length + response_length")
    enforce_eager: bool = F(True, "disable CUDA graphs in the engine")
    free_cache_engine: bool = F(True, "release the engine's KV cache while the actor trains (where supported)")
    update_weights_bucket_megabytes: int = F(512, "weight sync: most MiB of weights gathered and sent at once (one flat buffer per bucket)")
    log_prob_micro_batch_size_per_gpu: Optional[int] = F(
        None, "responses per old-log-prob forward on one rank; null = auto: as many as the rank's memory holds (all of them on small jobs)"
    )
    log_prob_use_dynamic_bsz: bool = F(II("actor_rollout_ref.actor.use_dynamic_bsz"),
                                       "cut old-log-prob forwards by token budget; default: the actor's use_dynamic_bsz")
    log_prob_max_token_len_per_gpu: int = F(II("actor_rollout_ref.actor.ppo_max_token_len_per_gpu"),
                                            "token budget of one old-log-prob forward; default: the actor's ppo_max_token_len_per_gpu")
    log_prob_micro_batch_size: Optional[int] = F(
        None, "verl's former global size: log_prob_micro_batch_size_per_gpu = this / data-parallel ranks; null = unset")
    seed: int = F(0, "engine sampling seed (each rollout rank adds its rank)")
    calculate_log_probs: bool = F(False, "also return the rollout engine's log-prob of every sampled token (batch key rollout_log_probs) and, when the old-log-prob forward runs, log training/rollout_probs_diff_{max,mean,std} against the actor's; costs 10-20 % of vLLM's generation time on CPU, and the hf engine keeps every step's scores (responses x vocab float32 per token)")
    val_kwargs: ValKwargsConfig = S(ValKwargsConfig, "sampling for validation")
    checkpoint_engine: CheckpointEngineConfig = S(CheckpointEngineConfig, "how the engine receives new weights")
    load_format: str = F("dummy", "how the engine first loads weights: dummy (random) | auto | safetensors | ...", NoOp(
        "the engine loads the model folder and then receives the actor's weights, so the first rollout samples from "
        "the actor's weights either way"))
    layered_summon: bool = F(False, "gather the actor's weights layer by layer for the sync", NoOp(
        "the weight sync already gathers and sends in buckets (update_weights_bucket_megabytes)"))
    logprobs_mode: str = F("processed_logprobs", "which log-probs the engine returns", NoOp(
        "the engine's log-probs are those of the distribution it samples from (after temperature, top-k and top-p)",
        values=("processed_logprobs",), otherwise="raw log-probs from the engine are not built; use processed_logprobs"))
    enable_prefix_caching: bool = F(True, "let the engine reuse the KV cache of shared prompt prefixes", ENGINE_SPEED)
    cudagraph_capture_sizes: Optional[List[int]] = F(None, "batch sizes captured as CUDA graphs", ENGINE_SPEED)
    disable_log_stats: bool = F(True, "silence the engine's periodic statistics", NoOp("the engine's own logging"))
    multi_stage_wake_up: bool = F(False, "wake the engine's weights and KV cache in two stages (memory)", ENGINE_SPEED)
    scheduling_policy: str = F("fcfs", "the engine's request scheduling", ENGINE_SPEED)
    skip_tokenizer_init: bool = F(True, "start the engine without a tokenizer", NoOp(
        "prompts reach the engine as token ids and responses leave it as token ids"))
    data_parallel_size: int = F(1, "engine replicas inside one rollout group", off_feature(
        "data parallelism inside the engine", "every rank runs its own engine; leave it at 1"))
    pipeline_model_parallel_size: int = F(1, "pipeline-parallel stages of the engine", off_feature(
        "pipeline parallelism in the engine", "leave it at 1"))
    expert_parallel_size: int = F(1, "expert-parallel ranks of the engine (MoE)", off_feature(
        "expert parallelism in the engine", "leave it at 1"))
    nnodes: int = F(0, "nodes of a separate rollout pool; 0 = colocated with the actor", off_feature(
        "a separate rollout pool", "the rollout runs on the actor's ranks (hybrid engine); leave it at 0"))
    n_gpus_per_node: int = F(II("trainer.n_gpus_per_node"), "devices per node of the separate rollout pool", NoOp(
        "read only with a separate rollout pool (rollout.nnodes > 0), which is accepted only off here"))
    over_sample_rate: float = F(0, "start more prompts than needed and keep the first finished", off_feature(
        "over-sampling the rollout", "leave it at 0"))
    ignore_eos: bool = F(False, "keep generating past the end-of-sequence token", off_feature(
        "generating past the end-of-sequence token", "leave it false"))
    full_determinism: bool = F(False, "deterministic engine kernels", off_feature(
        "forcing deterministic engine kernels", "leave it false"))
    quantization: Optional[str] = F(None, "quantize the engine's weights (e.g. fp8)", off_feature(
        "a quantized rollout engine", "the engine runs in rollout.dtype; leave it null"))
    quantization_config_file: Optional[str] = F(None, "the engine's quantization settings", NoOp(
        "read only with rollout.quantization, which is accepted only off here"))
    enable_rollout_routing_replay: bool = F(False, "record the engine's MoE routing for the trainer", off_feature(
        "MoE routing replay", "leave it false"))
    moe_load_balance_metrics_interval: int = F(0, "steps between MoE load-balance metrics; 0 = off", off_feature(
        "MoE load-balance metrics", "leave it at 0"))
    skip_rollout: bool = F(False, "replay dumped rollouts instead of generating (verl early 2026)", off_feature(
        "replaying dumped rollouts", "leave it false"))
    skip_dump_dir: str = F("/tmp/rollout_dump", "folder of dumped rollouts (verl early 2026)", NoOp(
        "read only with skip_rollout, which is accepted only off here"))
    disaggregation: DisaggregationConfig = S(DisaggregationConfig, "prefill/decode disaggregation (not built here)",
                                             NoOp("read only with disaggregation.enabled, which is accepted only off here"))
    prometheus: PrometheusConfig = S(PrometheusConfig, "Prometheus export of the engine's metrics (not built here)",
                                     NoOp("read only with prometheus.enable, which is accepted only off here"))
    trace: TraceConfig = S(TraceConfig, "rollout tracing (not built here)",
                           NoOp("read only with trace.backend set, which is accepted only null here"))
    profiler: ProfilerConfig = profiler_section("rollout")
    mtp: MTPConfig = mtp_section()
    layer_name_map: LayerNameMapConfig = layer_name_map_section()
    qat: QATConfig = qat_section()
    engine_kwargs: EngineKwargsConfig = S(EngineKwargsConfig, "extra constructor arguments of the rollout engine")
    multi_turn: MultiTurnConfig = S(MultiTurnConfig, "multi-turn (tool-calling) rollouts: not built; accepted only at verl's defaults (off)")
    agent: AgentConfig = S(AgentConfig, "verl's agent loop (rollout.mode=async): the single-turn loop only")


@dataclass
class ActorRolloutRefConfig:
    hybrid_engine: bool = F(True, "colocate actor, reference and rollout of a rank on one device", Refused(
        "the split placement (actor, reference and rollout on separate devices) is not built; the roles of a rank "
        "always share its device: use true"))
    nccl_timeout: int = F(600, "seconds a collective of the actor, reference or critic may wait before it fails")
    model: ModelConfig = S(ModelConfig, "the policy model")
    actor: ActorConfig = S(ActorConfig, "the policy update")
    ref: RefConfig = S(RefConfig, "the frozen reference policy (created only when a KL term is used)")
    rollout: RolloutConfig = S(RolloutConfig, "response generation")


# --------------------------------------------------------------------------------------------
# critic (PPO with a value model; on when the advantage estimator needs values)
# --------------------------------------------------------------------------------------------
@dataclass
class CriticFSDPConfig(FSDPEngineKeys):
    param_offload: bool = F(False, "keep the value model's parameters in CPU memory between uses")
    optimizer_offload: bool = F(False, "keep the critic's optimizer state in CPU memory")
    reshard_after_forward: bool = F(True, "free gathered parameters after the forward pass (ZeRO-3 style)")
    model_dtype: str = F("float32", "dtype of the value model's master weights: float32 | bfloat16")
    dtype: str = F("auto", "compute (mixed-precision) dtype: auto (bfloat16 on CUDA, float32 on CPU) | float32 | bfloat16 | float16")


@dataclass
class CriticModelConfig:
    path: str = F(
        II("actor_rollout_ref.model.path"),
        "value model: a Hugging Face directory (a causal LM gets a new scalar value head; one saved with "
        "AutoModelForTokenClassification, num_labels=1, keeps its own); default: the actor's model",
    )
    tokenizer_path: Optional[str] = F(
        II("actor_rollout_ref.model.path"),
        "the critic's tokenizer in verl; the critic reads the actor's token ids here, so its model's vocabulary "
        "must cover the actor's tokenizer (checked at start-up)", CRITIC_READS_ACTOR_IDS,
    )
    override_config: Dict[str, Any] = F(
        {}, "fields set on the value model's Hugging Face config before it is built (attn_implementation picks the attention kernel)"
    )
    use_remove_padding: bool = F(
        True, "run the value model's forwards on the real tokens only, packed into one row per micro-batch (same results, less compute)"
    )
    enable_gradient_checkpointing: Any = F(
        "auto", "recompute the value model's activations in the backward pass: true | false | auto (on only when a "
        "micro-batch's estimated activations would not fit in the rank's memory)"
    )
    trust_remote_code: bool = F(II("actor_rollout_ref.model.trust_remote_code"), "allow the value model directory's own Python code to run when loading it")
    fsdp_config: CriticFSDPConfig = S(
        CriticFSDPConfig, "FSDP2 settings of the value model, verl's early-2026 place for them (critic.fsdp is the current one; set either)"
    )
    custom_chat_template: Optional[str] = F(None, "the critic's chat template", CRITIC_READS_ACTOR_IDS)
    hf_config_path: Optional[str] = F(None, "a Hugging Face config folder other than the value model's", Refused(
        "a config from another folder is not built here; put the config.json beside the weights (critic.model.path)"))
    external_lib: Optional[str] = F(None, "a Python module imported before the value model is built", Refused(
        "importing a module into every worker is not built here; use critic.model.trust_remote_code=true for model "
        "code shipped with the model folder"))
    use_fused_kernels: bool = F(False, "verl's fused kernels", SPEED_ONLY)
    fused_kernel_options: FusedKernelOptions = S(FusedKernelOptions, "options of verl's fused kernels", SPEED_ONLY)
    use_liger: bool = F(False, "Liger kernels for the model's layers", SPEED_ONLY)
    use_shm: bool = F(False, "copy the model to shared memory before loading", SPEED_ONLY)
    enable_activation_offload: bool = F(False, "offload activations to the CPU in the backward", SPEED_ONLY)
    tiled_mlp: TiledMLPConfig = S(TiledMLPConfig, "tiled MLP computation (memory)", SPEED_ONLY)
    lora_rank: int = F(0, "LoRA rank of the value model (early layout); 0 = full fine-tuning", off_feature(
        "LoRA", "full fine-tuning is what runs; set it to 0"))
    lora_alpha: int = F(16, "LoRA alpha (early layout)", LORA_ONLY)
    target_modules: Any = F("all-linear", "modules that get LoRA adapters (early layout)", LORA_ONLY)
    exclude_modules: Optional[Any] = F(None, "modules that get none", LORA_ONLY)
    lora_adapter_path: Optional[str] = F(None, "pretrained LoRA adapter to start from", LORA_ONLY)
    lora: LoraConfig = lora_section()
    mtp: MTPConfig = mtp_section()


@dataclass
class CriticOptimConfig(MegatronOptimKeys):
    lr: float = F(1e-5, "peak learning rate of the critic's AdamW")
    weight_decay: float = F(0.01, "AdamW weight decay")
    betas: List[float] = F([0.9, 0.999], "AdamW betas")
    lr_warmup_steps: int = F(-1, "linear warm-up steps; -1 = use lr_warmup_steps_ratio")
    lr_warmup_steps_ratio: float = F(0.0, "warm-up steps as a fraction of the total training steps")
    lr_scheduler_type: str = F("constant", "schedule after warm-up: " + " | ".join(LR_SCHEDULER_TYPES))
    min_lr_ratio: float = F(0.0, "cosine schedule floor as a fraction of lr")
    total_training_steps: int = F(-1, "schedule length; verl's trainer writes the run's step count here", SCHEDULE_LENGTH)
    clip_grad: float = F(1.0, "clip the critic's global gradient norm to this value (verl's current key; critic.grad_clip is the early-2026 one: set either)")
    warmup_style: Optional[str] = F(None, "verl's former name of lr_scheduler_type; null = unset",
                                    Honoured(alias_of=".lr_scheduler_type"))
    num_cycles: float = F(0.5, "waves of the cosine schedule (0.5 = one half cosine down to min_lr_ratio)")
    zero_indexed_step: bool = F(True, "the cosine schedule counts steps from 0 (false: from 1)")
    optimizer: str = F("AdamW", "optimizer class", ADAMW_ONLY)
    optimizer_impl: str = F("torch.optim", "module of the optimizer class", ADAMW_ONLY)
    override_optimizer_config: Optional[Dict[str, Any]] = F(None, "extra optimizer arguments", ADAMW_ONLY)


@dataclass
class CriticCheckpointConfig:
    save_contents: List[str] = F(
        ["model", "optimizer", "extra"],
        "what the critic's checkpoint holds: model, optimizer, extra (schedule, RNG; all three always, for an exact "
        "resume) and hf_model (also a Hugging Face export of the value model, critic/huggingface)",
    )
    load_contents: List[str] = F(
        II("critic.checkpoint.save_contents"), "what resume loads: model, optimizer and extra (all three: resume is exact)"
    )
    async_save: bool = F(False, "write checkpoints in the background", NoOp(
        "checkpoints are written at the step boundary; the files are the same"))


@dataclass
class CriticConfig:
    enable: Optional[bool] = F(None, "train a critic (value model); null = on iff algorithm.adv_estimator needs values (gae)")
    strategy: str = F("fsdp2", "training backend of the critic: fsdp2 (fsdp is accepted as an alias)", FSDP2_ONLY)
    ppo_mini_batch_size: int = F(
        II("actor_rollout_ref.actor.ppo_mini_batch_size"),
        "prompts per critic optimizer step (x rollout.n responses), a global size; default: the actor's",
    )
    ppo_micro_batch_size_per_gpu: Optional[int] = F(
        None, "responses per critic forward/backward on one rank (a memory knob: the update does not depend on it); null = auto, "
        "as the actor's"
    )
    use_dynamic_bsz: bool = F(
        II("actor_rollout_ref.actor.use_dynamic_bsz"),
        "cut critic micro-batches by token budget (ppo_max_token_len_per_gpu); default: the actor's",
    )
    ppo_max_token_len_per_gpu: int = F(32768, "token budget of one critic micro-batch when use_dynamic_bsz is on")
    forward_micro_batch_size_per_gpu: Optional[int] = F(
        II("critic.ppo_micro_batch_size_per_gpu"), "responses per value forward on one rank; default: ppo_micro_batch_size_per_gpu"
    )
    forward_max_token_len_per_gpu: int = F(
        II("critic.ppo_max_token_len_per_gpu"), "token budget of one value forward when use_dynamic_bsz is on; default: ppo_max_token_len_per_gpu"
    )
    ppo_epochs: int = F(II("actor_rollout_ref.actor.ppo_epochs"), "passes of the critic over each step's responses; default: the actor's")
    shuffle: bool = F(
        II("actor_rollout_ref.actor.shuffle"),
        "shuffle the step's responses before cutting critic mini-batches, anew every epoch (seeded by "
        "critic.data_loader_seed); default: the actor's"
    )
    cliprange_value: float = F(0.5, "value clip range c: a prediction is also scored at clip(v, v_old - c, v_old + c)")
    loss_agg_mode: str = F(
        II("actor_rollout_ref.actor.loss_agg_mode"),
        "value-loss aggregation: " + " | ".join(LOSS_AGG_MODES) + "; default: the actor's",
    )
    grad_clip: float = F(1.0, "clip the critic's global gradient norm (verl's early-2026 key; critic.optim.clip_grad is the current one: set either)")
    model: CriticModelConfig = S(CriticModelConfig, "the value model")
    optim: CriticOptimConfig = S(CriticOptimConfig, "the critic's optimizer and learning-rate schedule")
    fsdp: CriticFSDPConfig = S(CriticFSDPConfig, "FSDP2 settings of the value model (verl's current place; critic.model.fsdp_config is the early-2026 one; set either)")
    checkpoint: CriticCheckpointConfig = S(CriticCheckpointConfig, "the critic's checkpoint contents")
    data_loader_seed: int = F(42, "seed of the critic's mini-batch shuffle (critic.shuffle)")
    ppo_micro_batch_size: Optional[int] = F(
        None, "verl's former global micro-batch size: ppo_micro_batch_size_per_gpu = this / data-parallel ranks; null = unset")
    forward_micro_batch_size: Optional[int] = F(
        None, "verl's former global size of a value forward: forward_micro_batch_size_per_gpu = this / ranks; null = unset")
    loss_scale_factor: Optional[float] = F(II("actor_rollout_ref.actor.loss_scale_factor"),
                                           "divisor of seq-mean-token-sum-norm; default: the actor's")
    rollout_n: int = F(II("actor_rollout_ref.rollout.n"), "verl's copy of rollout.n", COPY_OF_N)
    ulysses_sequence_parallel_size: int = F(1, "Ulysses sequence-parallel ranks", ULYSSES)
    profiler: ProfilerConfig = profiler_section("critic")
    nccl_timeout: int = F(II("actor_rollout_ref.nccl_timeout"), "seconds a collective of the critic may wait (verl's Megatron layout)",
                          ONE_TIMEOUT)
    megatron: Dict[str, Any] = megatron_section("critic")
    load_weight: bool = load_weight_field("critic")


# --------------------------------------------------------------------------------------------
# algorithm, reward
# --------------------------------------------------------------------------------------------
@dataclass
class KLCtrlConfig:
    type: str = F("fixed", "KL-in-reward controller: fixed | adaptive")
    kl_coef: float = F(0.001, "initial coefficient of the KL penalty in the reward")
    horizon: int = F(10000, "adaptive controller horizon")
    target_kl: float = F(0.1, "adaptive controller target KL")


@dataclass
class RolloutCorrectionConfig:
    rollout_is: Optional[str] = F(None, "importance weights against the rollout engine's log-probs: null | token | sequence")
    rollout_is_threshold: Any = F(
        2.0, "a number u > 1: truncate the weights at u (TIS); a band 'lo_hi' (quoted, e.g. \"0.5_2.0\"): weight 0 outside it (IcePop)"
    )
    rollout_rs: Optional[str] = F(
        None, "rejection sampling, comma-separated: token_k1|k2|k3, seq_sum_k1|k2|k3, seq_mean_k1|k2|k3, seq_max_k2|k3; null = off"
    )
    rollout_rs_threshold: Any = F(
        None, "rejection thresholds, one per rollout_rs option or one shared: k1 options a ratio band 'lo_hi' or u (the band 1/u..u), others an upper bound"
    )
    bypass_mode: bool = F(False, "use the rollout log-probs as the old log-probs (no old-log-prob forward); correction in the loss")
    loss_type: str = F("ppo_clip", "bypass mode's loss: ppo_clip (PPO clip against the rollout policy) | reinforce (-w * A * logp)")
    rollout_is_batch_normalize: bool = F(False, "divide the importance weights by their batch mean")


@dataclass
class FilterGroupsConfig:
    enable: bool = F(False, "dynamic sampling (DAPO): drop prompts whose responses all score the same, generate more")
    metric: Optional[str] = F(
        "acc", "what must differ within a prompt's responses: acc | score (the reward function's score) | seq_reward | "
        "seq_final_reward (null, verl's default, is accepted while filter_groups is off)")
    max_num_gen_batches: int = F(0, "most generation batches per step; <= 0 = no limit")
    on_exhausted: str = F("error", "at max_num_gen_batches with too few prompts: error | train (on the prompts kept, whole mini-batches)")
    max_inflight_gen_batches: int = F(1, "generation batches in flight at once (verl's asynchronous refill)", off_feature(
        "generating several batches ahead", "batches are generated one after another; leave it at 1"))


@dataclass
class PFPPOConfig:
    reweight_method: str = F("pow", "how responses are reweighted by reward: pow | max_min | max_random")
    weight_pow: float = F(2.0, "exponent of the pow method")


@dataclass
class AlgorithmConfig:
    adv_estimator: str = F("grpo", "advantage estimator: " + " | ".join(list_adv_estimators()) + " (docs/algorithms.md)")
    norm_adv_by_std_in_grpo: bool = F(True, "divide group-relative advantages by the group std (false = Dr. GRPO)")
    gamma: float = F(1.0, "discount factor (gae, reinforce_plus_plus)")
    lam: float = F(1.0, "GAE lambda")
    use_kl_in_reward: bool = F(False, "subtract a KL penalty from the reward (PPO style) instead of/besides the KL loss")
    kl_penalty: str = F("kl", "KL estimator of the in-reward penalty: kl | abs | mse | low_var_kl")
    kl_ctrl: KLCtrlConfig = S(KLCtrlConfig, "coefficient control of the in-reward KL penalty")
    rollout_correction: RolloutCorrectionConfig = S(
        RolloutCorrectionConfig, "rollout correction: importance weights and rejection against the rollout engine's log-probs"
    )
    filter_groups: FilterGroupsConfig = S(FilterGroupsConfig, "dynamic sampling (DAPO's group filtering)")
    use_pf_ppo: bool = F(False, "policy filtration (PF-PPO): resample the batch weighted by reward", off_feature(
        "PF-PPO's reward-weighted resampling", "leave it off"))
    pf_ppo: PFPPOConfig = S(PFPPOConfig, "PF-PPO's weighting (not built here)", NoOp(
        "read only with algorithm.use_pf_ppo, which is accepted only off here"))


@dataclass
class OverlongBufferConfig:
    enable: bool = F(False, "DAPO's overlong reward shaping: a linear penalty for responses within len tokens of max_resp_len")
    len: int = F(0, "length of the buffer in tokens")
    penalty_factor: float = F(0.0, "the penalty at max_resp_len (falls linearly from 0 inside the buffer)")
    log: bool = F(False, "log reward/overlong_reward/{mean,min} and reward/overlong/mean")


@dataclass
class RewardKwargsConfig:
    overlong_buffer_cfg: OverlongBufferConfig = S(OverlongBufferConfig, "overlong reward shaping (verl's reward_kwargs spelling)")
    max_resp_len: int = II("data.max_response_length")


_RM_FSDP_ONLY = NoOp("the reward model is an FSDP2 forward on each of its ranks here, not served by an inference engine")
_CUSTOM_REWARD_LOOP = off_feature(
    "loading a custom reward-loop class", "use custom_reward_function.path for a custom score, "
    "reward_model.reward_manager for naive / prime / dapo")


@dataclass
class RMWrapPolicyConfig:
    min_num_params: int = F(0, "verl's FSDP1 auto-wrap threshold", FSDP_INTERNAL)


@dataclass
class RMFSDPConfig:
    param_offload: bool = F(False, "keep the reward model's parameters in CPU memory between uses")
    reshard_after_forward: bool = F(True, "free gathered parameters after the forward pass (ZeRO-3 style)")
    fsdp_size: int = F(-1, "devices per FSDP shard group", Refused(
        "hybrid sharding of the reward model is not built here; -1 shards it over all its ranks (the training ranks, "
        "or its own pool's)", accept=(-1,)))
    forward_prefetch: bool = F(False, "prefetch the next layer's parameters in the forward", FSDP_INTERNAL)
    wrap_policy: RMWrapPolicyConfig = S(RMWrapPolicyConfig, "verl's FSDP1 wrap policy")
    model_dtype: str = F("float32", "dtype of the reward model's master weights: float32 | bfloat16 (grpo_dist)")
    dtype: str = F("auto", "compute dtype of the reward model: auto (bfloat16 on CUDA, float32 on CPU) | float32 | bfloat16 | float16 (grpo_dist)")


@dataclass
class RewardModelModelConfig:
    input_tokenizer: Optional[str] = F(
        II("actor_rollout_ref.model.path"),
        "the policy's tokenizer as the reward model sees it: when the reward model's own tokenizer differs "
        "(vocabulary or chat template), responses are decoded with this one and re-encoded with the reward "
        "model's chat template (outcome reward models only); null = feed the policy's token ids as they are",
    )
    path: str = F(
        "~/models/FsfairX-LLaMA3-RM-v0.1",
        "reward model: a Hugging Face directory saved with AutoModelForSequenceClassification or "
        "AutoModelForTokenClassification and one label, read as a token classifier; its weights must hold "
        "that head (a causal LM, or a head under a name the token classifier does not read, is refused at "
        "start-up); the current spelling is reward.reward_model.model_path (set either)",
    )
    trust_remote_code: bool = F(False, "allow the reward model directory's own Python code to run when loading it")
    use_remove_padding: bool = F(False, "pack sequences without padding", NoOp(
        "the reward model's forwards take the padded path, whose scores are the same"))
    override_config: Dict[str, Any] = F({}, "fields set on the reward model's Hugging Face config before it is built")
    fsdp_config: RMFSDPConfig = S(RMFSDPConfig, "FSDP2 settings of the reward model")
    external_lib: Optional[str] = F(II("actor_rollout_ref.model.external_lib"), "a Python module imported before the reward model is built; default: the policy's", Refused(
        "importing a module into every worker is not built here; use reward_model.model.trust_remote_code=true for "
        "model code shipped with the model folder", accept=(None,)))
    use_shm: bool = F(False, "copy the reward model to shared memory before loading", SPEED_ONLY)
    use_fused_kernels: bool = F(II("actor_rollout_ref.model.use_fused_kernels"), "verl's fused kernels in the reward model; default: the policy's", NoOp(
        "the reward model's forward ends in its one-label score head, not in the vocabulary: there are no "
        "log-probs to fuse"))


@dataclass
class RMProcessConfig:
    enable: bool = F(
        False,
        "process reward model: a score at the end of every reasoning step (the tokens whose text holds "
        "step_separator, and the last response token) instead of one at the last token; needs "
        "algorithm.adv_estimator=grpo_process",
    )
    step_separator: str = F("\n", "the text that ends a reasoning step (a token whose decoded text contains it ends one)")


@dataclass
class RMIterativeConfig:
    enable: bool = F(
        False,
        "iterative RL (DeepSeekMath's Algorithm 1): every steps_per_iteration steps, train the reward model further "
        "on the policy's new samples labelled by the rule-based verifier (with a replay of older samples), then "
        "reset the reference model to the policy",
    )
    steps_per_iteration: int = F(10, "training steps per iteration: the reward model is updated after every this many steps")
    replay_fraction: float = F(0.1, "share of historical samples in the reward model's training mix (the paper's 10%)")
    buffer_size: int = F(8192, "most samples the replay buffer keeps (the oldest go first)")
    heldout_fraction: float = F(
        0.1, "share of each iteration's fresh samples held out of training to measure reward_model/accuracy before and after the update"
    )
    label_threshold: Optional[float] = F(
        0.5,
        "the verifier's label of a response (or step) is 1 when its rule score is >= this value and 0 otherwise "
        "(0.5: a full score of 1 is correct; a format-only 0.1, 0 or a negative score are not); null = the rule "
        "score clamped to [0, 1] as a soft label",
    )
    epochs: int = F(1, "passes over the training mix per iteration")
    lr: float = F(1e-5, "learning rate of the reward model's AdamW (constant)")
    weight_decay: float = F(0.01, "AdamW weight decay of the reward model")
    betas: List[float] = F([0.9, 0.999], "AdamW betas of the reward model")
    grad_clip: float = F(1.0, "clip the reward model's global gradient norm to this value")
    mini_batch_size: int = F(64, "samples per reward-model optimizer step (a global size over all ranks)")
    micro_batch_size_per_gpu: Optional[int] = F(
        None, "samples per reward-model forward/backward on one rank (a memory knob: the update does not depend on it); null = whole mini-batch"
    )
    reset_reference: bool = F(True, "after each reward-model update, set the reference model to the current policy (the KL term then starts from 0)")


@dataclass
class RewardModelConfig:
    enable: bool = F(
        False,
        "score responses with a learned reward model (FSDP2 forward on every rank); the current spelling is "
        "reward.reward_model.enable (set either)",
    )
    strategy: str = F("fsdp2", "training backend of the reward model", NoOp(
        "the reward model runs under FSDP2 either way", values=("fsdp", "fsdp2"),
        otherwise="the Megatron backend is not built here; use fsdp or fsdp2"))
    model: RewardModelModelConfig = S(RewardModelModelConfig, "the reward model (verl's legacy layout)")
    micro_batch_size: Optional[int] = F(None, "verl's deprecated global micro-batch size: divided over the ranks when micro_batch_size_per_gpu is null")
    micro_batch_size_per_gpu: Optional[int] = F(None, "responses per reward-model forward on one rank; null = all at once")
    max_length: Optional[int] = F(
        None, "longest re-encoded input (with input_tokenizer): longer ones keep their last max_length tokens; null = no limit"
    )
    use_dynamic_bsz: bool = F(II("critic.use_dynamic_bsz"), "cut reward-model forwards by token budget; default: the critic's")
    forward_max_token_len_per_gpu: int = F(
        II("critic.forward_max_token_len_per_gpu"), "token budget of one reward-model forward when use_dynamic_bsz is on; default: the critic's"
    )
    use_reward_loop: bool = F(True, "verl's switch between its reward-loop server and its FSDP worker", _RM_FSDP_ONLY)
    rollout: Dict[str, Any] = F({}, "verl's inference-engine settings for serving the reward model", _RM_FSDP_ONLY)
    enable_resource_pool: bool = F(
        False, "give the reward model devices of its own: nnodes x n_gpus_per_node ranks (on CPU: rank processes) with "
        "their own process group, instead of a share of every training rank's device; scores are the same")
    n_gpus_per_node: int = F(8, "devices per node of the reward model's own pool (read with enable_resource_pool)")
    nnodes: int = F(0, "nodes of the reward model's own pool (read with enable_resource_pool; at least 1 then)")
    combine: str = F(
        "verl",
        "how reward-model and rule scores make the reward: verl (the reward model's score, or the custom function's "
        "when custom_reward_function.path is set) | weighted (rm_weight x reward model + rule_weight x rule/custom score)",
    )
    rm_weight: float = F(1.0, "weight of the reward model's score with combine=weighted")
    rule_weight: float = F(1.0, "weight of the rule-based (or custom function's) score with combine=weighted")
    process: RMProcessConfig = S(RMProcessConfig, "process reward model (a score per reasoning step)")
    iterative: RMIterativeConfig = S(RMIterativeConfig, "iterative RL: reward-model retraining with replay and reference reset")
    reward_manager: str = F("naive", "how responses are scored: naive | prime | dapo", MANAGER_NAME)
    num_workers: int = F(2, "processes scoring responses in parallel")
    timeout_s: float = F(10.0, "time limit for scoring one response, in seconds")
    on_error: str = F("raise", "a scorer that raises, hangs or returns a non-number: raise (stop, naming the sample) | zero (score 0, counted)")
    overlong_buffer: OverlongBufferConfig = S(OverlongBufferConfig, "DAPO's overlong reward shaping (its recipe's spelling; max_resp_len = data.max_response_length)")
    reward_kwargs: RewardKwargsConfig = S(RewardKwargsConfig, "reward-manager arguments (verl's spelling of the overlong shaping)")
    reward_loop_source: str = F("register", "where verl's reward loop comes from: register (by reward_manager) | importlib", MANAGER_SOURCE)
    reward_loop_module_path: Optional[str] = F(None, "Python file of a custom reward loop", _CUSTOM_REWARD_LOOP)
    reward_loop_class_name: Optional[str] = F(None, "class name of a custom reward loop", _CUSTOM_REWARD_LOOP)
    launch_reward_fn_async: bool = F(False, "score responses while the old log-probs are computed", NoOp(
        "scoring runs in parallel scoring processes after the rollout and before the log-prob forwards; the "
        "scores and the update are the same either way"))
    sandbox_fusion: SandboxFusionConfig = sandbox_section("verl's early-2026 layout")
    profiler: ProfilerConfig = profiler_section("reward model")
    ulysses_sequence_parallel_size: int = F(1, "Ulysses sequence-parallel ranks of the reward model", ULYSSES)
    nccl_timeout: int = F(II("actor_rollout_ref.nccl_timeout"),
                          "seconds a collective of the reward model may wait (verl's Megatron layout)", ONE_TIMEOUT)
    megatron: Dict[str, Any] = megatron_section("reward model")
    load_weight: bool = load_weight_field("reward model")


@dataclass
class RewardRewardModelConfig:
    enable: bool = F(False, "score with a learned reward model (verl's current spelling of reward_model.enable; set either)")
    model_path: Optional[str] = F(None, "the reward model's directory (verl's current spelling of reward_model.model.path; set either)")
    enable_resource_pool: bool = F(False, "verl's current spelling of reward_model.enable_resource_pool (set either)")
    n_gpus_per_node: int = F(8, "verl's current spelling of reward_model.n_gpus_per_node (set either)")
    nnodes: int = F(0, "verl's current spelling of reward_model.nnodes (set either)")
    rollout: Dict[str, Any] = F({}, "verl's inference-engine settings for serving the reward model", _RM_FSDP_ONLY)


@dataclass
class RewardConfig:
    reward_kwargs: RewardKwargsConfig = S(RewardKwargsConfig, "reward-manager arguments (verl's current spelling of the overlong shaping)")
    num_workers: Optional[int] = F(None, "processes scoring responses; null = reward_model.num_workers (the same setting)",
                                   Honoured(alias_of="reward_model.num_workers"))
    reward_manager: RewardManagerConfig = S(RewardManagerConfig, "the reward manager (verl's current layout)")
    custom_reward_function: RewardCustomFunctionConfig = S(
        RewardCustomFunctionConfig, "a user-supplied reward function (verl's current layout of custom_reward_function)")
    sandbox_fusion: SandboxFusionConfig = sandbox_section("verl's current layout")
    reward_model: RewardRewardModelConfig = S(RewardRewardModelConfig, "the learned reward model (verl's current layout)")


@dataclass
class CustomRewardFunctionConfig:
    path: Optional[str] = F(None, "Python file defining the reward function (runs with the trainer's rights); null = built-in scorers")
    name: Optional[str] = F(
        "compute_score", "function in that file: fn(data_source, solution_str, ground_truth, extra_info=None) -> float; "
        "null = compute_score")


# --------------------------------------------------------------------------------------------
# trainer, ray
# --------------------------------------------------------------------------------------------
@dataclass
class TrainerConfig:
    total_epochs: int = F(30, "passes over the training data (total_training_steps, when set, wins)")
    total_training_steps: Optional[int] = F(
        "${grpo_dist.default_job_steps:${data.train_files},${trainer.total_epochs}}",
        "training steps; null = total_epochs x steps per epoch (verl's rule); left unset it is null, except for the "
        f"no-argument job (the embedded task with total_epochs left at 30), which runs {DEFAULT_JOB_STEPS} steps",
    )
    project_name: str = F("grpo_dist", "project name (loggers, default output folder)")
    experiment_name: str = F("reverse_tiny", "experiment name (loggers, default output folder)")
    logger: Any = F(
        ["console", "file"],
        "loggers, a list or one name: console | file (metrics.jsonl) | tensorboard | wandb | mlflow",
    )
    log_val_generations: int = F(
        0,
        "log this many validation samples (input, output, score; the same fixed-seed choice every time) as a table: "
        "console, file (val_generations.jsonl), tensorboard, wandb, mlflow; 0 = none",
    )
    nnodes: int = F(1, "nodes in the Ray cluster used for training")
    n_gpus_per_node: int = F(1, "devices per node (with trainer.device=cpu: ranks per node)")
    device: str = F("auto", "cuda | cpu | auto (cuda when available)")
    save_freq: int = F(-1, "save a checkpoint every N steps and at the last step (-1 = only at the last step, "
                               "which the quick start's resume and final model need; verl's -1 saves none)")
    test_freq: int = F(10, "validate every N steps (-1 = never during training)")
    val_before_train: bool = F(True, "validate before the first step")
    val_only: bool = F(False, "validate (the resumed checkpoint, else the initial model), log the scores and exit without training")
    resume_mode: str = F("auto", "auto (latest checkpoint in default_local_dir) | disable | resume_path")
    resume_from_path: Optional[str] = F(None, "checkpoint folder (global_step_N) for resume_mode=resume_path")
    default_local_dir: str = F(
        "checkpoints/${trainer.project_name}/${trainer.experiment_name}",
        "output folder: checkpoints, metrics.jsonl, report",
    )
    max_actor_ckpt_to_keep: Optional[int] = F(None, "keep only the newest N checkpoints; null = all")
    seed: int = F(1, "seed of the critic's new value head")
    progress_bar: bool = F(True, "show a progress bar over training steps")
    log_level: str = F(
        "quiet",
        "what the console shows besides grpo_dist's own lines: quiet = nothing (the workers' output and the "
        "libraries' logs go to <default_local_dir>/logs/run.log, named at start) | warning | info | debug = the "
        "libraries' logs from that level up, on the console (no log file); the environment variable "
        "GRPO_DIST_LOG_LEVEL, when set, wins",
    )
    critic_warmup: int = F(
        0,
        "train only the critic until this step: the actor updates from step critic_warmup on (steps counted from 1, "
        "as verl does; 0 and 1: from the first step)",
    )
    worker_call_timeout_s: float = F(
        1800.0,
        "deadline of the first call of each worker method (it may load a model, compile, warm up); a worker that "
        "misses a deadline stops the run naming it (a frozen or deadlocked process); later calls: "
        "worker_call_timeout_min_s / _factor; 0 = no deadlines at all",
    )
    worker_call_timeout_factor: float = F(
        10.0, "a later call of a worker method may take this many times the slowest such call so far (at least "
        "worker_call_timeout_min_s)")
    worker_call_timeout_min_s: float = F(
        60.0, "the shortest deadline of a later call of a worker method: how long a worker may not answer a fast "
        "call (a busy machine, a pause) before it is named as frozen")
    preemption_grace_s: float = F(
        300.0,
        "seconds between SIGTERM and the scheduler's kill (Slurm: --signal=B:TERM@N; Kubernetes: "
        "terminationGracePeriodSeconds): SIGTERM saves a checkpoint at the next step boundary when the rest of the "
        "step and the save fit in it (estimated from the slowest step and save so far), else the run stops at once "
        "saying where the newest checkpoint is; 0 = no limit (always finish the step and save)",
    )
    balance_batch: bool = F(
        True,
        "reorder rows inside each mini-batch so that every data-parallel rank gets a similar token count "
        "(the update is unchanged: rows never move across mini-batches); logs global_seqlen/*",
    )
    max_consecutive_nonfinite_steps: int = F(
        3, "stop (after saving a checkpoint) when this many steps in a row had a non-finite loss or gradient norm; 0 = never"
    )
    max_critic_ckpt_to_keep: Optional[int] = F(None, "keep only the newest N critic checkpoints; null = all", NoOp(
        "a checkpoint folder holds every role, so trainer.max_actor_ckpt_to_keep decides how many are kept for the "
        "critic too", values=(None,), same_as="trainer.max_actor_ckpt_to_keep",
        otherwise="set trainer.max_actor_ckpt_to_keep (it keeps whole checkpoints)"))
    default_hdfs_dir: Optional[str] = F(None, "copy checkpoints to this HDFS folder", off_feature(
        "copying checkpoints to HDFS", "put trainer.default_local_dir on a file system every node sees"))
    del_local_ckpt_after_load: bool = F(False, "delete the local checkpoint after resuming from it", off_feature(
        "deleting checkpoints after resume", "leave it false"))
    rollout_data_dir: Optional[str] = F(None, "write each step's prompts, responses and scores as jsonl here", off_feature(
        "dumping rollouts", "leave it null"))
    validation_data_dir: Optional[str] = F(None, "write validation generations as jsonl here", off_feature(
        "dumping validation generations", "leave it null"))
    esi_redundant_time: float = F(0, "seconds kept free before an elastic instance expires", NoOp(
        "read only on Volcano Engine's elastic instances (their expiry time comes from the environment)"))
    ray_wait_register_center_timeout: int = F(300, "seconds to wait for verl's worker registry", NoOp(
        "grpo_dist has no worker registry: worker start-up and calls are bounded by trainer.worker_call_timeout_s"))
    use_legacy_worker_impl: str = F("auto", "verl's choice between its worker implementations (early 2026)", NoOp(
        "grpo_dist has one worker implementation per role"))
    use_v1: bool = F(True, "run verl's v1 trainer loop", NoOp("grpo_dist has one trainer loop (synchronous)"))
    v1: TrainerV1Config = S(TrainerV1Config, "verl's v1 trainer modes (asynchronous modes not built here)", NoOp(
        "read only by verl's asynchronous v1 trainer modes (trainer.v1.trainer_mode is accepted only as sync)"))


@dataclass
class RayInitConfig:
    address: Optional[str] = F(None, "Ray cluster to attach to (or RAY_ADDRESS); null = start a local one")
    num_cpus: Optional[int] = F(None, "CPUs of the local Ray instance; null = all")
    include_dashboard: bool = F(False, "start Ray's dashboard (bound to 127.0.0.1) for a local instance")
    runtime_env: RuntimeEnvConfig = S(RuntimeEnvConfig, "Ray's runtime environment of the workers (ray.init(runtime_env=...))")


@dataclass
class RayKwargsConfig:
    ray_init: RayInitConfig = S(RayInitConfig, "ray.init arguments")
    timeline_json_file: Optional[str] = F(None, "write Ray's timeline of the run (chrome://tracing JSON) here at the end")


@dataclass
class GRPOConfig:
    data: DataConfig = S(DataConfig, "prompt data")
    actor_rollout_ref: ActorRolloutRefConfig = S(ActorRolloutRefConfig, "policy, reference and rollout")
    critic: CriticConfig = S(CriticConfig, "the critic: a value model trained alongside the policy (PPO with GAE)")
    algorithm: AlgorithmConfig = S(AlgorithmConfig, "advantage estimation and KL in reward")
    reward_model: RewardModelConfig = S(RewardModelConfig, "reward scoring")
    reward: RewardConfig = S(RewardConfig, "reward arguments (verl's newer section)")
    custom_reward_function: CustomRewardFunctionConfig = S(CustomRewardFunctionConfig, "a user-supplied reward function")
    trainer: TrainerConfig = S(TrainerConfig, "the training loop")
    ray_kwargs: RayKwargsConfig = S(RayKwargsConfig, "Ray")
    reward_manager: EarlyRewardManagerConfig = S(EarlyRewardManagerConfig, "the reward manager (verl's early-2026 section)")
    sandbox_fusion: SandboxFusionConfig = sandbox_section("verl's top-level section")
    global_profiler: GlobalProfilerConfig = global_profiler_section()
    distillation: DistillationConfig = S(DistillationConfig, "on-policy distillation (not built here: accepted only off)",
                                         NoOp(UNUSED_WITHOUT.format("distillation.enabled")))
    transfer_queue: TransferQueueConfig = S(TransferQueueConfig, "verl's transfer queue (not built here: accepted only off)",
                                            NoOp(UNUSED_WITHOUT.format("transfer_queue.enable")))
    skip: SkipConfig = S(SkipConfig, "replaying cached stages (not built here: accepted only off)",
                         NoOp(UNUSED_WITHOUT.format("skip.<stage>.enable")))


DEFAULT_TRAIN_FILES = "builtin:reverse/train"
VERL_TOTAL_EPOCHS = 30


def _default_job_steps(train_files: Any, total_epochs: Any) -> Optional[int]:
    """``trainer.total_training_steps`` left unset: null (verl's rule, steps from epochs), except for the
    no-argument job, the embedded task with the default epochs, whose length is the task's own."""
    if str(train_files) == DEFAULT_TRAIN_FILES and total_epochs == VERL_TOTAL_EPOCHS:
        return DEFAULT_JOB_STEPS
    return None


OmegaConf.register_new_resolver("grpo_dist.default_job_steps", _default_job_steps, replace=True)

# Interpolated keys have no help metadata of their own (II cannot carry it); documented here.
INTERPOLATED_HELP = {
    "actor_rollout_ref.rollout.prompt_length": "longest prompt the engine sees (= data.max_prompt_length)",
    "actor_rollout_ref.rollout.response_length": "longest response the engine samples (= data.max_response_length)",
    "reward_model.reward_kwargs.max_resp_len": "the length the overlong penalty reaches penalty_factor at (= data.max_response_length)",
    "reward.reward_kwargs.max_resp_len": "the length the overlong penalty reaches penalty_factor at (= data.max_response_length)",
}

# Keys whose default differs from verl's, and why. Shown in docs/configuration.md.
VERL_DEFAULT_DIFFERENCES = {
    "data.train_files": "the embedded task, so that the no-argument run works offline",
    "data.val_files": "the embedded task's test split",
    "data.max_prompt_length": "sized for the embedded task (verl: 512)",
    "data.max_response_length": "sized for the embedded task (verl: 512)",
    "data.train_batch_size": "sized for a 2-core CPU (verl: 1024)",
    "actor_rollout_ref.model.path": "the embedded tiny model",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "sized for the embedded task (verl: 256)",
    "actor_rollout_ref.actor.use_kl_loss": "on, as in the GRPO recipe (verl: false)",
    "actor_rollout_ref.actor.optim.lr": "a tiny model needs a large step (verl: 1e-6)",
    "actor_rollout_ref.actor.strategy": "FSDP2 is the only backend (verl: fsdp)",
    "critic.strategy": "FSDP2 is the only backend (verl: fsdp)",
    "reward_model.strategy": "FSDP2 is the only backend (verl: fsdp)",
    "critic.model.path": "the actor's model (verl: ~/models/deepseek-llm-7b-chat)",
    "actor_rollout_ref.model.enable_gradient_checkpointing": (
        "auto: on only when the estimated activations would not fit (verl: true); the update is the same either way, "
        "only memory and time differ; set true for verl's behaviour"
    ),
    "critic.model.enable_gradient_checkpointing": "auto, as the actor's (verl: true)",
    "actor_rollout_ref.rollout.n": "a GRPO group (verl: 1)",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "one rank per engine (verl: 2)",
    "algorithm.adv_estimator": "GRPO (verl: gae)",
    "trainer.device": "auto-detect (verl: cuda)",
    "trainer.n_gpus_per_node": "one device (verl: 8)",
    "trainer.logger": "console and metrics.jsonl (verl: console, wandb)",
    "trainer.total_training_steps": f"null, as verl's, except for the no-argument job (embedded task, total_epochs left at 30): {DEFAULT_JOB_STEPS} steps",
    "data.seed": "a fixed seed, so that runs repeat (verl: null, a fresh seed)",
    "actor_rollout_ref.ref.fsdp_config.dtype": "the actor's compute dtype (verl: bfloat16)",
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes": "rollout.update_weights_bucket_megabytes, 512 (verl: 2048)",
    "reward.num_workers": "null: reward_model.num_workers, 2 scoring processes (verl: 8)",
    "reward.reward_manager.name": "null: reward_model.reward_manager, naive (verl: naive)",
    "reward_manager.name": "null: reward_model.reward_manager (verl: the same, by interpolation)",
    "trainer.test_freq": "validate every 10 steps (verl: -1)",
    "algorithm.filter_groups.metric": "acc, used once filter_groups is switched on (verl: null)",
    "custom_reward_function.name": "compute_score (verl's current layout: null, read as compute_score)",
    "trainer.project_name": "(verl: verl_examples)",
    "trainer.experiment_name": "(verl: gsm8k)",
}
