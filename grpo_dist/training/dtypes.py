"""Names of the floating-point dtypes the training settings accept, and their torch dtypes.

Light on purpose (torch only): the settings dataclasses check dtype names with it in the driver
process, which never imports the FSDP modules.
"""

from __future__ import annotations

import torch

__all__ = ["DTYPES", "to_dtype", "dtype_name"]

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
"""Accepted dtype names (with their short aliases) -> torch dtype."""


def to_dtype(name: str | torch.dtype) -> torch.dtype:
    """``"float32" | "bfloat16" | "float16"`` (or fp32/bf16/fp16, or a torch.dtype) -> torch.dtype."""
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; valid: float32 | bfloat16 | float16")
    return DTYPES[name]


def dtype_name(name: str) -> str:
    """The long name of a dtype name: ``fp32`` -> ``float32``, ``bf16`` -> ``bfloat16``, ``fp16`` ->
    ``float16`` (long names unchanged); ``ValueError`` for unknown names."""
    return str(to_dtype(name)).removeprefix("torch.")
