"""Ray actor shell around the frozen FSDP2 reference policy, one per rank.

``compute_ref_log_prob`` returns a :class:`~grpo_dist.workers.common.Timed` result (value and busy
seconds) for the driver's ``timing_s/ref/worker`` metric.
"""

from __future__ import annotations

import ray
import torch

from grpo_dist.distributed.process_group import free_port
from grpo_dist.workers.common import current_node_id, node_ip, setup_process, timed


@ray.remote
class ReferenceWorker:
    def __init__(self, *, rank: int, world_size: int, device: str, num_threads: int) -> None:
        setup_process(device, num_threads)
        self.rank, self.world_size, self.device = rank, world_size, device
        self.ref = None

    def address(self) -> tuple[str, int]:
        return node_ip(), free_port()

    def init_model(self, *, master_addr: str, master_port: int, backend: str, model_path: str,
                   timeout_s: float = 600.0, **kwargs) -> None:
        from grpo_dist.distributed.process_group import init_process_group
        from grpo_dist.training.reference import FSDPReference

        init_process_group(backend=backend, rank=self.rank, world_size=self.world_size,
                           master_addr=master_addr, master_port=master_port, timeout_s=timeout_s)
        dev = "cuda" if self.device == "cuda" else "cpu"
        self.ref = FSDPReference(model_path, rank=self.rank, world_size=self.world_size, device=dev, **kwargs)

    @timed
    def compute_ref_log_prob(self, data: dict[str, torch.Tensor], micro_batch_size: int | None,
                             max_token_len: int | None, temperature: float) -> torch.Tensor:
        return self.ref.compute_ref_log_prob(data, micro_batch_size=micro_batch_size, max_token_len=max_token_len,
                                             temperature=temperature)

    def node_id(self) -> str:
        return current_node_id()
