"""Tools from plain Python functions: ``@function_tool`` and ``function_tool_path`` files.

    from grpo_dist.tools.function_tool import function_tool

    @function_tool
    async def add(a: int, b: int = 0) -> str:
        \"\"\"Add two integers.

        Args:
            a: the first number
            b: the second number
        \"\"\"
        return str(a + b)

The schema comes from the type hints and the Google-style docstring (``transformers.utils.get_json_schema``):
the text before ``Args:`` is the description, each ``Args:`` line describes its parameter, and the
parameters without a default are ``required``. Every parameter needs a type hint and a line under ``Args:``;
a function without them is refused when it is decorated, naming the function and what is missing.

Sync and async functions both work; a sync function runs in a worker thread so that it does not hold up
the other trajectories. The return value becomes the model's text: a ``ToolResponse`` as it is, a string
as it is, a ``(response, reward)`` or ``(response, reward, metrics)`` tuple (a text or ``ToolResponse``, a
number, a dict) as ``execute``'s result, and anything else as JSON (or ``str`` when it is not JSON-serialisable).

``load_function_tools(path)`` reads a Python file (``multi_turn.function_tool_path``) and makes one tool of
every function in it that carries the decorator.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import importlib.util
import inspect
import json
import sys
from pathlib import Path
from typing import Any, Callable

from grpo_dist.tools.base_tool import BaseTool
from grpo_dist.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

SCHEMA_ATTR = "__tool_schema__"
"""The attribute ``@function_tool`` sets on the function: its ``OpenAIFunctionToolSchema``."""


class FunctionToolError(ValueError):
    """A function that cannot be a tool, or a function-tool file that cannot be loaded."""


def function_schema(fn: Callable, *, name: str | None = None, description: str | None = None) -> OpenAIFunctionToolSchema:
    """The OpenAI tool schema of ``fn`` from its type hints and Google-style docstring.

    Raises:
        FunctionToolError: a parameter without a type hint or without a line under ``Args:``.
    """
    from transformers.utils import get_json_schema  # heavy import, only where a function tool is made

    try:
        raw = get_json_schema(fn)
    except Exception as exc:  # transformers raises its own exception types for each gap
        raise FunctionToolError(f"function tool {getattr(fn, '__qualname__', fn)!r}: {exc}") from None
    raw["function"].pop("return", None)
    if name:
        raw["function"]["name"] = name
    if description:
        raw["function"]["description"] = description
    return OpenAIFunctionToolSchema.model_validate(raw)


def function_tool(fn: Callable | None = None, *, name: str | None = None, description: str | None = None):
    """Mark ``fn`` as a tool (usable bare, ``@function_tool``, or with ``name=``/``description=``
    overrides). The function is returned unchanged apart from its schema attribute, so it can still be
    called directly."""

    def mark(f: Callable) -> Callable:
        setattr(f, SCHEMA_ATTR, function_schema(f, name=name, description=description))
        return f

    return mark(fn) if fn is not None else mark


def _is_result_tuple(value: Any) -> bool:
    """``(response, reward[, metrics])``: a text or ``ToolResponse``, a number (or None), a dict (or None);
    any other tuple is data, returned as JSON."""
    return (isinstance(value, tuple) and len(value) in (2, 3) and isinstance(value[0], (str, ToolResponse))
            and (value[1] is None or (isinstance(value[1], (int, float)) and not isinstance(value[1], bool)))
            and (len(value) == 2 or value[2] is None or isinstance(value[2], dict)))


def as_tool_result(value: Any) -> tuple[ToolResponse, float, dict]:
    """A function's return value as ``execute``'s ``(response, reward, metrics)`` (see the module doc)."""
    if _is_result_tuple(value):
        response, reward, *rest = value
        return as_tool_result(response)[0], float(reward or 0.0), dict(rest[0] or {}) if rest else {}
    if isinstance(value, ToolResponse):
        return value, 0.0, {}
    if isinstance(value, str):
        return ToolResponse(text=value), 0.0, {}
    if value is None:
        return ToolResponse(), 0.0, {}
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = str(value)
    return ToolResponse(text=text), 0.0, {}


class FunctionTool(BaseTool):
    """A ``BaseTool`` that calls a decorated function with the model's arguments."""

    def __init__(self, fn: Callable, config: dict | None = None):
        schema = getattr(fn, SCHEMA_ATTR, None)
        if schema is None:
            raise FunctionToolError(f"{getattr(fn, '__qualname__', fn)!r} is not decorated with @function_tool")
        self.fn = fn
        super().__init__(config or {"type": "native"}, schema)

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        if inspect.iscoroutinefunction(self.fn):
            value = await self.fn(**parameters)
        else:
            value = await asyncio.to_thread(functools.partial(self.fn, **parameters))
            if inspect.isawaitable(value):
                value = await value
        return as_tool_result(value)


def _import_file(path: Path):
    """Import a Python file as a module of its own (a name derived from its path, so two files with the
    same name do not collide)."""
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    module_name = f"_grpo_dist_function_tools_{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise FunctionToolError(f"function_tool_path {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except FunctionToolError as exc:
        sys.modules.pop(module_name, None)
        raise FunctionToolError(f"function_tool_path {path}: {exc}") from None
    except Exception as exc:
        sys.modules.pop(module_name, None)
        where = ""
        if isinstance(exc, SyntaxError):
            where = f" (line {exc.lineno})"
        raise FunctionToolError(f"function_tool_path {path}: importing it failed{where}: "
                                f"{type(exc).__name__}: {exc}") from None
    return module


def load_function_tools(path: str | Path) -> list[FunctionTool]:
    """One ``FunctionTool`` per ``@function_tool`` function of the file, in the file's order.

    Raises:
        FunctionToolError: the file is missing, does not import, or holds no decorated function.
    """
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise FunctionToolError(f"function_tool_path {path}: no such file")
    module = _import_file(path)
    fns = [v for v in vars(module).values() if callable(v) and getattr(v, SCHEMA_ATTR, None) is not None]
    if not fns:
        raise FunctionToolError(f"function_tool_path {path}: no function decorated with @function_tool "
                                "(from grpo_dist.tools.function_tool import function_tool)")
    return [FunctionTool(fn) for fn in fns]
