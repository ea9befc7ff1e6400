"""Ray actor shell around the batch rewarder: decodes responses, scores them (rule-based registry or
a user function, in scoring processes) and places the rewards on tokens."""

from __future__ import annotations

import os
import signal
from typing import Any, Callable

import ray

from grpo_dist.utils import startup
from grpo_dist.workers.common import current_node_id


def exit_at_once_on_sigterm(before: Callable[[], None]) -> bool:
    """Make SIGTERM end this process at once, after ``before()`` (which must not wait). Ray ends a
    worker with SIGTERM, and may send it again while the process exits; Ray's own handler raises
    ``SystemExit`` wherever the process is, and inside a clean-up function (the scoring pool's
    finalizer, stopping its processes) Python prints that as ``Exception ignored ... Traceback``, which
    Ray forwards into the run's output. False where a handler cannot be set (not the main thread)."""

    def handler(signum, frame) -> None:
        try:
            before()
        finally:
            os._exit(128 + signum)

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:
        return False
    return True


@ray.remote
class RewardWorker:
    def __init__(self, *, tokenizer_path: str, trust_remote_code: bool, custom_path: str | None, custom_name: str,
                 num_workers: int, timeout_s: float, on_error: str) -> None:
        """Imports the scoring code and starts the scoring processes; the tokenizer comes with
        :meth:`load_tokenizer`, once the driver has loaded its own (the constructor runs while the
        driver still reads the data)."""
        startup.mark("constructor")
        from grpo_dist.rewards.custom import CustomRewardFn
        from grpo_dist.rewards.manager import RewardScorer
        import grpo_dist.tasks  # noqa: F401  registers the embedded tasks' scorers

        startup.mark("modules imported")
        self.tokenizer_path, self.trust_remote_code = tokenizer_path, trust_remote_code
        target = CustomRewardFn(custom_path, custom_name) if custom_path else None
        self.scorer = RewardScorer(target, num_workers=num_workers, timeout_s=timeout_s, on_error=on_error)
        self.rewarder = None
        exit_at_once_on_sigterm(self.scorer.kill_now)  # the scoring processes go with it, and no traceback

    def load_tokenizer(self, decoder: dict[str, Any] | None) -> None:
        """``decoder``: :func:`grpo_dist.rewards.decoding.decoder_spec` of the run's tokenizer, to decode
        without importing transformers; None loads the tokenizer at ``tokenizer_path`` with transformers."""
        from grpo_dist.rewards.rewarder import BatchRewarder

        if decoder is not None:
            from grpo_dist.rewards.decoding import FastDecoder

            tokenizer = FastDecoder(decoder)
        else:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path, trust_remote_code=self.trust_remote_code)
        self.rewarder = BatchRewarder(tokenizer, self.scorer)
        startup.mark("tokenizer and scorer")

    def compute(self, responses: Any, response_mask: Any, data_sources: list[str], ground_truths: list[Any],
                extra_infos: list[Any], token_level: bool, step_rewards: bool, optional_steps: bool = False):
        """A :class:`~grpo_dist.rewards.rewarder.RewardResult` for the batch (see ``BatchRewarder.compute``)."""
        return self.rewarder.compute(responses, response_mask, data_sources, ground_truths, extra_infos,
                                     token_level=token_level, step_rewards=step_rewards, optional_steps=optional_steps)

    def close(self) -> None:
        self.scorer.close()

    def node_id(self) -> str:
        return current_node_id()

    def startup_moments(self) -> dict[str, Any]:
        """This process's start-up moments (:func:`grpo_dist.utils.startup.moments`)."""
        return startup.moments()
