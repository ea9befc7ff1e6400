"""verl's engine-level keys: FSDP internals, quantization-aware training, LoRA, multi-token
prediction, MoE router replay, and the rollout engine's extras.

grpo_dist trains with FSDP2 (``fully_shard`` on every decoder layer, then the whole model) and
computes log-probs and entropy in chunks with a closed-form backward (``core/logprobs.py``); knobs
that only change how verl's engines reach the same numbers have no effect here, for every value.
Features that would change the training (LoRA, QAT, MTP, router replay, verl's other FSDP engine)
are accepted only off. The keys only verl's Megatron backend reads (``<role>.megatron``, its optimizer's
schedule keys, ``load_weight``, ``rollout.layer_name_map``) have no effect: that backend is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from grpo_dist.config.fields import F, NoOp, Refused, S

# ---- reasons (shown in docs/configuration.md and, for values given, once at start-up) ----------
ENTROPY_CHUNKED = NoOp(
    "log-probs and entropy are always computed in chunks of positions with a closed-form backward "
    "(grpo_dist/core/logprobs.py): no float32 [tokens, vocab] temporaries are kept, whatever this says"
)
FSDP_INTERNAL = NoOp(
    "an internal of verl's FSDP engines; grpo_dist shards every decoder layer and then the whole model with "
    "FSDP2 over all ranks of the role; the update is the same"
)
SPEED_ONLY = NoOp("a speed or memory knob of verl's engine that does not change the numbers; grpo_dist has its own path")
ULYSSES = NoOp(
    "Ulysses sequence parallelism is not built: a sequence is NOT split across ranks here, so each rank holds "
    "whole sequences and needs the activation memory of the full prompt + response, which this setting would "
    "have divided by sp (a micro-batch of ppo_micro_batch_size_per_gpu rows takes sp times the memory it takes "
    "in verl; the automatic memory choices are sized for whole sequences; if memory is short, lower the "
    "micro-batch size or use use_dynamic_bsz with a per-rank token budget); every rank is a data-parallel rank, "
    "so verl's data-parallel size ranks / sp is ranks here; the global mini-batch and so the update are the "
    "same, and batch sizes must divide by all ranks (trainer.nnodes x trainer.n_gpus_per_node)"
)
UNUSED_WITHOUT = "read only when {0} is on, which is accepted only off here"


def off_feature(what: str, instead: str) -> Refused:
    return Refused(f"{what} is not built here; {instead}")


# ---- verl's Megatron backend (its ppo_megatron_trainer layout) ---------------------------------------------
# strategy=megatron is refused (FSDP2_ONLY in schema/common.py); the keys only that backend reads have no effect.
MEGATRON_ONLY = NoOp(UNUSED_WITHOUT.format("verl's Megatron backend (strategy=megatron)"))


def megatron_section(role: str) -> Any:
    """``<role>.megatron``: verl's Megatron engine settings, a mapping (any of its keys has no effect here)."""
    return F({}, f"verl's Megatron engine settings of the {role} (tensor/pipeline parallel sizes, ...)", MEGATRON_ONLY)


def load_weight_field(role: str) -> Any:
    return F(True, f"verl's Megatron engine: load the {role}'s weights from its Hugging Face folder", MEGATRON_ONLY)


@dataclass
class MegatronOptimKeys:
    """The learning-rate keys of verl's Megatron optimizer (``McoreOptimizerConfig``), shared by the actor's
    and the critic's ``optim``; the FSDP2 optimizer's schedule is lr_scheduler_type / lr_warmup_steps(_ratio) /
    min_lr_ratio."""

    lr_warmup_init: float = F(0.0, "Megatron optimizer: learning rate at the start of the warm-up", MEGATRON_ONLY)
    lr_decay_steps: Optional[int] = F(None, "Megatron optimizer: steps of the decay", MEGATRON_ONLY)
    lr_decay_style: str = F("constant", "Megatron optimizer: decay schedule", MEGATRON_ONLY)
    min_lr: float = F(0.0, "Megatron optimizer: lowest learning rate", MEGATRON_ONLY)
    weight_decay_incr_style: str = F("constant", "Megatron optimizer: weight-decay schedule", MEGATRON_ONLY)
    lr_wsd_decay_style: str = F("exponential", "Megatron optimizer: decay of the warmup-stable-decay schedule", MEGATRON_ONLY)
    lr_wsd_decay_steps: Optional[int] = F(None, "Megatron optimizer: decay steps of that schedule", MEGATRON_ONLY)
    use_checkpoint_opt_param_scheduler: bool = F(False, "Megatron optimizer: take the schedule from the checkpoint",
                                                 MEGATRON_ONLY)


@dataclass
class LayerNameMapConfig:
    qkv_layer_name: str = F("qkv", "Megatron layer name of the fused attention projection")
    gate_proj_layer_name: str = F("gate_up", "Megatron layer name of the fused gate/up projection")


def layer_name_map_section() -> Any:
    return S(LayerNameMapConfig, "names of verl's Megatron layers in the weight transfer to the rollout", MEGATRON_ONLY)


# ---- FSDP engine internals ---------------------------------------------------------------------
@dataclass
class WrapPolicyConfig:
    min_num_params: int = F(0, "FSDP1 auto-wrap threshold (parameters per wrapped module)")


@dataclass
class MixedPrecisionConfig:
    """verl's ``fsdp_config.mixed_precision`` (set with ``+...mixed_precision.<key>=``)."""

    param_dtype: Optional[str] = F(
        None, "compute dtype of the gathered parameters; null = fsdp_config.dtype (the same setting: set either)"
    )
    reduce_dtype: str = F("float32", "dtype of the gradient reduce-scatter: float32 | bfloat16 | float16 (also fp32, bf16, fp16)")
    buffer_dtype: str = F("float32", "dtype of the model's buffers", NoOp(
        "the models' buffers (rotary tables) are built by transformers in their own dtype"))


@dataclass
class QATConfig:
    enable: bool = F(False, "quantization-aware training", off_feature(
        "quantization-aware training", "train in float32 or bfloat16 (fsdp_config.dtype)"))
    mode: str = F("w4a16", "QAT scheme")
    group_size: int = F(16, "QAT quantization group size")
    ignore_patterns: List[str] = F(["lm_head", "embed_tokens", "re:.*mlp.gate$"], "modules QAT leaves alone")
    activation_observer: str = F("static_minmax", "QAT activation observer")
    quantization_config_path: Optional[str] = F(None, "QAT configuration file")


def qat_section() -> Any:
    return S(QATConfig, "verl's quantization-aware training (accepted only off)", NoOp(UNUSED_WITHOUT.format("qat.enable")))


@dataclass
class FSDPPlanConfig:
    fsdp_implementation: str = F("native", "FSDP implementation of verl's turbo engine")
    num_to_forward_prefetch: int = F(1, "layers prefetched in the forward")
    num_to_backward_prefetch: int = F(1, "layers prefetched in the backward")
    param_dtype: str = F("bf16", "compute dtype")
    reduce_dtype: str = F("fp32", "gradient reduction dtype")
    output_dtype: str = F("bf16", "output dtype")


@dataclass
class TurboDistributedConfig:
    fsdp_plan: FSDPPlanConfig = S(FSDPPlanConfig, "FSDP plan")
    fully_shard_parallel_size: int = F(16, "ranks of one FSDP group")
    tensor_parallel_size: int = F(1, "tensor-parallel ranks")
    ulysses_parallel_size: int = F(1, "sequence-parallel ranks")
    expert_parallel_size: int = F(1, "expert-parallel ranks")
    expert_fully_shard_parallel_size: int = F(1, "ranks sharding each expert")


@dataclass
class TurboConfig:
    distributed: TurboDistributedConfig = S(TurboDistributedConfig, "parallel layout")


def turbo_section() -> Any:
    return S(TurboConfig, "verl's turbo FSDP engine (not built here: accepted at its defaults)",
             Refused("verl's turbo FSDP engine is not built here; grpo_dist's FSDP2 path is used, leave these at verl's defaults"))


@dataclass
class FSDPEngineKeys:
    """The internals of verl's FSDP engine config, shared by every role's ``fsdp_config``."""

    strategy: str = F("fsdp", "FSDP generation of verl's engine: fsdp | fsdp2", NoOp(
        "grpo_dist always trains with FSDP2 (fsdp is the same sharding)", values=("fsdp", "fsdp2"),
        otherwise="the Megatron backend is not built here; use fsdp or fsdp2"))
    forward_prefetch: bool = F(False, "prefetch the next layer's parameters in the forward", FSDP_INTERNAL)
    use_orig_params: bool = F(False, "FSDP1's flat-parameter option", FSDP_INTERNAL)
    fsdp_size: int = F(-1, "ranks per FSDP shard group (-1 = all; else hybrid sharding)", FSDP_INTERNAL)
    wrap_policy: WrapPolicyConfig = S(WrapPolicyConfig, "FSDP1 auto-wrap policy", FSDP_INTERNAL)
    offload_policy: bool = F(
        False, "FSDP2 CPU offload policy (parameters, gradients and optimizer step on the CPU); the same as param_offload here"
    )
    forward_only: bool = F(False, "engine built without an optimizer (verl sets it per role)", NoOp(
        "an engine flag verl sets per role; grpo_dist's roles know whether they train", values=(False,),
        otherwise="leave it at verl's value for this role"))
    seed: int = F(42, "seed of verl's engine", NoOp(
        "the weights come from the model folder and dropout is off: nothing here draws random numbers from it "
        "(the critic's new value head is drawn from trainer.seed)"))
    full_determinism: bool = F(False, "deterministic kernels", off_feature(
        "forcing deterministic kernels", "runs on the same machine and settings repeat up to float rounding"))
    use_torch_compile: bool = F(True, "torch.compile the engine's functions", SPEED_ONLY)
    ulysses_sequence_parallel_size: int = F(1, "Ulysses sequence-parallel ranks", ULYSSES)
    entropy_checkpointing: bool = F(False, "recompute the entropy in the backward", ENTROPY_CHUNKED)
    entropy_from_logits_with_chunking: bool = F(False, "compute the entropy in chunks", ENTROPY_CHUNKED)
    entropy_from_logits_chunk_size: int = F(2048, "positions per entropy chunk", ENTROPY_CHUNKED)
    pad_to_length: bool = F(False, "pad packed sequences to fixed lengths", SPEED_ONLY)
    pad_to_length_bucket: int = F(1024, "length bucket of pad_to_length", SPEED_ONLY)
    qat: QATConfig = qat_section()
    turbo_config: TurboConfig = turbo_section()
    mixed_precision: MixedPrecisionConfig = S(MixedPrecisionConfig, "FSDP mixed precision (verl's + keys)")


# ---- model extras --------------------------------------------------------------------------------
@dataclass
class LoraConfig:
    """verl's current LoRA layout (``model.lora.*``), the keys in verl's order; each model's section states what
    is honoured (:mod:`grpo_dist.config.schema.model`)."""

    rank: int = F(0, "LoRA rank; 0 = full fine-tuning")
    alpha: int = F(32, "LoRA scaling alpha")
    dropout: float = F(0.0, "LoRA dropout")
    dropout_position: str = F("pre", "where LoRA's dropout applies")
    dtype: Optional[str] = F(None, "LoRA weights' dtype")
    type: str = F("lora", "adapter type")
    target_modules: List[str] = F(["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"], "modules that get adapters")
    exclude_modules: List[str] = F([], "modules that get none")
    adapter_path: Optional[str] = F(None, "pretrained adapter to start from")
    merge: bool = F(False, "merge adapters into the weights for the rollout")
    freeze_language_model: bool = F(True, "freeze the language model's base weights")
    freeze_vision_model: bool = F(True, "freeze the vision tower")
    freeze_vision_projection: bool = F(True, "freeze the vision projection")
    lora_A_init_method: str = F("xavier", "initialisation of A")  # noqa: N815 - verl's key
    lora_B_init_method: str = F("zero", "initialisation of B")  # noqa: N815 - verl's key
    a2a_experimental: bool = F(False, "experimental all-to-all for MoE adapters")


MTP_OFF = off_feature("multi-token prediction", "leave it off")


@dataclass
class MTPConfig:
    enable: bool = F(False, "load the model's multi-token-prediction layers", MTP_OFF)
    enable_train: bool = F(False, "train them", MTP_OFF)
    enable_rollout: bool = F(False, "use them for speculative decoding", MTP_OFF)
    method: str = F("mtp", "MTP method")
    detach_encoder: bool = F(False, "stop gradients into the trunk")
    mtp_loss_scaling_factor: float = F(0.1, "weight of the MTP loss")
    speculative_algorithm: str = F("EAGLE", "speculative decoding algorithm")
    speculative_num_steps: int = F(3, "speculative steps")
    speculative_eagle_topk: int = F(1, "EAGLE top-k")
    speculative_num_draft_tokens: int = F(4, "draft tokens")
    num_speculative_tokens: int = F(1, "speculative tokens per step")


def mtp_section() -> Any:
    return S(MTPConfig, "multi-token prediction (not built here: accepted only off)", NoOp(UNUSED_WITHOUT.format("mtp.enable")))


@dataclass
class TiledMLPConfig:
    enabled: bool = F(False, "compute the MLP in tiles to save activation memory")
    num_shards: int = F(4, "tiles")


@dataclass
class FusedKernelOptions:
    impl_backend: str = F("torch", "backend of verl's fused kernels: torch | triton")


@dataclass
class RouterReplayConfig:
    mode: str = F("disabled", "MoE router replay: disabled | record | replay", off_feature(
        "MoE router replay", "leave it disabled"))
    record_file: Optional[str] = F(None, "where routing decisions are recorded")
    replay_file: Optional[str] = F(None, "routing decisions to replay")


def router_replay_section() -> Any:
    return S(RouterReplayConfig, "MoE router replay (not built here: accepted only disabled)",
             NoOp(UNUSED_WITHOUT.format("router_replay.mode")))


# ---- rollout extras ------------------------------------------------------------------------------
@dataclass
class CheckpointEngineConfig:
    backend: str = F("naive", "how weights reach the engine: naive (a CUDA IPC handle into an engine on the "
                     "actor's GPU, else Ray's object store) or nccl (actor rank 0 broadcasts each bucket over a "
                     "process group spanning it and every rollout rank: NCCL on GPUs, gloo on the CPU; an engine "
                     "on the actor's GPU still takes the IPC handle)")
    custom_backend_module: Optional[str] = F(None, "module of a custom weight-transfer backend", off_feature(
        "a custom weight-transfer backend", "leave it null"))
    engine_kwargs: Dict[str, Any] = F({}, "arguments of the weight-transfer backend", NoOp(
        "read by verl's weight-transfer backends only"))
    update_weights_bucket_megabytes: int = F(
        "${actor_rollout_ref.rollout.update_weights_bucket_megabytes}",
        "weight sync: most MiB gathered and sent at once (verl's current key; default: rollout.update_weights_bucket_megabytes)",
    )


@dataclass
class DisaggregationConfig:
    enabled: bool = F(False, "prefill/decode disaggregation", off_feature(
        "prefill/decode disaggregation", "leave it off (one engine per rank)"))
    prefill_replicas: int = F(1, "prefill engines")
    decode_replicas: int = F(1, "decode engines")
    decode_tensor_model_parallel_size: Optional[int] = F(None, "tensor-parallel size of decode engines")
    transfer_backend: str = F("nixl", "KV transfer backend")
    bootstrap_port: Optional[int] = F(None, "bootstrap port")
    ib_device: Optional[str] = F(None, "InfiniBand device")


@dataclass
class PrometheusConfig:
    enable: bool = F(False, "export the engine's metrics to Prometheus", off_feature(
        "Prometheus export of the rollout engine's metrics", "leave it off"))
    port: int = F(9090, "Prometheus port")
    file: str = F("/tmp/ray/session_latest/metrics/prometheus/prometheus.yml", "Prometheus configuration file")
    served_model_name: Optional[str] = F(None, "model name in the metrics")


@dataclass
class TraceConfig:
    backend: Optional[str] = F(None, "rollout tracing backend: weave | mlflow; null = off")
    token2text: bool = F(False, "decode tokens in traces")
    max_samples_per_step_per_worker: Optional[int] = F(None, "traces per step and worker")
    project_name: Optional[str] = F(None, "trace project (verl: trainer.project_name)")
    experiment_name: Optional[str] = F(None, "trace experiment (verl: trainer.experiment_name)")
