"""actor_rollout_ref.model.trust_remote_code reaches both rollout engines, not only the trainer."""

from __future__ import annotations

import sys
import types

import pytest

from grpo_dist.config.loader import compose, to_typed
from grpo_dist.config.engine import engine_kwargs


def cfg(*overrides):
    return to_typed(compose(list(overrides)), list(overrides))


@pytest.mark.parametrize("trust", [True, False])
@pytest.mark.parametrize("engine", ["vllm", "hf"])
def test_engine_kwargs_carry_trust_remote_code(engine, trust):
    c = cfg(f"actor_rollout_ref.rollout.name={engine}", f"actor_rollout_ref.model.trust_remote_code={str(trust).lower()}")
    assert engine_kwargs(c, "/m", "cpu")["trust_remote_code"] is trust


def test_vllm_engine_passes_it_to_llm(monkeypatch):
    seen = {}

    class FakeLLM:
        def __init__(self, **kwargs):
            seen.update(kwargs)

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=FakeLLM))
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "")
    from grpo_dist.rollout.vllm_engine import VLLMEngine

    VLLMEngine("/m", dtype="float32", trust_remote_code=True)
    assert seen["trust_remote_code"] is True and seen["model"] == "/m"


def test_hf_engine_passes_it_to_from_pretrained(monkeypatch):
    import torch
    import transformers

    seen = {}

    class Stop(Exception):
        pass

    def fake_from_pretrained(path, **kwargs):
        seen.update(kwargs, path=path)
        raise Stop

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_from_pretrained)
    from grpo_dist.rollout.hf_engine import HFEngine

    with pytest.raises(Stop):
        HFEngine("/m", trust_remote_code=True)
    assert seen["trust_remote_code"] is True and seen["path"] == "/m" and seen["dtype"] is torch.float32
