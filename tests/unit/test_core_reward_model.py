"""The reward model's math: the loss on verifier labels, agreement with the verifier, the replay share
(hand-computed values and plain loops)."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_dist.core.reward_model import labelled_bce, replay_count, verifier_agreement, verifier_labels

NAN = float("nan")


def bce_loop(scores, targets, num_labels):
    """-[y log p + (1 - y) log (1 - p)] summed over labelled positions, divided by num_labels."""
    total = 0.0
    for s_row, y_row in zip(scores.tolist(), targets.tolist()):
        for s, y in zip(s_row, y_row):
            if math.isnan(y):
                continue
            p = 1 / (1 + math.exp(-s))
            total += -(y * math.log(p) + (1 - y) * math.log(1 - p))
    return total / num_labels


def test_loss_by_hand():
    # one label 1 at score 0: -log(1/2); one label 0 at score log 3 (p = 3/4): -log(1/4)
    scores = torch.tensor([[0.0, 5.0], [math.log(3.0), -2.0]])
    targets = torch.tensor([[1.0, NAN], [0.0, NAN]])
    loss, correct = labelled_bce(scores, targets, num_labels=2)
    assert loss.item() == pytest.approx((math.log(2) + math.log(4)) / 2)
    # score 0 is not > 0, label 1 is > 0.5: disagree; log 3 > 0 and label 0: disagree
    assert correct.item() == 0


def test_loss_matches_a_loop_and_splits_over_micro_batches():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(6, 5, generator=g) * 3
    targets = torch.where(torch.rand(6, 5, generator=g) < 0.4, torch.rand(6, 5, generator=g).round(), torch.tensor(NAN))
    targets[0, 1] = 0.3  # soft labels are allowed
    k = int(torch.isfinite(targets).sum())
    loss, _ = labelled_bce(scores, targets, num_labels=k)
    assert loss.item() == pytest.approx(bce_loop(scores, targets, k), rel=1e-6)
    pieces = sum(labelled_bce(scores[i : i + 2], targets[i : i + 2], num_labels=k)[0].item() for i in range(0, 6, 2))
    assert pieces == pytest.approx(loss.item(), rel=1e-6)


def test_the_loss_gradient_moves_scores_towards_their_labels():
    scores = torch.zeros(1, 3, requires_grad=True)
    loss, _ = labelled_bce(scores, torch.tensor([[1.0, 0.0, NAN]]), num_labels=2)
    loss.backward()
    g = scores.grad[0].tolist()
    assert g[0] < 0 < g[1] and g[2] == 0.0  # descent raises the first, lowers the second, ignores the third


def test_agreement_by_hand_and_by_loop():
    scores = torch.tensor([[0.5, -1.0, 2.0], [0.0, -0.1, 3.0]])
    targets = torch.tensor([[1.0, 0.0, NAN], [1.0, 0.6, 0.0]])
    # (0.5, 1) yes; (-1, 0) yes; (0, 1) no (0 is not > 0); (-0.1, 0.6) no; (3, 0) no
    assert verifier_agreement(scores, targets) == (2, 5)
    loop = sum(1 for s, y in zip(scores.flatten().tolist(), targets.flatten().tolist())
               if not math.isnan(y) and (s > 0) == (y > 0.5))
    assert loop == 2
    assert labelled_bce(scores, targets, num_labels=5)[1].item() == 2


@pytest.mark.parametrize("fresh", [1, 9, 10, 90, 100, 333, 1000])
@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.25, 0.5, 0.9])
def test_replay_share_is_the_fraction_as_near_as_whole_samples_allow(fresh, fraction):
    h = replay_count(fresh, fraction, available=10**6)
    # H / (F + H) = fraction  <=>  H (1 - fraction) = fraction F; rounding H moves it by at most 1/2
    assert abs(h * (1 - fraction) - fraction * fresh) <= 0.5 * (1 - fraction) + 1e-9
    if fresh >= 100:
        assert abs(h / (fresh + h) - fraction) < 0.005


def test_replay_share_by_hand_and_capped_by_the_buffer():
    assert replay_count(90, 0.1, available=100) == 10  # 10 / 100 = 10 %
    assert replay_count(30, 0.25, available=100) == 10  # 10 / 40 = 25 %
    assert replay_count(90, 0.1, available=4) == 4
    assert replay_count(0, 0.1, available=100) == 0
    with pytest.raises(ValueError):
        replay_count(10, 1.0, available=5)


def test_verifier_labels_are_binary_at_the_threshold():
    """A format-only score (0.1) is an incorrect answer, not a 10% one; a full score is correct; scores
    outside [0, 1] (DAPO's -1) are labelled too; a position without a label stays unlabelled."""
    scores = torch.tensor([1.0, 0.1, 0.0, -1.0, 0.5, 0.49, 2.0, NAN])
    labels = verifier_labels(scores, 0.5)
    assert labels[:7].tolist() == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0] and math.isnan(labels[7])
    assert verifier_labels(scores, 1.0)[:7].tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert verifier_labels(scores, 0.0)[:7].tolist() == [1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    soft = verifier_labels(scores, None)
    assert soft[:7].tolist() == pytest.approx([1.0, 0.1, 0.0, 0.0, 0.5, 0.49, 1.0]) and math.isnan(soft[7])
