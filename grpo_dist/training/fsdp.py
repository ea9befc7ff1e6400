"""FSDP2 wrapping and full (unsharded) state dicts.

Building a model for a role is :func:`grpo_dist.training.model_builder.build_fsdp_model`; checkpoints
and the Hugging Face export are in :mod:`grpo_dist.training.checkpoint_io`.

Everything here that touches a sharded model is COLLECTIVE: every rank of the mesh must call it, in
the same order, or the job hangs.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

from grpo_dist.training.dtypes import to_dtype

__all__ = [
    "to_dtype",
    "decoder_layers",
    "apply_fsdp2",
    "full_state_dict",
]


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
