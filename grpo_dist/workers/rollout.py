"""Ray actor shell around a rollout engine (vLLM, or Hugging Face generate), one per rank.

``generate`` and the weight-sync pieces (``wake_up``, ``update_weights``) return
:class:`~grpo_dist.workers.common.Timed` results (value and busy seconds) for the driver's
``timing_s/gen/worker`` and ``timing_s/update_weights/...`` metrics.
"""

from __future__ import annotations

from typing import Any

import ray

from grpo_dist.workers.common import process_memory_gb, setup_process, timed


@ray.remote
class RolloutWorker:
    def __init__(self, *, rank: int, device: str, num_threads: int, engine: str, engine_kwargs: dict[str, Any]) -> None:
        setup_process(device, num_threads)
        from grpo_dist.rollout.base import make_engine

        self.rank = rank
        self.engine = make_engine(engine, **engine_kwargs)

    @timed
    def generate(self, prompt_ids: list[list[int]], sampling: Any):
        if not prompt_ids:
            from grpo_dist.rollout.base import RolloutOutput

            return RolloutOutput(response_ids=[], logprobs=[], finished_by_eos=[])
        return self.engine.generate(prompt_ids, sampling)

    @timed
    def update_weights(self, state_dict: dict) -> None:
        self.engine.update_weights(state_dict.items())

    def sleep(self) -> None:
        self.engine.sleep()

    @timed
    def wake_up(self) -> None:
        self.engine.wake_up()

    def memory_gb(self) -> float:
        return process_memory_gb()

    def close(self) -> None:
        self.engine.close()
