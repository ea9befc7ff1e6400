"""core.diagnostics: the rollout-vs-actor probability gap, against hand-computed values and a plain loop."""

from __future__ import annotations

import pytest
import torch


def test_rollout_probs_diff_against_hand_computed_values():
    """|exp(rollout) - exp(actor)| over response tokens only: max, mean, population std."""
    import math

    from grpo_dist.core.diagnostics import rollout_probs_diff

    rollout = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.4, 0.4, 0.1]]))
    actor = torch.log(torch.tensor([[0.4, 0.2, 0.1], [0.1, 0.4, 0.1]]))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])  # (0, 2) is padding: its 0.8 gap is ignored
    m = rollout_probs_diff(rollout, actor, mask)
    d = [0.1, 0.0, 0.3, 0.0, 0.0]
    mean = sum(d) / 5
    assert m["training/rollout_probs_diff_max"] == pytest.approx(0.3, abs=1e-6)
    assert m["training/rollout_probs_diff_mean"] == pytest.approx(mean, abs=1e-6)
    assert m["training/rollout_probs_diff_std"] == pytest.approx(math.sqrt(sum((x - mean) ** 2 for x in d) / 5), abs=1e-6)
    assert rollout_probs_diff(rollout, actor, torch.zeros_like(mask)) == {}


def test_rollout_probs_diff_matches_a_plain_loop():
    import math
    import statistics

    from grpo_dist.core.diagnostics import rollout_probs_diff

    g = torch.Generator().manual_seed(0)
    rollout = -3 * torch.rand(5, 6, generator=g)
    actor = rollout + 0.3 * torch.randn(5, 6, generator=g)
    mask = (torch.rand(5, 6, generator=g) < 0.7).float()
    gaps = [abs(math.exp(rollout[i, t].item()) - math.exp(actor[i, t].item()))
            for i in range(5) for t in range(6) if mask[i, t] != 0]
    m = rollout_probs_diff(rollout, actor, mask)
    assert m["training/rollout_probs_diff_max"] == pytest.approx(max(gaps), rel=1e-5)
    assert m["training/rollout_probs_diff_mean"] == pytest.approx(statistics.fmean(gaps), rel=1e-5)
    assert m["training/rollout_probs_diff_std"] == pytest.approx(statistics.pstdev(gaps), rel=1e-4)
