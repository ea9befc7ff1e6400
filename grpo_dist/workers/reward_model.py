"""Worker shell around the FSDP2 reward model (``grpo_dist.training.reward_model.FSDPRewardModel``),
one per rank (:class:`~grpo_dist.workers.shell.ModelShell`).

``compute_rm_score`` and ``update_reward_model`` return :class:`~grpo_dist.workers.common.Timed`
results (value and busy seconds) for the driver's ``timing_s/reward_model/worker`` metrics.
"""

from __future__ import annotations

from typing import Any

import torch

from grpo_dist.workers.common import timed
from grpo_dist.workers.shell import ModelShell


class RewardModelWorker(ModelShell):
    role = "reward_model"
    model_class = "grpo_dist.training.reward_model:FSDPRewardModel"

    def build(self, cls: type, model_path: str, **kwargs: Any) -> Any:
        try:
            return super().build(cls, model_path, **kwargs)
        except Exception as exc:  # one line naming the reward model, whatever the loader raised
            first = (str(exc).strip().splitlines() or [""])[0]
            raise RuntimeError(f"could not load the reward model {model_path}: {type(exc).__name__}: {first}") from None

    @timed
    def compute_rm_score(self, data: dict[str, torch.Tensor], raw_prompts: list | None = None) -> dict:
        return self.model.compute_scores(data, raw_prompts)

    @timed
    def update_reward_model(self, data: dict[str, torch.Tensor]) -> dict[str, float]:
        return self.with_memory(self.model.update(data))

    def export_hf(self, directory: str, tokenizer_path: str | None) -> None:
        self.model.export_hf(directory, tokenizer_path)
