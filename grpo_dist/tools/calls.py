"""One tool call, as the agent loop makes it: never an exception, always a response for the model.

``run_tool_call(tools, name, arguments_json, ...)`` parses the model's JSON arguments, opens an instance
of the named tool (``create`` with the row's ``create_kwargs``), runs ``execute`` under a timeout, releases
the instance, and cuts an oversized response. Every fault becomes a text for the model that starts like
verl's (``"Error when executing tool: ..."``) and is counted in the returned metrics:

| fault | metric set to 1 |
| --- | --- |
| the name is not a configured tool | ``tool_errors/unknown_tool`` |
| the arguments are not JSON, or not a JSON object | ``tool_errors/invalid_arguments`` |
| the tool raises (in ``create`` or ``execute``) or calls ``sys.exit()`` | ``tool_errors/exception`` |
| the tool runs past ``timeout_s`` | ``tool_errors/timeout`` |
| the response is longer than ``max_chars`` | ``tool_truncated`` (not an error: the text is cut as verl cuts it) |

Metrics of one call (numbers, summed or averaged by the caller): ``tool_calls`` (1), ``tool_errors`` (0 or
1), the error kind above, ``tool_truncated``, ``tool_wall_s``, and the tool's own numeric metrics under
``tool/<name>/<key>``.

As verl's agent loop does, each call opens its own instance: ``create`` gets the row's ``create_kwargs``
both as one ``create_kwargs=`` mapping (verl's agent loop) and spread as keywords (verl's older rollout), so
a tool written for either reads them; ``execute`` and ``release`` get ``execute_kwargs`` and
``release_kwargs`` spread as keywords.

A timeout cancels the tool's coroutine; a sync function tool's worker thread cannot be stopped and runs on
in the background (code that may hang belongs in the sandbox, which kills it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from grpo_dist.tools.base_tool import BaseTool
from grpo_dist.tools.function_tool import as_tool_result
from grpo_dist.tools.schemas import ToolResponse

logger = logging.getLogger(__name__)

ERROR_PREFIX = "Error when executing tool: "
ERROR_KINDS = ("unknown_tool", "invalid_arguments", "exception", "timeout")
TRUNCATE_SIDES = ("left", "right", "middle")
RELEASE_TIMEOUT_S = 5.0


def truncate_text(text: str, max_chars: int, side: str = "middle") -> str:
    """verl's cut of a long tool response (``tool_response_truncate_side``): ``left`` keeps the start,
    ``right`` the end, ``middle`` both halves, each with a ``(truncated)`` marker."""
    if side not in TRUNCATE_SIDES:
        raise ValueError(f"truncate side must be one of {TRUNCATE_SIDES}, got {side!r}")
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    if side == "left":
        return text[:max_chars] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-max_chars:]
    half = max_chars // 2
    return text[:half] + "...(truncated)..." + text[len(text) - half:]


def _metrics(error: str | None, wall_s: float, truncated: bool = False, tool_name: str = "",
             tool_metrics: dict | None = None) -> dict[str, float]:
    out = {"tool_calls": 1.0, "tool_errors": float(error is not None), "tool_truncated": float(truncated),
           "tool_wall_s": wall_s}
    for kind in ERROR_KINDS:
        out[f"tool_errors/{kind}"] = float(error == kind)
    for key, value in (tool_metrics or {}).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f"tool/{tool_name}/{key}"] = float(value)
    return out


def _error(kind: str, message: str, start: float, name: str) -> tuple[ToolResponse, float, dict]:
    logger.warning("tool call %r: %s", name, message)
    return ToolResponse(text=ERROR_PREFIX + message), 0.0, _metrics(kind, time.monotonic() - start)


def parse_arguments(arguments_json: str | dict) -> dict[str, Any]:
    """The model's arguments as a dict; ``ValueError`` when they are not a JSON object."""
    if isinstance(arguments_json, dict):
        return arguments_json
    try:
        value = json.loads(arguments_json) if arguments_json not in (None, "") else {}
    except (TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"the arguments are not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ValueError(f"the arguments must be a JSON object, got {type(value).__name__}")
    return value


async def _create_and_execute(tool: BaseTool, arguments: dict, tool_kwargs: dict) -> tuple[Any, str | None]:
    instance_id = None
    try:
        instance_id, _ = await tool.create(create_kwargs=tool_kwargs.get("create_kwargs", {}),
                                           **tool_kwargs.get("create_kwargs", {}))
        result = await tool.execute(instance_id, arguments, **tool_kwargs.get("execute_kwargs", {}))
        return result, instance_id
    except BaseException as exc:
        if instance_id is not None:
            await _release(tool, instance_id, tool_kwargs)
        if isinstance(exc, SystemExit):  # asyncio would end the whole event loop with it
            raise RuntimeError(f"the tool called sys.exit({exc.code!r})") from None
        raise


async def _release(tool: BaseTool, instance_id: str, tool_kwargs: dict) -> None:
    try:
        await asyncio.wait_for(tool.release(instance_id, **tool_kwargs.get("release_kwargs", {})), RELEASE_TIMEOUT_S)
    except Exception as exc:  # a failing release must not fail the call: the response is already made
        logger.warning("tool %r: release failed: %s: %s", tool.name, type(exc).__name__, exc)


async def run_tool_call(tools: dict[str, BaseTool], name: str, arguments_json: str | dict, *,
                        timeout_s: float | None = 30.0, max_chars: int = 0, truncate_side: str = "middle",
                        tools_kwargs: dict | None = None) -> tuple[ToolResponse, float, dict]:
    """Run one call of the model; ``(response for the model, tool reward, metrics)``. Never raises for a
    fault of the tool or the call (see the module doc).

    Args:
        tools: the configured tools by name (``registry.load_tools``).
        name: the function name the model called.
        arguments_json: the arguments as the model wrote them (a JSON object), or already a dict.
        timeout_s: seconds ``create`` + ``execute`` may take; None for no limit.
        max_chars: the response text is cut to this many characters (verl's ``max_tool_response_length``);
            0 keeps it whole.
        truncate_side: ``left`` | ``right`` | ``middle`` (verl's ``tool_response_truncate_side``).
        tools_kwargs: the row's ``extra_info.tools_kwargs``: per tool name, ``create_kwargs``,
            ``execute_kwargs``, ``release_kwargs``.
    """
    start = time.monotonic()
    tool = tools.get(name)
    if tool is None:
        known = ", ".join(sorted(tools)) or "none"
        return _error("unknown_tool", f"no tool named {name!r} (available: {known})", start, name)
    try:
        arguments = parse_arguments(arguments_json)
    except ValueError as exc:
        return _error("invalid_arguments", f"invalid arguments for {name!r}: {exc}", start, name)
    tool_kwargs = (tools_kwargs or {}).get(name, {}) or {}
    try:
        result, instance_id = await asyncio.wait_for(_create_and_execute(tool, arguments, tool_kwargs), timeout_s)
    except (asyncio.TimeoutError, TimeoutError):
        return _error("timeout", f"{name!r} did not finish within {timeout_s:g} s", start, name)
    except Exception as exc:
        return _error("exception", f"{name!r} raised {type(exc).__name__}: {exc}", start, name)
    await _release(tool, instance_id, tool_kwargs)
    response, reward, tool_metrics = as_tool_result(result)
    truncated = False
    if response.text and max_chars and len(response.text) > max_chars:
        response = response.model_copy(update={"text": truncate_text(response.text, max_chars, truncate_side)})
        truncated = True
    return response, reward, _metrics(None, time.monotonic() - start, truncated, name, tool_metrics)
