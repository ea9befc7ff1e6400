"""Worker shell around the frozen FSDP2 reference policy, one per rank, living in the rank's
:class:`~grpo_dist.workers.models.ModelWorker` process with the rank's other FSDP2 models.

``compute_ref_log_prob`` returns a :class:`~grpo_dist.workers.common.Timed` result (value and busy
seconds) for the driver's ``timing_s/ref/worker`` metric. ``wake_up``, ``load_bucket`` and
``finish_load`` take the actor's weights bucket by bucket (the rollout worker's weight-sync surface,
so :class:`grpo_dist.trainer.weight_sync.WeightSync` drives a reference reset as it drives a sync).
"""

from __future__ import annotations

import torch

from grpo_dist.distributed.process_group import free_port
from grpo_dist.utils import startup
from grpo_dist.workers.common import current_node_id, node_ip, setup_process, timed


class ReferenceWorker:
    def __init__(self, *, rank: int, world_size: int, device: str, num_threads: int) -> None:
        setup_process(device, num_threads)
        self.rank, self.world_size, self.device = rank, world_size, device
        self.ref = None
        self._pending: dict[str, torch.Tensor] = {}  # a reset in progress: the weights received so far

    def address(self) -> tuple[str, int]:
        return node_ip(), free_port()

    def init_model(self, *, master_addr: str, master_port: int, backend: str, model_path: str,
                   timeout_s: float = 600.0, **kwargs) -> None:
        from grpo_dist.distributed.process_group import init_process_group
        from grpo_dist.training.reference import FSDPReference

        init_process_group(backend=backend, rank=self.rank, world_size=self.world_size,
                           master_addr=master_addr, master_port=master_port, timeout_s=timeout_s)
        dev = "cuda" if self.device == "cuda" else "cpu"
        startup.mark("reference: modules and process group")
        self.ref = FSDPReference(model_path, rank=self.rank, world_size=self.world_size, device=dev, **kwargs)
        startup.mark("reference: model built")

    @timed
    def compute_ref_log_prob(self, data: dict[str, torch.Tensor], micro_batch_size: int | None,
                             max_token_len: int | None, temperature: float) -> torch.Tensor:
        return self.ref.compute_ref_log_prob(data, micro_batch_size=micro_batch_size, max_token_len=max_token_len,
                                             temperature=temperature)

    def node_id(self) -> str:
        return current_node_id()

    def gpu_uuid(self) -> str | None:
        from grpo_dist.rollout.weight_sync import gpu_uuid

        return gpu_uuid()

    @timed
    def wake_up(self) -> None:
        self._pending = {}

    @timed
    def load_bucket(self, bucket, payload) -> None:
        """One bucket of the policy's weights (object-store bytes or a CUDA IPC handle), copied."""
        import numpy as np

        from grpo_dist.rollout.weight_sync import bucket_buffer, open_cuda, unpack

        flat = bucket_buffer(bucket, payload) if isinstance(payload, np.ndarray) else open_cuda(payload)
        for name, view in unpack(bucket, flat):
            self._pending[name] = view.to("cpu", copy=True)
        if flat.is_cuda:
            torch.cuda.synchronize()

    @timed
    def finish_load(self) -> None:
        """Collective: the reference becomes the weights received since :meth:`wake_up`."""
        pending, self._pending = self._pending, {}
        self.ref.load_full_weights(pending)

    def save_checkpoint(self, directory: str) -> None:
        self.ref.save_checkpoint(directory)

    def load_checkpoint(self, directory: str) -> None:
        self.ref.load_checkpoint(directory)
