"""Reward functions that misbehave, for the reliability tests (loaded by path, as users do)."""

import time


def always_raises(data_source, solution_str, ground_truth, extra_info=None):
    raise ZeroDivisionError("this reward function is broken")


def mixed_faults(data_source, solution_str, ground_truth, extra_info=None):
    """Hangs, raises, returns NaN or None for some prompts; scores the rest."""
    k = extra_info["index"] % 4
    if k == 0:
        time.sleep(60)
    if k == 1:
        raise ValueError("bad sample")
    if k == 2:
        return float("nan")
    return 1.0 if solution_str.strip() == str(ground_truth) else 0.5


def huge_when_odd(data_source, solution_str, ground_truth, extra_info=None):
    """Finite but enormous rewards: without std normalisation the policy loss overflows to inf."""
    return 3e38 if len(solution_str) % 2 else 0.0


def returns_string(data_source, solution_str, ground_truth, extra_info=None):
    """A common slip: the score as text."""
    return "1.0" if solution_str.strip() == str(ground_truth) else "0.0"


def constant(data_source, solution_str, ground_truth, extra_info=None):
    """The same score for every response: no group has spread (DAPO's dynamic sampling keeps none)."""
    return 0.5
