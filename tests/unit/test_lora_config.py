"""The policy's LoRA keys (issue 29): both of verl's layouts resolve to the actor's LoraSettings and the
reference's arguments; bad values are refused before anything starts, with one message naming the key;
the target-module and adapter-folder checks."""

from __future__ import annotations

import json

import pytest

from grpo_dist.config import role_settings
from grpo_dist.training.lora import is_adapter_folder, unmatched_targets
from grpo_dist.training.settings import LoraSettings
from tests.configs import cfg_of as load, refused

M = "actor_rollout_ref.model."




def lora_of(*overrides: str) -> LoraSettings:
    return role_settings.actor_settings(load(*overrides), "cpu", 10).lora


def test_lora_is_off_by_default_and_the_reference_has_its_own_model():
    cfg = load()
    assert not lora_of().enabled
    assert "adapters_off_of" not in role_settings.reference_kwargs(cfg, "cpu")


@pytest.mark.parametrize("overrides,expected", [
    # verl's early layout: alpha 16 and all-linear unless given
    ((f"{M}lora_rank=8",), dict(rank=8, alpha=16.0, target_modules="all-linear", exclude_modules=None)),
    ((f"{M}lora_rank=32", f"{M}lora_alpha=64", f"{M}target_modules=[q_proj,v_proj]", f"{M}exclude_modules=[o_proj]"),
     dict(rank=32, alpha=64.0, target_modules=("q_proj", "v_proj"), exclude_modules=("o_proj",))),
    # the current layout: its own alpha default (32); its default modules (Megatron's names of every
    # linear layer of the blocks) are all-linear
    ((f"{M}lora.rank=16",), dict(rank=16, alpha=32.0, target_modules="all-linear")),
    ((f"{M}lora.rank=16", f"{M}lora.alpha=8", f"{M}lora.dropout=0.1", f"{M}lora.target_modules=[q_proj]"),
     dict(rank=16, alpha=8.0, dropout=0.1, target_modules=("q_proj",))),
    # mixed: the spelling that was changed wins; the same value twice is fine
    ((f"{M}lora.rank=16", f"{M}lora_alpha=4"), dict(rank=16, alpha=4.0)),
    ((f"{M}lora_rank=8", f"{M}lora.rank=8"), dict(rank=8)),
])
def test_both_layouts_resolve_to_the_actors_lora_settings(overrides, expected):
    lora = lora_of(*overrides)
    for name, value in expected.items():
        assert getattr(lora, name) == value, name
    assert lora.enabled and not lora.merge  # verl's default: the adapters alone go to the engine
    ref = role_settings.reference_kwargs(load(*overrides), "cpu")
    assert ref["adapters_off_of"] == "actor" and "param_offload" not in ref  # no model of its own


@pytest.mark.parametrize("overrides,needles", [
    ((f"{M}lora_rank=-1",), [f"{M}lora_rank = -1", ">= 0"]),
    ((f"{M}lora.rank=-4",), [f"{M}lora.rank = -4", ">= 0"]),
    ((f"{M}lora_rank=8", f"{M}lora_alpha=0"), [f"{M}lora_alpha = 0", "> 0"]),
    ((f"{M}lora.rank=8", f"{M}lora.alpha=-2"), [f"{M}lora.alpha = -2", "> 0"]),
    ((f"{M}lora_rank=8", f"{M}lora.rank=4"), ["lora.rank = 4", "contradicts", "lora_rank = 8"]),
    ((f"{M}lora_rank=8", f"{M}lora.dropout=1.0"), [f"{M}lora.dropout", "[0, 1)"]),
    ((f"{M}lora_rank=8", f"{M}target_modules=[]"), [f"{M}target_modules", "all-linear"]),
    ((f"{M}lora_rank=8", f"{M}lora.type=loha"), [f"{M}lora.type", "LoRA"]),
    ((f"{M}lora_rank=8", "reward_model.enable=true", "reward_model.model.path=/rm", "reward_model.iterative.enable=true",
      "reward_model.iterative.reset_reference=true", "actor_rollout_ref.actor.use_kl_loss=true"),
     ["reward_model.iterative.reset_reference", "base model"]),
])
def test_bad_lora_values_are_refused_with_one_message(overrides, needles):
    msg = refused(*overrides)
    assert "\n" not in msg
    for needle in needles:
        assert needle in msg, (needle, msg)


@pytest.mark.parametrize("overrides,served", [
    ((f"{M}lora_rank=8",), 8),  # merge=false (verl's default): the engine serves a rank-8 adapter
    ((f"{M}lora.rank=12",), 12),
    ((f"{M}lora_rank=8", f"{M}lora.merge=true"), 0),  # the merged weights: a plain engine
    ((), 0),
])
def test_the_engine_is_built_for_the_adapter_the_sync_sends(overrides, served):
    from grpo_dist.config.engine import engine_kwargs, served_adapter_rank

    cfg = load(*overrides)
    assert lora_of(*overrides).merge == (f"{M}lora.merge=true" in overrides)
    assert served_adapter_rank(cfg) == served
    kwargs = engine_kwargs(cfg, "/m", "cpu")
    assert kwargs.get("max_lora_rank") == (served or None)
    assert "max_lora_rank" not in engine_kwargs(load(*overrides, "actor_rollout_ref.rollout.name=hf"), "/m", "cpu")


def test_vllm_serves_adapter_ranks_up_to_its_largest():
    from grpo_dist.rollout.vllm_engine import vllm_max_lora_rank

    assert [vllm_max_lora_rank(r) for r in (1, 2, 8, 9, 64, 100, 512)] == [1, 8, 8, 16, 64, 128, 512]
    with pytest.raises(ValueError, match="up to rank 512"):
        vllm_max_lora_rank(513)


def write_adapter(folder, peft_type="LORA", weights=True):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": peft_type, "r": 4}))
    if weights:
        (folder / "adapter_model.safetensors").write_bytes(b"")
    return folder


def test_an_adapter_path_must_be_a_peft_lora_folder(tmp_path):
    good = write_adapter(tmp_path / "good")
    assert is_adapter_folder(good)
    assert not is_adapter_folder(tmp_path)  # no adapter_config.json
    assert not is_adapter_folder(write_adapter(tmp_path / "ia3", peft_type="IA3"))
    assert not is_adapter_folder(write_adapter(tmp_path / "bare", weights=False))
    for key in ("lora_adapter_path", "lora.adapter_path"):
        msg = refused(f"{M}lora_rank=8", f"{M}{key}={tmp_path}")
        assert msg.startswith(f"{M}{key} = ") and "peft LoRA adapter folder" in msg, msg
    assert lora_of(f"{M}lora_rank=8", f"{M}lora_adapter_path={good}").adapter_path == str(good)


LINEAR = [f"model.layers.{i}.{m}" for i in range(2) for m in (
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")] + ["lm_head"]


@pytest.mark.parametrize("targets,exclude,missing", [
    ("all-linear", None, []),
    (("q_proj", "v_proj"), None, []),
    (("q_proj", "qkv_proj", "linear_fc1"), None, ["qkv_proj", "linear_fc1"]),
    (("self_attn.q_proj",), None, []),
    (("q_proj",), ("q_proj",), ["q_proj"]),  # excluded everywhere
    (r"model\.layers\.0\..*_proj", None, []),
    (r"model\.encoder\..*", None, [r"model\.encoder\..*"]),
])
def test_target_modules_that_match_no_layer_are_named(targets, exclude, missing):
    assert unmatched_targets(LINEAR, LoraSettings(rank=4, target_modules=targets, exclude_modules=exclude)) == missing


def test_the_preflight_check_names_a_target_module_the_model_lacks(tiny_model_dir):
    from grpo_dist.config.spec import resolve
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ok = [f"{M}lora_rank=4", f"{M}target_modules=[q_proj,down_proj]"]
    resolve(load(*ok)).check_model_fits(str(tiny_model_dir), tok)
    with pytest.raises(ValueError) as info:
        resolve(load(f"{M}lora.rank=4", f"{M}lora.target_modules=[linear_qkv]")).check_model_fits(str(tiny_model_dir), tok)
    msg = str(info.value)
    assert msg.startswith(f"{M}lora.target_modules") and "linear_qkv" in msg and "q_proj" in msg, msg


@pytest.mark.parametrize("overrides,device,warned", [
    (("actor_rollout_ref.model.lora_rank=16",), "cpu", True),  # verl's default: the adapters synced alone
    (("actor_rollout_ref.model.lora.rank=16",), "cpu", True),  # the current layout
    (("actor_rollout_ref.model.lora_rank=16", "actor_rollout_ref.model.lora.merge=true"), "cpu", False),
    (("actor_rollout_ref.model.lora_rank=16",), "cuda", False),
    (("actor_rollout_ref.model.lora_rank=16", "actor_rollout_ref.rollout.name=hf"), "cpu", False),
    ((), "cpu", False),
])
def test_adapters_served_by_vllm_on_the_cpu_are_warned_about_at_start_up(overrides, device, warned):
    """vLLM's CPU build generates several times slower through LoRA adapters than with the merged weights
    (docs/lora.md): a CPU run that syncs the adapters alone to vLLM says so once, naming lora.merge=true."""
    from grpo_dist.config.spec import resolve

    warning = resolve(load(*overrides)).driver_plan(device, 16).startup_warning
    assert (warning is not None and "actor_rollout_ref.model.lora.merge=true" in warning) is warned
