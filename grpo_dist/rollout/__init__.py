"""Rollout engines: prompts (token ids) in, sampled responses and their log-probs out.

The only package that imports vLLM, and only inside :mod:`grpo_dist.rollout.vllm_engine` (loaded on
first use); the engine classes' base (:mod:`grpo_dist.rollout.base`, torch) is exported lazily too, so
importing this package is cheap and torch-free (the configuration reads the engine table).

The engine table
----------------
:data:`ENGINES` is the one list of rollout engines: ``actor_rollout_ref.rollout.name`` is validated
against its names, and :func:`make_engine` builds an engine from it. A new engine is one module here
implementing :class:`~grpo_dist.rollout.base.RolloutEngine` plus one row below.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from grpo_dist.rollout.base import RolloutEngine

_FROM_BASE = ("RolloutEngine", "RolloutOutput", "SamplingSettings", "pad_responses")


def __getattr__(name: str) -> Any:
    """The engines' base names, imported from :mod:`grpo_dist.rollout.base` on first use."""
    if name in _FROM_BASE:
        value = getattr(importlib.import_module("grpo_dist.rollout.base"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class EngineSpec:
    """One row of the engine table.

    Attributes:
        name: the value of ``actor_rollout_ref.rollout.name``.
        load: returns the engine class (imports its backend lazily); the class is called with the
            engine's keyword arguments.
        help: one line for the configuration reference.
    """

    name: str
    load: Callable[[], Callable[..., RolloutEngine]]
    help: str


def _vllm() -> Callable[..., RolloutEngine]:
    from grpo_dist.rollout.vllm_engine import VLLMEngine

    return VLLMEngine


def _hf() -> Callable[..., RolloutEngine]:
    from grpo_dist.rollout.hf_engine import HFEngine

    return HFEngine


ENGINES: dict[str, EngineSpec] = {
    spec.name: spec
    for spec in (
        EngineSpec("vllm", _vllm, "vLLM (CPU build on CPU machines), in the rollout worker's process"),
        EngineSpec("hf", _hf, "Hugging Face generate (fallback where vLLM is not installed)"),
    )
}
ENGINE_NAMES: tuple[str, ...] = tuple(ENGINES)

#: verl's ``actor_rollout_ref.rollout.checkpoint_engine.backend`` values the weight sync runs
#: (:func:`grpo_dist.trainer.weight_sync.choose_transport`): ``naive`` (a CUDA IPC handle into an engine on
#: the actor's GPU, else Ray's object store) and ``nccl`` (a broadcast over a process group of the actor's
#: rank 0 and the rollout ranks: NCCL on GPUs, gloo on the CPU).
WEIGHT_SYNC_BACKENDS: tuple[str, ...] = ("naive", "nccl")


def make_engine(name: str, **kwargs: Any) -> RolloutEngine:
    """Build the rollout engine ``name`` with the engine's keyword arguments (see
    :class:`~grpo_dist.rollout.vllm_engine.VLLMEngine`, :class:`~grpo_dist.rollout.hf_engine.HFEngine`).

    Raises:
        ValueError: ``name`` is not in the engine table.
    """
    spec = ENGINES.get(name)
    if spec is None:
        raise ValueError(f"unknown rollout engine {name!r}; valid names: {', '.join(sorted(ENGINES))}")
    return spec.load()(**kwargs)


__all__ = [
    "ENGINES",
    "ENGINE_NAMES",
    "EngineSpec",
    "RolloutEngine",
    "RolloutOutput",
    "SamplingSettings",
    "make_engine",
    "pad_responses",
]
