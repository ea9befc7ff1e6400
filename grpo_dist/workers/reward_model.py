"""Worker shell around the FSDP2 reward model (``grpo_dist.training.reward_model.FSDPRewardModel``),
one per rank, living in the rank's :class:`~grpo_dist.workers.models.ModelWorker` process with the
rank's other FSDP2 models.

``compute_rm_score`` and ``update_reward_model`` return :class:`~grpo_dist.workers.common.Timed`
results (value and busy seconds) for the driver's ``timing_s/reward_model/worker`` metrics.
"""

from __future__ import annotations

from typing import Any

import torch

from grpo_dist.distributed.process_group import free_port
from grpo_dist.workers.common import current_node_id, node_ip, process_memory_gb, setup_process, timed


class RewardModelWorker:
    def __init__(self, *, rank: int, world_size: int, device: str, num_threads: int) -> None:
        setup_process(device, num_threads)
        self.rank, self.world_size, self.device = rank, world_size, device
        self.rm = None

    def address(self) -> tuple[str, int]:
        return node_ip(), free_port()

    def node_id(self) -> str:
        return current_node_id()

    def init_model(self, *, master_addr: str, master_port: int, backend: str, model_path: str, settings: Any) -> None:
        from grpo_dist.distributed.process_group import init_process_group
        from grpo_dist.training.reward_model import FSDPRewardModel

        init_process_group(backend=backend, rank=self.rank, world_size=self.world_size,
                           master_addr=master_addr, master_port=master_port)
        dev = "cuda" if self.device == "cuda" else "cpu"
        try:
            self.rm = FSDPRewardModel(model_path, settings, rank=self.rank, world_size=self.world_size, device=dev)
        except Exception as exc:  # one line naming the reward model, whatever the loader raised
            first = (str(exc).strip().splitlines() or [""])[0]
            raise RuntimeError(f"could not load the reward model {model_path}: {type(exc).__name__}: {first}") from None

    @timed
    def compute_rm_score(self, data: dict[str, torch.Tensor], raw_prompts: list | None = None) -> dict:
        return self.rm.compute_scores(data, raw_prompts)

    @timed
    def update_reward_model(self, data: dict[str, torch.Tensor]) -> dict[str, float]:
        metrics = self.rm.update(data)
        metrics["perf/max_memory_gb/reward_model"] = process_memory_gb()
        return metrics

    def save_checkpoint(self, directory: str) -> None:
        self.rm.save_checkpoint(directory)

    def load_checkpoint(self, directory: str) -> None:
        self.rm.load_checkpoint(directory)

    def export_hf(self, directory: str, tokenizer_path: str | None) -> None:
        self.rm.export_hf(directory, tokenizer_path)
