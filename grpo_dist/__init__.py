"""grpo_dist: distributed GRPO (Ray, vLLM, FSDP2; verl's configuration keys) and an in-process API.

``from grpo_dist import GRPO`` is the in-process API (:mod:`grpo_dist.api`). It is loaded on first
access, so ``import grpo_dist`` stays cheap (it imports nothing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from grpo_dist.api import GRPO, Rollout

__all__ = ["GRPO", "Rollout"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from grpo_dist import api

        return getattr(api, name)
    raise AttributeError(f"module 'grpo_dist' has no attribute {name!r}")
