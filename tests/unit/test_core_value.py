"""The critic's value loss and explained variance: hand-computed values, a plain loop reference, the
global normalisers (pieces add up to the whole), and edge cases."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_dist.core import LOSS_AGG_MODES, AggSpec, explained_variance, global_counts, value_loss

NAN = float("nan")


def hand_batch():
    """Row 0: two tokens count, row 1: one token; the last columns are padding (garbage)."""
    vpreds = torch.tensor([[1.0, 2.0, NAN], [0.5, 7.0, 7.0]], dtype=torch.float64, requires_grad=True)
    values = torch.tensor([[0.8, 1.0, 9.0], [0.5, 9.0, 9.0]], dtype=torch.float64)
    returns = torch.tensor([[2.0, 3.0, 9.0], [0.0, 9.0, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.float64)
    return vpreds, values, returns, mask


def test_value_loss_hand_computed():
    vpreds, values, returns, mask = hand_batch()
    loss, metrics = value_loss(vpreds, values, returns, mask, cliprange_value=0.5, agg=AggSpec("token-mean"))
    # (0,0): vpred 1.0 within [0.3, 1.3] of the old value 0.8 -> (1 - 2)^2 = 1 either way
    # (0,1): vpred 2.0 clipped to 1.5: max((2 - 3)^2, (1.5 - 3)^2) = 2.25 (the clip bites)
    # (1,0): vpred 0.5 = old value: (0.5 - 0)^2 = 0.25
    assert loss.item() == pytest.approx(0.5 * (1.0 + 2.25 + 0.25) / 3)
    assert metrics["vf_clipfrac"].item() == pytest.approx(1 / 3)
    assert metrics["vpred_mean"].item() == pytest.approx((1.0 + 2.0 + 0.5) / 3)
    loss.backward()
    # d/dv 0.5 * (v - R)^2 / 3 = (v - R) / 3 where the unclipped term counts; the clipped term has
    # no gradient (the prediction is outside the clip range); padding gets none
    want = torch.tensor([[-1 / 3, 0.0, 0.0], [1 / 6, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(vpreds.grad, want)


def test_value_loss_clip_keeps_the_larger_error():
    """A prediction that moved past the clip range TOWARD the return is still scored unclipped
    (the max of the two errors): the clip only ever makes the loss larger."""
    vpreds = torch.tensor([[2.0]], dtype=torch.float64, requires_grad=True)
    values, returns, mask = torch.tensor([[1.0]]), torch.tensor([[2.2]]), torch.ones(1, 1)
    loss, m = value_loss(vpreds, values, returns, mask, cliprange_value=0.5, agg=AggSpec("token-mean"))
    # unclipped (2 - 2.2)^2 = 0.04, clipped (1.5 - 2.2)^2 = 0.49 -> 0.5 * 0.49
    assert loss.item() == pytest.approx(0.245)
    assert m["vf_clipfrac"].item() == 1.0
    # cliprange 0: every step away from the old value is scored at the old value when that is worse
    loss0, _ = value_loss(vpreds, values, returns, mask, cliprange_value=0.0, agg=AggSpec("token-mean"))
    assert loss0.item() == pytest.approx(0.5 * (1.0 - 2.2) ** 2)
    # a wide range never clips
    wide, m = value_loss(vpreds, values, returns, mask, cliprange_value=100.0, agg=AggSpec("token-mean"))
    assert wide.item() == pytest.approx(0.5 * 0.04) and m["vf_clipfrac"].item() == 0.0


def loop_reference(vpreds, values, returns, mask, c, mode, norm_constant):
    """The same loss written as plain Python loops over rows and tokens."""
    B, T = vpreds.shape
    per_row, lens = [], []
    for i in range(B):
        row, n = 0.0, 0
        for t in range(T):
            if mask[i, t]:
                v, old, r = float(vpreds[i, t]), float(values[i, t]), float(returns[i, t])
                vc = min(max(v, old - c), old + c)
                row += max((v - r) ** 2, (vc - r) ** 2)
                n += 1
        per_row.append(row)
        lens.append(n)
    seqs = sum(1 for n in lens if n > 0)
    if mode == "token-mean":
        total = sum(per_row) / sum(lens)
    elif mode == "seq-mean-token-sum":
        total = sum(per_row) / seqs
    elif mode == "seq-mean-token-mean":
        total = sum(r / n for r, n in zip(per_row, lens) if n > 0) / seqs
    else:
        total = sum(per_row) / (seqs * norm_constant)
    return 0.5 * total


def random_batch(seed: int, B: int = 6, T: int = 5):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    vpreds = values + 0.8 * torch.randn(B, T, generator=g, dtype=torch.float64)
    returns = torch.randn(B, T, generator=g, dtype=torch.float64)
    lens = torch.randint(0, T + 1, (B,), generator=g)
    lens[0] = T  # at least one full row
    mask = (torch.arange(T).unsqueeze(0) < lens.unsqueeze(1)).double()
    return vpreds, values, returns, mask


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_value_loss_matches_a_plain_loop(mode):
    vpreds, values, returns, mask = random_batch(1)
    loss, _ = value_loss(vpreds, values, returns, mask, cliprange_value=0.3, agg=AggSpec(mode, norm_constant=7.0))
    assert loss.item() == pytest.approx(loop_reference(vpreds, values, returns, mask, 0.3, mode, 7.0), rel=1e-12)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_value_loss_pieces_with_global_counts_add_up_to_the_whole(mode):
    """Micro-batches and ranks: each piece aggregated with the whole mini-batch's counts; the sum of
    the pieces (and of their gradients) is the whole's loss (and gradient)."""
    vpreds, values, returns, mask = random_batch(2, B=8)
    vpreds.requires_grad_(True)
    whole, _ = value_loss(vpreds, values, returns, mask, cliprange_value=0.2, agg=AggSpec(mode, norm_constant=5.0))
    (grad_whole,) = torch.autograd.grad(whole, vpreds)
    tokens, seqs = global_counts(mask)
    spec = AggSpec(mode, global_tokens=tokens, global_seqs=seqs, norm_constant=5.0)
    total = 0.0
    for rows in ([0, 5], [1, 2, 3], [4, 6, 7]):
        piece, _ = value_loss(vpreds[rows], values[rows], returns[rows], mask[rows], cliprange_value=0.2, agg=spec)
        total = total + piece
    (grad_pieces,) = torch.autograd.grad(total, vpreds)
    assert total.item() == pytest.approx(whole.item(), rel=1e-12)
    torch.testing.assert_close(grad_pieces, grad_whole)
    assert whole.item() > 0


def test_value_loss_rejects_bad_arguments():
    vpreds, values, returns, mask = hand_batch()
    with pytest.raises(ValueError, match="cliprange_value"):
        value_loss(vpreds, values, returns, mask, cliprange_value=-0.1, agg=AggSpec("token-mean"))
    with pytest.raises(ValueError, match="returns_BT shape"):
        value_loss(vpreds, values, returns[:, :2], mask, cliprange_value=0.5, agg=AggSpec("token-mean"))
    with pytest.raises(ValueError, match="2-D"):
        value_loss(vpreds[0], values[0], returns[0], mask[0], cliprange_value=0.5, agg=AggSpec("token-mean"))


def test_empty_mask_gives_zero_loss_not_nan():
    vpreds, values, returns, mask = hand_batch()
    loss, m = value_loss(vpreds, values, returns, torch.zeros_like(mask), cliprange_value=0.5, agg=AggSpec("token-mean"))
    assert loss.item() == 0.0 and m["vf_clipfrac"].item() == 0.0


# --------------------------------------------------------------------------------------------------
# explained variance
# --------------------------------------------------------------------------------------------------
def test_explained_variance_hand_computed():
    values = torch.tensor([[1.0, 2.0, 3.0, 50.0]])
    returns = torch.tensor([[1.0, 2.0, 4.0, -7.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    # returns - values = [0, 0, 1]: unbiased var 1/3; var(returns) = var([1, 2, 4]) = 7/3
    assert explained_variance(values, returns, mask) == pytest.approx(1 - (1 / 3) / (7 / 3 + 1e-5))


def test_explained_variance_perfect_constant_and_worse():
    returns = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.ones(2, 3)
    assert explained_variance(returns.clone(), returns, mask) == pytest.approx(1.0)
    # a constant prediction explains none of the variance
    assert explained_variance(torch.full_like(returns, 3.0), returns, mask) == pytest.approx(0.0, abs=1e-5)
    # values that move against the returns explain less than nothing
    assert explained_variance(-returns, returns, mask) < -1.0
    assert math.isnan(explained_variance(returns, returns, torch.tensor([[1, 0, 0], [0, 0, 0]])))
