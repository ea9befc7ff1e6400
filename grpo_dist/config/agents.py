"""Agent-loop rollouts from verl's keys: ``rollout.mode``, ``rollout.multi_turn.*`` and ``rollout.agent.*``.

``rollout.mode=async`` runs each trajectory as an agent loop against an asynchronous rollout server; the loop
of a row is its ``agent_name`` column, else ``rollout.agent.default_agent_loop``. Two loops are built in
(:data:`BUILTIN_AGENT_LOOPS`); a user's come from verl's YAML at ``rollout.agent.agent_loop_config_path``::

    - name: my_loop                       # what rows (and default_agent_loop) call it
      _target_: my_package.loops.MyLoop   # module.Class
      some_kwarg: 3                       # the rest: keyword arguments of the class

:func:`check_agents` validates these keys (one ``ConfigError`` naming the key, the value and what would be
valid); :func:`check_agent_files` reads the files they name: the tools of ``multi_turn.tool_config_path`` and
``function_tool_path`` are loaded (so a tool that cannot be built stops the run before any worker starts)
and the loop names of ``agent_loop_config_path`` are read (the classes are imported by the rollout replicas,
not here). :func:`agent_settings` is the frozen value the rollout replicas get.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from grpo_dist.agents.settings import SANITY_CHECK_MODES, TOOL_CALL_FORMATS, AgentSettings
from grpo_dist.config.checks import bad, check_exists, choice
from grpo_dist.tasks import BUILTIN_PREFIX
from grpo_dist.config.schema import GRPOConfig

__all__ = ["BUILTIN_AGENT_LOOPS", "MODES", "TRUNCATE_SIDES", "agent_settings", "check_agent_files", "check_agents",
           "default_agent_loop", "read_agent_loop_names"]

MODES = ("sync", "async")
#: The agent loops built in, by the names verl gives them.
BUILTIN_AGENT_LOOPS = ("single_turn_agent", "tool_agent")
TRUNCATE_SIDES = ("left", "right", "middle")

_R = "actor_rollout_ref.rollout."
_MT = _R + "multi_turn."
_AG = _R + "agent."


def default_agent_loop(cfg: GRPOConfig) -> str:
    """The loop of rows without an ``agent_name``: ``agent.default_agent_loop``, except that with
    ``multi_turn.enable`` and the key left at verl's default (``single_turn_agent``) it is ``tool_agent``,
    as in verl."""
    r = cfg.actor_rollout_ref.rollout
    name = r.agent.default_agent_loop
    if r.multi_turn.enable and name == "single_turn_agent":
        return "tool_agent"
    return name


def read_agent_loop_names(path: str) -> tuple[str, ...]:
    """The ``name:`` entries of verl's agent-loop YAML, in the file's order.

    Raises:
        ValueError: the file does not parse, is not a list of mappings each with a ``name`` and a
            ``_target_`` (module.Class), or names one loop twice.
    """
    from omegaconf import OmegaConf

    try:
        data = OmegaConf.to_container(OmegaConf.load(Path(path).expanduser()), resolve=True)
    except Exception as exc:
        raise ValueError(f"not valid YAML: {type(exc).__name__}: {exc}") from None
    if not isinstance(data, list):
        raise ValueError("expected a YAML list of agent loops, each '- name: ..., _target_: module.Class'")
    names: list[str] = []
    for i, entry in enumerate(data):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise ValueError(f"entry {i} has no name (expected '- name: ..., _target_: module.Class')")
        target = entry.get("_target_")
        if not isinstance(target, str) or "." not in target:
            raise ValueError(f"entry {i} ({entry['name']}) has no _target_ of the form module.Class")
        if entry["name"] in names:
            raise ValueError(f"the agent loop {entry['name']!r} is named twice")
        names.append(entry["name"])
    return tuple(names)


def _at_least_one(key: str, value: int | None, *, nullable: bool) -> None:
    if value is None and nullable:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise bad(key, value, "expected null (no limit) or an integer >= 1" if nullable else "expected an integer >= 1")


def check_agents(cfg: GRPOConfig) -> None:
    """``ConfigError`` for the first agent-loop key with a value that cannot run; the files they name are
    checked by :func:`check_agent_files`."""
    r = cfg.actor_rollout_ref.rollout
    mt, ag = r.multi_turn, r.agent
    choice(_R + "mode", r.mode, MODES)
    if mt.enable and r.mode != "async":
        raise bad(_MT + "enable", True, "multi-turn rollouts run as agent loops: set actor_rollout_ref.rollout.mode=async")
    _at_least_one(_AG + "num_workers", ag.num_workers, nullable=False)
    _at_least_one(_MT + "max_assistant_turns", mt.max_assistant_turns, nullable=True)
    _at_least_one(_MT + "max_user_turns", mt.max_user_turns, nullable=True)
    _at_least_one(_MT + "max_parallel_calls", mt.max_parallel_calls, nullable=False)
    _at_least_one(_MT + "max_tool_response_length", mt.max_tool_response_length, nullable=False)
    choice(_MT + "tool_response_truncate_side", mt.tool_response_truncate_side, TRUNCATE_SIDES)
    choice(_MT + "tokenization_sanity_check_mode", mt.tokenization_sanity_check_mode, SANITY_CHECK_MODES)
    if mt.format not in TOOL_CALL_FORMATS:
        raise bad(_MT + "format", mt.format, "the tool-call formats built here are " + ", ".join(TOOL_CALL_FORMATS)
                  + " (<tool_call>{json}</tool_call>)")
    loop = default_agent_loop(cfg)
    if loop not in BUILTIN_AGENT_LOOPS and not ag.agent_loop_config_path:
        raise bad(_AG + "default_agent_loop", ag.default_agent_loop, "the built-in agent loops are "
                  + ", ".join(BUILTIN_AGENT_LOOPS) + "; a loop of your own is named in a YAML given as "
                  "actor_rollout_ref.rollout.agent.agent_loop_config_path")


def tool_paths(cfg: GRPOConfig) -> tuple[str | None, str | None]:
    """``multi_turn.tool_config_path`` and ``function_tool_path`` as files: an embedded name (``builtin:...``,
    e.g. the calculator task's tool file) resolved to its path, ``~`` expanded."""
    from grpo_dist import tasks

    mt = cfg.actor_rollout_ref.rollout.multi_turn
    return tuple(tasks.resolve(p) if p else None for p in (mt.tool_config_path, mt.function_tool_path))


def check_agent_files(cfg: GRPOConfig) -> None:
    """The files the agent keys name: they exist, the tools load (``ToolConfigError``'s message, prefixed by the
    key), the agent-loop YAML parses and names the default loop (unless it is a built-in one)."""
    loop = default_agent_loop(cfg)
    mt, ag = cfg.actor_rollout_ref.rollout.multi_turn, cfg.actor_rollout_ref.rollout.agent
    for key, path in (("tool_config_path", mt.tool_config_path), ("function_tool_path", mt.function_tool_path)):
        if path:
            check_exists(_MT + key, path, kind="tools" if path.startswith(BUILTIN_PREFIX) else "file")
    # the tool config alone, then with the function tools: an error of the second load is the function file's
    # (or a name both define), so each message is prefixed by the key of the file at fault
    tool_config, function_tools = tool_paths(cfg)
    for key, files in (("tool_config_path", (tool_config, None)), ("function_tool_path", (tool_config, function_tools))):
        if not getattr(mt, key):
            continue
        from grpo_dist.tools.registry import ToolConfigError, load_tools  # pydantic (~0.15 s): only for tools

        try:
            load_tools(*files)
        except ToolConfigError as exc:
            raise bad(_MT + key, getattr(mt, key), str(exc)) from None
    path = ag.agent_loop_config_path
    if path:
        check_exists(_AG + "agent_loop_config_path", path, kind="file")
        try:
            names = read_agent_loop_names(path)
        except ValueError as exc:
            raise bad(_AG + "agent_loop_config_path", path, str(exc)) from None
        if loop not in BUILTIN_AGENT_LOOPS + names:
            raise bad(_AG + "default_agent_loop", ag.default_agent_loop, "expected a built-in agent loop ("
                      + ", ".join(BUILTIN_AGENT_LOOPS) + f") or one named in {path} (" + ", ".join(names) + ")")


def _plain(obj: Any) -> Any:
    """A copy of ``obj`` as plain dicts and lists: dataclasses become dicts of their fields. Fields are read
    without attribute hooks (``object.__getattribute__``): handing the whole configuration to a user's loop is
    not a use of each key (``tests/unit/test_key_walk.py``)."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(object.__getattribute__(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def agent_settings(cfg: GRPOConfig) -> AgentSettings | None:
    """The agent loops' settings of a validated configuration; None with ``rollout.mode=sync``."""
    r = cfg.actor_rollout_ref.rollout
    if r.mode != "async":
        return None
    mt = r.multi_turn
    tool_config, function_tools = tool_paths(cfg)
    return AgentSettings(
        default_agent_loop=default_agent_loop(cfg),
        agent_loop_config_path=r.agent.agent_loop_config_path,
        prompt_length=int(r.prompt_length),
        response_length=int(r.response_length),
        tool_config_path=tool_config,
        function_tool_path=function_tools,
        max_assistant_turns=mt.max_assistant_turns,
        max_user_turns=mt.max_user_turns,
        max_parallel_calls=int(mt.max_parallel_calls),
        max_tool_response_length=int(mt.max_tool_response_length),
        tool_response_truncate_side=mt.tool_response_truncate_side,
        tokenization_sanity_check_mode=mt.tokenization_sanity_check_mode,
        format=mt.format,
        apply_chat_template_kwargs=dict(cfg.data.apply_chat_template_kwargs),
        trainer_config=_plain(cfg),
    )
