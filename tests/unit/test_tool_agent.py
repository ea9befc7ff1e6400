"""tool_agent (grpo_dist/agents/tool_agent.py): hermes tool calls parsed from the model's turn, run (in
parallel, faults turned into error text for the model and counted), the tool turn rendered by the chat
template with mask 0, the model's tokens kept exactly as sampled with their log-probs, the budget and turn
limits, per-turn seeds, and the tokenization sanity check. The rollout server is scripted."""

from __future__ import annotations

import json
import logging

import pytest

from grpo_dist.agents import tool_agent
from grpo_dist.agents.runner import run_trajectories_sync
from grpo_dist.tools.calls import ERROR_PREFIX
from tests.unit.test_agent_loops import EOS, ScriptedServer, hermes_tokenizer, sampling, settings, turn_logprob

TOOLS_PY = '''
import asyncio

from grpo_dist.tools.function_tool import function_tool

ARRIVED = {"n": 0}


@function_tool
async def add(a: int, b: int) -> str:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return str(a + b)


@function_tool
async def meet(who: str) -> str:
    """Answer once three calls are running at the same time.

    Args:
        who: the caller
    """
    ARRIVED["n"] += 1
    while ARRIVED["n"] < 3:
        await asyncio.sleep(0.01)
    return "met " + who


@function_tool
def boom(x: str) -> str:
    """Fail.

    Args:
        x: anything
    """
    raise RuntimeError("kaboom")


@function_tool
async def hang(x: str) -> str:
    """Never answer.

    Args:
        x: anything
    """
    await asyncio.sleep(60)
    return x


@function_tool
async def scored(x: str) -> tuple:
    """Answer with a reward and a metric.

    Args:
        x: anything
    """
    return "scored " + x, 0.5, {"hits": 2}


@function_tool
def big(x: str) -> str:
    """A long answer.

    Args:
        x: anything
    """
    return "y" * 500
'''

GSM8K_CONFIG = """
tools:
  - class_name: verl.tools.gsm8k_tool.Gsm8kTool
    config: {type: native}
    tool_schema:
      type: function
      function:
        name: calc_gsm8k_reward
        description: Score the answer.
        parameters:
          type: object
          properties:
            answer: {type: string, description: the answer}
          required: [answer]
"""

MESSAGES = [{"role": "user", "content": "add 1 and 2"}]


def call(name: str, arguments) -> str:
    """A hermes tool call block exactly as the test template renders one."""
    return '<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>' % (name, json.dumps(arguments))


@pytest.fixture
def tools_py(tmp_path):
    path = tmp_path / "tools_fns.py"
    path.write_text(TOOLS_PY)
    return str(path)


def run(script, tools_py=None, rows=None, *, seed=None, logprobs=True, **kw):
    tok = hermes_tokenizer()
    server = ScriptedServer(tok, script)
    kw.setdefault("tool_timeout_s", 5.0)
    kw.setdefault("response_length", 1024)
    s = settings(default_agent_loop="tool_agent", function_tool_path=tools_py, **kw)
    outs = run_trajectories_sync(rows or [{"raw_prompt": MESSAGES}], sampling(seed=seed, logprobs=logprobs),
                                 server=server, tokenizer=tok, settings=s)
    return outs, server, tok


def segments(out):
    """The response as (mask, token ids) runs."""
    runs = []
    for t, m in zip(out.response_ids, out.response_mask):
        if runs and runs[-1][0] == m:
            runs[-1][1].append(t)
        else:
            runs.append((m, [t]))
    return runs


def tool_texts(out, tok) -> list[str]:
    return [tok.decode(ids) for m, ids in segments(out) if m == 0]


# ---------------------------------------------------------------------------------------------
# one call, token by token
# ---------------------------------------------------------------------------------------------
def test_a_tool_round_trip_keeps_model_tokens_and_masks_the_template_tokens(tools_py):
    turn0 = "Let me add.\n" + call("add", {"a": 1, "b": 2})
    turn1 = "It is 3."
    (out,), server, tok = run([turn0, turn1], tools_py)
    enc = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    schemas = tool_agent.tool_schemas(tool_agent.ToolAgentLoop.tools)
    assert out.prompt_ids == enc(tok.apply_chat_template(MESSAGES, tools=schemas, tokenize=False,
                                                         add_generation_prompt=True))
    assert "# Tools" in tok.decode(out.prompt_ids) and '"name": "add"' in tok.decode(out.prompt_ids)

    model0, model1 = enc(turn0) + [EOS], enc(turn1) + [EOS]
    tool_turn = enc("\n<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert out.response_ids == model0 + tool_turn + model1
    assert out.response_mask == [1] * len(model0) + [0] * len(tool_turn) + [1] * len(model1)
    assert out.response_logprobs == ([turn_logprob(0, k) for k in range(len(model0))] + [0.0] * len(tool_turn)
                                     + [turn_logprob(1, k) for k in range(len(model1))])
    # the second turn continues exactly from what the first left, with the budget left
    assert server.calls[1]["prompt_ids"] == out.prompt_ids + model0 + tool_turn
    assert server.calls[1]["params"]["max_tokens"] == 1024 - len(model0) - len(tool_turn)
    assert out.num_turns == 4 and out.finished_by_eos
    assert out.metrics["tool_calls"] == 1 and out.metrics["tool_errors"] == 0
    assert out.metrics["cut_by_budget"] == 0 and out.metrics["tokenization_mismatch"] == 0
    assert out.metrics["num_turns"] == 4 and out.metrics["tool_wall_s"] >= 0
    assert out.extra_fields["tool_rewards"] == [0.0]


def test_the_trajectory_is_the_templates_one_shot_rendering_without_a_second_system_prompt(tools_py):
    (out,), _, tok = run(["Let me add.\n" + call("add", {"a": 1, "b": 2}), "It is 3."], tools_py)
    text = tok.decode(out.prompt_ids + out.response_ids)
    assert text.count("You are a helpful assistant.") == 1
    schemas = tool_agent.tool_schemas(tool_agent.ToolAgentLoop.tools)
    messages = MESSAGES + [
        {"role": "assistant", "content": "Let me add.",
         "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]},
        {"role": "tool", "content": "3"}, {"role": "assistant", "content": "It is 3."}]
    assert text + "\n" == tok.apply_chat_template(messages, tools=schemas, tokenize=False)


def test_arguments_may_be_a_json_string_and_a_row_without_logprobs_gets_none(tools_py):
    block = '<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 2, \\"b\\": 5}"}\n</tool_call>'
    (out,), _, tok = run([block, "7"], tools_py, logprobs=False)
    assert "<tool_response>\n7\n</tool_response>" in tool_texts(out, tok)[0]
    assert out.response_logprobs is None and out.metrics["tool_errors"] == 0


# ---------------------------------------------------------------------------------------------
# parallel calls
# ---------------------------------------------------------------------------------------------
def test_the_calls_of_one_turn_run_concurrently(tools_py):
    turn0 = "\n".join(call("meet", {"who": w}) for w in "abc")
    (out,), _, tok = run([turn0, "done"], tools_py, max_parallel_calls=3, tool_timeout_s=3.0)
    (text,) = tool_texts(out, tok)  # meet answers only when all three run at once; else one times out
    assert [line for line in text.split("\n") if line.startswith("met")] == ["met a", "met b", "met c"]
    assert out.metrics["tool_calls"] == 3 and out.metrics["tool_errors"] == 0


def test_calls_beyond_max_parallel_calls_are_ignored(tools_py):
    turn0 = "".join(call("add", {"a": i, "b": 0}) for i in range(4))
    (out,), _, tok = run([turn0, "done"], tools_py, max_parallel_calls=2)
    (text,) = tool_texts(out, tok)
    assert text.count("<tool_response>") == 2 and "\n0\n" in text and "\n1\n" in text
    assert out.metrics["tool_calls"] == 2


# ---------------------------------------------------------------------------------------------
# every fault gives the model an error text, counted
# ---------------------------------------------------------------------------------------------
def test_every_fault_becomes_an_error_for_the_model_and_is_counted(tools_py):
    turn0 = "".join([call("boom", {"x": "1"}), call("hang", {"x": "1"}), call("big", {"x": "1"}),
                     '<tool_call>\n{"name": "add", "arguments": {"a": 1,\n</tool_call>', call("nope", {})])
    (out,), _, tok = run([turn0, "sorry"], tools_py, max_parallel_calls=5, tool_timeout_s=0.5,
                         max_tool_response_length=20, response_length=2048)
    (text,) = tool_texts(out, tok)
    responses = text.split("<tool_response>\n")[1:]
    assert len(responses) == 5
    assert responses[0].startswith(ERROR_PREFIX) and "kaboom" in responses[0]
    assert responses[1].startswith(ERROR_PREFIX) and "did not finish within 0.5 s" in responses[1]
    assert "(truncated)" in responses[2] and not responses[2].startswith(ERROR_PREFIX)
    assert responses[3].startswith(ERROR_PREFIX) and "not valid JSON" in responses[3]
    assert responses[4].startswith(ERROR_PREFIX) and "no tool named 'nope'" in responses[4]
    m = out.metrics
    assert (m["tool_calls"], m["tool_errors"], m["tool_truncated"]) == (5, 4, 1)
    assert [m[f"tool_errors/{k}"] for k in ("exception", "timeout", "invalid_arguments", "unknown_tool")] == [1] * 4
    last_mask, last_ids = segments(out)[-1]
    assert last_mask == 1 and tok.decode(last_ids) == "sorry<|im_end|>" and out.finished_by_eos


# ---------------------------------------------------------------------------------------------
# budget and turn limits
# ---------------------------------------------------------------------------------------------
def test_a_tool_turn_past_the_budget_is_cut_and_marked(tools_py):
    turn0 = call("add", {"a": 1, "b": 2})
    budget = len(turn0) + 1 + 5
    (out,), server, _ = run([turn0, "never"], tools_py, response_length=budget)
    assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs) == budget
    assert out.response_mask[-5:] == [0] * 5
    assert len(server.calls) == 1
    assert out.metrics["cut_by_budget"] == 1 and not out.finished_by_eos


def test_a_model_turn_cut_at_the_budget_runs_no_tool(tools_py):
    (out,), server, _ = run([call("add", {"a": 1, "b": 2})], tools_py, response_length=10)
    assert server.calls[0]["params"]["max_tokens"] == 10
    assert out.response_mask == [1] * 10
    assert out.metrics["tool_calls"] == 0 and out.metrics["cut_by_budget"] == 1 and not out.finished_by_eos


def test_max_assistant_turns_stops_before_the_tools(tools_py):
    (out,), server, _ = run([call("add", {"a": 1, "b": 2})] * 3, tools_py, max_assistant_turns=1)
    assert len(server.calls) == 1 and out.num_turns == 2
    assert set(out.response_mask) == {1} and out.metrics["tool_calls"] == 0 and out.finished_by_eos
    # a trajectory without calls reports the same keys, at 0 (the batch averages them)
    assert out.metrics["tool_errors/timeout"] == 0 and out.metrics["tool_truncated"] == 0


def test_max_user_turns_stops_after_that_many_tool_turns(tools_py):
    (out,), server, _ = run([call("add", {"a": 1, "b": 2})] * 3, tools_py, max_user_turns=2)
    assert len(server.calls) == 2 and out.num_turns == 5
    assert [m for m, _ in segments(out)] == [1, 0, 1, 0]
    assert out.metrics["tool_calls"] == 2 and out.metrics["cut_by_budget"] == 0


def test_each_turn_has_its_own_seed_and_the_trajectory_one_request_id_prefix(tools_py):
    _, server, _ = run([call("add", {"a": 1, "b": 2}), "3"], tools_py, seed=7)
    assert [c["params"]["seed"] for c in server.calls] == [7, 7 + 1_000_003]
    ids = [c["request_id"] for c in server.calls]
    assert ids[0].rsplit("-", 1) == [ids[1].rsplit("-", 1)[0], "0"] and ids[1].endswith("-1")


def test_tools_kwargs_come_from_extra_info_or_the_row_and_tool_rewards_are_kept(tmp_path):
    config = tmp_path / "tools.yaml"
    config.write_text(GSM8K_CONFIG)
    kwargs = {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "42"}}}
    rows = [{"raw_prompt": MESSAGES, "extra_info": {"tools_kwargs": kwargs}},
            {"raw_prompt": MESSAGES, "tools_kwargs": kwargs}]
    tok = hermes_tokenizer()
    server = ScriptedServer(tok, lambda t, p, params: call("calc_gsm8k_reward", {"answer": "42" if t == 0 else "41"}))
    s = settings(default_agent_loop="tool_agent", tool_config_path=str(config), max_user_turns=2, response_length=1024)
    outs = run_trajectories_sync(rows, sampling(), server=server, tokenizer=tok, settings=s)
    for out in outs:
        texts = tool_texts(out, tok)
        assert "reward=1.0" in texts[0] and "reward=0.0" in texts[1]
        assert out.extra_fields["tool_rewards"] == [0.0, -0.05]


# ---------------------------------------------------------------------------------------------
# tokenization sanity check
# ---------------------------------------------------------------------------------------------
WHITESPACE_ONLY = "Let me add.\n\n" + call("add", {"a": 1, "b": 2})  # the template renders one "\n"
REORDERED = '<tool_call>\n{"arguments": {"a": 1, "b": 2}, "name": "add"}\n</tool_call>'


@pytest.mark.parametrize("turn0, mode, flagged", [
    (WHITESPACE_ONLY, "strict", 1), (WHITESPACE_ONLY, "ignore_strippable", 0), (WHITESPACE_ONLY, "disable", 0),
    (REORDERED, "strict", 1), (REORDERED, "ignore_strippable", 1), (REORDERED, "disable", 0),
])
def test_the_sanity_check_flags_what_the_mode_asks_and_never_raises(tools_py, turn0, mode, flagged):
    (out,), _, _ = run([turn0, "It is 3."], tools_py, tokenization_sanity_check_mode=mode)
    assert out.metrics["tokenization_mismatch"] == flagged
    assert out.metrics["tool_calls"] == 1 and out.finished_by_eos


def test_a_mismatch_warns_once_per_process(tools_py, monkeypatch, caplog):
    monkeypatch.setattr(tool_agent, "_warned_mismatch", False)
    with caplog.at_level(logging.WARNING, logger=tool_agent.__name__):
        outs, _, _ = run([REORDERED, "3"], tools_py, rows=[{"raw_prompt": MESSAGES}] * 3)
    assert [o.metrics["tokenization_mismatch"] for o in outs] == [1, 1, 1]
    assert len([r for r in caplog.records if "one-shot rendering" in r.getMessage()]) == 1


def test_parse_hermes_tool_calls():
    content, calls = tool_agent.parse_hermes_tool_calls(
        'think\n<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>\n<tool_call>[1]</tool_call>'
        '<tool_call>{"name": "g", "arguments": "{}"}</tool_call>')
    assert content == "think"
    assert [(c.name, c.arguments, c.error is None) for c in calls] == [("f", {"x": 1}, True), ("", "[1]", False),
                                                                       ("g", "{}", True)]


def test_a_template_that_renders_the_last_assistant_message_differently_still_gets_its_tool_turn(tools_py):
    # like Qwen3: the last assistant message gets an empty think block, earlier ones do not
    from tests.unit.conftest import build_char_tokenizer
    from tests.unit.test_agent_loops import HERMES_TEMPLATE

    marker = "{% elif m.role == 'assistant' %}{{ '<|im_start|>assistant\\n' + m.content }}"
    assert marker in HERMES_TEMPLATE
    template = HERMES_TEMPLATE.replace(marker, "{% elif m.role == 'assistant' %}{{ '<|im_start|>assistant\\n' }}"
                                       "{% if loop.last %}{{ '<think></think>' }}{% endif %}{{ m.content }}")
    tok = build_char_tokenizer(template)
    server = ScriptedServer(tok, [call("add", {"a": 1, "b": 2}), "3"])
    s = settings(default_agent_loop="tool_agent", function_tool_path=tools_py, response_length=1024)
    (out,) = run_trajectories_sync([{"raw_prompt": MESSAGES}], sampling(), server=server, tokenizer=tok, settings=s)
    assert tool_texts(out, tok) == ["\n<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n"
                                    "<|im_start|>assistant\n"]


def test_a_tool_call_format_other_than_hermes_is_refused(tools_py):
    problem = "tool-call format 'json' is not built; rollout.multi_turn.format must be one of hermes"
    with pytest.raises(RuntimeError, match=problem):
        run(["x"], tools_py, format="json")


def test_the_tools_own_metrics_and_rewards_are_summed_over_the_trajectory(tools_py):
    (out,), _, _ = run([call("scored", {"x": "a"}) + call("scored", {"x": "b"}), call("scored", {"x": "c"}), "ok"],
                       tools_py, max_parallel_calls=2)
    assert out.metrics["tool/scored/hits"] == 6 and out.metrics["tool_calls"] == 3
    assert out.extra_fields["tool_rewards"] == [0.5, 0.5, 0.5]
