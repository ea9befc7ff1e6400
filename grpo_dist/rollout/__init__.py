"""Rollout engines: prompts (token ids) in, sampled responses and their log-probs out.

The only package that imports vLLM, and only inside :mod:`grpo_dist.rollout.vllm_engine`
(loaded on first use), so importing this package is cheap.
"""

from grpo_dist.rollout.base import (
    ENGINES,
    RolloutEngine,
    RolloutOutput,
    SamplingSettings,
    make_engine,
    pad_responses,
)

__all__ = [
    "ENGINES",
    "RolloutEngine",
    "RolloutOutput",
    "SamplingSettings",
    "make_engine",
    "pad_responses",
]
