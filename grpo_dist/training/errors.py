"""Errors the training modules raise that the driver tells apart (kept light: the driver imports this
module, and Ray imports it there to rebuild such an error raised in a worker, without loading FSDP)."""

from __future__ import annotations

__all__ = ["UnsafeCheckpointError"]


class UnsafeCheckpointError(ValueError):
    """A checkpoint file holds something other than tensors, plain values and DCP's own metadata
    classes: it is refused instead of unpickled (unpickling can run arbitrary code)."""
