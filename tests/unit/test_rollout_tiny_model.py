"""The tiny test model: loads through the real Hugging Face code paths; its tokenizer round-trips text."""

from __future__ import annotations

import json

import pytest
import torch

from grpo_dist.utils.tiny_model import SPECIAL_TOKENS, build_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=3)


def test_tokenizer_round_trips_ascii_text_with_whitespace(model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    text = "Hello, World!\n  12 + 34 = 46\t~`{}[]\\|\"'\r\nend "
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)  # one token per character
    assert tok.decode(ids) == text
    assert len(tok) == len(SPECIAL_TOKENS) + 100
    assert tok.pad_token == "<|pad|>" and tok.eos_token == "<|endoftext|>"
    assert tok.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == [0, 1, 2, 3]


def test_chat_template_builds_a_chatml_generation_prompt(model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+3?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = tok.encode(text, add_special_tokens=False)
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 3  # special tokens stay whole
    assert tok.decode(ids) == text


def test_model_loads_with_the_requested_shape_and_stops_on_im_end(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    cfg = model.config
    assert cfg.model_type == "qwen2" and not cfg.tie_word_embeddings
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.head_dim) == (64, 2, 64)
    assert model.dtype == torch.float32
    assert model.generation_config.eos_token_id == [3, 1]  # <|im_end|>, <|endoftext|>
    logits = model(torch.tensor([[2, 10, 11]])).logits
    assert logits.shape == (1, 3, cfg.vocab_size) and torch.isfinite(logits).all()
    gen = json.loads((model_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [3, 1]


def test_same_seed_same_weights_and_other_seed_other_weights(model_dir, tmp_path):
    from safetensors.torch import load_file

    a = load_file(model_dir / "model.safetensors")
    b = load_file(build_tiny_model(tmp_path / "same", seed=3) / "model.safetensors")
    c = load_file(build_tiny_model(tmp_path / "other", seed=4) / "model.safetensors")
    name = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(a[name], b[name])
    assert not torch.equal(a[name], c[name])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(head_dim=16), "head_dim"),
        (dict(num_heads=3, num_kv_heads=2), "multiple"),
        (dict(vocab=["a", "a"]), "duplicate"),
        (dict(vocab=["ab"]), "one-character"),
        (dict(vocab=["é"]), "ASCII"),
    ],
)
def test_build_tiny_model_rejects_bad_arguments(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_tiny_model(tmp_path / "bad", **kwargs)
