"""``actor_rollout_ref.model.override_config``: the policy's config fields as the actor, the reference,
the rollout engines and the start-up checks see them (verl's DAPO recipe raises
``max_position_embeddings`` this way)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from grpo_dist.config import engine, preflight, role_settings
from tests.configs import cfg_of

OVERRIDE = "+actor_rollout_ref.model.override_config.max_position_embeddings=512"


def test_every_builder_of_the_policy_gets_the_fields():
    cfg = cfg_of(OVERRIDE)
    assert role_settings.actor_settings(cfg, "cpu", 10).override_config == {"max_position_embeddings": 512}
    assert role_settings.reference_kwargs(cfg, "cpu")["override_config"] == {"max_position_embeddings": 512}
    assert engine.engine_kwargs(cfg, "/m", "cpu")["hf_overrides"] == {"max_position_embeddings": 512}
    hf = cfg_of(OVERRIDE, "actor_rollout_ref.rollout.name=hf")
    assert engine.engine_kwargs(hf, "/m", "cpu")["config_overrides"] == {"max_position_embeddings": 512}
    plain = cfg_of()
    assert role_settings.actor_settings(plain, "cpu", 10).override_config is None
    assert engine.engine_kwargs(plain, "/m", "cpu")["hf_overrides"] is None


def test_vllm_receives_them_as_hf_overrides(monkeypatch):
    seen: dict = {}

    class LLM:
        def __init__(self, **kwargs):
            seen.update(kwargs)

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    from grpo_dist.rollout.vllm_engine import VLLMEngine

    VLLMEngine(**engine.engine_kwargs(cfg_of(OVERRIDE), "/m", "cpu"))
    assert seen["hf_overrides"] == {"max_position_embeddings": 512}
    seen.clear()
    VLLMEngine(**engine.engine_kwargs(cfg_of(), "/m", "cpu"))
    assert "hf_overrides" not in seen
    with pytest.raises(ValueError, match="hf_overrides"):
        VLLMEngine("/m", extra_kwargs={"hf_overrides": {}})  # one owner: model.override_config


def test_the_context_check_reads_the_overridden_length(tiny_model_dir):
    """The tiny model holds 256 positions: 200 + 100 tokens do not fit, unless the config is overridden."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    sizes = ["data.max_prompt_length=200", "data.max_response_length=100"]
    with pytest.raises(ValueError, match="max_position_embeddings = 256"):
        preflight.check_model_fits(cfg_of(*sizes), str(tiny_model_dir), tok)
    preflight.check_model_fits(cfg_of(*sizes, OVERRIDE), str(tiny_model_dir), tok)


def test_the_hf_engine_builds_the_policy_with_them(tiny_model_dir):
    from grpo_dist.rollout.hf_engine import HFEngine

    engine = HFEngine(str(tiny_model_dir), config_overrides={"max_position_embeddings": 512})
    assert engine.model.config.max_position_embeddings == 512
    assert HFEngine(str(tiny_model_dir)).model.config.max_position_embeddings == 256
