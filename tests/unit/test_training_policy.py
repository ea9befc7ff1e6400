"""The policy forward (padding trim, temperature, entropy), the LR schedule and ActorSettings checks."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from grpo_dist.core.policy_loss import PolicyLossParams
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


def test_cosine_cycles_and_step_indexing_follow_verl():
    """verl's optim.num_cycles (waves of the cosine) and optim.zero_indexed_step (count from 1 when false)."""
    full = [lr_lambda(s, kind="cosine", warmup_steps=0, total_steps=4, min_lr_ratio=0.0, num_cycles=1.0) for s in range(5)]
    assert full == pytest.approx([1.0, 0.5, 0.0, 0.5, 1.0], abs=1e-12)  # one whole wave: down and back up
    shifted = [lr_lambda(s, kind="cosine", warmup_steps=2, total_steps=10, min_lr_ratio=0.1, zero_indexed_step=False)
               for s in range(10)]
    assert shifted[0] == pytest.approx(0.55) and shifted[1] == pytest.approx(1.0) and shifted[5] == pytest.approx(0.55)

    def reference(step, warmup, total, floor, cycles, zero_indexed):  # verl's formula, written out again
        s = step if zero_indexed else step + 1
        if s < warmup:
            return floor + (1 - floor) * s / max(1, warmup)
        p = (s - warmup) / max(1, total - warmup)
        return max(floor, (1 - floor) / 2 * math.cos(2 * math.pi * cycles * p) + (1 + floor) / 2)

    for cycles in (0.25, 0.5, 1.5):
        for zero_indexed in (True, False):
            for step in range(12):
                got = lr_lambda(step, kind="cosine", warmup_steps=3, total_steps=11, min_lr_ratio=0.2,
                                num_cycles=cycles, zero_indexed_step=zero_indexed)
                assert got == pytest.approx(reference(step, 3, 11, 0.2, cycles, zero_indexed))
    # the constant schedule has no cosine: both keys leave it alone
    assert lr_lambda(3, kind="constant", warmup_steps=4, total_steps=10, min_lr_ratio=0.0, num_cycles=2.0,
                     zero_indexed_step=False) == 0.75


@pytest.mark.parametrize(
    ("kind", "total_steps", "min_lr_ratio", "message"),
    [
        ("linear", 10, 0.0, "lr_scheduler_type 'linear' unknown; valid: ['constant', 'cosine']"),
        ("cosine", 0, 0.0, "lr_scheduler_type='cosine' needs total_training_steps > 0"),
        ("constant", 10, 1.5, "min_lr_ratio must be in [0, 1], got 1.5"),
    ],
)
def test_one_schedule_check_serves_the_actor_the_critic_and_the_lr_multiplier(kind, total_steps, min_lr_ratio, message):
    from grpo_dist.core.schedules import LRMultiplier
    from grpo_dist.training.settings import CriticSettings

    keywords = dict(lr_scheduler_type=kind, total_training_steps=total_steps, min_lr_ratio=min_lr_ratio)
    for make in (lambda: ActorSettings(**keywords), lambda: CriticSettings(**keywords),
                 lambda: LRMultiplier(kind, warmup_steps=0, total_steps=total_steps, min_lr_ratio=min_lr_ratio)):
        with pytest.raises(ValueError) as info:
            make()
        assert str(info.value) == message


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(loss_agg_mode="mean"),
        dict(kl_loss_agg_mode="mean"),
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
    loss = {k: kwargs.pop(k) for k in list(kwargs) if k in {f.name for f in dataclasses.fields(PolicyLossParams)}}
    with pytest.raises(ValueError):
        ActorSettings(**kwargs, **({"policy_loss": PolicyLossParams(**loss)} if loss else {}))


def test_actor_settings_accept_aliases():
    s = ActorSettings(kl_loss_type="k3", betas=[0.9, 0.95], lr_scheduler_type="cosine", total_training_steps=10)
    assert s.betas == (0.9, 0.95)
    assert math.isclose(s.policy_loss.clip_ratio_low, 0.2)


# ---- packed forward (use_remove_padding) ----


def packed_vs_padded(model, ids, am, pos, R, T):
    """Log-probs, entropies and parameter gradients of one loss through both paths."""
    results = []
    for remove_padding in (False, True):
        model.zero_grad()
        logp, ent = forward_logprobs(
            model, ids, am, pos, response_length=R, temperature=T, compute_entropy=True, remove_padding=remove_padding
        )
        rm = am[:, -R:].bool()
        (-(logp * rm).sum() - 0.1 * (ent * rm).sum()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((logp.detach(), ent.detach(), grads))
    return results


@pytest.mark.parametrize(
    "prompt_lengths,response_lengths",
    [([2, 4, 3], [1, 3, 2]), ([6, 1, 5, 2], [5, 5, 2, 4]), ([3], [5]), ([4, 2], [0, 3])],
)
def test_packed_forward_equals_the_padded_one(tiny_model, prompt_lengths, response_lengths):
    tiny_model.train()
    ids, am, pos, rm = batch(prompt_lengths, response_lengths, seed=len(prompt_lengths))
    (lp0, en0, g0), (lp1, en1, g1) = packed_vs_padded(tiny_model, ids, am, pos, R=5, T=0.7)
    m = rm.bool()
    assert (lp0 - lp1)[m].abs().max() < 1e-5
    assert (en0 - en1)[m].abs().max() < 1e-5
    assert torch.all(lp1[~m] == 0) and torch.all(en1[~m] == 0), "padding positions of the packed path hold 0"
    assert g0.keys() == g1.keys()
    for name in g0:
        assert torch.allclose(g0[name], g1[name], atol=1e-5, rtol=1e-4), name
    tiny_model.eval()


def test_packed_forward_runs_only_the_real_tokens(tiny_model):
    ids, am, pos, rm = batch([2, 4, 3], [1, 3, 2])
    seen = []
    handle = tiny_model.model.embed_tokens.register_forward_hook(lambda mod, inp, out: seen.append(inp[0].shape))
    try:
        forward_logprobs(tiny_model, ids, am, pos, response_length=5, temperature=1.0, compute_entropy=False,
                         remove_padding=True)
    finally:
        handle.remove()
    assert seen == [torch.Size([1, int(am.sum())])]


def test_packed_forward_of_rows_without_response_tokens_is_zero(tiny_model):
    ids, am, pos, _ = batch([2, 4], [0, 0])
    logp, ent = forward_logprobs(tiny_model, ids, am, pos, response_length=5, temperature=1.0, compute_entropy=True,
                                 remove_padding=True)
    assert torch.all(logp == 0) and torch.all(ent == 0)


def test_packing_refuses_a_row_with_a_hole_or_without_a_prompt(tiny_model):
    ids, am, pos, _ = batch([2, 4], [3, 3])
    holed = am.clone()
    holed[1, 7] = 0
    with pytest.raises(ValueError, match="row 1 cannot be packed"):
        forward_logprobs(tiny_model, ids, holed, pos, response_length=5, temperature=1.0, compute_entropy=False,
                         remove_padding=True)
    no_prompt = am.clone()
    no_prompt[0, :6] = 0
    with pytest.raises(ValueError, match="row 0 cannot be scored: its response has no attended prompt token"):
        forward_logprobs(tiny_model, ids, no_prompt, pos, response_length=5, temperature=1.0, compute_entropy=False,
                         remove_padding=True)


@pytest.mark.parametrize("remove_padding", [False, True])
def test_chunked_logits_give_the_same_values_and_gradients(tiny_model, remove_padding):
    ids, am, pos, rm = batch([6, 1, 5, 2], [5, 5, 2, 4], seed=9)
    results = []
    for chunk in (None, 3):
        tiny_model.zero_grad()
        logp, ent = forward_logprobs(tiny_model, ids, am, pos, response_length=5, temperature=0.9, compute_entropy=True,
                                     remove_padding=remove_padding, logits_chunk_size=chunk)
        (-(logp * rm).sum() - 0.1 * (ent * rm).sum()).backward()
        results.append((logp.detach(), ent.detach(), [p.grad.clone() for p in tiny_model.parameters()]))
    (lp0, en0, g0), (lp1, en1, g1) = results
    m = rm.bool()
    assert (lp0 - lp1)[m].abs().max() < 1e-6 and (en0 - en1)[m].abs().max() < 1e-6
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(g0, g1, strict=True))


def test_update_keys_are_what_the_driver_sends_and_the_actor_takes():
    from grpo_dist.training.settings import UPDATE_KEYS, update_keys

    assert update_keys(use_kl_loss=False, old_log_probs=False, rollout_is_weights=False) == UPDATE_KEYS
    assert update_keys(use_kl_loss=True, old_log_probs=True, rollout_is_weights=True) == UPDATE_KEYS + (
        "ref_log_prob", "old_log_probs", "rollout_is_weights")
    assert update_keys(use_kl_loss=False, old_log_probs=True, rollout_is_weights=False) == UPDATE_KEYS + ("old_log_probs",)
