"""A custom reward function tried once on a training row before the run starts.

Without this, a function that raises or returns text on every sample is first called after Ray and
the workers have started (tens of seconds, minutes with a large model). :func:`try_custom_reward`
calls it the way a scoring process of the run would (verl's keywords, the row's ``data_source``,
``ground_truth`` and ``extra_info``, the response being the ground truth as text), in a process of its
own under ``reward_model.timeout_s`` (:func:`grpo_dist.rewards.manager.try_reward_fn`).

- With ``reward_model.on_error=raise`` (the default) a raise, a value that is not a score, a timeout
  or a crash stops the start-up: ``ValueError`` with one message naming the function, its file, the
  line that raised and the exception, and what to change.
- With ``reward_model.on_error=zero`` the user has chosen to score failing samples 0 and go on, so
  the same finding is a warning and the run starts (the summary counts the failed scores).
"""

from __future__ import annotations

from typing import Any

from grpo_dist.rewards.custom import CustomRewardFn
from grpo_dist.rewards.manager import trial_solution, try_reward_fn

__all__ = ["try_custom_reward"]


def try_custom_reward(path: str, name: str, item: dict[str, Any], *, timeout_s: float | None,
                      on_error: str) -> str | None:
    """Try ``name`` from ``path`` on the dataset item ``item`` (``reward_source``, ``ground_truth``,
    ``extra_info``). Returns None when it gave a valid score, the warning to print with
    ``on_error="zero"``; raises ``ValueError`` with ``on_error="raise"``."""
    target = CustomRewardFn(path, name)
    source = item["reward_source"]  # what the run's samples hand the function (data.reward_fn_key's column)
    problem = try_reward_fn(target, source, item["ground_truth"], item["extra_info"], timeout_s=timeout_s)
    if problem is None:
        return None
    response = trial_solution(item["ground_truth"])
    shown = response if len(response) <= 40 else response[:40] + "..."
    head = (f"reward function {target.describe()} failed when tried once before the run, on the first training "
            f"row (data_source={source!r}, response {shown!r}, which is its ground truth): {problem}")
    slow = problem.startswith("timed out")
    if on_error == "zero":
        return (f"{head}; with reward_model.on_error=zero the run goes on and scores such samples 0 "
                "(reward/num_errors, reward/num_timeouts count them)")
    fix = ("make it faster, or raise reward_model.timeout_s" if slow
           else "fix it (custom_reward_function.path / .name)")
    raise ValueError(f"{head}\n  the samples of the run would meet the same: {fix}; or set reward_model.on_error=zero "
                     "to score the samples it fails on 0 and count them")
