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


def raises_unless_exact(data_source, solution_str, ground_truth, extra_info=None):
    """Scores an exact answer (so the trial call before the run, on the ground truth, passes) and raises
    on any other response: the run meets the raise on its first batch."""
    if solution_str.strip() == str(ground_truth):
        return 1.0
    raise ZeroDivisionError("this reward function is broken")


def text_unless_exact(data_source, solution_str, ground_truth, extra_info=None):
    """The score as text, except for an exact answer (which passes the trial call before the run)."""
    return 1.0 if solution_str.strip() == str(ground_truth) else "0.0"
