"""``tool_agent``: the model calls tools between its turns (verl's ``ToolAgentLoop``).

One trajectory, as a loop of turns::

    prompt = chat template over raw_prompt, tools=[schemas], add_generation_prompt=True
    repeat:
        generate (max_tokens = response_length - tokens so far)   -> model tokens, mask 1, their log-probs
        parse hermes calls in this turn's text: <tool_call>{"name": ..., "arguments": {...}}</tool_call>
        stop when: no call | the turn ended by length | max_assistant_turns | the budget is spent
        run up to max_parallel_calls calls at once (run_tool_call: faults become error text for the model)
        the tool messages rendered by the chat template           -> template tokens, mask 0, log-prob 0.0
        stop when: max_user_turns | the budget is spent
    response cut to response_length (cut_by_budget = 1 when the budget ended the trajectory)

The model's tokens are appended exactly as sampled, never re-tokenised. The tokens between two model
turns are what the chat template renders there: the rest of the model's message after its stop token
(e.g. the ``"\\n"`` after ``<|im_end|>`` of ChatML), the tool messages, and the next generation prompt.
They are found by rendering a fixed short conversation with and without the tool messages after it, so a
template that puts a default system prompt before the first message adds nothing in between. The fixed
conversation is a user and an assistant message, or only a user message for templates that render an
assistant message differently once more messages follow (Qwen3 drops an empty think block).

``tokenization_sanity_check_mode`` compares the trajectory with the chat template's one-shot rendering of
all its messages (each model turn's decoded text as an assistant message with its tool calls, the tool
messages): ``strict`` needs identical ids, ``ignore_strippable`` identical text once whitespace is removed,
``disable`` skips the check. A mismatch sets ``metrics["tokenization_mismatch"] = 1`` and logs one warning
per process; it never stops the run.

Per-turn seed: ``seed + turn * 1_000_003`` (turn = 0, 1, ... over the model turns) when a seed is given.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

from grpo_dist.agents.base import AgentLoopBase, AgentLoopOutput, register
from grpo_dist.agents.single_turn import check_prompt_length, require_settings
from grpo_dist.agents.settings import TOOL_CALL_FORMATS, AgentSettings
from grpo_dist.tools.base_tool import BaseTool
from grpo_dist.tools.calls import ERROR_KINDS, ERROR_PREFIX, run_tool_call
from grpo_dist.tools.registry import load_tools
from grpo_dist.tools.schemas import ToolResponse

logger = logging.getLogger(__name__)

SEED_STRIDE = 1_000_003
TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
# fixed conversations the tool turns are rendered after (their text is never part of a trajectory), in the
# order tried: the first whose rendering does not change when tool messages follow is used
_ANCHORS = ([{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}],
            [{"role": "user", "content": "u"}])
_warned_mismatch = False


@dataclass(frozen=True)
class ToolCall:
    """One ``<tool_call>`` block of a model turn.

    Attributes:
        name: the function name ("" when the block did not say).
        arguments: the arguments as written: a dict, or a JSON string (verl accepts both).
        error: why the block is not a usable call (not JSON, no name), or None.
    """

    name: str
    arguments: dict | str
    error: str | None = None


def parse_hermes_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """The hermes tool calls of one model turn's text, in order, and the text without them (stripped).

    A block that is not a JSON object with a string ``name`` becomes a call with ``error`` set (the model is
    told what is wrong, as verl does for a parse error).
    """
    calls = []
    for body in TOOL_CALL_RE.findall(text):
        try:
            value = json.loads(body)
        except json.JSONDecodeError as exc:
            calls.append(ToolCall("", body, f"the tool call is not valid JSON ({exc})"))
            continue
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            calls.append(ToolCall("", body, "the tool call must be a JSON object with a string 'name' and "
                                            "'arguments'"))
            continue
        arguments = value.get("arguments", {})
        if not isinstance(arguments, (dict, str)):
            arguments = json.dumps(arguments)  # run_tool_call tells the model it is not an object
        calls.append(ToolCall(value["name"], arguments))
    return TOOL_CALL_RE.sub("", text).strip(), calls


async def _parse_error(call: ToolCall) -> tuple[ToolResponse, float, dict[str, float]]:
    """The response and metrics of a block that is not a call (counted as invalid arguments)."""
    metrics = {"tool_calls": 1.0, "tool_errors": 1.0, "tool_truncated": 0.0, "tool_wall_s": 0.0}
    metrics.update({f"tool_errors/{kind}": float(kind == "invalid_arguments") for kind in ERROR_KINDS})
    hint = 'write <tool_call>{"name": "<tool name>", "arguments": {...}}</tool_call>'
    return ToolResponse(text=f"{ERROR_PREFIX}{call.error}; {hint}"), 0.0, metrics


def tool_schemas(tools: dict[str, BaseTool]) -> list[dict]:
    """The tools as the chat template's ``tools=`` gets them (verl's dump: no unset or None fields)."""
    return [t.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for t in tools.values()]


def _assistant_message(content: str, calls: list[ToolCall]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    tool_calls = []
    for call in calls:
        if call.error is not None:
            continue
        arguments = call.arguments
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                continue
        tool_calls.append({"type": "function", "function": {"name": call.name, "arguments": arguments}})
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


@register("tool_agent")
class ToolAgentLoop(AgentLoopBase):
    """verl's tool agent loop over hermes tool calls (see the module doc)."""

    tools: dict[str, BaseTool] = {}
    _tools_key: tuple | None = None

    def __init__(self, trainer_config: Any, server_manager: Any, tokenizer: Any, processor: Any = None,
                 **kwargs: Any) -> None:
        self.settings: AgentSettings = require_settings("tool_agent", kwargs)
        super().__init__(trainer_config, server_manager, tokenizer, processor, **kwargs)
        self.tool_schemas = tool_schemas(self.tools) or None
        self._tails: dict[int, list[int]] = {}

    @classmethod
    def init_class(cls, config: Any, tokenizer: Any, processor: Any = None, **kwargs: Any) -> None:
        """Load the configured tools once per process (again only when the tool paths change)."""
        settings = require_settings("tool_agent", kwargs)
        if settings.format not in TOOL_CALL_FORMATS:
            raise ValueError(f"tool_agent: tool-call format {settings.format!r} is not built; "
                             f"rollout.multi_turn.format must be one of {', '.join(TOOL_CALL_FORMATS)}")
        key = (settings.tool_config_path, settings.function_tool_path)
        if cls.__dict__.get("_class_initialized") and cls._tools_key == key:
            return
        cls.tools = load_tools(settings.tool_config_path, settings.function_tool_path)
        cls._tools_key = key
        cls._class_initialized = True
        logger.info("tool_agent: %d tool(s): %s", len(cls.tools), ", ".join(cls.tools) or "none")

    # -- chat-template rendering ---------------------------------------------------------------------
    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=self.tool_schemas, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt,
                                                  **self.settings.apply_chat_template_kwargs)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _tail_after(self, stop_token: int) -> list[int]:
        """What the template renders after an assistant message's last token ``stop_token`` (e.g. ChatML's
        ``"\\n"`` after ``<|im_end|>``); [] when the template does not end a message with that token or the
        token is not a special token (a plain token may occur anywhere in the rendering)."""
        if stop_token not in self._tails:
            ids = self._encode(self._render(_ANCHORS[0], False))
            special = stop_token in set(self.tokenizer.all_special_ids)
            at = [i for i, t in enumerate(ids) if t == stop_token] if special else []
            self._tails[stop_token] = ids[at[-1] + 1:] if at else []
        return self._tails[stop_token]

    def _tool_turn_ids(self, tool_messages: list[dict]) -> list[int]:
        """The template's tokens for ``tool_messages`` and the next generation prompt, rendered after a fixed
        conversation (so that no system prompt or other prefix of the template comes with them)."""
        problems = []
        for anchor in _ANCHORS:
            try:
                base = self._render(anchor, False)
                full = self._render(anchor + tool_messages, True)
            except Exception as exc:  # a template may refuse a conversation shape (e.g. a tool after a user)
                problems.append(f"{type(exc).__name__}: {exc}")
                continue
            if full.startswith(base):
                return self._encode(full[len(base):])
            problems.append("the earlier messages render differently once tool messages follow")
        raise ValueError("tool_agent: the chat template cannot render a tool turn on its own (tried after a "
                         f"user+assistant and after a user message: {'; '.join(problems)}); use a template that "
                         "renders earlier messages independently of later ones")

    # -- the loop ------------------------------------------------------------------------------------
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        s = self.settings
        if kwargs.get("raw_prompt") is None:
            raise ValueError("tool_agent: the row has no raw_prompt (the chat messages the loop renders with tools)")
        messages = [dict(m) for m in kwargs["raw_prompt"]]
        prompt_ids = self._encode(self._render(messages, True))
        check_prompt_length("tool_agent", prompt_ids, s)
        tools_kwargs = kwargs.get("tools_kwargs") or (kwargs.get("extra_info") or {}).get("tools_kwargs") or {}
        want_logprobs = bool(sampling_params.get("logprobs"))
        seed = sampling_params.get("seed")
        trajectory_id = uuid4().hex

        ids: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        # every trajectory reports the same keys (the caller averages them over the batch)
        metrics: dict[str, float] = {"tool_calls": 0.0, "tool_errors": 0.0, "tool_truncated": 0.0, "tool_wall_s": 0.0,
                                     **{f"tool_errors/{kind}": 0.0 for kind in ERROR_KINDS}}
        tool_rewards: list[float] = []
        assistant_turns = user_turns = 0
        cut = False
        last_stop = "stop"
        ends_with_model_turn = True

        while True:
            budget = s.response_length - len(ids)
            if budget <= 0:
                cut = True
                break
            params = {**sampling_params, "max_tokens": budget}
            if seed is not None:
                params["seed"] = int(seed) + assistant_turns * SEED_STRIDE
            out = await self.server_manager.generate(f"{trajectory_id}-{assistant_turns}", prompt_ids=prompt_ids + ids,
                                                     sampling_params=params)
            turn_ids = [int(t) for t in out.token_ids]
            if want_logprobs and (out.log_probs is None or len(out.log_probs) != len(turn_ids)):
                raise ValueError(f"tool_agent: the server returned {len(turn_ids)} tokens with "
                                 f"{'no' if out.log_probs is None else len(out.log_probs)} log-probs in turn "
                                 f"{assistant_turns}; logprobs=True needs one per token")
            ids += turn_ids
            mask += [1] * len(turn_ids)
            logprobs += [float(x) for x in out.log_probs] if want_logprobs else []
            assistant_turns += 1
            last_stop = out.stop_reason
            ends_with_model_turn = True
            content, calls = parse_hermes_tool_calls(self.tokenizer.decode(turn_ids, skip_special_tokens=True))
            messages.append(_assistant_message(content, calls))
            if last_stop != "stop":
                cut = len(ids) >= s.response_length
                break
            if not calls or (s.max_assistant_turns is not None and assistant_turns >= s.max_assistant_turns):
                break
            if len(ids) >= s.response_length:
                cut = True
                break

            tool_messages, rewards, call_metrics = await self._run_calls(calls[: s.max_parallel_calls], tools_kwargs)
            tool_rewards += rewards
            for key, value in call_metrics.items():
                metrics[key] = metrics.get(key, 0.0) + value
            delta = (self._tail_after(turn_ids[-1]) if turn_ids else []) + self._tool_turn_ids(tool_messages)
            messages += tool_messages
            ids += delta
            mask += [0] * len(delta)
            logprobs += [0.0] * len(delta) if want_logprobs else []
            user_turns += 1
            ends_with_model_turn = False
            if len(ids) >= s.response_length:
                cut = True
                break
            if s.max_user_turns is not None and user_turns >= s.max_user_turns:
                break

        metrics["tokenization_mismatch"] = 0.0
        if s.tokenization_sanity_check_mode != "disable" and not (ends_with_model_turn and last_stop != "stop"):
            trajectory = prompt_ids + ids
            if ends_with_model_turn and ids:
                trajectory = trajectory + self._tail_after(ids[-1])
            metrics["tokenization_mismatch"] = float(not self._matches_one_shot(trajectory, messages,
                                                                                not ends_with_model_turn))
        metrics.update({"num_turns": float(1 + assistant_turns + user_turns), "cut_by_budget": float(cut)})
        R = s.response_length
        return AgentLoopOutput(prompt_ids=prompt_ids, response_ids=ids[:R], response_mask=mask[:R],
                               response_logprobs=logprobs[:R] if want_logprobs else None,
                               num_turns=1 + assistant_turns + user_turns, metrics=metrics,
                               extra_fields={"tool_rewards": tool_rewards},
                               finished_by_eos=last_stop == "stop" and not cut)

    async def _run_calls(self, calls: list[ToolCall], tools_kwargs: dict) -> tuple[list[dict], list[float], dict]:
        """Run ``calls`` at once; their tool messages (in the calls' order), rewards and summed metrics."""
        s = self.settings
        results = await asyncio.gather(*(
            _parse_error(call) if call.error is not None else
            run_tool_call(self.tools, call.name, call.arguments, timeout_s=s.tool_timeout_s,
                          max_chars=s.max_tool_response_length, truncate_side=s.tool_response_truncate_side,
                          tools_kwargs=tools_kwargs)
            for call in calls))
        metrics: dict[str, float] = {}
        for _, _, call_metrics in results:
            for key, value in call_metrics.items():
                metrics[key] = metrics.get(key, 0.0) + float(value)
        return ([{"role": "tool", "content": response.text or ""} for response, _, _ in results],
                [float(reward) for _, reward, _ in results], metrics)

    def _matches_one_shot(self, trajectory: list[int], messages: list[dict], add_generation_prompt: bool) -> bool:
        """Whether ``trajectory`` is what the chat template renders for ``messages`` at once (per the mode)."""
        global _warned_mismatch
        one_shot = self._encode(self._render(messages, add_generation_prompt))
        if self.settings.tokenization_sanity_check_mode == "strict":
            same = one_shot == trajectory
        else:  # ignore_strippable
            same = ("".join(self.tokenizer.decode(one_shot).split())
                    == "".join(self.tokenizer.decode(trajectory).split()))
        if not same and not _warned_mismatch:
            _warned_mismatch = True
            logger.warning("tool_agent: a trajectory's tokens differ from the chat template's one-shot rendering "
                           "of its messages (tokenization_sanity_check_mode=%s); counted in "
                           "metrics['tokenization_mismatch'], warned once per process.\ntrajectory: %r\none-shot:   %r",
                           self.settings.tokenization_sanity_check_mode, self.tokenizer.decode(trajectory),
                           self.tokenizer.decode(one_shot))
        return same
