"""Which keys of a configuration the code reads: a recorder over the typed config tree.

:func:`recording` instruments attribute access of the schema's dataclasses while a block runs and
collects the dotted keys read from one config object; :func:`unread_honoured_keys` runs a builder
over several configurations and returns the keys that are honoured (by their state in the schema)
yet were read by none of the builds. The test ``tests/unit/test_key_walk.py`` uses it to keep every
honoured key in use; reads made by the state checks themselves go around the hook on purpose
(:func:`grpo_dist.config.states.raw_get`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import fields, is_dataclass
from typing import Any

from grpo_dist.config.fields import Honoured
from grpo_dist.config.states import leaf_states

__all__ = ["recording", "unread_honoured_keys", "interpolation_sources"]

_SIMPLE = re.compile(r"^\$\{([A-Za-z0-9_.]+)\}$")


def _tree(cfg: Any) -> dict[int, tuple[Any, str]]:
    """``id(object) -> (object, dotted prefix)`` for every dataclass object in ``cfg``'s tree."""
    out: dict[int, tuple[Any, str]] = {}

    def walk(obj: Any, prefix: str) -> None:
        out[id(obj)] = (obj, prefix)
        for f in fields(obj):
            value = object.__getattribute__(obj, f.name)
            if is_dataclass(value) and not isinstance(value, type):
                walk(value, f"{prefix}{f.name}.")

    walk(cfg, "")
    return out


@contextmanager
def recording(cfg: Any) -> Iterator[set[str]]:
    """Yield a set that collects the keys read from ``cfg`` (a typed config) while the block runs."""
    tree = _tree(cfg)
    names = {type(obj): {f.name for f in fields(obj)} for obj, _ in tree.values()}
    reads: set[str] = set()
    patched: list[tuple[type, Any]] = []
    for cls in names:
        own = cls.__dict__.get("__getattribute__")
        original = cls.__getattribute__

        def hook(self: Any, name: str, _original: Any = original) -> Any:
            entry = tree.get(id(self))
            if entry is not None and entry[0] is self and name in names.get(type(self), ()):
                reads.add(entry[1] + name)
            return _original(self, name)

        patched.append((cls, own))
        cls.__getattribute__ = hook  # type: ignore[method-assign]
    try:
        yield reads
    finally:
        for cls, own in patched:
            if own is None:
                del cls.__getattribute__
            else:
                cls.__getattribute__ = own  # type: ignore[method-assign]


def interpolation_sources(schema: type) -> dict[str, str]:
    """``key -> the key its default is`` for defaults that are a plain ``${other.key}``: reading the key
    uses the other one's value unless it was set (verl's derived defaults)."""
    out = {}
    for key, f, _state in leaf_states(schema):
        m = _SIMPLE.match(str(f.default)) if isinstance(f.default, str) else None
        if m:
            out[key] = m.group(1)
    return out


def unread_honoured_keys(schema: type, builds: Iterable[tuple[Any, Callable[[Any], Any]]]) -> list[str]:
    """The honoured keys of ``schema`` that no ``build(cfg)`` read, over every ``(cfg, build)`` given.

    A key also counts as read when a key that was read takes its default from it (``${key}``), and a
    setting's other spellings (``Honoured.alias_of``) count when the setting is read through them.
    """
    reads: set[str] = set()
    for cfg, build in builds:
        with recording(cfg) as seen:
            build(cfg)
        reads |= seen
    sources = interpolation_sources(schema)
    frontier = list(reads)
    while frontier:
        src = sources.get(frontier.pop())
        if src and src not in reads:
            reads.add(src)
            frontier.append(src)
    return [key for key, _f, state in leaf_states(schema)
            if isinstance(state, Honoured) and key not in reads]
