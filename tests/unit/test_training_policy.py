"""The policy forward (padding trim, temperature, entropy), the LR schedule and ActorSettings checks."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_dist.core.schedules import lr_lambda, resolve_warmup_steps
from grpo_dist.training.settings import ActorSettings
from grpo_dist.training.policy import forward_logprobs, trim_padding_columns


@pytest.fixture(scope="module")
def tiny_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=1, num_key_value_heads=1,
        head_dim=64, intermediate_size=128, tie_word_embeddings=False, attn_implementation="sdpa",
    )
    return Qwen2ForCausalLM(config).eval()


def batch(prompt_lengths, response_lengths, P=6, R=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    B = len(prompt_lengths)
    ids = torch.randint(0, 64, (B, P + R), generator=g)
    am = torch.zeros(B, P + R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lengths, response_lengths, strict=True)):
        am[i, P - p : P + r] = 1
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    rm = am[:, P:].float()
    return ids, am, pos, rm


def test_trim_padding_columns():
    _, am, _, _ = batch([2, 4], [1, 3])
    assert trim_padding_columns(am, 5) == (2, 3)  # prompt columns 0-1 and response columns 3-4 unused
    _, am, _, _ = batch([6, 1], [5, 1])
    assert trim_padding_columns(am, 5) == (0, 5)


def test_forward_logprobs_matches_plain_forward(tiny_model):
    ids, am, pos, rm = batch([2, 4, 3], [1, 3, 2])
    T, R = 0.6, 5
    logp, ent = forward_logprobs(tiny_model, ids, am, pos, response_length=R, temperature=T, compute_entropy=True)
    with torch.no_grad():
        z = tiny_model(input_ids=ids, attention_mask=am, position_ids=pos).logits[:, -R - 1 : -1] / T
    ls = torch.log_softmax(z.float(), -1)
    want = ls.gather(-1, ids[:, -R:].unsqueeze(-1)).squeeze(-1)
    m = rm.bool()
    assert (logp - want)[m].abs().max() < 1e-5
    assert (ent - (-(ls.exp() * ls).sum(-1)))[m].abs().max() < 1e-5
    assert logp.shape == (3, R)
    assert torch.all(logp[:, 3:] == 0), "columns past the longest response are trimmed and filled with 0"
    assert logp.requires_grad and ent.requires_grad


def test_entropy_without_grad(tiny_model):
    ids, am, pos, _ = batch([2, 4], [5, 3])
    logp, ent = forward_logprobs(
        tiny_model, ids, am, pos, response_length=5, temperature=1.0, compute_entropy=True, entropy_requires_grad=False
    )
    assert logp.requires_grad and not ent.requires_grad


def test_lr_schedule_follows_verl():
    const = [lr_lambda(s, kind="constant", warmup_steps=0, total_steps=10, min_lr_ratio=0.0) for s in range(3)]
    assert const == [1.0, 1.0, 1.0]
    warm = [lr_lambda(s, kind="constant", warmup_steps=4, total_steps=10, min_lr_ratio=0.0) for s in range(6)]
    assert warm == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    cos = [lr_lambda(s, kind="cosine", warmup_steps=2, total_steps=10, min_lr_ratio=0.1) for s in range(11)]
    assert cos[0] == pytest.approx(0.1) and cos[1] == pytest.approx(0.55) and cos[2] == pytest.approx(1.0)
    assert cos[6] == pytest.approx(0.55)  # half way through the decay
    assert cos[10] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(cos[2:], cos[3:]))
    assert resolve_warmup_steps(-1, 0.1, 50) == 5
    assert resolve_warmup_steps(None, 0.0, -1) == 0
    assert resolve_warmup_steps(3, 0.5, 50) == 3
    with pytest.raises(ValueError):
        resolve_warmup_steps(-1, 0.1, -1)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(loss_agg_mode="mean"),
        dict(kl_loss_type="k9"),
        dict(kl_loss_type="full"),
        dict(clip_ratio_c=1.0),
        dict(ppo_micro_batch_size_per_gpu=0),
        dict(ppo_epochs=0),
        dict(lr_scheduler_type="cosine"),  # needs total_training_steps
        dict(lr_scheduler_type="linear"),
        dict(param_dtype="fp8"),
        dict(min_lr_ratio=1.5),
    ],
)
def test_actor_settings_reject_bad_values(kwargs):
    with pytest.raises(ValueError):
        ActorSettings(**kwargs)


def test_actor_settings_accept_aliases():
    s = ActorSettings(kl_loss_type="k3", betas=[0.9, 0.95], lr_scheduler_type="cosine", total_training_steps=10)
    assert s.betas == (0.9, 0.95)
    assert math.isclose(s.clip_ratio_low, 0.2)
