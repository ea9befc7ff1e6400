"""Worker shell around the FSDP2 critic (``grpo_dist.training.critic.FSDPCritic``), one per rank
(:class:`~grpo_dist.workers.shell.ModelShell`).

``compute_values`` and ``update_critic`` return :class:`~grpo_dist.workers.common.Timed` results
(value and busy seconds) for the driver's ``timing_s/values/worker`` and
``timing_s/update_critic/worker`` metrics.
"""

from __future__ import annotations

import torch

from grpo_dist.workers.common import timed
from grpo_dist.workers.shell import ModelShell


class CriticWorker(ModelShell):
    role = "critic"
    model_class = "grpo_dist.training.critic:FSDPCritic"

    @timed
    def compute_values(self, data: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.model.compute_values(data)

    @timed
    def update_critic(self, data: dict[str, torch.Tensor]) -> dict[str, float]:
        return self.with_memory(self.model.update_critic(data))
