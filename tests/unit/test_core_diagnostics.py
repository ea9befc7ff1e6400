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


def test_zero_advantage_group_ratio_against_hand_computed_values():
    from grpo_dist.core.diagnostics import zero_advantage_group_ratio

    # three groups of two: "a" all zero, "b" one nonzero token, "c" nonzero only under the mask's 0 (padding)
    adv = torch.tensor([[0.0, 0.0], [0.0, 0.0],
                        [0.0, 0.0], [0.0, -0.5],
                        [0.0, 0.0], [0.0, 2.0]])
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1], [1, 1], [1, 0]])
    assert zero_advantage_group_ratio(adv, mask, ["a", "a", "b", "b", "c", "c"]) == pytest.approx(2 / 3)
    # rounding noise of a flat group's mean (float64 sums of 0.1) stays below the tolerance
    assert zero_advantage_group_ratio(torch.full((2, 2), 1e-11), torch.ones(2, 2), ["a", "a"]) == 1.0
    assert zero_advantage_group_ratio(adv, mask, ["a"] * 6) == 0.0
    assert zero_advantage_group_ratio(torch.zeros(0, 3), torch.zeros(0, 3), []) == 0.0


def test_zero_advantage_group_ratio_of_grpo_advantages_is_the_share_of_flat_groups():
    """On GRPO's own advantages the ratio is the share of groups whose rewards are all equal (a plain count)."""
    from grpo_dist.core.advantages import AdvantageInputs, AdvantageParams, get_adv_estimator
    from grpo_dist.core.diagnostics import zero_advantage_group_ratio

    g = torch.Generator().manual_seed(0)
    n, groups, T = 4, 50, 5
    scores = torch.randint(0, 2, (groups, n), generator=g).float()
    scores[::3] = 0.1  # flat groups of a reward with no exact binary form
    index = [i for i in range(groups) for _ in range(n)]
    mask = torch.ones(groups * n, T)
    rewards = torch.zeros(groups * n, T)
    rewards[:, -1] = scores.flatten()
    for norm in (True, False):  # GRPO and Dr. GRPO
        adv, _ = get_adv_estimator("grpo")(AdvantageInputs(token_level_rewards_BT=rewards, response_mask_BT=mask,
                                                             index_B=index), AdvantageParams(norm_adv_by_std=norm))
        flat = sum(len(set(row.tolist())) == 1 for row in scores) / groups
        assert zero_advantage_group_ratio(adv, mask, index) == pytest.approx(flat)
        assert 0 < flat < 1
