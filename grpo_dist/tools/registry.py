"""Loading tools from verl's tool config YAML (``multi_turn.tool_config_path``) and function-tool files.

The YAML, as verl writes it::

    tools:
      - class_name: grpo_dist.tools.gsm8k_tool.Gsm8kTool     # module.Class, importable
        config:
          type: native                                       # verl's tool type; only native is built
          ...                                                # the tool's own keys, passed as ``config``
        tool_schema:                                         # optional: OpenAIFunctionToolSchema's form
          type: function
          function: {name: ..., description: ..., parameters: {...}}

A ``class_name`` that starts with verl's module prefix ``verl.tools.`` is read as ``grpo_dist.tools.``
(``verl.tools.gsm8k_tool.Gsm8kTool`` -> ``grpo_dist.tools.gsm8k_tool.Gsm8kTool``), so verl's own tool
configs load unchanged and a user's config moves over with only its own module names changed.

A file that cannot be used raises one ``ToolConfigError`` naming the file, the entry (its index and
class name) and what is wrong: no ``tools`` list, a class that does not import or does not exist, a class
that is not a ``BaseTool``, a schema that does not validate, a constructor that fails, two tools with the
same name. ``load_tools`` is what the agent loop calls: the config file's tools and the function tools,
by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpo_dist.tools.base_tool import BaseTool
from grpo_dist.tools.function_tool import load_function_tools
from grpo_dist.tools.schemas import OpenAIFunctionToolSchema, schema_errors
from grpo_dist.utils.imports import import_attr

VERL_PREFIX = "verl.tools."
OUR_PREFIX = "grpo_dist.tools."
TOOL_TYPES = ("native",)
"""verl's ``config.type`` values that are built; ``mcp`` (and benchmax) are not."""


class ToolConfigError(ValueError):
    """A tool config that cannot be used; the message names the file, the entry and the problem."""


def resolve_class_name(class_name: str) -> str:
    """verl's module prefix ``verl.tools.`` mapped to ``grpo_dist.tools.``; other names unchanged."""
    return OUR_PREFIX + class_name[len(VERL_PREFIX):] if class_name.startswith(VERL_PREFIX) else class_name


def import_tool_class(class_name: str) -> type:
    """The class named ``module.Class`` (verl's prefix mapped); ``ValueError`` saying what is missing."""
    resolved = resolve_class_name(class_name)
    cls = import_attr(resolved, what="class_name", kind="class")
    if not (isinstance(cls, type) and issubclass(cls, BaseTool)):
        raise ValueError(f"{resolved} is not a BaseTool subclass (subclass grpo_dist.tools.base_tool.BaseTool)")
    return cls


def _read_yaml(path: Path) -> Any:
    from omegaconf import OmegaConf  # verl reads the file with OmegaConf: interpolations resolve the same way

    try:
        return OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except Exception as exc:
        raise ToolConfigError(f"tool config {path}: not valid YAML: {type(exc).__name__}: {exc}") from None


def _entry_tool(path: Path, index: int, entry: Any) -> BaseTool:
    where = f"tool config {path}: tools[{index}]"
    if not isinstance(entry, dict):
        raise ToolConfigError(f"{where}: expected a mapping with class_name, config and tool_schema, got {entry!r}")
    class_name = entry.get("class_name")
    if not isinstance(class_name, str) or not class_name:
        raise ToolConfigError(f"{where}: missing class_name (module.Class of a BaseTool subclass)")
    where = f"{where} ({class_name})"
    config = entry.get("config") or {}
    if not isinstance(config, dict):
        raise ToolConfigError(f"{where}: config must be a mapping, got {config!r}")
    tool_type = config.get("type", "native")
    if tool_type not in TOOL_TYPES:
        raise ToolConfigError(f"{where}: config.type {tool_type!r} is not supported (supported: "
                              f"{', '.join(TOOL_TYPES)}; MCP tools are not built)")
    try:
        cls = import_tool_class(class_name)
    except ValueError as exc:
        raise ToolConfigError(f"{where}: {exc}") from None
    schema = None
    if entry.get("tool_schema") is not None:
        try:
            schema = OpenAIFunctionToolSchema.model_validate(entry["tool_schema"])
        except Exception as exc:
            raise ToolConfigError(f"{where}: bad tool_schema: {schema_errors(exc)}") from None
    try:
        return cls(config=config, tool_schema=schema)
    except Exception as exc:
        raise ToolConfigError(f"{where}: creating the tool failed: {type(exc).__name__}: {exc}") from None


def load_tool_config(path: str | Path) -> list[BaseTool]:
    """The tools of a verl tool config YAML, in the file's order.

    Raises:
        ToolConfigError: one message naming the file, the entry and what is wrong.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise ToolConfigError(f"tool config {path}: no such file")
    data = _read_yaml(path)
    if not isinstance(data, dict) or not isinstance(data.get("tools"), list):
        raise ToolConfigError(f"tool config {path}: expected a top-level 'tools:' list of entries "
                              "(class_name, config, tool_schema)")
    return [_entry_tool(path, i, entry) for i, entry in enumerate(data["tools"])]


def load_tools(tool_config_path: str | Path | None = None,
               function_tool_path: str | Path | None = None) -> dict[str, BaseTool]:
    """Every configured tool by its function name: the tool config's, then the function-tool file's.

    Raises:
        ToolConfigError: a file that cannot be used, or two tools with the same name.
    """
    tools: dict[str, BaseTool] = {}
    sources = []
    if tool_config_path:
        sources += [(t, str(tool_config_path)) for t in load_tool_config(tool_config_path)]
    if function_tool_path:
        try:
            sources += [(t, str(function_tool_path)) for t in load_function_tools(function_tool_path)]
        except ValueError as exc:
            raise ToolConfigError(str(exc)) from None
    origin: dict[str, str] = {}
    for tool, source in sources:
        if tool.name in tools:
            raise ToolConfigError(f"tool name {tool.name!r} is defined twice ({origin[tool.name]} and {source}); "
                                  "tool names must be unique")
        tools[tool.name] = tool
        origin[tool.name] = source
    return tools
