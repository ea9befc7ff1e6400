"""Named registries: the rules shared by the advantage estimators and the policy-loss modes.

A registry is a plain ``dict`` from a name to a spec, owned by a torch-free module
(:mod:`grpo_dist.core.advantage_registry`, :mod:`grpo_dist.core.policy_loss_registry`) so that the
configuration can check names and read what a name needs without importing torch; a spec is any
dataclass with the registered function as ``spec.fn``. These helpers hold the rules and the wording of
their errors:

- a name is a non-empty string;
- registering the same function again under its name is a no-op (a module imported twice), a
  different function under a taken name is refused;
- looking up a name that is not there names the configuration key and the valid names;
- a built-in entry names its function (:class:`BuiltinFn`, module and attribute) instead of holding it:
  the math module that defines the functions imports torch, so it is imported when a built-in is first
  called, and binds its functions into the registry when it is imported (:func:`bind_builtins`).
"""

import dataclasses
import importlib
import sys
from typing import Any

__all__ = ["check_name", "add_spec", "find_spec", "BuiltinFn", "bind_builtins"]


class BuiltinFn:
    """The function of a built-in registry entry before its module is imported: ``module.attr``,
    imported on the first call (which also binds the module's built-ins, :func:`bind_builtins`)."""

    def __init__(self, module: str, attr: str) -> None:
        self.module, self.attr = module, attr
        self.__qualname__ = attr

    def resolve(self) -> Any:
        """The function itself (imports its module)."""
        return getattr(importlib.import_module(self.module), self.attr)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<built-in {self.module}.{self.attr}, not imported yet>"


def _function(fn: Any) -> Any:
    return fn.resolve() if isinstance(fn, BuiltinFn) else fn


def bind_builtins(registry: dict[str, Any], module: str) -> None:
    """Replace every entry of ``registry`` whose function is a :class:`BuiltinFn` of ``module`` (being
    imported: called at its end) with the same entry holding the function itself."""
    namespace = vars(sys.modules[module])
    for name, spec in list(registry.items()):
        if isinstance(spec.fn, BuiltinFn) and spec.fn.module == module:
            registry[name] = dataclasses.replace(spec, fn=namespace[spec.fn.attr])


def check_name(name: Any, what: str) -> None:
    """``ValueError`` unless ``name`` is a non-empty string; ``what`` names the kind ("policy loss")."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} name must be a non-empty string, got {name!r}")


def add_spec(registry: dict[str, Any], name: str, spec: Any, what: str) -> None:
    """``registry[name] = spec``, refused (``ValueError``) when ``name`` holds a different function."""
    old = registry.get(name)
    if old is not None and _function(old.fn) is not _function(spec.fn):
        raise ValueError(f"{what} {name!r} is already registered (to {old.fn.__qualname__}); choose another name")
    registry[name] = spec


def find_spec(registry: dict[str, Any], name: Any, what: str, key: str, valid: str = "names") -> Any:
    """``registry[name]``; ``ValueError`` naming ``what`` was asked for, the configuration ``key`` that
    asked, and the sorted valid names (called ``valid`` in the message) if there is none."""
    spec = registry.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ValueError(f"unknown {what} {name!r} ({key}); valid {valid}: {sorted(registry)}")
    return spec
