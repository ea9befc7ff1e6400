"""User reward functions loaded from a file path (verl's ``custom_reward_function.path`` / ``.name``).

The function has verl's signature::

    def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict

returning a number, or a dict with a ``"score"`` number plus extra per-sample metrics.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class CustomRewardFn:
    """A reference to a reward function in a user file, cheap to send to worker processes (a
    function defined in a file loaded by path cannot be pickled by reference, so workers receive
    this and load the file themselves). ``kwargs`` are passed to every call (verl's
    ``custom_reward_function.reward_kwargs``)."""

    path: str
    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def load(self) -> Callable:
        return load_custom_reward_fn(self.path, self.name)

    def describe(self) -> str:
        return f"{self.name} from {self.path}"


def _module_name(path: str) -> str:
    digest = hashlib.sha1(path.encode()).hexdigest()[:12]
    stem = "".join(c if c.isalnum() else "_" for c in os.path.splitext(os.path.basename(path))[0])
    return f"grpo_dist_custom_reward_{stem}_{digest}"


def load_custom_reward_fn(path: str, name: str) -> Callable:
    """Import the file at ``path`` and return its function ``name``.

    Raises ``ValueError`` (worded for ``custom_reward_function.path`` / ``.name``) when the file does
    not exist, fails to import (the exception's one-line summary is given), or has no callable
    ``name`` (the functions it does define are listed).
    """
    path = os.path.abspath(os.path.expanduser(os.fspath(path)))
    if not os.path.isfile(path):
        folder = os.path.dirname(path)
        if os.path.isdir(folder):
            py_files = sorted(f for f in os.listdir(folder) if f.endswith(".py"))
            nearby = f"; .py files in {folder}: {', '.join(py_files[:10]) or '(none)'}"
        else:
            nearby = f"; the folder {folder} does not exist"
        raise ValueError(f"custom_reward_function.path={path}: file not found{nearby}")

    module_name = _module_name(path)
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"custom_reward_function.path={path}: cannot be imported as Python (is it a .py file?)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # so that dataclasses, pickle etc. inside the file can find it
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 - a SystemExit in user code must not end the trainer
        sys.modules.pop(module_name, None)
        where = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) and exc.lineno else ""
        raise ValueError(
            f"custom_reward_function.path={path}: importing the file failed{where}: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from exc

    fn = getattr(module, name, None)
    if fn is None or not callable(fn):
        defined = sorted(
            n for n, obj in vars(module).items()
            if inspect.isfunction(obj) and obj.__module__ == module_name and not n.startswith("_")
        )
        what = "has no function" if fn is None else f"defines a {type(fn).__name__}, not a function, named"
        raise ValueError(
            f"custom_reward_function.name={name!r}: {path} {what} {name!r}. "
            f"Functions it defines: {', '.join(defined) or '(none)'}"
        )
    return fn
