"""Loss aggregation, PPO clip loss, entropy and log-probs: hand values, split invariance, edge cases."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_dist.core import (
    ALL_LOSS_AGG_MODES,
    LOSS_AGG_MODES,
    AggSpec,
    agg_loss,
    entropy_from_logits,
    global_counts,
    logprobs_from_logits,
    masked_mean,
    ppo_clip_policy_loss,
)

NAN, INF = float("nan"), float("inf")


def hand_batch():
    # row 0: tokens 1, 2 count (len 2, sum 3); row 1: token 4 (len 1, sum 4); row 2: empty mask
    # padding holds garbage (including nan / inf) that must be ignored
    loss = torch.tensor([[1.0, 2.0, NAN], [4.0, INF, 6.0], [NAN, 8.0, -INF]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.float64)
    return loss, mask


# --------------------------------------------------------------------------------------------------
# AggSpec / agg_loss
# --------------------------------------------------------------------------------------------------


def test_agg_spec_validates_mode_and_counts():
    with pytest.raises(ValueError) as e:
        AggSpec("token_mean")
    for mode in LOSS_AGG_MODES:
        assert mode in str(e.value)
    with pytest.raises(ValueError, match="global_tokens"):
        AggSpec("token-mean", global_tokens=-1.0)
    with pytest.raises(ValueError, match="global_seqs"):
        AggSpec("seq-mean-token-sum", global_seqs=-2.0)
    with pytest.raises(ValueError, match="norm_constant"):
        AggSpec("seq-mean-token-sum-norm", norm_constant=0.0)
    assert AggSpec("token-mean").global_tokens is None


def test_agg_loss_hand_computed_local_counts():
    loss, mask = hand_batch()
    # 3 mask tokens: (1 + 2 + 4)/3
    assert agg_loss(loss, mask, AggSpec("token-mean")).item() == pytest.approx(7 / 3)
    # 2 non-empty sequences: (3 + 4)/2
    assert agg_loss(loss, mask, AggSpec("seq-mean-token-sum")).item() == pytest.approx(3.5)
    # (3/2 + 4/1)/2
    assert agg_loss(loss, mask, AggSpec("seq-mean-token-mean")).item() == pytest.approx(2.75)
    # (3 + 4)/(C * 2) with C = 4; C defaults to T = 3
    assert agg_loss(loss, mask, AggSpec("seq-mean-token-sum-norm", norm_constant=4)).item() == pytest.approx(0.875)
    assert agg_loss(loss, mask, AggSpec("seq-mean-token-sum-norm")).item() == pytest.approx(7 / 6)
    # token-sum: no normaliser, 1 + 2 + 4
    assert agg_loss(loss, mask, AggSpec("token-sum")).item() == pytest.approx(7.0)


def test_agg_loss_hand_computed_global_counts():
    loss, mask = hand_batch()
    # the rows of this call are a piece of a mini-batch with 10 tokens in 4 non-empty sequences
    assert agg_loss(loss, mask, AggSpec("token-mean", global_tokens=10)).item() == pytest.approx(0.7)  # 7/10
    assert agg_loss(loss, mask, AggSpec("seq-mean-token-sum", global_seqs=4)).item() == pytest.approx(1.75)  # 7/4
    assert agg_loss(loss, mask, AggSpec("seq-mean-token-mean", global_seqs=4)).item() == pytest.approx(1.375)  # 5.5/4
    spec = AggSpec("seq-mean-token-sum-norm", global_seqs=4, norm_constant=4)
    assert agg_loss(loss, mask, spec).item() == pytest.approx(0.4375)  # 7/16
    # token-sum has no count to take: still 1 + 2 + 4, and every token's gradient is 1
    x = loss.clone().requires_grad_(True)
    out = agg_loss(x, mask, AggSpec("token-sum", global_tokens=10, global_seqs=4))
    (g,) = torch.autograd.grad(out, x)
    assert out.item() == pytest.approx(7.0)
    torch.testing.assert_close(g, mask)


def agg_loop(loss, mask, mode, n_tok, n_seq, C):
    """agg_loss and its gradient from the definitions, one sequence and one token at a time."""
    L, M = loss.tolist(), mask.tolist()
    value, grad = 0.0, [[0.0] * len(L[0]) for _ in L]
    for i in range(len(L)):
        toks = [j for j, m in enumerate(M[i]) if m != 0]
        for j in toks:
            w = {"token-mean": 1 / n_tok, "token-sum": 1.0, "seq-mean-token-sum": 1 / n_seq,
                 "seq-mean-token-mean": 1 / (len(toks) * n_seq), "seq-mean-token-sum-norm": 1 / (C * n_seq)}[mode]
            value += L[i][j] * M[i][j] * w
            grad[i][j] = M[i][j] * w
    return value, grad


@pytest.mark.parametrize("mode", ALL_LOSS_AGG_MODES)
def test_agg_loss_matches_a_plain_loop(mode):
    gen = torch.Generator().manual_seed(3)
    loss = torch.randn(6, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([5, 0, 2, 1, 4, 3])
    mask = (torch.arange(5)[None, :] < lengths[:, None]).double()
    spec = AggSpec(mode, global_tokens=23.0, global_seqs=7.0, norm_constant=6.0)  # a larger mini-batch's counts
    out = agg_loss(loss, mask, spec)
    (g,) = torch.autograd.grad(out, loss)
    want, want_grad = agg_loop(loss, mask, mode, 23.0, 7.0, 6.0)
    assert out.item() == pytest.approx(want, rel=1e-12)
    torch.testing.assert_close(g, torch.tensor(want_grad, dtype=torch.float64))


def test_agg_loss_bool_mask_and_float32():
    loss, mask = hand_batch()
    for mode in ALL_LOSS_AGG_MODES:
        a = agg_loss(loss.float(), mask.bool(), AggSpec(mode))
        b = agg_loss(loss, mask, AggSpec(mode))
        assert a.dtype == torch.float32
        assert a.item() == pytest.approx(b.item(), rel=1e-6)


def test_agg_loss_zero_counts_give_zero_not_nan():
    loss = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(3, 4)
    for mode in ALL_LOSS_AGG_MODES:
        for spec in (AggSpec(mode), AggSpec(mode, global_tokens=0.0, global_seqs=0.0)):
            out = agg_loss(loss, mask, spec)
            assert out.item() == 0.0, mode
            (g,) = torch.autograd.grad(out, loss)
            assert torch.equal(g, torch.zeros_like(g)), mode
    # an empty piece of a non-empty mini-batch contributes exactly 0
    for mode in ALL_LOSS_AGG_MODES:
        assert agg_loss(loss, mask, AggSpec(mode, global_tokens=5, global_seqs=2)).item() == 0.0


def test_global_counts_and_masked_mean():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    assert global_counts(mask) == (3.0, 2.0)
    assert global_counts(mask.bool()) == (3.0, 2.0)
    x = torch.tensor([[1.0, 2.0, 9.0], [9.0, 9.0, 9.0], [6.0, 9.0, 9.0]])
    assert masked_mean(x, mask).item() == pytest.approx(3.0)  # (1 + 2 + 6)/3
    assert masked_mean(x, torch.zeros(3, 3)).item() == 0.0


# --------------------------------------------------------------------------------------------------
# split invariance: micro-batches and data-parallel shards
# --------------------------------------------------------------------------------------------------


def invariance_batch(B=11, T=9, seed=0, holes=False):
    """Rows of random lengths; with ``holes``, agent-loop trajectories: tokens 2-3 of every row longer than 5
    are a tool's response (mask 0 inside the response)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, T + 1, (B,), generator=gen)
    lengths[2] = 0  # an empty row
    lengths[5] = T
    lengths[7] = 1
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).double()
    if holes:
        mask[lengths > 5, 2:4] = 0.0
    old = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 3
    logp = old + 0.4 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    adv = torch.randn(B, 1, generator=gen, dtype=torch.float64).expand(B, T) * mask
    return logp, old, adv, mask


def loss_and_grad(logp, old, adv, mask, pieces, spec_for):
    """Sum the PPO loss over row pieces (each with its own AggSpec) and return (loss, dloss/dlogp)."""
    logp = logp.clone().requires_grad_(True)
    total = 0.0
    for rows in pieces:
        loss, _ = ppo_clip_policy_loss(
            logp[rows], old[rows], adv[rows], mask[rows],
            clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, agg=spec_for(rows),
        )
        total = total + loss
    (grad,) = torch.autograd.grad(total, logp)
    return total.detach(), grad


@pytest.mark.parametrize("holes", [False, True], ids=["single-turn", "tool-tokens-masked"])
@pytest.mark.parametrize("mode", ALL_LOSS_AGG_MODES)
def test_agg_loss_and_grad_invariant_to_micro_batches_and_shards(mode, holes):
    logp, old, adv, mask = invariance_batch(holes=holes)
    B = logp.shape[0]
    tokens, seqs = global_counts(mask)
    global_spec = AggSpec(mode, global_tokens=tokens, global_seqs=seqs, norm_constant=12.0)

    whole_loss, whole_grad = loss_and_grad(logp, old, adv, mask, [torch.arange(B)], lambda rows: AggSpec(mode, norm_constant=12.0))
    # local counts of the whole == global counts
    same_loss, same_grad = loss_and_grad(logp, old, adv, mask, [torch.arange(B)], lambda rows: global_spec)
    torch.testing.assert_close(same_loss, whole_loss)
    torch.testing.assert_close(same_grad, whole_grad)

    # micro-batches of 3 rows (uneven last piece)
    micro = [torch.arange(B)[i : i + 3] for i in range(0, B, 3)]
    mb_loss, mb_grad = loss_and_grad(logp, old, adv, mask, micro, lambda rows: global_spec)
    torch.testing.assert_close(mb_loss, whole_loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mb_grad, whole_grad, rtol=1e-12, atol=1e-12)

    # 2 data-parallel shards (interleaved rows), each cut into micro-batches of 2; the sum over
    # ranks (what an all-reduce SUM of the gradients gives) equals the whole
    shards = [torch.arange(r, B, 2) for r in range(2)]
    pieces = [s[i : i + 2] for s in shards for i in range(0, len(s), 2)]
    sh_loss, sh_grad = loss_and_grad(logp, old, adv, mask, pieces, lambda rows: global_spec)
    torch.testing.assert_close(sh_loss, whole_loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(sh_grad, whole_grad, rtol=1e-12, atol=1e-12)
    # tokens the model did not sample (mask 0, tool responses included) get no gradient
    assert torch.all(whole_grad[mask == 0] == 0)
    if holes:  # the batch really has model tokens after a masked tool response
        assert bool(((mask[:, 2] == 0) & (mask[:, 4] == 1)).any())

    # sanity of the test itself: with LOCAL counts per piece the sum is NOT the whole (token-sum has no
    # count, so for it there is nothing to get wrong)
    if mode == "token-sum":
        return
    loc_loss, loc_grad = loss_and_grad(logp, old, adv, mask, pieces, lambda rows: AggSpec(mode, norm_constant=12.0))
    assert not torch.allclose(loc_grad, whole_grad, rtol=1e-6, atol=1e-9)


def test_seq_mean_token_sum_norm_uses_constant_not_length():
    # Dr. GRPO: a longer sequence's tokens are not down-weighted; per-token weight = 1/(C * N_seq)
    loss = torch.ones(2, 4, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1.0, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.float64)
    out = agg_loss(loss, mask, AggSpec("seq-mean-token-sum-norm", norm_constant=8))
    (g,) = torch.autograd.grad(out, loss)
    # (1 + 4)/(8 * 2) = 5/16, gradient 1/16 on every mask token
    assert out.item() == pytest.approx(5 / 16)
    torch.testing.assert_close(g, mask / 16)
    # seq-mean-token-mean instead weights the short sequence's token 4x more: 1/2 vs 1/8
    out2 = agg_loss(loss, mask, AggSpec("seq-mean-token-mean"))
    (g2,) = torch.autograd.grad(out2, loss)
    torch.testing.assert_close(g2, torch.tensor([[0.5, 0, 0, 0], [0.125] * 4], dtype=torch.float64))


# --------------------------------------------------------------------------------------------------
# PPO clip loss
# --------------------------------------------------------------------------------------------------


def test_ppo_clip_policy_loss_hand_computed():
    # clip low 0.2, high 0.28 (clip-higher), dual clip c = 3; old_logp = 0 so ratio = exp(logp)
    # t0: A=+1, ratio 1.5: pg1 = -1.5, pg2 = -1.28 -> max -1.28 (ratio clip active)
    # t1: A=+1, ratio 0.5: pg1 = -0.5, pg2 = -0.8  -> max -0.5  (no clip: pessimistic unclipped)
    # t2: A=-1, ratio 0.5: pg1 = 0.5, pg2 = 0.8    -> max 0.8 (clip active); pg3 = 3 -> min 0.8
    # t3: A=-1, ratio 5:   pg1 = 5, pg2 = 1.28     -> max 5; pg3 = 3 -> dual clip 3 (lower clip active)
    # t4: A=+2, ratio 1:   -2
    # t5: padding (A=-1, log-ratio 100): ignored
    # token-mean = (-1.28 - 0.5 + 0.8 + 3 - 2)/5 = 0.02/5 = 0.004
    ratios = [1.5, 0.5, 0.5, 5.0, 1.0]
    logp = torch.tensor([[math.log(x) for x in ratios] + [100.0]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 6, dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, 2.0, -1.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1, 1, 1, 1, 0]], dtype=torch.float64)
    loss, metrics = ppo_clip_policy_loss(
        logp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, agg=AggSpec("token-mean")
    )
    assert loss.item() == pytest.approx(0.004, abs=1e-12)
    assert metrics["pg_clipfrac"].item() == pytest.approx(2 / 5)  # t0, t2
    assert metrics["pg_clipfrac_lower"].item() == pytest.approx(1 / 5)  # t3
    assert metrics["ppo_kl"].item() == pytest.approx(-math.log(1.5 * 0.5 * 0.5 * 5.0) / 5)  # mean(old - logp)
    for v in metrics.values():
        assert isinstance(v, torch.Tensor) and v.dim() == 0 and not v.requires_grad
    # gradient: only unclipped tokens move: t1 d(-A*exp(logp))/dlogp = -0.5, t4 = -2; divided by 5 tokens
    (g,) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(g, torch.tensor([[0.0, -0.1, 0.0, 0.0, -0.4, 0.0]], dtype=torch.float64))


def test_ppo_clip_policy_loss_validates_clip_ratios():
    x = torch.zeros(1, 2)
    kw = dict(clip_ratio_low=0.2, clip_ratio_high=0.2, agg=AggSpec("token-mean"))
    for c in (1.0, 0.5):
        with pytest.raises(ValueError, match="clip_ratio_c"):
            ppo_clip_policy_loss(x, x, x, x + 1, clip_ratio_c=c, **kw)
    with pytest.raises(ValueError, match="clip_ratio_low"):
        ppo_clip_policy_loss(x, x, x, x + 1, clip_ratio_c=3.0, clip_ratio_low=-0.1, clip_ratio_high=0.2, agg=AggSpec("token-mean"))
    with pytest.raises(ValueError, match="mask_BT"):
        ppo_clip_policy_loss(x, x, x, torch.ones(1, 3), clip_ratio_c=3.0, **kw)


def test_ppo_clip_policy_loss_extreme_log_ratios_are_finite():
    logp = torch.tensor([[1000.0, -1000.0, 50.0, -3.0]], requires_grad=True)
    old = torch.tensor([[-1000.0, 1000.0, 0.0, 0.0]])
    mask = torch.ones(1, 4)
    for a in (1.0, -1.0):
        adv = torch.full((1, 4), a)
        for mode in LOSS_AGG_MODES:
            loss, metrics = ppo_clip_policy_loss(
                logp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0, agg=AggSpec(mode)
            )
            (g,) = torch.autograd.grad(loss, logp)
            assert torch.isfinite(loss) and torch.isfinite(g).all(), (a, mode)
            assert all(torch.isfinite(v) for v in metrics.values())
    # ppo_kl uses the clamped log-ratio (verl): d = [2000, -2000, 50, -3] -> clamped [20, -20, 20, -3]
    #   mean(-d) = -17/4 (unclamped it would be -47/4)
    assert metrics["ppo_kl"].item() == pytest.approx(-4.25)


def test_ppo_clip_policy_loss_empty_mask():
    logp = torch.randn(2, 3, requires_grad=True)
    loss, metrics = ppo_clip_policy_loss(
        logp, torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2, 3),
        clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0, agg=AggSpec("token-mean"),
    )
    assert loss.item() == 0.0 and all(v.item() == 0.0 for v in metrics.values())


# --------------------------------------------------------------------------------------------------
# entropy and log-probs
# --------------------------------------------------------------------------------------------------


def test_entropy_from_logits_hand_and_reference():
    # uniform over 4 -> ln 4; one-hot (other logits -inf) -> 0
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [3.0, -INF, -INF, -INF]]])
    ent = entropy_from_logits(logits)
    torch.testing.assert_close(ent, torch.tensor([[math.log(4), 0.0]]))
    # two outcomes with p = [1/4, 3/4] (logits 0, ln 3): -(1/4 ln 1/4 + 3/4 ln 3/4) = 0.562335
    two = torch.tensor([0.0, math.log(3.0)])
    assert entropy_from_logits(two).item() == pytest.approx(0.562335, abs=1e-6)
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(3, 5, 11, generator=gen) * 4
    torch.testing.assert_close(entropy_from_logits(z), torch.distributions.Categorical(logits=z).entropy())


def test_entropy_from_logits_extreme_values_finite_with_finite_grad():
    z = torch.tensor([[[1e4, 0.0, -1e4], [0.0, -INF, 5.0]]], requires_grad=True)
    ent = entropy_from_logits(z)
    ent.sum().backward()
    assert torch.isfinite(ent).all() and torch.isfinite(z.grad).all()
    assert ent[0, 0].item() == pytest.approx(0.0, abs=1e-6)


def test_logprobs_from_logits_hand_and_reference():
    # logits [0, ln 3]: p = [1/4, 3/4] -> log p[1] = ln 0.75, log p[0] = ln 0.25
    z = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]])
    lab = torch.tensor([[1, 0]])
    torch.testing.assert_close(logprobs_from_logits(z, lab), torch.tensor([[math.log(0.75), math.log(0.25)]]))
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(2, 6, 13, generator=gen) * 10
    lab = torch.randint(0, 13, (2, 6), generator=gen)
    want = torch.log_softmax(z, -1).gather(-1, lab.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(logprobs_from_logits(z, lab), want)
    big = torch.tensor([[[1e4, -1e4]]])
    out = logprobs_from_logits(big, torch.tensor([[1]]))
    assert torch.isfinite(out).all() and out.item() == pytest.approx(-2e4)


def test_logprobs_from_logits_validates_labels():
    z = torch.zeros(2, 3, 5)
    with pytest.raises(ValueError, match="labels_BT"):
        logprobs_from_logits(z, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="labels_BT"):
        logprobs_from_logits(z, torch.zeros(2, 3))
