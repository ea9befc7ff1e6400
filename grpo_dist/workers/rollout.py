"""Ray actor shell around a rollout engine (vLLM, or Hugging Face generate), one per rank."""

from __future__ import annotations

from typing import Any

import ray

from grpo_dist.workers.common import process_memory_gb, setup_process


@ray.remote
class RolloutWorker:
    def __init__(self, *, rank: int, device: str, num_threads: int, engine: str, engine_kwargs: dict[str, Any]) -> None:
        setup_process(device, num_threads)
        from grpo_dist.rollout.base import make_engine

        self.rank = rank
        self.engine = make_engine(engine, **engine_kwargs)

    def generate(self, prompt_ids: list[list[int]], sampling: Any):
        if not prompt_ids:
            from grpo_dist.rollout.base import RolloutOutput

            return RolloutOutput(response_ids=[], logprobs=[], finished_by_eos=[])
        return self.engine.generate(prompt_ids, sampling)

    def update_weights(self, state_dict: dict) -> None:
        self.engine.update_weights(state_dict.items())

    def sleep(self) -> None:
        self.engine.sleep()

    def wake_up(self) -> None:
        self.engine.wake_up()

    def memory_gb(self) -> float:
        return process_memory_gb()

    def close(self) -> None:
        self.engine.close()
