"""The value model's adapters (grpo_dist.training.critic_lora) on an unsharded tiny value model: the value
head is never adapted and stays trainable, whatever the targets and exclusions say; a saved adapter loads
whatever task it was saved for, and one that carries the head is refused; the export's merged weights are
peft's own merge under the value model's names."""

from __future__ import annotations

import pytest
import torch

from grpo_dist.training.critic_lora import add_value_adapters, merged_value_state, value_linear_names
from grpo_dist.training.settings import LoraSettings

BLOCK = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LAYERS = [f"model.layers.{i}.{'mlp' if m in ('gate_proj', 'up_proj', 'down_proj') else 'self_attn'}.{m}"
          for i in range(2) for m in BLOCK]
"""The linear layers of the tiny value model's two blocks (its head, ``score``, aside)."""


def qwen2_config(**extra):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=32, hidden_size=16, num_hidden_layers=2, num_attention_heads=1, num_key_value_heads=1,
                       head_dim=16, intermediate_size=32, **extra)


def value_model(seed: int = 0):
    from transformers import Qwen2ForTokenClassification

    torch.manual_seed(seed)
    return Qwen2ForTokenClassification(qwen2_config(num_labels=1)).eval()


def adapted(model) -> set[str]:
    from peft.tuners.lora import LoraLayer

    return {name.removeprefix("base_model.model.") for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def trainable(model) -> set[str]:
    return {n for n, p in model.named_parameters() if p.requires_grad}


def lora_params(model) -> set[str]:
    return {n for n, _ in model.named_parameters() if ".lora_" in n}


HEAD = {"base_model.model.score.weight", "base_model.model.score.bias"}


@pytest.mark.parametrize("targets,exclude,expected", [
    ("all-linear", None, set(LAYERS)),
    (("q_proj", "score"), None, {"model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.q_proj"}),
    ("all-linear", r"model\.layers\.\d+\.mlp\..*", {n for n in LAYERS if ".self_attn." in n}),
    (r".*(q_proj|score)", ("layers.1.self_attn.q_proj",), {"model.layers.0.self_attn.q_proj"}),
])
def test_the_value_head_is_never_adapted_and_stays_trainable(targets, exclude, expected):
    model = add_value_adapters(value_model(), LoraSettings(rank=2, alpha=4, target_modules=targets, exclude_modules=exclude))
    assert type(model).__name__ == "PeftModel"  # task-neutral: the value model's own forward
    assert adapted(model) == expected
    assert trainable(model) == lora_params(model) | HEAD


def test_the_head_keeps_its_weights_and_b_starts_at_zero():
    plain = value_model(seed=3)
    ids = torch.randint(0, 32, (2, 5))
    with torch.no_grad():
        want = plain(input_ids=ids).logits
        model = add_value_adapters(value_model(seed=3), LoraSettings(rank=2, alpha=4))
        torch.testing.assert_close(model(input_ids=ids).logits, want, rtol=0, atol=0)


def test_rank_zero_is_refused():
    with pytest.raises(ValueError, match="rank > 0"):
        add_value_adapters(value_model(), LoraSettings(rank=0))


def saved_adapter(folder, *, task_type, modules_to_save=None, targets=("q_proj", "v_proj")):
    """An adapter trained elsewhere: LoRA on a causal LM (or a value model) with the same backbone, B non-zero."""
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(5)
    base = value_model() if task_type == "TOKEN_CLS" else Qwen2ForCausalLM(qwen2_config())
    peft = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules=list(targets), task_type=task_type,
                                           modules_to_save=modules_to_save))
    with torch.no_grad():
        for n, p in peft.named_parameters():
            if ".lora_B." in n:
                p.normal_()
    peft.save_pretrained(folder)
    return {n.replace(".default", ""): p.detach().clone() for n, p in peft.named_parameters() if ".lora_" in n}


def test_a_saved_causal_lm_adapter_loads_on_the_value_model(tmp_path):
    saved = saved_adapter(tmp_path / "adapter", task_type="CAUSAL_LM")
    model = add_value_adapters(value_model(), LoraSettings(rank=8, adapter_path=str(tmp_path / "adapter")))
    assert type(model).__name__ == "PeftModel"
    got = {n.replace(".default", ""): p for n, p in model.named_parameters() if ".lora_" in n}
    assert set(got) == set(saved) and all(torch.equal(got[n], saved[n]) for n in saved)
    assert got["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"].shape[0] == 2  # the saved rank
    assert trainable(model) == lora_params(model) | HEAD


@pytest.mark.filterwarnings("ignore:Found missing adapter keys")  # the head's factors, which were never saved
def test_a_saved_adapter_that_carries_the_value_head_is_refused(tmp_path):
    saved_adapter(tmp_path / "with_head", task_type="TOKEN_CLS")  # peft saves the head (modules_to_save)
    with pytest.raises(ValueError, match="saves its own value head"):
        add_value_adapters(value_model(), LoraSettings(rank=2, adapter_path=str(tmp_path / "with_head")))
    saved_adapter(tmp_path / "on_head", task_type="CAUSAL_LM", targets=("q_proj", "score"))
    with pytest.raises(ValueError, match="adapts the value head"):
        add_value_adapters(value_model(), LoraSettings(rank=2, adapter_path=str(tmp_path / "on_head")))


def test_the_merged_state_is_peft_merge_under_the_value_models_names():
    model = add_value_adapters(value_model(seed=1), LoraSettings(rank=2, alpha=6, target_modules=("q_proj", "down_proj")))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.normal_()
    merged = merged_value_state(model, {k: v.clone() for k, v in model.state_dict().items()})
    want = model.merge_and_unload().state_dict()
    assert set(merged) == set(want) == set(value_model().state_dict())
    for name in want:
        torch.testing.assert_close(merged[name], want[name], rtol=1e-6, atol=1e-6)
    assert merged_value_state(model, {}) == {}  # a rank other than 0


def test_the_preflight_names_are_the_value_models_without_its_head():
    names = value_linear_names(qwen2_config(num_labels=1))
    assert "score" not in names and "lm_head" not in names
    assert sorted(n.rsplit(".", 1)[-1] for n in names) == sorted(BLOCK * 2)
