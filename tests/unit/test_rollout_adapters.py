"""The adapter-only weight sync's pieces without vLLM: the folder an engine loads an adapter from, the Hugging
Face engine serving an adapter, and the protocol's one-time set-up (stand-in groups)."""

from __future__ import annotations

import json

import pytest
import torch

from grpo_dist.rollout.adapters import check_adapter_names, write_adapter
from tests.adapters import random_adapter


def _peft(model_dir, seed: int, targets="all-linear"):
    """A rank-4 LoRA policy on ``model_dir`` with random B (the adapter changes the policy)."""
    return random_adapter(model_dir, seed, rank=4, alpha=8, targets=targets, scale=0.5)


def test_a_written_adapter_folder_loads_in_peft_as_the_same_policy(tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from grpo_dist.training.lora import is_adapter_folder

    model, tensors, config = _peft(tiny_model_dir, seed=0, targets=["q_proj", "v_proj"])
    json.dumps(config)  # JSON as it is: the module sets became lists
    assert sorted(config["target_modules"]) == ["q_proj", "v_proj"]
    folder = write_adapter(tmp_path / "a", tensors.items(), config)
    assert is_adapter_folder(folder)
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
                                       str(folder)).eval()
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, atol=1e-6, rtol=0)


@pytest.mark.parametrize("names", [["model.layers.0.self_attn.q_proj.weight"],
                                   ["base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"]])
def test_tensors_that_are_not_lora_factors_are_refused(names, tmp_path):
    with pytest.raises(ValueError, match="not LoRA factors"):
        check_adapter_names(names)
    with pytest.raises(ValueError, match="not LoRA factors"):
        write_adapter(tmp_path / "x", [(n, torch.zeros(2, 2)) for n in names], {"peft_type": "LORA"})


def test_the_hf_engine_samples_through_each_adapter_version_it_is_sent(tiny_model_dir):
    """The Hugging Face engine's adapter mode: after ``load_adapter`` its greedy tokens and sampling log-probs
    are the peft policy's, version after version (the tensors replaced in place)."""
    from grpo_dist.rollout import SamplingSettings, make_engine

    engine = make_engine("hf", model_path=tiny_model_dir, dtype="float32", device="cpu", seed=0)
    prompt = [2, 5, 6, 7, 8]
    greedy = SamplingSettings.greedy(max_tokens=6)
    base = engine.generate([prompt], greedy)
    outs = []
    for seed in (1, 2):
        model, tensors, config = _peft(tiny_model_dir, seed)
        engine.load_adapter(tensors.items(), config)
        out = engine.generate([prompt], greedy)
        ids = out.response_ids[0]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
        want = logits.log_softmax(-1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(out.logprobs[0]), want, atol=1e-5, rtol=0)
        assert ids == logits.argmax(-1).tolist()
        outs.append(out.logprobs[0])
    assert outs[0] != outs[1] and base.logprobs[0] != outs[0]
    _, tensors, config = _peft(tiny_model_dir, 3, targets=["q_proj"])
    with pytest.raises(ValueError, match="configured differently"):
        engine.load_adapter(tensors.items(), config)


class _Group:
    def __init__(self, ranks, answer):
        self.ranks, self.answer, self.calls = ranks, answer, []

    def __len__(self):
        return self.ranks

    def call(self, method, *args, per_rank=None):
        self.calls.append((method, args))
        return [self.answer(method, args) for _ in range(self.ranks)]


@pytest.mark.parametrize("config", [None, {"peft_type": "LORA", "r": 8}])
def test_prepare_tells_every_rollout_rank_the_adapter_once(config):
    from grpo_dist.trainer.weight_sync import WeightSync

    actor = _Group(2, lambda method, args: config if method == "adapter_config" else None)
    rollout = _Group(2, lambda method, args: None)
    sync = WeightSync(actor, rollout, transport="object_store", dtype="float32", bucket_bytes=1024)
    assert sync.prepare() is (config is not None) and sync.adapter_only is (config is not None)
    assert actor.calls == [("adapter_config", ())]
    assert rollout.calls == ([("set_adapter_config", (config,))] if config else [])
