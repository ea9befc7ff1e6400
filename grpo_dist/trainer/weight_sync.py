"""Actor -> rollout weight sync: the protocol between the two worker groups, bucket by bucket.

The pieces it drives live with the workers: bucket planning, packing and unpacking in
:mod:`grpo_dist.rollout.weight_sync`, gathering on the actor ranks
(``sync_begin``/``sync_bucket``/``sync_end``), loading on the rollout ranks
(``wake_up``/``load_bucket``/``finish_load``). One sync:

1. every actor rank plans the same buckets (``sync_begin``); the rollout engines wake up;
2. for each bucket, the actor ranks gather its full tensors into one flat buffer (collective), and
   every rollout rank loads it:
   - ``cuda_ipc`` (actor rank r and rollout rank r share a GPU): rank r's buffer by CUDA IPC handle;
   - ``object_store``: actor rank 0 puts its buffer in Ray's object store, every rollout rank maps it;
3. engines that load all weights at once do so (``finish_load``); the actor ranks drop their buffers.

With LoRA and ``lora.merge=false`` the buckets hold the adapter factors alone and ``finish_load`` loads them as
the engine's LoRA adapter (set up once by :meth:`WeightSync.prepare`).

The object talks to the groups only through ``call(method, *args, per_rank=...)`` and ``len()``, so it
is tested with stand-in groups (tests/unit/test_weight_sync_protocol.py).
"""

from __future__ import annotations

import time
from typing import Any, Protocol, Sequence

from grpo_dist.workers.common import unwrap_timed

TRANSPORTS = ("cuda_ipc", "object_store")


class Group(Protocol):
    def call(self, method: str, *args: Any, per_rank: Sequence[tuple] | None = None) -> list: ...

    def __len__(self) -> int: ...


def choose_transport(actor: Group, rollout: Group, device: str) -> str:
    """``cuda_ipc`` when every actor rank shares its GPU with the rollout rank of the same index
    (checked by device UUID) in another process, else ``object_store``. Two roles of one process
    (the reference reset: actor and reference live in the rank's model worker) use the object store,
    since CUDA cannot open an IPC handle in the process that made it."""
    same_process = getattr(actor, "shares_processes_with", None)
    if device != "cuda" or (same_process is not None and same_process(rollout)):
        return "object_store"
    actor_gpus, rollout_gpus = actor.call("gpu_uuid"), rollout.call("gpu_uuid")
    same = len(actor_gpus) == len(rollout_gpus) and all(a is not None and a == b for a, b in zip(actor_gpus, rollout_gpus))
    return "cuda_ipc" if same else "object_store"


class WeightSync:
    """Sends the actor's current weights to every rollout engine.

    Args:
        actor, rollout: the two worker groups.
        transport: one of :data:`TRANSPORTS` (see :func:`choose_transport`).
        dtype: the engine's weight dtype name (floating tensors are cast on the actor side).
        bucket_bytes: the most bytes gathered and sent at once.
    """

    def __init__(self, actor: Group, rollout: Group, *, transport: str, dtype: str, bucket_bytes: int) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"weight sync transport {transport!r} unknown; valid: {', '.join(TRANSPORTS)}")
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
        self.actor, self.rollout = actor, rollout
        self.transport, self.dtype, self.bucket_bytes = transport, dtype, bucket_bytes
        self.adapter_only = False
        self.last_bytes = 0
        """Bytes the last sync sent each engine (the buckets' sizes: the weights, or the adapters alone)."""

    def prepare(self) -> bool:
        """Once, before the first sync: when the actor sends LoRA adapters only (``lora.merge=false``), tell
        every rollout rank their configuration, so that each sync loads them as the engine's adapter. Returns
        whether the sync is adapter-only (the engines then serve the adapter only after a first sync)."""
        config = self.actor.call("adapter_config")[0]
        if config is not None:
            self.rollout.call("set_adapter_config", config)
        self.adapter_only = config is not None
        return self.adapter_only

    def __call__(self) -> dict[str, float]:
        """Run one sync. Returns where the time went, in seconds, keyed by name under ``timing_s/``:

        - ``update_weights/gather``: actor ranks gathering and packing (slowest rank, summed over buckets);
        - ``update_weights/transfer``: moving the buffers (``ray.put`` or the IPC handles) and the Ray
          calls' time outside the workers' bodies;
        - ``update_weights/load``: the engines loading (slowest rank);
        - ``update_weights/worker``: busy time inside the workers (gather, put, wake-up and load).
        """
        t0 = time.perf_counter()
        plans, gather_s = unwrap_timed(self.actor.call("sync_begin", self.dtype, self.bucket_bytes))
        self.last_bytes = sum(b.nbytes for b in plans[0])
        _, wake_s = unwrap_timed(self.rollout.call("wake_up"))
        put_s = load_s = 0.0
        for i, bucket in enumerate(plans[0]):
            outs, busy_s = unwrap_timed(self.actor.call("sync_bucket", i, self.transport))
            bucket_put_s = max(p for _, p in outs)
            gather_s += busy_s - bucket_put_s
            put_s += bucket_put_s
            if self.transport == "cuda_ipc":
                per_rank = [(bucket, handle) for handle, _ in outs]
            else:
                per_rank = [(bucket, outs[0][0][0])] * len(self.rollout)
            _, busy_s = unwrap_timed(self.rollout.call("load_bucket", per_rank=per_rank))
            load_s += busy_s
        _, busy_s = unwrap_timed(self.rollout.call("finish_load"))
        load_s += busy_s
        self.actor.call("sync_end")
        total_s = time.perf_counter() - t0
        return {
            "update_weights/gather": gather_s,
            "update_weights/transfer": max(0.0, total_s - gather_s - wake_s - load_s),
            "update_weights/load": load_s,
            "update_weights/worker": gather_s + put_s + wake_s + load_s,
        }
