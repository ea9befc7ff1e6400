"""Named registries: the rules shared by the advantage estimators and the policy-loss modes.

A registry is a plain ``dict`` from a name to a spec, owned by the module that registers into it
(:mod:`grpo_dist.core.advantages`, :mod:`grpo_dist.core.policy_loss`); a spec is any object with the
registered function as ``spec.fn``. These helpers hold the rules and the wording of their errors:

- a name is a non-empty string;
- registering the same function again under its name is a no-op (a module imported twice), a
  different function under a taken name is refused;
- looking up a name that is not there names the configuration key and the valid names.
"""

from typing import Any

__all__ = ["check_name", "add_spec", "find_spec"]


def check_name(name: Any, what: str) -> None:
    """``ValueError`` unless ``name`` is a non-empty string; ``what`` names the kind ("policy loss")."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} name must be a non-empty string, got {name!r}")


def add_spec(registry: dict[str, Any], name: str, spec: Any, what: str) -> None:
    """``registry[name] = spec``, refused (``ValueError``) when ``name`` holds a different function."""
    old = registry.get(name)
    if old is not None and old.fn is not spec.fn:
        raise ValueError(f"{what} {name!r} is already registered (to {old.fn.__qualname__}); choose another name")
    registry[name] = spec


def find_spec(registry: dict[str, Any], name: Any, what: str, key: str, valid: str = "names") -> Any:
    """``registry[name]``; ``ValueError`` naming ``what`` was asked for, the configuration ``key`` that
    asked, and the sorted valid names (called ``valid`` in the message) if there is none."""
    spec = registry.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ValueError(f"unknown {what} {name!r} ({key}); valid {valid}: {sorted(registry)}")
    return spec
