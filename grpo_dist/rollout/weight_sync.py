"""Weight sync from the trainer to the rollout engines in flat buckets.

The actor's weights reach the engine bucket by bucket: the tensors of one bucket (same dtype, at
most ``bucket_bytes`` together unless a single tensor is larger) are gathered and copied into one
flat 1-D buffer, the buffer crosses the process boundary, and the engine side takes views of it by
name. One buffer per bucket instead of one object per tensor keeps the per-tensor cost (pickling,
CUDA IPC handle opening, Ray object bookkeeping) out of the sync, and the bucket size bounds the
extra device memory the gathered copy takes.

Three transports carry a buffer:

- ``"object_store"``: the buffer (a CPU tensor) goes through Ray's object store. Works everywhere,
  across nodes too; costs a device-to-host copy, the store write and the reader's copy.
- ``"cuda_ipc"``: the buffer stays on the GPU and only a CUDA IPC handle crosses (a few hundred
  bytes); the rollout worker maps the same memory and copies from it on the device. Needs the actor
  rank and the rollout rank on the same physical GPU (colocated), which the driver checks by GPU
  UUID before it picks this transport.
- ``"broadcast"`` (verl's ``checkpoint_engine.backend=nccl``): the actor's rank 0 broadcasts the buffer over a
  process group spanning it and every rollout rank
  (:func:`grpo_dist.distributed.process_group.open_side_group`: NCCL on GPUs, device to device;
  gloo on the CPU), each receiver into a buffer of its own. For a rollout on devices of its own, across nodes.

Shapes: a bucket's ``numel`` is the sum of its entries' numels; entry ``i`` is
``flat[offset_i : offset_i + numel_i].view(shape_i)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
                torch.float64: "float64", torch.int64: "int64", torch.int32: "int32", torch.bool: "bool",
                torch.uint8: "uint8", torch.int8: "int8"}
_DTYPES = {v: k for k, v in _DTYPE_NAMES.items()}


@dataclass(frozen=True)
class BucketEntry:
    name: str
    shape: tuple[int, ...]
    offset: int
    numel: int


@dataclass(frozen=True)
class Bucket:
    """One flat buffer's layout: its dtype (by name) and the tensors it holds, in order."""

    dtype: str
    entries: tuple[BucketEntry, ...]

    @property
    def numel(self) -> int:
        return sum(e.numel for e in self.entries)

    @property
    def nbytes(self) -> int:
        return self.numel * _DTYPES[self.dtype].itemsize


def dtype_name(dtype: torch.dtype) -> str:
    if dtype not in _DTYPE_NAMES:
        raise ValueError(f"weight sync does not handle dtype {dtype}; supported: {sorted(_DTYPE_NAMES.values())}")
    return _DTYPE_NAMES[dtype]


def plan_buckets(tensors: Iterable[tuple[str, tuple[int, ...], torch.dtype]], bucket_bytes: int) -> list[Bucket]:
    """Group ``(name, shape, dtype)`` into buckets, keeping the order.

    A bucket takes consecutive tensors of one dtype while their total stays <= ``bucket_bytes``; a
    tensor larger than that gets a bucket of its own. Every name appears in exactly one bucket.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    buckets: list[Bucket] = []
    entries: list[BucketEntry] = []
    current: str | None = None
    offset = 0  # elements in the open bucket
    for name, shape, dtype in tensors:
        dname = dtype_name(dtype)
        numel = math.prod(shape)
        if entries and (dname != current or (offset + numel) * dtype.itemsize > bucket_bytes):
            buckets.append(Bucket(current, tuple(entries)))  # type: ignore[arg-type]
            entries, offset = [], 0
        entries.append(BucketEntry(name, tuple(int(d) for d in shape), offset, numel))
        current, offset = dname, offset + numel
    if entries:
        buckets.append(Bucket(current, tuple(entries)))  # type: ignore[arg-type]
    return buckets


def pack(bucket: Bucket, tensors: dict[str, torch.Tensor], device: torch.device | str) -> torch.Tensor:
    """A new flat ``[bucket.numel]`` buffer on ``device`` holding ``tensors`` (cast to the bucket's dtype)."""
    flat = torch.empty(bucket.numel, dtype=_DTYPES[bucket.dtype], device=device)
    for e in bucket.entries:
        t = tensors[e.name]
        if tuple(t.shape) != e.shape:
            raise ValueError(f"weight sync: {e.name} has shape {tuple(t.shape)}, the plan says {e.shape}")
        flat[e.offset : e.offset + e.numel].copy_(t.reshape(-1))
    return flat


def unpack(bucket: Bucket, flat: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, view)`` pairs of a flat buffer laid out by ``bucket`` (views: no copies)."""
    if flat.numel() != bucket.numel or flat.dtype != _DTYPES[bucket.dtype]:
        raise ValueError(
            f"weight sync: buffer of {flat.numel()} {flat.dtype} does not match the bucket "
            f"({bucket.numel} {bucket.dtype})"
        )
    for e in bucket.entries:
        yield e.name, flat[e.offset : e.offset + e.numel].view(e.shape)


def bucket_buffer(bucket: Bucket, raw) -> torch.Tensor:
    """The flat buffer of ``bucket`` viewed over ``raw``, a 1-D uint8 numpy array of its bytes (what
    the object-store transport carries). No copy; the array may be read-only (mapped from Ray's
    object store): the result must only be read."""
    import warnings

    if raw.dtype != "uint8" or raw.ndim != 1 or raw.size != bucket.nbytes:
        raise ValueError(f"weight sync: got {raw.size} bytes ({raw.dtype}), the bucket has {bucket.nbytes}")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(raw).view(_DTYPES[bucket.dtype])


#: What the driver sends a rollout rank for a ``"broadcast"`` bucket (the transport's name): the bytes come over
#: the sync group.
BROADCAST = "broadcast"


def broadcast_device(group) -> torch.device:
    """Where a broadcast buffer lives for ``group``: this process's GPU under nccl, the CPU under gloo."""
    if group.name().lower() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def receive(bucket: Bucket, group) -> torch.Tensor:
    """Collective (a rollout rank's side of a ``"broadcast"`` bucket): a new flat buffer of ``bucket`` holding
    what rank 0 of ``group`` broadcast."""
    flat = torch.empty(bucket.numel, dtype=_DTYPES[bucket.dtype], device=broadcast_device(group))
    group.broadcast(flat, 0).wait()
    return flat


def send(flat: torch.Tensor, group) -> None:
    """Collective (the actor's rank 0's side of a ``"broadcast"`` bucket): broadcast ``flat`` to ``group``."""
    flat = flat.to(broadcast_device(group))
    group.broadcast(flat, 0).wait()
    if flat.is_cuda:
        torch.cuda.synchronize()  # the buffer may be freed or reused once this returns


def share_cuda(flat: torch.Tensor) -> tuple:
    """A picklable CUDA IPC handle of a CUDA tensor (the tensor must stay alive until it is read)."""
    from torch.multiprocessing.reductions import reduce_tensor

    if flat.device.type != "cuda":
        raise ValueError(f"cuda_ipc needs a CUDA tensor, got one on {flat.device}")
    return reduce_tensor(flat)


def open_cuda(handle: tuple) -> torch.Tensor:
    """The tensor behind a :func:`share_cuda` handle, mapped into this process (same GPU)."""
    rebuild, args = handle
    return rebuild(*args)


def gpu_uuid() -> str | None:
    """UUID of this process's current CUDA device, or None without CUDA."""
    if not torch.cuda.is_available():
        return None
    return str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
