"""FSDP2 wrapping, full state dicts, sharded checkpoints (DCP) and the Hugging Face export.

Everything here that touches a sharded model is COLLECTIVE: every rank of the mesh must call it, in
the same order, or the job hangs.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

__all__ = [
    "DTYPES",
    "to_dtype",
    "decoder_layers",
    "apply_fsdp2",
    "full_state_dict",
    "save_sharded",
    "load_sharded",
    "export_hf",
    "copy_tokenizer_files",
]

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def to_dtype(name: str | torch.dtype) -> torch.dtype:
    """``"float32" | "bfloat16" | "float16"`` (or fp32/bf16/fp16, or a torch.dtype) -> torch.dtype."""
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; valid: float32 | bfloat16 | float16")
    return DTYPES[name]


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a Hugging Face model, found by its ``_no_split_modules`` class names.

    Falls back to ``model.model.layers``. ``ValueError`` when none is found (FSDP2 would then shard the
    whole model as one unit, which gathers every parameter at once).
    """
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        inner = getattr(getattr(model, "model", None), "layers", None)
        layers = list(inner) if inner is not None else []
    if not layers:
        raise ValueError(f"cannot find the decoder layers of {type(model).__name__} to shard them one by one")
    return layers


def apply_fsdp2(
    model: nn.Module,
    mesh: DeviceMesh,
    *,
    param_dtype: str | torch.dtype,
    reduce_dtype: str | torch.dtype,
    reshard_after_forward: bool,
    cpu_offload: bool,
) -> nn.Module:
    """``fully_shard`` each decoder layer, then the root module (in place; returns ``model``).

    ``param_dtype`` is the compute dtype of the gathered parameters, ``reduce_dtype`` the dtype of the
    gradient reduce-scatter; the sharded master weights keep the dtype the model was loaded in.
    ``cpu_offload`` keeps sharded parameters, gradients and the optimizer step on the CPU
    (``CPUOffloadPolicy``; a no-op on a CPU mesh). FSDP2 averages gradients over the mesh.
    """
    mp = MixedPrecisionPolicy(param_dtype=to_dtype(param_dtype), reduce_dtype=to_dtype(reduce_dtype))
    kwargs: dict[str, Any] = {"mesh": mesh, "mp_policy": mp}
    if cpu_offload and mesh.device_type != "cpu":  # on a CPU mesh everything already lives on the CPU
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
    for layer in decoder_layers(model):
        fully_shard(layer, reshard_after_forward=reshard_after_forward, **kwargs)
    fully_shard(model, reshard_after_forward=reshard_after_forward, **kwargs)
    return model


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Collective: the full (unsharded) state dict, on CPU, on rank 0; ``{}`` on the other ranks."""
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.is_initialized() and dist.get_rank() != 0:
        return {}
    return sd


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def save_sharded(
    directory: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Collective: write model + optimizer shards with DCP under ``directory/dcp``.

    ``extra`` (small per-rank objects: scheduler state, RNG state, counters) goes to
    ``directory/extra_rank{r}.pt``. ``directory`` must be on a file system every rank sees.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(directory / "dcp"))
    if extra is not None:
        torch.save(dict(extra), directory / f"extra_rank{_rank()}.pt")
    if dist.is_initialized():
        dist.barrier()


def load_sharded(
    directory: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any] | None:
    """Collective: load what :func:`save_sharded` wrote into ``model`` and ``optimizer`` (in place).

    The mesh size may differ from the one that saved (DCP reshards). Returns this rank's ``extra``
    dict, or ``None`` when the checkpoint has none for this rank.
    """
    directory = Path(directory)
    if not (directory / "dcp").is_dir():
        raise FileNotFoundError(f"no sharded checkpoint at {directory / 'dcp'}")
    # get_state_dict initialises the optimizer state (a zero-lr step) so DCP has tensors to load into.
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(state, checkpoint_id=str(directory / "dcp"))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    extra_path = directory / f"extra_rank{_rank()}.pt"
    return torch.load(extra_path, weights_only=False) if extra_path.exists() else None


TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)


def copy_tokenizer_files(source: str | os.PathLike, directory: str | os.PathLike) -> list[str]:
    """Copy the tokenizer files of a local model directory verbatim (no re-serialisation, so the
    copy is exactly what the rollout engine and the data pipeline were given). Returns their names."""
    source = Path(source)
    found = [name for name in TOKENIZER_FILES if (source / name).is_file()]
    if not found:
        raise FileNotFoundError(f"no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, ...) in {source}")
    for name in found:
        shutil.copyfile(source / name, Path(directory) / name)
    return found


def export_hf(
    directory: str | os.PathLike,
    model: nn.Module,
    *,
    config: Any,
    tokenizer_path: str | os.PathLike | None = None,
    generation_config_path: str | os.PathLike | None = None,
    dtype: str | torch.dtype | None = None,
    max_shard_size: str = "5GB",
) -> None:
    """Collective: write a Hugging Face model directory that transformers and vLLM can load.

    Every rank takes part in gathering the full state dict; rank 0 writes ``config.json``, the
    weights as safetensors (``model.safetensors``, or shards + index above ``max_shard_size``), a copy
    of ``generation_config.json`` from ``generation_config_path`` and a verbatim copy of the tokenizer
    files of the local directory ``tokenizer_path`` when given. ``dtype`` casts the weights (default: their training dtype).
    """
    from huggingface_hub import save_torch_state_dict

    sd = full_state_dict(model)
    if _rank() == 0:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        target = to_dtype(dtype) if dtype is not None else None
        if getattr(config, "tie_word_embeddings", False):
            # transformers re-ties lm_head to the input embedding on load
            sd = {k: v for k, v in sd.items() if k != "lm_head.weight"}
        sd = {k: (v.to(target) if target is not None and v.is_floating_point() else v).contiguous() for k, v in sd.items()}
        floating = [v.dtype for v in sd.values() if v.is_floating_point()]
        config = type(config).from_dict(config.to_dict())  # a copy: the caller's config is left as is
        if floating:
            config.dtype = floating[0]
        config.save_pretrained(directory)
        save_torch_state_dict(sd, directory, max_shard_size=max_shard_size, metadata={"format": "pt"})
        if generation_config_path is not None and (Path(generation_config_path) / "generation_config.json").exists():
            from transformers import GenerationConfig

            GenerationConfig.from_pretrained(generation_config_path).save_pretrained(directory)
        if tokenizer_path is not None:
            copy_tokenizer_files(tokenizer_path, directory)
    if dist.is_initialized():
        dist.barrier()
