"""Ray actor shell around the reward scorer (rule-based registry or a user function)."""

from __future__ import annotations

from typing import Any

import ray


@ray.remote
class RewardWorker:
    def __init__(self, *, custom_path: str | None, custom_name: str, num_workers: int, timeout_s: float,
                 on_error: str) -> None:
        from grpo_dist.rewards.custom import CustomRewardFn
        from grpo_dist.rewards.manager import RewardScorer
        import grpo_dist.tasks  # noqa: F401  registers the embedded tasks' scorers

        target = CustomRewardFn(custom_path, custom_name) if custom_path else None
        self.scorer = RewardScorer(target, num_workers=num_workers, timeout_s=timeout_s, on_error=on_error)

    def score(self, data_sources: list[str], solution_strs: list[str], ground_truths: list[Any],
              extra_infos: list[Any]) -> tuple[list[float], dict, dict]:
        return self.scorer.score_batch(data_sources, solution_strs, ground_truths, extra_infos)

    def close(self) -> None:
        self.scorer.close()
