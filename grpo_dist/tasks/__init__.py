"""Embedded tasks and base models, built locally on first use (no downloads).

A config value ``builtin:NAME`` (see ``grpo_dist.config.schema.BUILTIN_PREFIX``) names one of
them; ``resolve(value)`` builds it into the cache if needed and returns the real path.
"""

from __future__ import annotations

BUILTIN_MODELS = ("tiny-reverse",)
BUILTIN_DATA = ("reverse/train", "reverse/test")


def builtin_names(kind: str) -> tuple[str, ...]:
    """The embedded names of a kind ("model" or "data")."""
    return BUILTIN_MODELS if kind == "model" else BUILTIN_DATA if kind == "data" else ()
