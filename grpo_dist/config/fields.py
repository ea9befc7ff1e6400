"""Schema fields and the state of every key: honoured, accepted with no effect here, or refused.

Every leaf of the schema (the ``schema`` package) is declared with :func:`F`, which stores its one-line help
and its *state* in the dataclass field's metadata. The state is one of:

- :class:`Honoured`: the key does here what it does in verl. ``refuse`` lists values that cannot
  be taken (each with what to use instead); ``alias_of`` marks another spelling of a key.
- :class:`NoOp`: the key is accepted and has no effect here, for the reason given, either for every
  value or only for the listed ones (``values``) or the value of another key (``same_as``); other
  values are refused.
- :class:`Refused`: the feature behind the key is not built; the key is accepted only at the values
  that leave it off (by default its default), anything else is refused with ``message``.

A nested section (:func:`S`) may carry a state that every leaf under it without one of its own
takes (e.g. all the settings of a profiler that cannot be switched on). Leaves with neither are
honoured. ``docs/configuration.md`` lists each key's state, and validation
(:func:`grpo_dist.config.states.check_states`) enforces it, both from this metadata.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

__all__ = ["ConfigError", "Honoured", "NoOp", "Refused", "HONOURED", "F", "S", "State"]


class ConfigError(ValueError):
    """A user mistake in the configuration. The message is meant to be printed as is."""


@dataclass(frozen=True)
class Honoured:
    """The key does what verl's does.

    ``refuse``: ``((value, what to use instead), ...)`` values the key cannot take here.
    ``alias_of``: this key is another spelling (verl's other layout, or a renamed key) of the key
    named; code reads the setting through :func:`grpo_dist.config.states.setting`, which takes the
    spelling that was changed from its default and refuses two different changed values.
    """

    refuse: tuple[tuple[Any, str], ...] = ()
    alias_of: str | None = None
    kind: ClassVar[str] = "honoured"


@dataclass(frozen=True)
class NoOp:
    """Accepted, with no effect here, because of ``reason``.

    ``values``: the values that are no-ops (None: every value); ``same_as``: accepted only when equal
    to that key's value (verl keeps copies of some settings); ``otherwise``: what to use instead, for
    the values refused.
    """

    reason: str
    values: tuple[Any, ...] | None = None
    same_as: str | None = None
    otherwise: str = ""
    kind: ClassVar[str] = "no-op"


@dataclass(frozen=True)
class Refused:
    """The feature behind the key is not built here: accepted only at ``accept`` (None: the key's
    default, the feature off), refused otherwise with ``message`` (why, and what to use instead)."""

    message: str
    accept: tuple[Any, ...] | None = None
    kind: ClassVar[str] = "refused"


State = Honoured | NoOp | Refused
HONOURED = Honoured()


def F(default: Any, help: str, state: State | None = None, **kw: Any) -> Any:  # noqa: A002, N802
    """A dataclass field with a default, its one-line help text and (optionally) its state."""
    metadata = {"help": help, "state": state}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=metadata, **kw)
    return field(default=default, metadata=metadata, **kw)


def S(cls: type, help: str, state: State | None = None) -> Any:  # noqa: A002, N802
    """A nested config section; ``state`` is taken by every leaf below that has none of its own."""
    return field(default_factory=cls, metadata={"help": help, "state": state})
