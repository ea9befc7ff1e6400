"""The agent-loop package (grpo_dist/agents/): verl's AgentLoopOutput / AgentLoopBase / register API, the
single-turn loop, verl's agent-loop YAML of user loops, and the runner (prompt-major order, seeds per
trajectory, routing by agent_name, all trajectories at once, errors named). The rollout server is scripted."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import pytest

from grpo_dist.agents.base import (AgentLoopBase, AgentLoopOutput, get_agent_loop_class, load_agent_loop_config,
                                   register)
from grpo_dist.agents.runner import run_trajectories, run_trajectories_sync
from grpo_dist.agents.settings import AgentSettings
from grpo_dist.agents.single_turn import SingleTurnAgentLoop
from grpo_dist.data.dataset import tokenize_prompt
from grpo_dist.rollout.base import SamplingSettings, TokenOutput
from tests.unit.conftest import build_char_tokenizer

# A Qwen2.5-like hermes template: a default system prompt when the messages bring none, tool schemas in the
# system turn, assistant tool calls as <tool_call> blocks, consecutive tool messages in one user turn.
HERMES_TEMPLATE = (
    "{% if messages and messages[0].role == 'system' %}{{ '<|im_start|>system\\n' + messages[0].content }}"
    "{% else %}{{ '<|im_start|>system\\nYou are a helpful assistant.' }}{% endif %}"
    "{% if tools %}{{ '\\n# Tools\\n<tools>' }}{% for t in tools %}{{ '\\n' + t | tojson }}{% endfor %}"
    "{{ '\\n</tools>' }}{% endif %}{{ '<|im_end|>\\n' }}"
    "{% for m in messages %}"
    "{% if m.role == 'system' and loop.first %}"
    "{% elif m.role == 'assistant' %}{{ '<|im_start|>assistant\\n' + m.content }}"
    "{% for tc in m.tool_calls or [] %}{% if m.content or not loop.first %}{{ '\\n' }}{% endif %}"
    "{{ '<tool_call>\\n{\"name\": \"' + tc.function.name + '\", \"arguments\": ' + tc.function.arguments | tojson }}"
    "{{ '}\\n</tool_call>' }}{% endfor %}{{ '<|im_end|>\\n' }}"
    "{% elif m.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
EOS = 3  # <|im_end|> of the char tokenizer


def hermes_tokenizer():
    return build_char_tokenizer(HERMES_TEMPLATE)


def turn_logprob(turn: int, k: int) -> float:
    """The scripted log-prob of token ``k`` of model turn ``turn`` (distinct everywhere, to check alignment)."""
    return -(turn + 1) - k / 1000.0


class ScriptedServer:
    """A rollout server that answers turn ``t`` of every trajectory with ``script(t, prompt_ids, params)``
    (a text), as char tokens + EOS, cut at ``max_tokens`` (then ``stop_reason="length"``). Records every
    call and the most requests in flight at once."""

    def __init__(self, tokenizer, script: list[str] | Callable[[int, list[int], dict], str], delay: float = 0.0):
        self.tokenizer = tokenizer
        self.script = script
        self.delay = delay
        self.calls: list[dict[str, Any]] = []
        self.active = 0
        self.max_active = 0

    def text(self, turn: int, prompt_ids: list[int], params: dict) -> str:
        return self.script(turn, prompt_ids, params) if callable(self.script) else self.script[turn]

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any]) -> TokenOutput:
        turn = int(request_id.rsplit("-", 1)[1])
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids), "params": dict(sampling_params)})
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        await asyncio.sleep(self.delay)
        self.active -= 1
        ids = self.tokenizer.encode(self.text(turn, prompt_ids, sampling_params), add_special_tokens=False) + [EOS]
        stop = "stop"
        if len(ids) > sampling_params["max_tokens"]:
            ids, stop = ids[: sampling_params["max_tokens"]], "length"
        logprobs = [turn_logprob(turn, k) for k in range(len(ids))] if sampling_params.get("logprobs") else None
        return TokenOutput(token_ids=ids, log_probs=logprobs, stop_reason=stop)


def settings(**kw) -> AgentSettings:
    kw.setdefault("prompt_length", 4096)
    kw.setdefault("response_length", 64)
    return AgentSettings(**kw)


def sampling(n: int = 1, seed: int | None = None, logprobs: bool = True) -> SamplingSettings:
    return SamplingSettings(n=n, temperature=1.0, max_tokens=64, seed=seed, logprobs=logprobs)


MESSAGES = [{"role": "user", "content": "hi"}]


# ---------------------------------------------------------------------------------------------
# AgentLoopOutput
# ---------------------------------------------------------------------------------------------
def test_the_output_refuses_fields_of_different_lengths():
    AgentLoopOutput(prompt_ids=[1], response_ids=[4, 5], response_mask=[1, 0], response_logprobs=[-0.1, 0.0])
    with pytest.raises(ValueError, match="response_mask has 1 entries but response_ids has 2"):
        AgentLoopOutput(prompt_ids=[1], response_ids=[4, 5], response_mask=[1])
    with pytest.raises(ValueError, match="response_logprobs has 3 entries"):
        AgentLoopOutput(prompt_ids=[1], response_ids=[4, 5], response_mask=[1, 1], response_logprobs=[0.0] * 3)
    with pytest.raises(ValueError, match="must be 0 .* or 1"):
        AgentLoopOutput(prompt_ids=[1], response_ids=[4], response_mask=[2])


# ---------------------------------------------------------------------------------------------
# single_turn_agent
# ---------------------------------------------------------------------------------------------
def test_single_turn_samples_from_the_rows_prompt_ids_with_the_response_budget():
    tok = hermes_tokenizer()
    server = ScriptedServer(tok, ["ok"])
    rows = [{"prompt_ids": [7, 8, 9], "raw_prompt": MESSAGES}]
    (out,) = run_trajectories_sync(rows, sampling(seed=5), server=server, tokenizer=tok,
                                   settings=settings(response_length=10))
    assert server.calls[0]["prompt_ids"] == [7, 8, 9]
    assert server.calls[0]["params"]["max_tokens"] == 10
    assert out.prompt_ids == [7, 8, 9]
    assert out.response_ids == tok.encode("ok", add_special_tokens=False) + [EOS]
    assert out.response_mask == [1, 1, 1]
    assert out.response_logprobs == [turn_logprob(0, k) for k in range(3)]
    assert out.num_turns == 2 and out.finished_by_eos


def test_single_turn_without_prompt_ids_renders_the_chat_template_as_the_dataset_does():
    tok = hermes_tokenizer()
    server = ScriptedServer(tok, ["a long answer"])
    (out,) = run_trajectories_sync([{"raw_prompt": MESSAGES}], sampling(logprobs=False), server=server,
                                   tokenizer=tok, settings=settings(response_length=4))
    assert out.prompt_ids == tokenize_prompt(tok, MESSAGES)
    assert len(out.response_ids) == 4 and out.response_logprobs is None
    assert not out.finished_by_eos  # cut at the budget


# ---------------------------------------------------------------------------------------------
# runner: order, seeds, routing, concurrency, errors
# ---------------------------------------------------------------------------------------------
def test_trajectories_are_prompt_major_with_one_seed_each_and_run_at_once():
    tok = hermes_tokenizer()
    # the answer names the prompt (its last id) and the seed, so the order can be checked
    server = ScriptedServer(tok, lambda t, p, params: f"{p[-1]}:{params['seed']}", delay=0.05)
    rows = [{"prompt_ids": [10 + i]} for i in range(3)]
    outs = run_trajectories_sync(rows, sampling(n=2, seed=100), server=server, tokenizer=tok, settings=settings())
    texts = [tok.decode(o.response_ids, skip_special_tokens=True) for o in outs]
    assert texts == [f"{10 + i}:{100 + i * 2 + j}" for i in range(3) for j in range(2)]
    assert server.max_active == 6
    assert len({c["request_id"] for c in server.calls}) == 6


def test_without_a_seed_every_trajectory_samples_with_seed_none():
    tok = hermes_tokenizer()
    server = ScriptedServer(tok, ["x"])
    run_trajectories_sync([{"prompt_ids": [5]}], sampling(n=3), server=server, tokenizer=tok, settings=settings())
    assert [c["params"]["seed"] for c in server.calls] == [None] * 3
    assert {c["params"]["temperature"] for c in server.calls} == {1.0}


@register("echo_test_agent")
class EchoLoop(AgentLoopBase):
    """A user loop: answers with its own name's marker and reads the trainer configuration."""

    configs: list = []

    async def run(self, sampling_params, **kwargs):
        EchoLoop.configs.append(self.config)
        marker = int(self.config.marker) if "marker" in self.config else 1
        return AgentLoopOutput(prompt_ids=list(kwargs["prompt_ids"]), response_ids=[marker], response_mask=[1],
                               num_turns=2)


def test_the_loops_of_a_call_share_one_trainer_configuration():
    """verl hands every loop the same configuration object; building one per trajectory cost milliseconds each
    (most of a single-turn step's rollout time on CPU)."""
    EchoLoop.configs.clear()
    rows = [{"prompt_ids": [5], "agent_name": "echo_test_agent"}] * 3
    run_trajectories_sync(rows, sampling(n=2), server=None, tokenizer=None, settings=settings(trainer_config={"marker": 7}))
    assert len(EchoLoop.configs) == 6 and all(c is EchoLoop.configs[0] for c in EchoLoop.configs)
    assert EchoLoop.configs[0].marker == 7


def test_rows_pick_their_loop_by_agent_name_else_the_default():
    tok = hermes_tokenizer()
    server = ScriptedServer(tok, ["x"])
    rows = [{"prompt_ids": [5], "agent_name": "echo_test_agent"}, {"prompt_ids": [6]}]
    outs = run_trajectories_sync(rows, sampling(), server=server, tokenizer=tok,
                                 settings=settings(trainer_config={"marker": 42}))
    assert outs[0].response_ids == [42]
    assert outs[1].response_ids == tok.encode("x", add_special_tokens=False) + [EOS]
    assert len(server.calls) == 1
    assert get_agent_loop_class("single_turn_agent") is SingleTurnAgentLoop


def test_an_unknown_agent_name_is_refused_before_anything_runs_naming_the_valid_ones():
    tok = hermes_tokenizer()
    server = ScriptedServer(tok, ["x"])
    with pytest.raises(ValueError, match=r"unknown agent loop 'nope'.*single_turn_agent.*tool_agent"):
        run_trajectories_sync([{"prompt_ids": [5]}, {"prompt_ids": [5], "agent_name": "nope"}], sampling(),
                              server=server, tokenizer=tok, settings=settings())
    assert server.calls == []


@register("failing_test_agent")
class FailingLoop(AgentLoopBase):
    async def run(self, sampling_params, **kwargs):
        if kwargs["prompt_ids"] == [2]:
            raise KeyError("no answer")
        await asyncio.sleep(5)  # cancelled when another trajectory fails
        raise AssertionError("not cancelled")


def test_a_failing_loop_is_named_with_its_row_and_the_others_are_cancelled():
    tok = hermes_tokenizer()
    rows = [{"prompt_ids": [k], "agent_name": "failing_test_agent"} for k in (1, 2)]

    async def main():
        problem = r"agent loop 'failing_test_agent' failed on row 1 .*KeyError.*no answer"
        with pytest.raises(RuntimeError, match=problem):
            await asyncio.wait_for(run_trajectories(rows, sampling(), server=ScriptedServer(tok, []), tokenizer=tok,
                                                    settings=settings()), 2.0)
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    assert asyncio.run(main()) == []


# ---------------------------------------------------------------------------------------------
# verl's agent-loop YAML
# ---------------------------------------------------------------------------------------------
USER_LOOP = '''
from grpo_dist.agents.base import AgentLoopBase, AgentLoopOutput


class ScaledLoop(AgentLoopBase):
    def __init__(self, trainer_config, server_manager, tokenizer, processor=None, scale=1, **kwargs):
        super().__init__(trainer_config, server_manager, tokenizer, processor, **kwargs)
        self.scale = scale

    async def run(self, sampling_params, **kwargs):
        out = await self.server_manager.generate("r-0", prompt_ids=list(kwargs["prompt_ids"]),
                                                 sampling_params=sampling_params)
        return AgentLoopOutput(prompt_ids=list(kwargs["prompt_ids"]), response_ids=out.token_ids * self.scale,
                               response_mask=[1] * len(out.token_ids) * self.scale, num_turns=2)


class NotALoop:
    pass
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_loops_mod.py").write_text(USER_LOOP)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_the_yaml_registers_a_user_loop_with_its_constructor_keys(user_module):
    path = user_module / "loops.yaml"
    path.write_text("- name: scaled_agent\n  _target_: my_loops_mod.ScaledLoop\n  scale: 2\n")
    tok = hermes_tokenizer()
    outs = run_trajectories_sync([{"prompt_ids": [5], "agent_name": "scaled_agent"}], sampling(),
                                 server=ScriptedServer(tok, ["ab"]),
                                 tokenizer=tok, settings=settings(agent_loop_config_path=str(path)))
    one = tok.encode("ab", add_special_tokens=False) + [EOS]
    assert outs[0].response_ids == one * 2
    assert get_agent_loop_class("scaled_agent").__name__ == "ScaledLoop"


@pytest.mark.parametrize("text, problem", [
    ("name: x\n", "expected a YAML list"),
    ("- name: x\n", r"entry \[0\] \(x\): missing _target_"),
    ("- _target_: my_loops_mod.ScaledLoop\n", r"entry \[0\]: missing name"),
    ("- name: x\n  _target_: no_such_mod_q.Loop\n", r"\(x\): module 'no_such_mod_q' not found"),
    ("- name: x\n  _target_: my_loops_mod.Missing\n", "has no attribute 'Missing'"),
    ("- name: ok\n  _target_: my_loops_mod.ScaledLoop\n- name: y\n  _target_: my_loops_mod.NotALoop\n",
     r"entry \[1\] \(y\): my_loops_mod.NotALoop is not an AgentLoopBase subclass"),
])
def test_a_bad_agent_loop_yaml_names_the_file_the_entry_and_the_problem(user_module, text, problem):
    path = user_module / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"agent loop config {path}.*{problem}"):
        load_agent_loop_config(path)


def test_a_missing_agent_loop_yaml_is_named():
    with pytest.raises(ValueError, match="agent loop config /nonexistent/loops.yaml: no such file"):
        load_agent_loop_config("/nonexistent/loops.yaml")


def test_init_class_runs_once_per_class():
    calls = []

    class Counted(AgentLoopBase):
        @classmethod
        def init_class(cls, config, tokenizer, processor=None, **kwargs):
            if cls.__dict__.get("_class_initialized"):
                return
            calls.append(cls)
            cls._class_initialized = True

        async def run(self, sampling_params, **kwargs):
            raise NotImplementedError

    class Ref:
        config = {"a": {"b": 1}}

    loops = [Counted(Ref(), None, None) for _ in range(3)]
    assert calls == [Counted]
    assert loops[0].config.a.b == 1


def test_the_base_init_class_is_per_subclass():
    class A(AgentLoopBase):
        async def run(self, sampling_params, **kwargs):
            raise NotImplementedError

    class B(A):
        pass

    class Ref:
        config = {}

    A(Ref(), None, None)
    assert A.__dict__.get("_class_initialized") and not B.__dict__.get("_class_initialized")
    B(Ref(), None, None)
    assert B.__dict__.get("_class_initialized")



def test_a_prompt_longer_than_prompt_length_is_refused_naming_the_key():
    tok = hermes_tokenizer()
    with pytest.raises(RuntimeError, match=r"row 0 .*prompt is 4 tokens .*rollout.prompt_length=3"):
        run_trajectories_sync([{"prompt_ids": [1, 2, 3, 4]}], sampling(), server=ScriptedServer(tok, ["x"]),
                              tokenizer=tok, settings=settings(prompt_length=3))
