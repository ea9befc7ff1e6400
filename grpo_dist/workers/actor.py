"""Worker shell around the FSDP2 policy (``grpo_dist.training.actor.FSDPActor``), one per rank
(:class:`~grpo_dist.workers.shell.ModelShell`).

The methods that do a step phase's work return :class:`~grpo_dist.workers.common.Timed` results
(value and busy seconds) for the driver's ``timing_s/<phase>/worker`` metrics.
"""

from __future__ import annotations

import time
from typing import Any

import ray
import torch

from grpo_dist.workers.common import timed
from grpo_dist.workers.shell import ModelShell


class ActorWorker(ModelShell):
    role = "actor"
    model_class = "grpo_dist.training.actor:FSDPActor"

    def __init__(self, *, rank: int, world_size: int, device: str, num_threads: int,
                 external_libs: tuple[str, ...] = ()) -> None:
        super().__init__(rank=rank, world_size=world_size, device=device, num_threads=num_threads,
                         external_libs=external_libs)
        self._sync_buckets: list | None = None  # the weight sync in progress (sync_begin .. sync_end)
        self._sync_buffer: torch.Tensor | None = None
        self._sync_group: Any = None  # rank 0's process group with the rollout ranks (the "broadcast" transport)

    @timed
    def compute_log_prob(self, data: dict[str, torch.Tensor], micro_batch_size: int | None,
                         max_token_len: int | None, compute_entropy: bool = False):
        logp, ent = self.model.compute_log_prob(data, micro_batch_size=micro_batch_size, max_token_len=max_token_len,
                                                compute_entropy=compute_entropy)
        return logp, ent

    @timed
    def update_policy(self, data: dict[str, torch.Tensor]) -> dict[str, float]:
        return self.with_memory(self.model.update_policy(data))

    @timed
    def sync_begin(self, dtype: str | None, bucket_bytes: int) -> list:
        """Plan the weight sync's buckets (the same on every rank)."""
        self._sync_buckets = self.model.weight_buckets(dtype, bucket_bytes)
        self._sync_buffer = None
        return self._sync_buckets

    @timed
    def sync_bucket(self, index: int, transport: str) -> tuple[Any, float]:
        """Collective: gather bucket ``index`` into a flat buffer and return ``(payload, put seconds)``.

        ``cuda_ipc``: every rank returns a CUDA IPC handle of its buffer, kept alive until the next
        bucket or :meth:`sync_end`. ``object_store``: rank 0 puts a CPU copy (its bytes, as a numpy
        array) in Ray's object store and
        returns ``[ObjectRef]`` (in a list, so the driver passes the reference on without fetching
        the data); the other ranks return None. ``broadcast``: rank 0 broadcasts the buffer over the sync
        group (:meth:`open_sync_group`) while the rollout ranks receive it, and returns None.
        """
        from grpo_dist.rollout.weight_sync import send, share_cuda

        self._sync_buffer = None  # the previous bucket is loaded by now
        flat = self.model.pack_weight_bucket(self._sync_buckets[index])
        if transport == "cuda_ipc":
            self._sync_buffer = flat
            return share_cuda(flat), 0.0
        if self.rank != 0:
            return None, 0.0
        t0 = time.perf_counter()
        if transport == "broadcast":
            if self._sync_group is None:
                raise RuntimeError("the broadcast weight sync needs open_sync_group first")
            send(flat, self._sync_group)
            return None, time.perf_counter() - t0
        # as raw bytes in a numpy array: readers map it from the object store without a copy (a
        # pickled torch tensor would be copied again on every reader)
        ref = ray.put(flat.cpu().view(torch.uint8).numpy())
        return [ref], time.perf_counter() - t0

    def open_sync_group(self, master_addr: str, master_port: int, size: int, backend: str, timeout_s: float) -> None:
        """Collective with the rollout ranks: rank 0 joins the ``"broadcast"`` weight sync's process group as its
        rank 0, hosting it at ``master_addr:master_port`` (this rank's :meth:`address`); the other ranks have no
        part in it."""
        from grpo_dist.distributed.process_group import open_side_group

        if self.rank == 0:
            self._sync_group = open_side_group(backend=backend, rank=0, size=size, master_addr=master_addr,
                                               master_port=master_port, timeout_s=timeout_s)

    def adapter_config(self) -> dict | None:
        """The adapter's peft configuration when the weight sync sends LoRA adapters only, else None."""
        return self.model.adapter_config()

    def sync_end(self) -> None:
        self._sync_buffer = self._sync_buckets = None
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.ipc_collect()  # free buffers the rollout side has closed

    def export_hf(self, directory: str, tokenizer_path: str | None, merged: bool | None = None) -> None:
        """The Hugging Face export; with LoRA the peft adapter folder ``lora_adapter/`` and, with ``merged``
        (default: the settings' ``lora.export_merged``), the merged model
        (:meth:`grpo_dist.training.actor.FSDPActor.export_hf`)."""
        merged = self.model.settings.lora.export_merged if merged is None else merged
        self.model.export_hf(directory, tokenizer_path, merged=merged)
