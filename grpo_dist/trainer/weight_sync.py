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
   - ``broadcast`` (verl's ``checkpoint_engine.backend=nccl``): actor rank 0 broadcasts its buffer over a
     process group spanning it and every rollout rank (NCCL on GPUs, gloo on the CPU), opened once by
     :meth:`WeightSync.prepare`; the rollout ranks' loads are running as it does;
3. engines that load all weights at once do so (``finish_load``); the actor ranks drop their buffers.

With LoRA and ``lora.merge=false`` the buckets hold the adapter factors alone and ``finish_load`` loads them as
the engine's LoRA adapter (set up once by :meth:`WeightSync.prepare`).

The object talks to the groups only through ``call(method, *args, per_rank=...)`` and ``len()``, so it
is tested with stand-in groups (tests/unit/test_weight_sync_protocol.py).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Protocol, Sequence

from grpo_dist.distributed.worker_group import collect_together
from grpo_dist.rollout import WEIGHT_SYNC_BACKENDS
from grpo_dist.workers.common import unwrap_timed

TRANSPORTS = ("cuda_ipc", "object_store", "broadcast")



class Group(Protocol):
    def call(self, method: str, *args: Any, per_rank: Sequence[tuple] | None = None) -> list: ...

    def call_later(self, method: str, *args: Any, per_rank: Sequence[tuple] | None = None) -> Callable[[], list]: ...

    def __len__(self) -> int: ...


def choose_transport(actor: Group, rollout: Group, device: str, backend: str = "naive") -> str:
    """``cuda_ipc`` when every actor rank shares its GPU with the rollout rank of the same index
    (checked by device UUID) in another process; otherwise ``broadcast`` when ``backend`` (verl's
    ``checkpoint_engine.backend``) is ``nccl``, else ``object_store``. Two roles of one process
    (the reference reset: actor and reference live in the rank's model worker) use the object store,
    since CUDA cannot open an IPC handle in the process that made it, nor can a process broadcast to itself."""
    if backend not in WEIGHT_SYNC_BACKENDS:
        raise ValueError(f"weight sync backend {backend!r} unknown; valid: {', '.join(WEIGHT_SYNC_BACKENDS)}")
    same_process = getattr(actor, "shares_processes_with", None)
    if same_process is not None and same_process(rollout):
        return "object_store"
    if device == "cuda":
        actor_gpus, rollout_gpus = actor.call("gpu_uuid"), rollout.call("gpu_uuid")
        if len(actor_gpus) == len(rollout_gpus) and all(a is not None and a == b for a, b in zip(actor_gpus, rollout_gpus)):
            return "cuda_ipc"  # NCCL cannot join two ranks on one GPU; the IPC handle copies nothing
    return "broadcast" if backend == "nccl" else "object_store"


class WeightSync:
    """Sends the actor's current weights to every rollout engine.

    Args:
        actor, rollout: the two worker groups.
        transport: one of :data:`TRANSPORTS` (see :func:`choose_transport`).
        dtype: the engine's weight dtype name (floating tensors are cast on the actor side).
        bucket_bytes: the most bytes gathered and sent at once.
        device: ``"cuda"`` or ``"cpu"``: the ``broadcast`` group's backend is nccl on GPUs, gloo on the CPU.
        timeout_s: how long the ``broadcast`` group's collectives may wait (the actor's collective timeout).
    """

    def __init__(self, actor: Group, rollout: Group, *, transport: str, dtype: str, bucket_bytes: int,
                 device: str = "cpu", timeout_s: float = 600.0) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"weight sync transport {transport!r} unknown; valid: {', '.join(TRANSPORTS)}")
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
        self.actor, self.rollout = actor, rollout
        self.transport, self.dtype, self.bucket_bytes = transport, dtype, bucket_bytes
        self.group_backend = "nccl" if device == "cuda" else "gloo"
        self.timeout_s = timeout_s
        self._group_open = False
        self.adapter_only = False
        self.last_bytes = 0
        """Bytes the last sync sent each engine (the buckets' sizes: the weights, or the adapters alone)."""

    @property
    def label(self) -> str:
        """The transport as the start-up lines name it (``broadcast`` with its group's backend)."""
        return f"broadcast over {self.group_backend}" if self.transport == "broadcast" else self.transport

    def prepare(self) -> bool:
        """Once, before the first sync: open the ``broadcast`` transport's process group (the actor's rank 0 and
        every rollout rank, in that order); when the actor sends LoRA adapters only (``lora.merge=false``), tell
        every rollout rank their configuration, so that each sync loads them as the engine's adapter. Returns
        whether the sync is adapter-only (the engines then serve the adapter only after a first sync)."""
        if self.transport == "broadcast" and not self._group_open:
            addr, port = self.actor.call("address")[0]
            size, how = 1 + len(self.rollout), (self.group_backend, self.timeout_s)
            collect_together(self.actor.call_later("open_sync_group", addr, port, size, *how),
                      self.rollout.call_later("open_sync_group",
                                              per_rank=[(addr, port, 1 + i, size, *how) for i in range(len(self.rollout))]))
            self._group_open = True
        config = self.actor.call("adapter_config")[0]
        if config is not None:
            self.rollout.call("set_adapter_config", config)
        self.adapter_only = config is not None
        return self.adapter_only

    def _send_bucket(self, index: int, bucket: Any) -> tuple[float, float, float]:
        """Bucket ``index`` from the actor ranks to every rollout rank; its (gather, put, load) seconds: the actor
        ranks' busy time less the transfer, rank 0's ``ray.put`` or broadcast, and the rollout ranks' busy time
        (less their wait for the bytes under ``broadcast``)."""
        if self.transport == "broadcast":  # rank 0 sends while the rollout ranks receive
            gathered, loads = collect_together(
                self.actor.call_later("sync_bucket", index, self.transport),
                self.rollout.call_later("load_bucket", per_rank=[(bucket, "broadcast")] * len(self.rollout)))
            outs, actor_busy_s = unwrap_timed(gathered)
            load_s = max(r.busy_s - r.value for r in loads)
        else:
            outs, actor_busy_s = unwrap_timed(self.actor.call("sync_bucket", index, self.transport))
            if self.transport == "cuda_ipc":
                per_rank = [(bucket, handle) for handle, _ in outs]
            else:
                per_rank = [(bucket, outs[0][0][0])] * len(self.rollout)
            _, load_s = unwrap_timed(self.rollout.call("load_bucket", per_rank=per_rank))
        put_s = max(p for _, p in outs)
        return actor_busy_s - put_s, put_s, load_s

    def __call__(self) -> dict[str, float]:
        """Run one sync. Returns where the time went, in seconds, keyed by name under ``timing_s/``:

        - ``update_weights/gather``: actor ranks gathering and packing (slowest rank, summed over buckets);
        - ``update_weights/transfer``: moving the buffers (``ray.put``, the IPC handles or the broadcast) and
          the Ray calls' time outside the workers' bodies;
        - ``update_weights/load``: the engines loading (slowest rank);
        - ``update_weights/worker``: busy time inside the workers (gather, put, wake-up and load).
        """
        t0 = time.perf_counter()
        plans, gather_s = unwrap_timed(self.actor.call("sync_begin", self.dtype, self.bucket_bytes))
        self.last_bytes = sum(b.nbytes for b in plans[0])
        _, wake_s = unwrap_timed(self.rollout.call("wake_up"))
        put_s = load_s = 0.0
        for i, bucket in enumerate(plans[0]):
            bucket_gather_s, bucket_put_s, bucket_load_s = self._send_bucket(i, bucket)
            gather_s, put_s, load_s = gather_s + bucket_gather_s, put_s + bucket_put_s, load_s + bucket_load_s
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
