"""The GRPO family's estimators and loss modes against values computed by hand and plain loops."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_dist.core.advantages import get_adv_estimator
from grpo_dist.core.losses import AggSpec
from grpo_dist.core.policy_loss import PolicyLossParams, get_policy_loss

TOKEN_MEAN = AggSpec(mode="token-mean")


def outcome(scores, lengths, T=4):
    """Token rewards with the score on each response's last token, and the response mask."""
    B = len(scores)
    r, m = torch.zeros(B, T), torch.zeros(B, T)
    for i, (s, n) in enumerate(zip(scores, lengths, strict=True)):
        m[i, :n] = 1
        r[i, n - 1] = s
    return r, m


def adv(name, scores, lengths, index, **kw):
    r, m = outcome(scores, lengths)
    a, ret = get_adv_estimator(name).fn(token_level_rewards_BT=r, response_mask_BT=m, index_B=index, **kw)
    return a, ret, m


def test_remax_subtracts_the_greedy_reward_from_the_rewards_to_go():
    a, ret, m = adv("remax", [1.0, 0.0], [2, 3], None, reward_baselines_B=torch.tensor([0.25, 0.25]))
    assert torch.allclose(ret[0, :2], torch.tensor([1.0, 1.0]))
    assert torch.allclose(a, torch.tensor([[0.75, 0.75, 0, 0], [-0.25, -0.25, -0.25, 0]]))
    with pytest.raises(ValueError, match="reward_baselines_B"):
        adv("remax", [1.0], [2], None)


def test_passk_gives_only_the_best_its_margin_over_the_runner_up():
    # group a: rewards 1, 0.5, 0 -> best row 0, margin 0.5, std = 0.5 (unbiased)
    # group b: a tie at the top -> margin 0
    a, _, m = adv("grpo_passk", [1.0, 0.5, 0.0, 1.0, 1.0], [1, 1, 1, 1, 1], ["a", "a", "a", "b", "b"],
                  norm_adv_by_std=True, epsilon=0.0)
    assert a[:, 0].tolist() == pytest.approx([0.5 / 0.5, 0, 0, 0, 0])
    a, _, _ = adv("grpo_passk", [1.0, 0.5, 0.0], [1, 1, 1], ["a"] * 3, norm_adv_by_std=False)
    assert a[:, 0].tolist() == pytest.approx([0.5, 0, 0])


def test_opo_baseline_is_the_length_weighted_mean():
    # lengths 1 and 3, rewards 1 and 0: b = (1*1 + 3*0) / 4 = 0.25
    a, _, m = adv("opo", [1.0, 0.0], [1, 3], ["g", "g"])
    assert a[0, 0].item() == pytest.approx(0.75) and a[1, :3].tolist() == pytest.approx([-0.25] * 3)
    assert torch.all(a[m == 0] == 0)


def test_gpg_rescales_by_the_share_of_non_zero_rewards():
    # B = 4, one non-zero reward: alpha = 4; group means 0.5 and 0
    a, _, _ = adv("gpg", [1.0, 0.0, 0.0, 0.0], [1] * 4, ["a", "a", "b", "b"])
    assert a[:, 0].tolist() == pytest.approx([2.0, -2.0, 0.0, 0.0])
    a, _, _ = adv("gpg", [1.0, 0.0, 2.0, 0.0], [1] * 4, ["a", "a", "b", "b"])
    assert a[:, 0].tolist() == pytest.approx([1.0, -1.0, 2.0, -2.0])  # alpha = 4 / 2


def loss_inputs(seed=0, B=3, T=4):
    g = torch.Generator().manual_seed(seed)
    logp = (-1.0 + 0.3 * torch.randn(B, T, generator=g)).requires_grad_(True)
    old = logp.detach() + 0.2 * torch.randn(B, T, generator=g)
    A = torch.randn(B, T, generator=g)
    mask = torch.ones(B, T)
    mask[0, 3] = mask[2, 2:] = 0
    return logp, old, A, mask


def test_gpg_loss_is_the_plain_policy_gradient():
    logp, old, A, mask = loss_inputs()
    loss, metrics = get_policy_loss("gpg").fn(logp, old, A, mask, agg=TOKEN_MEAN, params=PolicyLossParams())
    assert loss.item() == pytest.approx(float((-A * logp.detach() * mask).sum() / mask.sum()), rel=1e-6)
    assert metrics == {}


def test_cispo_clips_the_weight_and_keeps_every_gradient():
    logp, old, A, mask = loss_inputs(1)
    p = PolicyLossParams(clip_ratio_low=0.1, clip_ratio_high=0.1)
    loss, metrics = get_policy_loss("cispo").fn(logp, old, A, mask, agg=TOKEN_MEAN, params=p)
    loss.backward()
    r = (logp.detach() - old).exp()
    c = r.clamp(0.9, 1.1)
    want = float((-c * A * logp.detach() * mask).sum() / mask.sum())
    assert loss.item() == pytest.approx(want, rel=1e-6)
    assert torch.allclose(logp.grad, -c * A * mask / mask.sum(), atol=1e-7)  # no token loses its gradient
    assert metrics["pg_clipfrac"].item() == pytest.approx(float(((r != c).float() * mask).sum() / mask.sum()))


def test_gspo_uses_one_length_normalised_ratio_per_sequence():
    logp, old, A, mask = loss_inputs(2)
    p = PolicyLossParams(clip_ratio_low=0.05, clip_ratio_high=0.05)
    loss, _ = get_policy_loss("gspo").fn(logp, old, A, mask, agg=TOKEN_MEAN, params=p)
    # a plain loop: per sequence, s = mean of (logp - old) over its tokens, r = exp(s) for every token
    per_seq = []
    for i in range(logp.shape[0]):
        n = int(mask[i].sum())
        s = float(((logp.detach()[i] - old[i]) * mask[i]).sum()) / n
        r = math.exp(s)
        terms = [max(-A[i, t].item() * r, -A[i, t].item() * min(max(r, 0.95), 1.05)) for t in range(n)]
        per_seq.append(sum(terms) / n)
    assert loss.item() == pytest.approx(sum(per_seq) / len(per_seq), rel=1e-5)  # seq-mean-token-mean always


def test_straight_through_kl_has_k1_or_k3_value_and_k2_gradient():
    from grpo_dist.core.kl import kl_penalty

    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0]])
    d = (logp.detach() - ref)
    for kind, value in (("k1+", d), ("k3+", (-d).exp() - 1 + d)):
        logp.grad = None
        kl = kl_penalty(logp, ref, kind)
        assert torch.allclose(kl.detach(), value, atol=1e-6), kind
        kl.sum().backward()
        assert torch.allclose(logp.grad, d, atol=1e-6), kind  # d/dlogp of k2 = (logp - ref)^2 / 2


def test_group_filter_keeps_groups_with_spread_and_single_rows():
    from grpo_dist.core.group_filter import groups_with_spread

    keep, groups, kept = groups_with_spread(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5]), ["a", "a", "b", "b", "c"])
    assert keep.tolist() == [False, False, True, True, True] and (groups, kept) == (3, 2)


def test_overlong_penalty_is_linear_inside_the_buffer():
    from grpo_dist.rewards.shaping import overlong_penalty

    got = overlong_penalty(torch.tensor([4, 6, 7, 8]), max_resp_len=8, buffer_len=4, penalty_factor=1.0)
    assert got.tolist() == pytest.approx([0.0, -0.5, -0.75, -1.0])


def test_truncated_and_band_importance_weights():
    from grpo_dist.core.rollout_correction import importance_weights

    r = torch.log(torch.tensor([[0.5, 1.0, 4.0], [2.0, 1.0, 1.0]]))
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    w, _ = importance_weights(r, mask, level="token", lower=0.5, upper=2.0, band=False)
    assert torch.allclose(w, torch.tensor([[0.5, 1.0, 2.0], [2.0, 1.0, 0.0]]))  # truncated at the upper bound
    w, _ = importance_weights(r, mask, level="token", lower=0.75, upper=3.0, band=True)
    assert torch.allclose(w, torch.tensor([[0.0, 1.0, 0.0], [2.0, 1.0, 0.0]]))  # outside the band: 0
    w, _ = importance_weights(r, mask, level="sequence", lower=0.1, upper=10.0, band=False)
    assert torch.allclose(w, torch.tensor([[2.0, 2.0, 2.0], [2.0, 2.0, 0.0]]))  # 0.5 * 1 * 4 and 2 * 1


def test_geo_mean_loss_by_hand():
    logp = torch.tensor([[-1.0, -1.2, 0.0]], requires_grad=True)
    old = torch.tensor([[-1.1, -1.0, 0.0]])
    A = torch.tensor([[1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    p = PolicyLossParams(clip_ratio_low=0.05, clip_ratio_high=0.05)
    loss, _ = get_policy_loss("geo_mean").fn(logp, old, A, mask, agg=AggSpec(mode="token-mean", global_seqs=1.0), params=p)
    # d = [0.1, -0.2]; clipped [0.05, -0.05]; A > 0 takes min(d, dc) = [0.05, -0.2]
    ratio = math.exp((0.05 - 0.2) / 2)
    assert loss.item() == pytest.approx(-1.0 * ratio, rel=1e-5)
