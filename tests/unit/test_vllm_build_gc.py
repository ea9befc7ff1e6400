"""The vLLM engine is built with the process's heap frozen (vLLM's full garbage collections during the
build then skip the imported modules' objects), and a failed build leaves the heap unfrozen."""

from __future__ import annotations

import gc
import sys
import types

import pytest
import torch


@pytest.fixture
def fake_vllm(monkeypatch):
    """A ``vllm`` module whose LLM records the number of frozen objects when it is built (or fails)."""
    seen: dict = {}

    class LLM:
        fail = False

        def __init__(self, **kwargs):
            seen["frozen"] = gc.get_freeze_count()
            if LLM.fail:
                raise RuntimeError("engine build failed")

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    gc.unfreeze()
    yield LLM, seen
    gc.unfreeze()


def test_the_engine_is_built_with_the_heap_frozen(fake_vllm):
    from grpo_dist.rollout.vllm_engine import VLLMEngine

    LLM, seen = fake_vllm
    assert gc.get_freeze_count() == 0
    VLLMEngine("/m", kv_cache_gib=0.25)
    assert seen["frozen"] > 1000  # the modules' objects, at least


def test_a_failed_build_leaves_the_heap_unfrozen(fake_vllm):
    from grpo_dist.rollout.vllm_engine import VLLMEngine

    LLM, seen = fake_vllm
    LLM.fail = True
    with pytest.raises(RuntimeError, match="engine build failed"):
        VLLMEngine("/m", kv_cache_gib=0.25)
    assert seen["frozen"] > 1000 and gc.get_freeze_count() == 0


def test_nothing_is_frozen_where_garbage_collection_is_off(fake_vllm):
    from grpo_dist.rollout.vllm_engine import VLLMEngine

    LLM, seen = fake_vllm
    gc.disable()
    try:
        VLLMEngine("/m", kv_cache_gib=0.25)
    finally:
        gc.enable()
    assert seen["frozen"] == 0
