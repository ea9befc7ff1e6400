"""Embedded tasks and base models, built locally on first use (no downloads).

A config value ``builtin:NAME`` (see ``grpo_dist.config.schema.BUILTIN_PREFIX``) names one of
them; ``resolve(value)`` builds it into the cache if needed and returns the real path. Other
values pass through unchanged (with ``~`` expanded).
"""

from __future__ import annotations

import os

from grpo_dist.config.schema import BUILTIN_PREFIX
from grpo_dist.tasks import reverse

BUILTIN_MODELS = ("tiny-reverse",)
BUILTIN_DATA = ("reverse/train", "reverse/test")


def builtin_names(kind: str) -> tuple[str, ...]:
    """The embedded names of a kind ("model" or "data")."""
    return BUILTIN_MODELS if kind == "model" else BUILTIN_DATA if kind == "data" else ()


def cache_root() -> str:
    return os.path.expanduser(os.environ.get("GRPO_DIST_CACHE", "~/.cache/grpo_dist"))


def resolve(value: str) -> str:
    if not str(value).startswith(BUILTIN_PREFIX):
        return os.path.expanduser(str(value))
    name = str(value)[len(BUILTIN_PREFIX):]
    if name == "tiny-reverse":
        return str(reverse.ensure_model(cache_root()))
    if name in ("reverse/train", "reverse/test"):
        return str(reverse.ensure_data(cache_root())[name.split("/")[1]])
    raise ValueError(f"unknown embedded name {value!r}; valid: " + ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_MODELS + BUILTIN_DATA))
