"""Worker shell around the FSDP2 critic (``grpo_dist.training.critic.FSDPCritic``), one per rank,
living in the rank's :class:`~grpo_dist.workers.models.ModelWorker` process with the rank's other FSDP2
models.

``compute_values`` and ``update_critic`` return :class:`~grpo_dist.workers.common.Timed` results
(value and busy seconds) for the driver's ``timing_s/values/worker`` and
``timing_s/update_critic/worker`` metrics.
"""

from __future__ import annotations

from typing import Any

import torch

from grpo_dist.distributed.process_group import free_port
from grpo_dist.workers.common import current_node_id, node_ip, process_memory_gb, setup_process, timed


class CriticWorker:
    def __init__(self, *, rank: int, world_size: int, device: str, num_threads: int) -> None:
        setup_process(device, num_threads)
        self.rank, self.world_size, self.device = rank, world_size, device
        self.critic = None

    def address(self) -> tuple[str, int]:
        return node_ip(), free_port()

    def node_id(self) -> str:
        return current_node_id()

    def init_model(self, *, master_addr: str, master_port: int, backend: str, model_path: str, settings: Any,
                   timeout_s: float = 600.0) -> str | None:
        from grpo_dist.distributed.process_group import init_process_group
        from grpo_dist.training.critic import FSDPCritic

        init_process_group(backend=backend, rank=self.rank, world_size=self.world_size,
                           master_addr=master_addr, master_port=master_port, timeout_s=timeout_s)
        dev = "cuda" if self.device == "cuda" else "cpu"
        self.critic = FSDPCritic(model_path, settings, rank=self.rank, world_size=self.world_size, device=dev)
        return self.critic.memory_note  # what the auto memory choices chose (printed by the driver)

    @timed
    def compute_values(self, data: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.critic.compute_values(data)

    @timed
    def update_critic(self, data: dict[str, torch.Tensor]) -> dict[str, float]:
        metrics = self.critic.update_critic(data)
        metrics["perf/max_memory_gb/critic"] = process_memory_gb()
        return metrics

    def save_checkpoint(self, directory: str) -> None:
        self.critic.save_checkpoint(directory)

    def load_checkpoint(self, directory: str) -> None:
        self.critic.load_checkpoint(directory)
