"""``actor_rollout_ref.model.*``: the policy model that the actor, the reference and the rollout
engine load (path, tokenizer, kernels, config overrides), with verl's LoRA and MTP keys."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from grpo_dist.config.fields import HONOURED, F, Honoured, NoOp, Refused, S
from grpo_dist.config.sections.engine import (
    ENTROPY_CHUNKED,
    SPEED_ONLY,
    FusedKernelOptions,
    LoraConfig,
    MTPConfig,
    TiledMLPConfig,
    mtp_section,
)

_M = "actor_rollout_ref.model."


def honoured_lora_layout(model_prefix: str) -> Callable[[type], type]:
    """A class decorator over a subclass of :class:`LoraConfig` (verl's current LoRA layout, ``<model>.lora.*``):
    its rank, alpha, dropout, modules and adapter path honoured, the first five as other spellings of the
    early layout's keys of the model section at ``model_prefix`` (``<model>.lora_rank`` ...). The fields
    override :class:`LoraConfig`'s, so they keep its order. A setting given in neither spelling takes the
    default of the layout the rank was given in (alpha: 16 early, 32 current); the current layout's default
    modules (Megatron's linear_qkv, linear_proj, linear_fc1, linear_fc2: every linear layer of the blocks)
    are all-linear (:func:`grpo_dist.config.validate.lora_spellings`)."""
    m = model_prefix
    keys = [
        ("rank", int, F(0, "LoRA rank; 0 = full fine-tuning", Honoured(alias_of=m + "lora_rank"))),
        ("alpha", int, F(32, "LoRA scaling alpha (the update is scaled by alpha / rank)", Honoured(alias_of=m + "lora_alpha"))),
        ("dropout", float, F(0.0, "LoRA dropout on the adapters' input", HONOURED)),
        ("target_modules", List[str], F(["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"],
                                        "modules that get adapters (default: every linear layer of the blocks)",
                                        Honoured(alias_of=m + "target_modules"))),
        ("exclude_modules", List[str], F([], "modules that get none", Honoured(alias_of=m + "exclude_modules"))),
        ("adapter_path", Optional[str], F(None, "a saved peft adapter folder to start from",
                                          Honoured(alias_of=m + "lora_adapter_path"))),
        ("type", str, F("lora", "adapter type", Refused("only LoRA adapters (peft) are built", accept=("lora",)))),
        ("freeze_language_model", bool, F(True, "freeze the language model's base weights", Refused(
            "the base weights are always frozen under LoRA here", accept=(True,)))),
    ]
    return _with_fields(keys)


def _with_fields(keys: list[tuple[str, Any, Any]]) -> Callable[[type], type]:
    """A class decorator (before ``@dataclass``): ``keys`` (name, type, field) set on the class as its own
    annotated fields, after those it declares (a field a base class has keeps the base's place)."""

    def add(cls: type) -> type:
        own = cls.__dict__.get("__annotations__")
        if own is None:
            own = {}
            cls.__annotations__ = own
        for name, type_, field_ in keys:
            assert name not in own, f"{cls.__name__}.{name} is set by the decorator"
            own[name] = type_
            setattr(cls, name, field_)
        return cls

    return add


@dataclass
@honoured_lora_layout(_M)
class PolicyLoraConfig(LoraConfig):
    """verl's current LoRA layout of the policy (``actor_rollout_ref.model.lora.*``): the same keys, in the
    same order, as :class:`LoraConfig`; rank, alpha, dropout, the modules and the adapter path honoured
    (:func:`honoured_lora_layout`); ``merge`` picks the weight sync."""

    merge: bool = F(False, "the weight sync: false sends the adapters alone and the rollout engine samples through "
                    "them as a LoRA adapter on its base weights (vLLM's enable_lora); true sends the merged weights "
                    "W + alpha/rank * B A (needed when an adapted module is one vLLM's LoRA cannot serve, e.g. lm_head; "
                    "faster on the CPU, where vLLM generates several times slower through adapters: docs/lora.md)",
                    HONOURED)


_C = "critic.model."


@dataclass
@honoured_lora_layout(_C)
class CriticLoraConfig(LoraConfig):
    """verl's current LoRA layout of the value model (``critic.model.lora.*``): as the policy's
    (:func:`honoured_lora_layout`), with no weight sync to pick (``merge``)."""

    merge: bool = F(False, "merge the adapters into the weights for the rollout", NoOp(
        "the value model sends no weights to a rollout engine; its Hugging Face export holds the merged weights"))


PEFT_LORA = NoOp("an option of verl's Megatron-engine LoRA; the LoRA built here is peft's: dropout on the adapters' "
                 "input, adapters in the model's dtype, A Kaiming-uniform and B zero at the start, no vision tower")

POLICY_LORA_KEYS = [
    ("lora_rank", int, F(0, "LoRA rank (verl's early layout): > 0 trains peft LoRA adapters on the frozen policy, "
                           "and the reference is the policy with its adapters off; 0 = full fine-tuning")),
    ("lora_alpha", int, F(16, "LoRA alpha (early layout): the adapters' update is scaled by alpha / rank")),
    ("target_modules", Any, F("all-linear", "modules that get LoRA adapters (early layout): all-linear (every linear "
                              "layer but the output layer) | a list of module names | a regular expression")),
    ("exclude_modules", Optional[Any], F(None, "modules that get none (names or a regular expression)")),
    ("lora_adapter_path", Optional[str], F(None, "a saved peft LoRA adapter folder to start from (its rank, alpha "
                                           "and modules are used)")),
    ("lora", PolicyLoraConfig, S(PolicyLoraConfig, "LoRA, verl's current layout (another spelling of the keys above)",
                                 PEFT_LORA)),
]
"""The policy's LoRA keys, honoured (:class:`grpo_dist.training.settings.LoraSettings`)."""

CRITIC_LORA_KEYS = [
    ("lora_rank", int, F(0, "LoRA rank of the value model (verl's early layout): > 0 trains peft LoRA adapters on its "
                           "frozen backbone, its value head trained in full; 0 = full fine-tuning")),
    ("lora_alpha", int, F(16, "LoRA alpha (early layout): the adapters' update is scaled by alpha / rank")),
    ("target_modules", Any, F("all-linear", "modules that get LoRA adapters (early layout): all-linear (every linear "
                              "layer but the value head) | a list of module names | a regular expression")),
    ("exclude_modules", Optional[Any], F(None, "modules that get none (names or a regular expression)")),
    ("lora_adapter_path", Optional[str], F(None, "a saved peft LoRA adapter folder to start from (its rank, alpha "
                                           "and modules are used; the value head comes from critic.model.path)")),
    ("lora", CriticLoraConfig, S(CriticLoraConfig, "LoRA, verl's current layout (another spelling of the keys above)",
                                 PEFT_LORA)),
]
"""The value model's LoRA keys, honoured (``CriticSettings.lora``, :mod:`grpo_dist.training.critic_lora`)."""


def engine_model_keys(lora_keys: list[tuple[str, Any, Any]]) -> Callable[[type], type]:
    """A class decorator: the keys of verl's model sections that the policy's ``model`` and the critic's
    ``model`` both carry (the engine's kernel and memory knobs, LoRA in verl's early and current layouts,
    multi-token prediction), appended after the section's own keys, in verl's order, each with its one
    state. Appended rather than inherited: a base class's fields would come first, and conf/ and
    docs/configuration.md list a section's keys in field order. ``lora_keys``: the section's LoRA keys
    (:data:`POLICY_LORA_KEYS`, :data:`CRITIC_LORA_KEYS`)."""
    return _with_fields([
        ("use_liger", bool, F(False, "Liger kernels for the model's layers", SPEED_ONLY)),
        ("use_shm", bool, F(False, "copy the model to shared memory before loading", SPEED_ONLY)),
        ("enable_activation_offload", bool, F(False, "offload activations to the CPU in the backward", SPEED_ONLY)),
        ("tiled_mlp", TiledMLPConfig, S(TiledMLPConfig, "tiled MLP computation (memory)", SPEED_ONLY)),
        *lora_keys,
        ("mtp", MTPConfig, mtp_section()),
    ])


def hf_config_path_field(model: str, path_key: str) -> Any:
    """``<section>.hf_config_path`` of ``model`` (e.g. "the value model"), whose weights ``path_key`` names."""
    return F(None, f"a Hugging Face config folder other than {model}'s", Refused(
        f"a config from another folder is not built here; put the config.json beside the weights ({path_key})"))


EXTERNAL_LIB_HELP = ("a Python module (or a list of modules) imported by the driver and by every worker process that "
                     "builds a model or a rollout engine, before it does (verl's; e.g. a module that registers a model "
                     "class with transformers' Auto classes or vLLM's ModelRegistry); it must be importable there")


@dataclass
@engine_model_keys(POLICY_LORA_KEYS)
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
    hf_config_path: Optional[str] = hf_config_path_field("the model", "model.path")
    external_lib: Any = F(None, EXTERNAL_LIB_HELP)
    fused_kernel_options: FusedKernelOptions = S(FusedKernelOptions, "options of verl's fused kernels", ENTROPY_CHUNKED)
