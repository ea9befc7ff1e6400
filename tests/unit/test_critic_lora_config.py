"""The value model's LoRA keys (issue 29, critic): verl's two layouts (``critic.model.lora_rank`` ... and
``critic.model.lora.*``) resolve to the critic's LoraSettings, independently of the policy's; bad values
are refused before anything starts, with one message naming the key; a target module the value model
lacks is refused by the preflight check, and its value head is no target."""

from __future__ import annotations

import json

import pytest

from grpo_dist.config import role_settings
from grpo_dist.training.settings import LoraSettings
from tests.configs import cfg_of as load, refused

C = "critic.model."
P = "actor_rollout_ref.model."


def critic_lora(*overrides: str) -> LoraSettings:
    return role_settings.critic_settings(load("critic.enable=true", *overrides), "cpu", 10).lora


def test_the_critics_lora_is_off_by_default():
    assert not critic_lora().enabled


@pytest.mark.parametrize("overrides,expected", [
    # verl's early layout: alpha 16 and all-linear unless given
    ((f"{C}lora_rank=8",), dict(rank=8, alpha=16.0, target_modules="all-linear", exclude_modules=None)),
    ((f"{C}lora_rank=32", f"{C}lora_alpha=64", f"{C}target_modules=[q_proj,v_proj]", f"{C}exclude_modules=[o_proj]"),
     dict(rank=32, alpha=64.0, target_modules=("q_proj", "v_proj"), exclude_modules=("o_proj",))),
    ((f"{C}lora_rank=4", rf"{C}target_modules=model\.layers\.0\..*"),
     dict(rank=4, target_modules=r"model\.layers\.0\..*")),
    # the current layout: its own alpha default (32); its default modules are all-linear
    ((f"{C}lora.rank=16",), dict(rank=16, alpha=32.0, target_modules="all-linear", dropout=0.0)),
    ((f"{C}lora.rank=16", f"{C}lora.alpha=8", f"{C}lora.dropout=0.1", f"{C}lora.target_modules=[q_proj]",
      f"{C}lora.exclude_modules=[k_proj]"),
     dict(rank=16, alpha=8.0, dropout=0.1, target_modules=("q_proj",), exclude_modules=("k_proj",))),
    # mixed: the spelling that was changed wins; the same value twice is fine
    ((f"{C}lora.rank=16", f"{C}lora_alpha=4"), dict(rank=16, alpha=4.0)),
    ((f"{C}lora_rank=8", f"{C}lora.rank=8"), dict(rank=8)),
])
def test_both_layouts_resolve_to_the_critics_lora_settings(overrides, expected):
    lora = critic_lora(*overrides)
    for name, value in expected.items():
        assert getattr(lora, name) == value, name


def test_the_critics_and_the_policys_lora_are_separate():
    cfg = load("critic.enable=true", f"{C}lora_rank=8", f"{P}lora.rank=4", f"{P}lora.alpha=2")
    critic = role_settings.critic_settings(cfg, "cpu", 10).lora
    actor = role_settings.actor_settings(cfg, "cpu", 10).lora
    assert (critic.rank, critic.alpha) == (8, 16.0) and (actor.rank, actor.alpha) == (4, 2.0)
    assert not role_settings.actor_settings(load(f"{C}lora_rank=8"), "cpu", 10).lora.enabled
    assert "adapters_off_of" not in role_settings.reference_kwargs(load(f"{C}lora_rank=8"), "cpu")


def test_lora_merge_has_no_effect_on_the_critic_and_is_noted():
    from grpo_dist.config.states import noop_notes

    cfg = load("critic.enable=true", f"{C}lora_rank=8", f"{C}lora.merge=true")
    assert critic_lora(f"{C}lora_rank=8", f"{C}lora.merge=true").merge is False
    assert any(n.startswith(f"{C}lora.merge") and "no weights" in n for n in noop_notes(cfg))


@pytest.mark.parametrize("overrides,needles", [
    ((f"{C}lora_rank=-1",), [f"{C}lora_rank = -1", ">= 0"]),
    ((f"{C}lora.rank=-4",), [f"{C}lora.rank = -4", ">= 0"]),
    ((f"{C}lora_rank=8", f"{C}lora_alpha=0"), [f"{C}lora_alpha = 0", "> 0"]),
    ((f"{C}lora.rank=8", f"{C}lora.alpha=-2"), [f"{C}lora.alpha = -2", "> 0"]),
    ((f"{C}lora_rank=8", f"{C}lora.rank=4"), [f"{C}lora.rank = 4", "contradicts", f"{C}lora_rank = 8"]),
    ((f"{C}lora_rank=8", f"{C}lora.dropout=1.0"), [f"{C}lora.dropout", "[0, 1)"]),
    ((f"{C}lora_rank=8", f"{C}target_modules=[]"), [f"{C}target_modules", "all-linear"]),
    ((f"{C}lora_rank=8", f"{C}lora.type=loha"), [f"{C}lora.type", "LoRA"]),
    ((f"{C}lora_rank=8", f"{C}lora.freeze_language_model=false"), [f"{C}lora.freeze_language_model", "frozen"]),
    ((f"{C}lora_rank=8", f"{C}lora_adapter_path=/no/such/adapter"), [f"{C}lora_adapter_path", "peft LoRA adapter folder"]),
])
def test_bad_critic_lora_values_are_refused_with_one_message(overrides, needles):
    msg = refused(*overrides)
    assert "\n" not in msg
    assert msg.startswith(needles[0].split(" ")[0]), msg
    for needle in needles:
        assert needle in msg, (needle, msg)


def test_a_saved_adapter_folder_is_taken(tmp_path):
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4}))
    (folder / "adapter_model.safetensors").write_bytes(b"")
    for key in ("lora_adapter_path", "lora.adapter_path"):
        assert critic_lora(f"{C}lora_rank=8", f"{C}{key}={folder}").adapter_path == str(folder)


# ---- preflight: the value model's module names -------------------------------------------------------------
def check(tiny_model_dir, *overrides: str) -> None:
    from transformers import AutoTokenizer

    from grpo_dist.config.spec import resolve

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    resolve(load("critic.enable=true", *overrides)).check_model_fits(str(tiny_model_dir), tok)


def test_the_preflight_check_accepts_the_value_models_layers(tiny_model_dir):
    check(tiny_model_dir, f"{C}lora_rank=4")
    check(tiny_model_dir, f"{C}lora_rank=4", f"{C}target_modules=[q_proj,down_proj]")
    check(tiny_model_dir, f"{C}lora.rank=4", rf"{C}lora.target_modules=[self_attn.o_proj]")


@pytest.mark.parametrize("overrides,key,missing", [
    ((f"{C}lora.rank=4", f"{C}lora.target_modules=[linear_qkv]"), f"{C}lora.target_modules", "linear_qkv"),
    ((f"{C}lora_rank=4", f"{C}target_modules=[q_proj,qkv_proj]"), f"{C}target_modules", "qkv_proj"),
    # the value head is trained in full: it is no target
    ((f"{C}lora_rank=4", f"{C}target_modules=[score]"), f"{C}target_modules", "score"),
    # the causal LM's output layer is not the value model's
    ((f"{C}lora_rank=4", f"{C}target_modules=[lm_head]"), f"{C}target_modules", "lm_head"),
    ((f"{C}lora_rank=4", f"{C}target_modules=[q_proj]", f"{C}exclude_modules=[q_proj]"), f"{C}target_modules", "q_proj"),
])
def test_the_preflight_check_names_a_critic_target_module_the_value_model_lacks(tiny_model_dir, overrides, key, missing):
    with pytest.raises(ValueError) as info:
        check(tiny_model_dir, *overrides)
    msg = str(info.value)
    assert msg.startswith(key + " = ") and missing in msg and "matches no linear layer" in msg, msg
    assert "q_proj" in msg and "score" not in msg.split("named", 1)[1], msg  # the layers it does have


def test_the_critic_is_not_checked_when_it_is_off(tiny_model_dir):
    from transformers import AutoTokenizer

    from grpo_dist.config.spec import resolve

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    resolve(load("critic.enable=false", f"{C}lora_rank=4", f"{C}target_modules=[nothing]")).check_model_fits(
        str(tiny_model_dir), tok)
