"""Loading a Hugging Face model directory and wrapping it with FSDP2: one builder for every model role.

The policy (:class:`~grpo_dist.training.actor.FSDPActor`), the frozen reference
(:class:`~grpo_dist.training.reference.FSDPReference`) and any further trained or frozen model (a
value model: ``AutoModelForTokenClassification`` with ``num_labels=1``; a reward model:
``AutoModelForSequenceClassification``) are built by :func:`build_fsdp_model` from the same steps:
load in a dtype on the CPU, zero dropout, freeze or not, gradient checkpointing if asked, shard with
FSDP2. :func:`build_fsdp_model` is COLLECTIVE (every rank of the mesh calls it, in the same order).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from transformers import AutoConfig, AutoModelForCausalLM

from grpo_dist.training import fsdp
from grpo_dist.training.attention import VARLEN_SDPA
from grpo_dist.training.dtypes import to_dtype
from grpo_dist.training.settings import ATTN_IMPLEMENTATIONS, LoraSettings

__all__ = [
    "ATTN_IMPLEMENTATIONS",
    "to_torch_device",
    "resolve_attn_implementation",
    "load_hf_model",
    "build_fsdp_model",
]



def to_torch_device(device: str | torch.device) -> torch.device:
    """The ``torch.device`` a model runs on: ``"cpu"`` or a CUDA device; ``"cuda"`` without an index
    means the current CUDA device.

    On CUDA the device is made current (FSDP2 and the device mesh use the current device).
    ``ValueError`` when CUDA is asked for but not available.
    """
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device} asked for, but CUDA is not available")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    return device


def resolve_attn_implementation(name: str, device: torch.device, compute_dtype: torch.dtype | None = None) -> str:
    """The attention kernel a model is loaded with.

    ``"auto"`` -> ``flash_attention_2`` on CUDA when flash-attn is installed and the compute dtype is
    bfloat16/float16, else SDPA. SDPA (``"auto"`` without flash-attn, or ``"sdpa"``) is loaded as
    :data:`~grpo_dist.training.attention.VARLEN_SDPA`: transformers' SDPA for padded batches, and for a
    packed row one causal SDPA per sequence instead of a block-diagonal mask over the whole row.
    ``flash_attention_2`` on a non-CUDA device is a ``ValueError``.
    """
    if name not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"unknown attn_implementation {name!r}; valid: {list(ATTN_IMPLEMENTATIONS)}")
    if name == "auto":
        half = compute_dtype in (torch.bfloat16, torch.float16)
        if device.type == "cuda" and half and importlib.util.find_spec("flash_attn") is not None:
            return "flash_attention_2"
        return VARLEN_SDPA
    if name == "flash_attention_2" and device.type != "cuda":
        raise ValueError(f"attn_implementation='flash_attention_2' needs a CUDA device, got {device}; use sdpa")
    if name == "sdpa":
        return VARLEN_SDPA
    return name


def require_process_group(owner: str, rank: int, world_size: int) -> None:
    """Raise unless torch.distributed is initialised, as ``rank`` of ``world_size`` ranks (a role's
    model is built collectively on every rank of the default process group)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError(f"{owner} needs torch.distributed initialised (init_process_group) first")
    if dist.get_rank() != rank or dist.get_world_size() != world_size:
        raise ValueError(
            f"rank/world_size {rank}/{world_size} differ from the process group's "
            f"{dist.get_rank()}/{dist.get_world_size()}"
        )


def model_config(model_path: str | os.PathLike, overrides: Mapping[str, Any] | None = None, *,
                 trust_remote_code: bool = False) -> Any:
    """The model folder's Hugging Face config with ``overrides`` set on it (``model.override_config``,
    a value head's ``num_labels``): what a role builds and sizes its memory from, and, dropout as
    shipped, what its Hugging Face export writes."""
    config = AutoConfig.from_pretrained(str(model_path), trust_remote_code=trust_remote_code)
    for key, value in (overrides or {}).items():
        setattr(config, key, value)
    return config


def load_hf_model(
    model_path: str | os.PathLike,
    *,
    dtype: torch.dtype,
    attn_implementation: str,
    model_class: Any = AutoModelForCausalLM,
    config_overrides: Mapping[str, Any] | None = None,
    trust_remote_code: bool = False,
    disable_dropout: bool = True,
    require_head: bool = False,
) -> nn.Module:
    """``model_class.from_pretrained`` on the CPU, in ``dtype``, KV cache off, eval mode.

    ``model_class`` is a transformers auto class (or a model class) with ``from_pretrained``;
    ``config_overrides`` sets config fields before the model is built (e.g. ``{"num_labels": 1}`` for
    a value head). ``disable_dropout`` sets every float ``*dropout*`` field of the config and every
    ``nn.Dropout`` to 0, so train mode (needed by Hugging Face gradient checkpointing) computes the
    same function as eval mode and an update's forward matches a no-grad forward. ``require_head``:
    ``ValueError`` when a weight outside the backbone (``base_model_prefix``: the task head) is not in
    the folder, which transformers would initialise at random (a reward model's head).
    """
    config = model_config(model_path, config_overrides, trust_remote_code=trust_remote_code)
    if disable_dropout:
        for key, value in config.to_dict().items():
            if "dropout" in key and isinstance(value, float):
                setattr(config, key, 0.0)
    config.use_cache = False
    model = model_class.from_pretrained(
        str(model_path),
        config=config,
        dtype=dtype,
        attn_implementation=attn_implementation,
        trust_remote_code=trust_remote_code,
        output_loading_info=require_head,
    )
    if require_head:
        model, info = model
        prefix = getattr(model, "base_model_prefix", "") or ""
        missing = sorted(k for k in info.get("missing_keys", ()) if not (prefix and k.startswith(prefix + ".")))
        if missing:
            found = ", ".join(sorted(info.get("unexpected_keys", ()))[:6]) or "nothing"
            raise ValueError(
                f"{model_path} holds no trained head for {type(model).__name__}: {', '.join(missing)} missing from its "
                f"weights (would be random); the folder holds {found} that the model does not read"
            )
    if disable_dropout:
        for module in model.modules():
            if isinstance(module, nn.Dropout):
                module.p = 0.0
    return model.eval()


def build_fsdp_model(
    model_path: str | os.PathLike,
    *,
    mesh: DeviceMesh,
    device: torch.device,
    model_dtype: str | torch.dtype,
    param_dtype: str | torch.dtype,
    reduce_dtype: str | torch.dtype,
    trainable: bool,
    attn_implementation: str = "auto",
    model_class: Any = AutoModelForCausalLM,
    config_overrides: Mapping[str, Any] | None = None,
    gradient_checkpointing: bool = False,
    reshard_after_forward: bool = True,
    cpu_offload: bool = False,
    trust_remote_code: bool = False,
    require_head: bool = False,
    lora: LoraSettings | None = None,
) -> nn.Module:
    """Collective: load ``model_path`` with ``model_class`` and shard it over ``mesh`` with FSDP2.

    Steps: :func:`load_hf_model` in ``model_dtype`` (the dtype of the sharded master weights) with
    dropout zeroed and the attention kernel resolved for ``device`` and ``param_dtype``
    (:func:`resolve_attn_implementation`; ``require_head`` refuses a head missing from the folder);
    ``requires_grad_(False)`` unless ``trainable``; Hugging
    Face gradient checkpointing (non-reentrant) when ``gradient_checkpointing``; with ``lora`` enabled,
    peft LoRA adapters on its target modules (:func:`grpo_dist.training.lora.add_adapters`: the base
    frozen, the adapters trainable; FSDP2 then shards both);
    :func:`~grpo_dist.training.fsdp.apply_fsdp2` with compute dtype ``param_dtype``, gradient
    reduce dtype ``reduce_dtype``, ``reshard_after_forward`` and ``cpu_offload``. Returns the wrapped
    model in eval mode (its parameters are DTensors sharded over ``mesh``).
    """
    compute = to_dtype(param_dtype)
    model = load_hf_model(
        model_path,
        dtype=to_dtype(model_dtype),
        attn_implementation=resolve_attn_implementation(attn_implementation, device, compute),
        model_class=model_class,
        config_overrides=config_overrides,
        trust_remote_code=trust_remote_code,
        require_head=require_head,
    )
    if not trainable:
        model.requires_grad_(False)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora is not None and lora.enabled:
        from grpo_dist.training.lora import add_adapters

        model = add_adapters(model, lora)
    model = fsdp.apply_fsdp2(
        model,
        mesh,
        param_dtype=compute,
        reduce_dtype=reduce_dtype,
        reshard_after_forward=reshard_after_forward,
        cpu_offload=cpu_offload,
    )
    return model.eval()
