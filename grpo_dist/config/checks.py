"""The small pieces every validation module of ``config/`` shares: the one shape of a configuration
error (the key, the value given, what would be valid), the common checks (a choice, a positive number,
a path that exists), the rule for a setting verl spells two ways, and the data-parallel size."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

from grpo_dist.config.schema import ConfigError, GRPOConfig
from grpo_dist.data import as_path_list
from grpo_dist.tasks import BUILTIN_PREFIX
from grpo_dist.training.dtypes import DTYPE_NAMES

DTYPES = tuple(DTYPE_NAMES)  # verl's short names too


def bad(key: str, value: Any, valid: str) -> ConfigError:
    return ConfigError(f"{key} = {value!r} is not valid: {valid}")


def choice(key: str, value: Any, choices: Iterable[str]) -> None:
    choices = tuple(choices)
    if value not in choices:
        raise bad(key, value, "expected one of " + ", ".join(choices))


def positive(key: str, value: float | int | None, *, allow_zero: bool = False) -> None:
    if value is None:
        return
    if value < 0 or (value == 0 and not allow_zero):
        raise bad(key, value, "expected a number " + (">= 0" if allow_zero else "> 0"))


def check_exists(key: str, value: Any, *, kind: str) -> None:
    for p in as_path_list(value):
        if p.startswith(BUILTIN_PREFIX):
            from grpo_dist.tasks import builtin_names

            names = builtin_names(kind)
            if p[len(BUILTIN_PREFIX):] not in names:
                raise bad(key, p, f"the embedded {kind}s are " + ", ".join(BUILTIN_PREFIX + n for n in names))
            continue
        path = Path(os.path.expanduser(p))
        if kind == "model" and not path.exists():
            from grpo_dist.tasks import is_hub_id

            if is_hub_id(p):
                continue  # a hub name: taken from the cache (or downloaded) at start-up
        if not path.exists():
            parent = path.parent
            hint = f" (its folder {parent} exists)" if parent.is_dir() else f" (folder {parent} does not exist either)"
            raise bad(key, p, f"no such {'directory' if kind == 'model' else 'file'}{hint}")


def data_parallel_size(cfg: GRPOConfig) -> int:
    """Data-parallel ranks of the actor: one per device (on CPU: per rank process) over all nodes.
    The one place this is computed; everything else asks here."""
    return cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node


def one_of_two(key_a: str, a: Any, key_b: str, b: Any, default: Any) -> Any:
    """The value of a setting verl spells two ways (two layouts, or a renamed key): the one that was
    changed from the default; ``ConfigError`` when both were, to different values."""
    if a != default and b != default and a != b:
        raise bad(key_b, b, f"it contradicts {key_a} = {a!r}, another name for the same setting; set only one of them")
    return a if a != default else b
