"""Importing a user's class or function named ``module.attr`` (tool classes, agent loops), or a user's modules
(verl's ``external_lib``), with one message that says what is missing."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any


def import_attr(target: str, *, what: str = "name", kind: str = "attribute") -> Any:
    """The attribute ``attr`` of module ``module`` for ``target = "module.attr"``.

    Raises:
        ValueError: ``target`` is not of that form, the module does not import (why), or it has no such
            attribute; ``what`` names the setting in the message (e.g. ``_target_``, ``class_name``), ``kind``
            what the attribute should be (``class``).
    """
    if not isinstance(target, str) or "." not in target:
        raise ValueError(f"{what} {target!r} is not of the form 'module.Class'")
    module_name, attr = target.rsplit(".", 1)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ValueError(f"module {module_name!r} not found ({exc.msg}); it must be importable (on PYTHONPATH "
                         "or installed)") from None
    except Exception as exc:
        raise ValueError(f"importing module {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    value = getattr(module, attr, None)
    if value is None:
        raise ValueError(f"module {module_name!r} has no {kind} {attr!r}")
    return value


def import_modules(names: Iterable[str], *, where: str) -> None:
    """Import each module of ``names`` (verl's ``external_lib``: modules that register model classes).

    Raises:
        ValueError: one does not import; the message names the module, ``where`` it was imported (e.g. "in the
            driver") and why.
    """
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:
            raise ValueError(f"external_lib: module {name!r} does not import {where}: {type(exc).__name__}: {exc}; "
                             "it must be importable by the driver and every model and rollout worker") from None
