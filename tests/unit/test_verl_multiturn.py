"""verl's gsm8k multi-turn launch scripts (tests/verl_multiturn) pass validation with their own
``--config-path``/``--config-name`` YAML and tool config, only the module name, the paths and the engine
name changed; what they ask for that is not built here is refused with a message naming the key and the fix."""

from __future__ import annotations

import asyncio

import pytest

from grpo_dist.config.loader import compose, to_typed
from grpo_dist.config.schema import ConfigError
from grpo_dist.config.states import noop_notes
from grpo_dist.config.validate import validate_config
from grpo_dist.main import main
from tests import verl_multiturn as vmt

pytestmark = pytest.mark.filterwarnings("ignore:provider=hydra.searchpath")  # verl's own config folder is not here
PATHS = dict(model="builtin:tiny-reverse", train="builtin:reverse/train", test="builtin:reverse/test",
             out="/tmp/grpo_dist_verl_multiturn")


def load(overrides: list[str], config_dir=vmt.CONFIG_DIR, config_name=vmt.CONFIG_NAME):
    cfg = to_typed(compose(overrides, config_dir=config_dir, config_name=config_name), overrides)
    validate_config(cfg, check_paths=True)
    return cfg


def as_shipped(name: str, **extra: str) -> list[str]:
    return vmt.fill(vmt.SCRIPTS[name], **PATHS, **extra)


@pytest.mark.parametrize("name", sorted(vmt.SCRIPTS))
def test_the_script_validates_as_shipped(name):
    cfg = load(as_shipped(name, use_kl_loss="True"))
    r = cfg.actor_rollout_ref.rollout
    assert r.tensor_model_parallel_size == 2  # agent loops on a tensor-parallel engine, in lock step
    assert (r.name, r.mode, r.multi_turn.enable) == ("vllm", "async", True)
    assert r.multi_turn.max_assistant_turns == 5  # from verl's YAML, not the command line
    assert r.multi_turn.tool_config_path == str(vmt.TOOL_CONFIG)
    assert cfg.data.max_prompt_length == 1024 and cfg.data.return_raw_chat
    assert cfg.actor_rollout_ref.actor.use_kl_loss and cfg.actor_rollout_ref.actor.kl_loss_type == "low_var_kl"
    assert cfg.trainer.n_gpus_per_node == {"vllm_fsdp": 16, "tool_agent_mlflow": 8}[name]
    assert r.n == {"vllm_fsdp": 8, "tool_agent_mlflow": 16}[name]


def test_the_vllm_scripts_unset_variable_is_refused_naming_the_key_and_the_empty_value():
    """``actor_rollout_ref.actor.use_kl_loss=${use_kl_loss}`` with the variable unset, as the script ships."""
    with pytest.raises(ConfigError) as info:
        load(as_shipped("vllm_fsdp"))
    message = str(info.value)
    assert message.startswith("invalid value for actor_rollout_ref.actor.use_kl_loss = '' (an empty value")
    assert "shell variable" in message and "'True', ''" in message
    cfg = load(as_shipped("vllm_fsdp", use_kl_loss="False"))
    assert cfg.actor_rollout_ref.actor.use_kl_loss is False  # the last value wins, as on verl's command line


def test_the_trace_keys_are_accepted_and_named_as_no_ops():
    cfg = load(as_shipped("tool_agent_mlflow"))
    assert (cfg.actor_rollout_ref.rollout.trace.backend, cfg.actor_rollout_ref.rollout.trace.token2text) == ("mlflow", True)
    notes = [n for n in noop_notes(cfg) if "rollout.trace." in n]
    assert len(notes) == 2 and all("tracing of agent loops is not built" in n for n in notes)
    assert cfg.trainer.logger == ["console", "mlflow"]


@pytest.mark.parametrize("name", sorted(vmt.SCRIPTS))
def test_the_command_line_checks_at_full_and_cpu_sizes(name, capsys):
    """``python -m grpo_dist.main --config-path=... --config-name=...`` with the script's overrides, as verl's
    script passes them: the configuration at the script's sizes (``--check=config``: its 8 or 16 ranks are not
    on this machine), and at CPU sizes with every file read and the tool config's tools built (``--check``)."""
    argv = vmt.script_argv(vmt.SCRIPTS[name], cpu=False, **PATHS, use_kl_loss="True")
    assert main(["--check=config", *argv]) == 0
    out = capsys.readouterr().out
    assert "the configuration is valid" in out and "multi-turn: assistant turns 5" in out
    cpu = vmt.script_argv(vmt.SCRIPTS[name], cpu=True, **PATHS, use_kl_loss="True")
    assert main(["--check", *cpu]) == 0
    out = capsys.readouterr().out
    assert "4 prompt(s) x rollout.n 2 = 8 responses" in out and "tools from " + str(vmt.TOOL_CONFIG) in out


def test_a_missing_config_file_or_tool_config_is_named(tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"config 'gsm8k_multiturn_grpo' not found in .*" + str(tmp_path)):
        load(as_shipped("tool_agent_mlflow"), config_dir=tmp_path)
    argv = vmt.script_argv(vmt.TOOL_AGENT_MLFLOW, cpu=True, **PATHS, tool_config=str(tmp_path / "gone.yaml"))
    assert main(["--check", *argv]) == 2
    err = capsys.readouterr().err
    assert "actor_rollout_ref.rollout.multi_turn.tool_config_path" in err and str(tmp_path / "gone.yaml") in err


def test_verls_tool_config_gives_the_gsm8k_tool_that_scores_a_rows_ground_truth():
    """The tool config as verl ships it (``verl.tools.gsm8k_tool.Gsm8kTool``) and the create_kwargs of a row of
    verl's gsm8k_tool_agent_loop.py."""
    from grpo_dist.tools.calls import run_tool_call
    from grpo_dist.tools.gsm8k_tool import Gsm8kTool
    from grpo_dist.tools.registry import load_tools

    tools = load_tools(vmt.TOOL_CONFIG)
    assert list(tools) == ["calc_gsm8k_reward"] and isinstance(tools["calc_gsm8k_reward"], Gsm8kTool)
    assert tools["calc_gsm8k_reward"].tool_schema.function.parameters.required == ["answer"]
    tools_kwargs = {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72"}}}
    for answer, reward in (("72", "reward=1.0"), ("71", "reward=0.0")):
        response, _, _ = asyncio.run(run_tool_call(tools, "calc_gsm8k_reward", {"answer": answer}, timeout_s=5.0,
                                                   max_chars=256, truncate_side="middle", tools_kwargs=tools_kwargs))
        assert reward in response.text, response.text
