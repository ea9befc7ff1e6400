"""KL estimators, controllers and the in-reward KL penalty."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_dist.core import (
    KL_ALIASES,
    KL_KINDS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    canonical_kl_kind,
    kl_full,
    kl_penalty,
    make_kl_controller,
)


def test_canonical_kinds_and_aliases():
    assert set(KL_KINDS) == {"kl", "abs", "mse", "low_var_kl", "full"}
    assert canonical_kl_kind("k1") == "kl" and canonical_kl_kind("k2") == "mse"
    assert canonical_kl_kind("k3") == "low_var_kl" and canonical_kl_kind("abs") == "abs"
    assert KL_ALIASES == {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}
    with pytest.raises(ValueError) as e:
        canonical_kl_kind("k4")
    for name in ("kl", "abs", "mse", "low_var_kl", "full", "k1", "k2", "k3"):
        assert name in str(e.value)
    with pytest.raises(ValueError, match="valid kinds"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "reverse_kl")


def test_kl_penalty_hand_computed_every_kind():
    # d = logp - ref = [1, -0.5]
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    ref = torch.tensor([[-2.0, -1.5]], dtype=torch.float64)
    want = {
        "kl": [1.0, -0.5],
        "abs": [1.0, 0.5],
        "mse": [0.5, 0.125],  # 0.5 * d^2
        # x = ref - logp = [-1, 0.5]: exp(x) - x - 1 = [e^-1 + 1 - 1, e^0.5 - 0.5 - 1]
        "low_var_kl": [math.exp(-1.0), math.exp(0.5) - 1.5],
    }
    for kind, values in want.items():
        torch.testing.assert_close(kl_penalty(logp, ref, kind), torch.tensor([values], dtype=torch.float64))
    for alias, kind in KL_ALIASES.items():
        torch.testing.assert_close(kl_penalty(logp, ref, alias), kl_penalty(logp, ref, kind))


def test_kl_penalty_full_points_to_kl_full():
    with pytest.raises(ValueError, match="kl_full"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "full")


def test_low_var_kl_extreme_log_ratios_are_clamped_and_finite():
    # logp >> ref: x = ref - logp = -100 -> clamp -20 -> e^-20 + 20 - 1 = 19.0 -> clamp 10
    # logp << ref: x = +100 -> clamp 20 -> e^20 - 21 -> clamp 10
    logp = torch.tensor([[0.0, -100.0, -1e30]], requires_grad=True)
    ref = torch.tensor([[-100.0, 0.0, 0.0]])
    k3 = kl_penalty(logp, ref, "low_var_kl")
    torch.testing.assert_close(k3, torch.tensor([[10.0, 10.0, 10.0]]))
    k3.sum().backward()
    assert torch.isfinite(logp.grad).all()
    for kind in ("kl", "abs", "mse"):
        assert torch.isfinite(kl_penalty(logp.detach()[:, :2], ref[:, :2], kind)).all()


def test_low_var_kl_nonnegative_and_expectation_equals_full_kl():
    # E_{v ~ p}[k3(v)] = sum_v p_v (q_v/p_v - log(q_v/p_v) - 1) = KL(p || q)   (k1 too)
    gen = torch.Generator().manual_seed(0)
    # moderate logits so that no k3 value reaches the [-10, 10] clamp
    z = 0.7 * torch.randn(3, 4, 7, generator=gen, dtype=torch.float64)
    zr = 0.7 * torch.randn(3, 4, 7, generator=gen, dtype=torch.float64)
    logp, logq = torch.log_softmax(z, -1), torch.log_softmax(zr, -1)
    k3 = kl_penalty(logp, logq, "low_var_kl")
    assert (k3 >= 0).all() and (k3 < 10).all()
    full = kl_full(z, zr)
    torch.testing.assert_close((logp.exp() * k3).sum(-1), full)
    torch.testing.assert_close((logp.exp() * kl_penalty(logp, logq, "k1")).sum(-1), full)


def test_kl_full_hand_computed_and_edge_cases():
    # p = [1/2, 1/2], q = [1/4, 3/4]: KL = 1/2 ln 2 + 1/2 ln(2/3) = 1/2 ln(4/3) = 0.143841
    z = torch.tensor([[[0.0, 0.0]]])
    zr = torch.tensor([[[0.0, math.log(3.0)]]])
    assert kl_full(z, zr).item() == pytest.approx(0.5 * math.log(4 / 3), abs=1e-6)
    assert kl_full(zr, zr).item() == pytest.approx(0.0, abs=1e-7)
    # p puts zero mass on a token (-inf logit): that token contributes 0, result finite, grad finite
    zp = torch.tensor([[[0.0, -float("inf"), 1.0]]], requires_grad=True)
    zq = torch.tensor([[[0.5, 2.0, -3.0]]])
    out = kl_full(zp, zq)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(zp.grad).all()
    # p = softmax([0, 1]) on tokens 0 and 2; KL = sum over those two tokens of p (log p - log q)
    p = torch.softmax(torch.tensor([0.0, 1.0]), -1)
    logq = torch.log_softmax(zq[0, 0], -1)
    want = p[0] * (p[0].log() - logq[0]) + p[1] * (p[1].log() - logq[2])
    assert out.item() == pytest.approx(want.item(), abs=1e-6)
    with pytest.raises(ValueError, match="ref_logits_BTV"):
        kl_full(torch.zeros(1, 2, 3), torch.zeros(1, 2, 4))


def test_fixed_and_adaptive_controllers():
    fixed = FixedKLController(0.05)
    fixed.update(current_kl=100.0, n_steps=1000)
    assert fixed.value == 0.05

    # target 6, horizon 10000, 256 responses
    # current 12: e = clip(12/6 - 1, -0.2, 0.2) = 0.2 -> value = 0.1 * (1 + 0.2*256/10000) = 0.100512
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=6.0, horizon=10000)
    ctrl.update(current_kl=12.0, n_steps=256)
    assert ctrl.value == pytest.approx(0.100512)
    # current 5.7: e = 5.7/6 - 1 = -0.05 -> value *= 1 - 0.05*256/10000 = 0.99872
    ctrl.update(current_kl=5.7, n_steps=256)
    assert ctrl.value == pytest.approx(0.100512 * 0.99872)
    # current 0: e = -1 clipped to -0.2 -> value *= 1 - 0.2*1000/10000 = 0.98
    before = ctrl.value
    ctrl.update(current_kl=0.0, n_steps=1000)
    assert ctrl.value == pytest.approx(before * 0.98)


def test_make_kl_controller_and_validation():
    assert isinstance(make_kl_controller("fixed", 0.01, 6.0, 10000), FixedKLController)
    a = make_kl_controller("adaptive", 0.01, 6.0, 10000)
    assert isinstance(a, AdaptiveKLController) and a.value == 0.01
    with pytest.raises(ValueError) as e:
        make_kl_controller("pid", 0.01, 6.0, 10000)
    assert "fixed" in str(e.value) and "adaptive" in str(e.value)
    with pytest.raises(ValueError, match="horizon"):
        make_kl_controller("adaptive", 0.01, 6.0, 0)
    with pytest.raises(ValueError, match="target_kl"):
        make_kl_controller("adaptive", 0.01, 0.0, 100)
    with pytest.raises(ValueError, match="kl_coef"):
        make_kl_controller("fixed", -0.1, 6.0, 100)


def test_apply_kl_penalty_hand_computed():
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0], [0.0, 0.0, 0.0]])
    old = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0], [-1.0, -1.0, -1.0]])
    ref = torch.tensor([[-1.5, -1.0, -2.0], [-2.4, -1.0, 0.0], [-3.0, -3.0, -3.0]])
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0], [0, 0, 0]])
    # k1 = old - ref: row 0 [0.5, 0, 1]; row 1 [0.4, -1, (2, masked)]; row 2 fully masked
    # rewards = scores - 0.1 * k1 * mask:
    #   row 0 [-0.05, 0, 0.9]; row 1 [-0.04, 2.1, 0]; row 2 [0, 0, 0]
    # per-sequence masked mean: 1.5/3 = 0.5, -0.6/2 = -0.3, 0 (empty) -> mean over 3 rows = 0.2/3
    rewards, current_kl = apply_kl_penalty(scores, old, ref, mask, kl_coef=0.1, kind="kl")
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, 0.0, 0.9], [-0.04, 2.1, 0.0], [0.0, 0.0, 0.0]]))
    assert isinstance(current_kl, float) and current_kl == pytest.approx(0.2 / 3, abs=1e-6)

    # with k3 the penalty is non-negative, so rewards never increase
    rewards3, kl3 = apply_kl_penalty(scores, old, ref, mask, kl_coef=0.1, kind="k3")
    assert (rewards3 <= scores).all() and kl3 > 0
    with pytest.raises(ValueError, match="mask_BT"):
        apply_kl_penalty(scores, old, ref, mask[:, :2], kl_coef=0.1, kind="kl")
