"""What an agent-loop rollout needs from the run's configuration, in one frozen value (built by
:func:`grpo_dist.config.agents.agent_settings` from verl's ``rollout.agent.*`` and ``rollout.multi_turn.*``
keys, shipped to every rollout replica)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: ``rollout.multi_turn.tokenization_sanity_check_mode`` values (verl's).
SANITY_CHECK_MODES = ("strict", "ignore_strippable", "disable")
#: ``rollout.multi_turn.format`` values built here.
TOOL_CALL_FORMATS = ("hermes",)


@dataclass(frozen=True, kw_only=True)
class AgentSettings:
    """The agent loops of one run.

    Attributes:
        default_agent_loop: the loop of rows without an ``agent_name`` (``rollout.agent.default_agent_loop``;
            ``tool_agent`` when ``multi_turn.enable`` and the key is left at verl's default).
        agent_loop_config_path: verl's YAML of user loops (``- name: ..., _target_: module.Class, ...kwargs``).
        prompt_length: ``rollout.prompt_length``: the most prompt tokens (a tool agent's prompt with the tool
            schemas rendered included).
        response_length: ``rollout.response_length``: the most response tokens of a trajectory, model and tool
            tokens together (the budget).
        tool_config_path: verl's tool config YAML (``multi_turn.tool_config_path``).
        function_tool_path: a Python file of ``@function_tool`` functions (``multi_turn.function_tool_path``).
        max_assistant_turns: the most model turns of a trajectory; None = until the budget.
        max_user_turns: the most user (tool-response) turns; None = until the budget.
        max_parallel_calls: the most tool calls of one model turn that run (at once); extra calls are ignored.
        max_tool_response_length: a tool response's text is cut to this many characters.
        tool_response_truncate_side: ``left`` | ``right`` | ``middle``.
        tool_timeout_s: seconds one tool call may take (create + execute) before the model gets an error.
        tokenization_sanity_check_mode: ``strict`` | ``ignore_strippable`` | ``disable``.
        format: the tool-call format the model writes (``hermes``: ``<tool_call>{json}</tool_call>``).
        apply_chat_template_kwargs: ``data.apply_chat_template_kwargs``.
        trainer_config: the run's resolved configuration as plain containers (user loops read
            ``self.config.actor_rollout_ref...`` as in verl).
    """

    default_agent_loop: str = "single_turn_agent"
    agent_loop_config_path: str | None = None
    prompt_length: int
    response_length: int
    tool_config_path: str | None = None
    function_tool_path: str | None = None
    max_assistant_turns: int | None = None
    max_user_turns: int | None = None
    max_parallel_calls: int = 1
    max_tool_response_length: int = 256
    tool_response_truncate_side: str = "middle"
    tool_timeout_s: float = 30.0
    tokenization_sanity_check_mode: str = "strict"
    format: str = "hermes"
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    trainer_config: dict[str, Any] = field(default_factory=dict)
