"""``actor_rollout_ref.model.*``: the policy model that the actor, the reference and the rollout
engine load (path, tokenizer, kernels, config overrides), with verl's LoRA and MTP keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

from grpo_dist.config.fields import F, Refused, S
from grpo_dist.config.schema.common import LORA_ONLY
from grpo_dist.config.sections.engine import (
    ENTROPY_CHUNKED,
    SPEED_ONLY,
    FusedKernelOptions,
    LoraConfig,
    MTPConfig,
    TiledMLPConfig,
    lora_section,
    mtp_section,
    off_feature,
)


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
