"""verl's agent-loop keys (``rollout.mode``, ``rollout.multi_turn.*``, ``rollout.agent.*``, ``rollout.trace.*``):
each honoured, accepted with no effect (and said so), or refused with one message naming the key and what is
valid; the files they name are read at validation; and the frozen settings the rollout replicas get."""

from __future__ import annotations

import textwrap

import pytest

from grpo_dist.agents.settings import AgentSettings
from grpo_dist.config.agents import agent_settings
from grpo_dist.config.loader import compose, to_typed
from grpo_dist.config.schema import ConfigError
from grpo_dist.config.spec import resolve
from grpo_dist.config.states import noop_notes
from grpo_dist.config.validate import validate_config
from tests.configs import cfg_of, refused

R = "actor_rollout_ref.rollout."
MT = R + "multi_turn."
AG = R + "agent."
ASYNC = R + "mode=async"


def validated_with_files(*overrides: str):
    """The defaults with ``overrides``, validated as a run validates them (the files named are read)."""
    return cfg_of(*overrides, check_paths=True)


def refused_with_files(*overrides: str) -> str:
    return refused(*overrides, check_paths=True)


# ------------------------------------------------------------------------------ refusals, one message each
@pytest.mark.parametrize("overrides,needles", [
    ([R + "mode=server"], [R + "mode", "'server'", "sync, async"]),
    ([MT + "enable=true"], [MT + "enable", "multi-turn rollouts run as agent loops: set actor_rollout_ref.rollout.mode=async"]),
    ([ASYNC, MT + "max_assistant_turns=0"], [MT + "max_assistant_turns", "null (no limit) or an integer >= 1"]),
    ([ASYNC, MT + "max_user_turns=-2"], [MT + "max_user_turns", "-2", ">= 1"]),
    ([ASYNC, MT + "max_parallel_calls=0"], [MT + "max_parallel_calls", "integer >= 1"]),
    ([ASYNC, MT + "max_tool_response_length=0"], [MT + "max_tool_response_length", "integer >= 1"]),
    ([ASYNC, MT + "tool_response_truncate_side=both"], [MT + "tool_response_truncate_side", "left, right, middle"]),
    ([ASYNC, MT + "tokenization_sanity_check_mode=loose"],
     [MT + "tokenization_sanity_check_mode", "strict, ignore_strippable, disable"]),
    ([ASYNC, MT + "format=gpt-oss"], [MT + "format", "'gpt-oss'", "hermes"]),
    ([ASYNC, MT + "interaction_config_path=/i.yaml"], [MT + "interaction_config_path", "verl removed them", "null"]),
    ([ASYNC, MT + "num_repeat_rollouts=3"], [MT + "num_repeat_rollouts", "CollabLLM", "null"]),
    ([ASYNC, AG + "num_workers=0"], [AG + "num_workers", "integer >= 1"]),
    ([ASYNC, AG + "default_agent_loop=react_agent"],
     [AG + "default_agent_loop", "'react_agent'", "single_turn_agent, tool_agent", "agent_loop_config_path"]),
    ([ASYNC, AG + "custom_async_server.name=MyServer"], [AG + "custom_async_server.name", "custom async rollout server"]),
    (["data.tool_config_path=/t.yaml"], ["data.tool_config_path", MT + "tool_config_path"]),
    (["data.function_tool_path=/f.py"], ["data.function_tool_path", MT + "function_tool_path"]),
])
def test_each_refusal_names_the_key_and_what_is_valid(overrides, needles):
    message = refused(*overrides)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_tensor_parallel_engines_are_allowed_in_both_modes(mode):
    cfg = cfg_of(R + f"mode={mode}", R + "tensor_model_parallel_size=2", "trainer.n_gpus_per_node=2")
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 2


def test_the_multi_turn_settings_are_accepted_in_async_mode():
    cfg = cfg_of(ASYNC, MT + "enable=true", MT + "max_assistant_turns=4", MT + "max_user_turns=3",
                 MT + "max_parallel_calls=2", MT + "max_tool_response_length=100", MT + "tool_response_truncate_side=left",
                 MT + "tokenization_sanity_check_mode=ignore_strippable")
    assert noop_notes(cfg) == []  # honoured: nothing to say at start-up
    # trajectories are never re-rendered for training: one template either way, said once at start-up
    (note,) = noop_notes(cfg_of(ASYNC, MT + "enable=true", MT + "use_inference_chat_template=true"))
    assert "use_inference_chat_template" in note and "never re-rendered" in note


@pytest.mark.parametrize("override", [AG + "num_workers=32", R + "trace.backend=mlflow", R + "trace.token2text=true",
                                      R + "trace.max_samples_per_step_per_worker=5"])
def test_knobs_without_an_effect_are_accepted_and_noted_with_the_reason(override):
    notes = [n for n in noop_notes(cfg_of(ASYNC, override)) if n.startswith(override.split("=")[0])]
    assert len(notes) == 1
    reason = notes[0]
    assert ("coroutines" in reason) if "num_workers" in override else ("tracing of agent loops is not built" in reason)


# ------------------------------------------------------------------------------ the default loop
@pytest.mark.parametrize("overrides,loop", [
    ([ASYNC], "single_turn_agent"),
    ([ASYNC, MT + "enable=true"], "tool_agent"),  # verl's default under multi_turn.enable
    ([ASYNC, AG + "default_agent_loop=tool_agent"], "tool_agent"),
])
def test_the_default_loop(overrides, loop):
    assert agent_settings(cfg_of(*overrides)).default_agent_loop == loop


def test_a_loop_named_in_the_agent_loop_file_may_be_the_default(tmp_path):
    loops = tmp_path / "loops.yaml"
    loops.write_text("- name: math_react\n  _target_: my_pkg.loops.MathReact\n  max_steps: 3\n")
    cfg = validated_with_files(ASYNC, MT + "enable=true", AG + f"agent_loop_config_path={loops}",
                               AG + "default_agent_loop=math_react")
    s = agent_settings(cfg)
    assert (s.default_agent_loop, s.agent_loop_config_path) == ("math_react", str(loops))
    message = refused_with_files(ASYNC, AG + f"agent_loop_config_path={loops}", AG + "default_agent_loop=math")
    assert AG + "default_agent_loop = 'math'" in message and "math_react" in message and "tool_agent" in message


@pytest.mark.parametrize("text,needle", [
    ("name: x\n_target_: a.B\n", "expected a YAML list"),
    ("- _target_: a.B\n", "entry 0 has no name"),
    ("- name: x\n", "entry 0 (x) has no _target_"),
    ("- name: x\n  _target_: a.B\n- name: x\n  _target_: a.C\n", "'x' is named twice"),
    ("- name: [unclosed\n", "not valid YAML"),
])
def test_a_bad_agent_loop_file_is_refused_at_validation(tmp_path, text, needle):
    loops = tmp_path / "loops.yaml"
    loops.write_text(text)
    message = refused_with_files(ASYNC, AG + f"agent_loop_config_path={loops}")
    assert message.startswith(AG + "agent_loop_config_path") and needle in message


def test_a_missing_agent_loop_file_is_refused(tmp_path):
    message = refused_with_files(ASYNC, AG + f"agent_loop_config_path={tmp_path / 'none.yaml'}")
    assert message.startswith(AG + "agent_loop_config_path") and "no such file" in message


# ------------------------------------------------------------------------------ tool files
TOOL_FILE = textwrap.dedent('''
    from grpo_dist.tools.function_tool import function_tool


    @function_tool
    def add(a: int, b: int) -> str:
        """Add two integers.

        Args:
            a: the first number
            b: the second number
        """
        return str(a + b)
''')


def test_tool_files_are_loaded_at_validation(tmp_path):
    good = tmp_path / "tools.py"
    good.write_text(TOOL_FILE)
    cfg = validated_with_files(ASYNC, MT + "enable=true", MT + f"function_tool_path={good}")
    assert agent_settings(cfg).function_tool_path == str(good)


@pytest.mark.parametrize("key,text,needle", [
    ("tool_config_path", "tools:\n  - class_name: no_such_module.Tool\n", "no_such_module"),
    ("tool_config_path", "tools: 3\n", "top-level 'tools:' list"),
    ("function_tool_path", "raise RuntimeError('broken on import')\n", "broken on import"),
])
def test_a_bad_tool_file_is_refused_before_any_worker_starts(tmp_path, key, text, needle):
    path = tmp_path / ("tools.yaml" if key == "tool_config_path" else "tools.py")
    path.write_text(text)
    message = refused_with_files(ASYNC, MT + "enable=true", MT + f"{key}={path}")
    assert message.startswith(MT + key) and needle in message, message


def test_with_both_tool_files_the_message_names_the_one_at_fault(tmp_path):
    config = tmp_path / "tools.yaml"
    config.write_text("tools: []\n")
    functions = tmp_path / "tools.py"
    functions.write_text("raise RuntimeError('broken on import')\n")
    message = refused_with_files(ASYNC, MT + f"tool_config_path={config}", MT + f"function_tool_path={functions}")
    assert message.startswith(MT + "function_tool_path") and "broken on import" in message
    functions.write_text(TOOL_FILE)
    config.write_text("tools:\n  - class_name: no_such_module.Tool\n")
    message = refused_with_files(ASYNC, MT + f"tool_config_path={config}", MT + f"function_tool_path={functions}")
    assert message.startswith(MT + "tool_config_path") and "no_such_module" in message


def test_a_missing_tool_file_is_refused(tmp_path):
    message = refused_with_files(ASYNC, MT + "enable=true", MT + f"tool_config_path={tmp_path / 'no.yaml'}")
    assert message.startswith(MT + "tool_config_path") and "no such file" in message


# ------------------------------------------------------------------------------ the settings value
def test_sync_mode_has_no_agent_settings():
    cfg = cfg_of(R + "mode=sync", MT + "max_assistant_turns=3")
    assert agent_settings(cfg) is None and resolve(cfg).agent_settings is None


def test_agent_settings_carry_every_key():
    cfg = cfg_of(ASYNC, MT + "enable=true", "data.max_prompt_length=100", "data.max_response_length=50",
                 MT + "max_assistant_turns=4", MT + "max_user_turns=3", MT + "max_parallel_calls=2",
                 MT + "max_tool_response_length=77", MT + "tool_response_truncate_side=right",
                 MT + "tokenization_sanity_check_mode=disable", MT + "use_inference_chat_template=true",
                 MT + "tool_config_path=/t.yaml", MT + "function_tool_path=/f.py",
                 "+data.apply_chat_template_kwargs.enable_thinking=false", "trainer.experiment_name=agents")
    s = resolve(cfg).agent_settings
    assert isinstance(s, AgentSettings)
    assert s == AgentSettings(
        default_agent_loop="tool_agent", agent_loop_config_path=None, prompt_length=100, response_length=50,
        tool_config_path="/t.yaml", function_tool_path="/f.py", max_assistant_turns=4, max_user_turns=3,
        max_parallel_calls=2, max_tool_response_length=77, tool_response_truncate_side="right",
        tokenization_sanity_check_mode="disable", format="hermes",
        apply_chat_template_kwargs={"enable_thinking": False}, trainer_config=s.trainer_config)
    assert s.tool_timeout_s == 30.0  # no key of verl's sets it
    tc = s.trainer_config  # what a user's loop reads as self.config, as in verl
    assert tc["actor_rollout_ref"]["rollout"]["response_length"] == 50  # interpolations resolved
    assert tc["actor_rollout_ref"]["rollout"]["multi_turn"]["max_user_turns"] == 3
    assert tc["trainer"]["experiment_name"] == "agents"
    assert isinstance(tc["data"]["apply_chat_template_kwargs"], dict)


def test_agent_settings_are_frozen_and_built_once_per_run():
    spec = resolve(cfg_of(ASYNC))
    s = spec.agent_settings
    assert spec.agent_settings is s
    with pytest.raises(AttributeError):
        s.max_parallel_calls = 5  # type: ignore[misc]


# ------------------------------------------------------------------------------ verl's multi-turn YAMLs
VERL_MULTI_TURN_YAML = textwrap.dedent("""
    hydra:
      searchpath:
        - file://verl/trainer/config

    defaults:
      - ppo_trainer
      - _self_

    data:
      max_prompt_length: 100
    actor_rollout_ref:
      rollout:
        mode: async
        multi_turn:
          enable: true
          max_assistant_turns: 5
""")


@pytest.mark.filterwarnings("ignore:provider=hydra.searchpath")  # Hydra warns that verl's folder is not here
def test_a_verl_multi_turn_config_loads_with_its_own_config_path(tmp_path):
    """verl's launch scripts pass ``--config-path <their folder> --config-name <their file>``, a file starting
    from ``defaults: [ppo_trainer, _self_]``: ppo_trainer is grpo_dist's own configuration."""
    (tmp_path / "gsm8k_multiturn_grpo.yaml").write_text(VERL_MULTI_TURN_YAML)
    overrides = ["actor_rollout_ref.rollout.n=4"]
    cfg = to_typed(compose(overrides, config_dir=tmp_path, config_name="gsm8k_multiturn_grpo"), overrides)
    validate_config(cfg, check_paths=False)
    r = cfg.actor_rollout_ref.rollout
    assert (r.mode, r.multi_turn.enable, r.multi_turn.max_assistant_turns, r.n) == ("async", True, 5, 4)
    assert r.prompt_length == 100  # the file's data key, through grpo_dist's ${data.max_prompt_length}
    assert cfg.trainer.total_epochs == to_typed(compose([])).trainer.total_epochs  # the rest: grpo_dist's defaults
    assert agent_settings(cfg).default_agent_loop == "tool_agent"


@pytest.mark.filterwarnings("ignore:provider=hydra.searchpath")
def test_a_missing_default_is_named_with_the_file_that_lists_it(tmp_path):
    (tmp_path / "mine.yaml").write_text(VERL_MULTI_TURN_YAML.replace("- ppo_trainer", "- ppo_trainr"))
    with pytest.raises(ConfigError) as info:
        compose([], config_dir=tmp_path, config_name="mine")
    message = str(info.value)
    assert message.startswith("config 'mine' lists 'ppo_trainr' in its defaults, and no 'ppo_trainr.yaml' is found in")
    assert str(tmp_path) in message and "verl/trainer/config (hydra.searchpath; no such folder)" in message
    with pytest.raises(ConfigError, match="config 'other' not found in"):
        compose([], config_dir=tmp_path, config_name="other")


def test_the_check_plan_says_how_trajectories_run():
    cfg = cfg_of(ASYNC, MT + "enable=true", MT + "max_assistant_turns=3", MT + "tool_config_path=/t.yaml",
                 "data.max_response_length=40")
    note = next(line for line in resolve(cfg).check_plan(count_rows=False).lines() if "agent loops" in line)
    assert "rows without agent_name run tool_agent" in note
    assert "assistant turns 3, user turns no limit, within 40 response tokens" in note and "tools from /t.yaml" in note
    assert not any("agent loops" in line for line in resolve(cfg_of()).check_plan(count_rows=False).lines())
