"""The state of every key (honoured / no effect here / refused), enforced from the schema's metadata.

The schema's fields carry their state (:mod:`grpo_dist.config.fields`); this module walks them:

- :func:`leaf_states`: every leaf key with its field and its state (a section's state is taken by
  the leaves under it that have none of their own; leaves with neither are honoured);
- :func:`check_states`: one :class:`ConfigError` for the first key whose value its state refuses;
- :func:`setting`: the value of a setting verl spells in several ways (``Honoured.alias_of``);
- :func:`noop_notes`: the keys given a value that has no effect here, with the reason (printed once
  at start-up).

Reads made here to check values go around attribute access on purpose
(``object.__getattribute__``): a test records which keys the code reads while it builds every
worker's settings, and a check that looks at every key must not count as a use.
"""

from __future__ import annotations

import functools
from dataclasses import MISSING, Field, fields, is_dataclass, replace
from typing import Any, Iterator

from grpo_dist.config.fields import HONOURED, ConfigError, Honoured, NoOp, Refused, State

__all__ = ["leaf_states", "state_of", "default_of", "raw_get", "get", "check_states", "setting", "noop_notes",
           "describe_state", "is_interpolation"]


def _schema() -> type:
    from grpo_dist.config.schema import GRPOConfig

    return GRPOConfig


def _default(f: Field) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    raise AssertionError(f"field {f.name} has no default")


def leaf_states(cls: type | None = None, prefix: str = "", inherited: State | None = None
                ) -> Iterator[tuple[str, Field, State]]:
    """``(dotted key, field, state)`` of every leaf of the schema ``cls`` (default: the project's), in
    declaration order."""
    for f in fields(cls or _schema()):
        key = f"{prefix}{f.name}"
        own = f.metadata.get("state")
        default = _default(f)
        if is_dataclass(default):
            yield from leaf_states(type(default), key + ".", own or inherited)
        else:
            state = own or inherited or HONOURED
            if isinstance(state, Honoured) and state.alias_of and state.alias_of.startswith("."):
                state = replace(state, alias_of=prefix + state.alias_of[1:])  # a sibling key
            yield key, f, state


@functools.lru_cache(maxsize=4)
def _table(cls: type) -> dict[str, tuple[Field, State]]:
    return {key: (f, state) for key, f, state in leaf_states(cls)}


def state_of(key: str, cls: type | None = None) -> State:
    return _table(cls or _schema())[key][1]


def is_interpolation(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("${")


def default_of(key: str, cls: type | None = None) -> Any:
    """The schema default of ``key`` (an interpolation is returned as its ``${...}`` string)."""
    return _default(_table(cls or _schema())[key][0])


def raw_get(cfg: Any, key: str) -> Any:
    """The value of ``key`` in the typed config, read without attribute hooks."""
    obj = cfg
    for part in key.split("."):
        obj = object.__getattribute__(obj, part)
    return obj


def get(cfg: Any, key: str) -> Any:
    """The value of ``key`` in the typed config (an ordinary read: it counts as a use)."""
    obj = cfg
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def _plain(value: Any) -> Any:
    """Lists and tuples compared as tuples (OmegaConf hands lists; states list tuples)."""
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _plain(v)) for k, v in value.items()))
    return value


def _among(value: Any, allowed: tuple[Any, ...]) -> bool:
    v = _plain(value)
    return any(v == _plain(a) for a in allowed)


def _show(values: tuple[Any, ...]) -> str:
    return " | ".join("null" if v is None else repr(v) if isinstance(v, str) else str(v).lower()
                      if isinstance(v, bool) else str(list(v)) if isinstance(v, (list, tuple)) else str(v)
                      for v in values)


def _accepted(key: str, state: Refused, cls: type | None = None) -> tuple[Any, ...]:
    return state.accept if state.accept is not None else (default_of(key, cls),)


def check_states(cfg: Any, cls: type | None = None) -> None:
    """``ConfigError`` for the first key whose value its state does not accept: a refused value of a
    honoured key, a value of a no-op key outside the no-op values, a refused feature switched on; and
    two spellings of one setting changed to different values."""
    cls = cls or type(cfg)
    for key, _f, state in leaf_states(cls):
        value = raw_get(cfg, key)
        if isinstance(state, Honoured):
            for bad, instead in state.refuse:
                if _among(value, (bad,)):
                    raise ConfigError(f"{key} = {value!r} is not supported here: {instead}")
            if state.alias_of:
                setting(cfg, state.alias_of, cls=cls, raw=True)
        elif isinstance(state, NoOp) and (state.values is not None or state.same_as is not None):
            ok = state.values is not None and _among(value, state.values)
            accepted = [_show(state.values)] if state.values is not None else []
            if state.same_as is not None:
                other = raw_get(cfg, state.same_as)
                ok = ok or _plain(value) == _plain(other)
                accepted.append(f"the value of {state.same_as}, {other!r}")
            if not ok:
                raise ConfigError(f"{key} = {value!r} is not supported here: {state.otherwise or state.reason} "
                                  f"(accepted: {' or '.join(accepted)}, which have no effect: {state.reason})")
        elif isinstance(state, Refused):
            accepted = _accepted(key, state, cls)
            if not _among(value, accepted):
                raise ConfigError(f"{key} = {value!r} is not supported here: {state.message} "
                                  f"(accepted: {_show(accepted)})")


@functools.lru_cache(maxsize=4)
def _aliases(cls: type) -> dict[str, tuple[str, ...]]:
    out: dict[str, list[str]] = {}
    for key, _f, state in leaf_states(cls):
        if isinstance(state, Honoured) and state.alias_of:
            out.setdefault(state.alias_of, []).append(key)
    return {k: tuple(v) for k, v in out.items()}


def setting(cfg: Any, key: str, *, cls: type | None = None, raw: bool = False) -> Any:
    """The value of the setting ``key`` that verl also spells in other ways (the keys whose state has
    ``alias_of=key``): the spelling changed from its own default (and not null) wins; none changed:
    ``key``'s value; two changed to different values: ``ConfigError`` naming both."""
    cls = cls or type(cfg)
    read = raw_get if raw else get
    changed: list[tuple[str, Any]] = []
    for name in (key, *_aliases(cls).get(key, ())):
        value = read(cfg, name)
        default = default_of(name, cls)
        if value is None:  # null: this spelling is not given
            continue
        if is_interpolation(default) or _plain(value) != _plain(default):
            if name == key and is_interpolation(default):
                continue
            changed.append((name, value))
    distinct = {repr(_plain(v)) for _, v in changed}
    if len(distinct) > 1:
        (a, va), (b, vb) = changed[0], next((n, v) for n, v in changed if repr(_plain(v)) != repr(_plain(changed[0][1])))
        raise ConfigError(f"{b} = {vb!r} is not valid: it contradicts {a} = {va!r}, another spelling of the same "
                          "setting; set only one of them")
    return changed[0][1] if changed else read(cfg, key)


def noop_notes(cfg: Any, cls: type | None = None) -> list[str]:
    """``key = value: no effect here (reason)`` for every no-op key given a value other than its
    default (so that a run says once what it leaves aside)."""
    cls = cls or type(cfg)
    notes = []
    for key, _f, state in leaf_states(cls):
        if not isinstance(state, NoOp):
            continue
        value, default = raw_get(cfg, key), default_of(key, cls)
        if is_interpolation(default) or _plain(value) == _plain(default):
            continue
        notes.append(f"{key} = {value!r} has no effect here: {state.reason}")
    return notes


def describe_state(key: str, state: State, cls: type | None = None) -> tuple[str, str]:
    """``(short state, explanation)`` for the generated reference."""
    if isinstance(state, Honoured):
        parts = []
        if state.alias_of:
            parts.append(f"another spelling of `{state.alias_of}` (set either)")
        for bad, instead in state.refuse:
            parts.append(f"{_show((bad,))} is refused: {instead}")
        return "honoured", "; ".join(parts)
    if isinstance(state, NoOp):
        if state.values is None and state.same_as is None:
            return "no effect", state.reason
        accepted = ([_show(state.values)] if state.values is not None else []) + (
            [f"= `{state.same_as}`"] if state.same_as is not None else [])
        return f"no effect ({' or '.join(accepted)})", f"{state.reason}; other values are refused" + (
            f": {state.otherwise}" if state.otherwise else "")
    accepted = _accepted(key, state, cls)
    return f"refused unless {_show(accepted)}", state.message
