"""Names of the floating-point dtypes the training settings accept, and their torch dtypes.

The names need no torch (the configuration checks them before anything heavy is imported); torch is
imported when a name is turned into a torch dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["DTYPE_NAMES", "to_dtype", "dtype_name"]

DTYPE_NAMES: dict[str, str] = {
    "float32": "float32",
    "bfloat16": "bfloat16",
    "float16": "float16",
    "fp32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
}
"""Accepted dtype names (with verl's short aliases) -> the long name (torch's attribute)."""


def dtype_name(name: str) -> str:
    """The long name of a dtype name: ``fp32`` -> ``float32``, ``bf16`` -> ``bfloat16``, ``fp16`` ->
    ``float16`` (long names unchanged); ``ValueError`` for unknown names."""
    if name not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {name!r}; valid: float32 | bfloat16 | float16")
    return DTYPE_NAMES[name]


def to_dtype(name: str | torch.dtype) -> torch.dtype:
    """``"float32" | "bfloat16" | "float16"`` (or fp32/bf16/fp16, or a torch.dtype) -> torch.dtype."""
    import torch

    if isinstance(name, torch.dtype):
        return name
    return getattr(torch, dtype_name(name))
