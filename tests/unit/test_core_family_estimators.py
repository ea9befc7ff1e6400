"""The GRPO family's advantage estimators (ReMax, REINFORCE++ with a group baseline, pass@k, OPO, GPG):
numbers worked out by hand, and plain loops written from each definition (one group, one response,
one token at a time, python floats)."""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch

from grpo_dist.core.advantages import AdvantageInputs, AdvantageParams, get_adv_estimator

EPS = 1e-6


def outcome(scores, lengths, T=4):
    """Token rewards with the score on each response's last token, and the response mask."""
    B = len(scores)
    r, m = torch.zeros(B, T, dtype=torch.float64), torch.zeros(B, T, dtype=torch.float64)
    for i, (s, n) in enumerate(zip(scores, lengths, strict=True)):
        m[i, :n] = 1
        if n > 0:
            r[i, n - 1] = s
    return r, m


def adv(name, scores, lengths, index, T=4, reward_baselines_B=None, **params):
    r, m = outcome(scores, lengths, T)
    inputs = AdvantageInputs(token_level_rewards_BT=r, response_mask_BT=m, index_B=index,
                             reward_baselines_B=reward_baselines_B)
    a, ret = get_adv_estimator(name)(inputs, AdvantageParams(**params))
    return a, ret, m


def random_case(seed, num_groups=5, G=4, T=6, levels=(0.0, 0.5, 1.0)):
    """Discrete rewards (ties happen), groups shuffled over the batch, lengths 0..T."""
    rng = random.Random(seed)
    index = [f"g{g}" for g in range(num_groups) for _ in range(G)]
    rng.shuffle(index)
    scores = [rng.choice(levels) for _ in index]
    lengths = [rng.randint(1, T) for _ in index]
    return scores, lengths, index


def per_token(values, lengths, T):
    """A per-response value on every response token, 0 elsewhere."""
    return torch.tensor([[v if t < n else 0.0 for t in range(T)] for v, n in zip(values, lengths)], dtype=torch.float64)


def groups_of(index):
    groups: dict = {}
    for i, g in enumerate(index):
        groups.setdefault(g, []).append(i)
    return groups


# --------------------------------------------------------------------------------------------------
# ReMax
# --------------------------------------------------------------------------------------------------


def test_remax_by_hand():
    # rewards on the last token: row 0 (2 tokens) 1.0, row 1 (3 tokens) 0.0; greedy baseline 0.25 each
    #   returns-to-go: row 0 [1, 1, 0, 0], row 1 [0, 0, 0, 0]
    #   advantages = (returns - b) on response tokens: [[0.75, 0.75, 0, 0], [-0.25, -0.25, -0.25, 0]]
    a, ret, m = adv("remax", [1.0, 0.0], [2, 3], None, reward_baselines_B=torch.tensor([0.25, 0.25]))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.float64))
    torch.testing.assert_close(a, torch.tensor([[0.75, 0.75, 0, 0], [-0.25, -0.25, -0.25, 0]], dtype=torch.float64))
    with pytest.raises(ValueError, match="reward_baselines_B"):
        adv("remax", [1.0], [2], None)


def test_remax_matches_a_plain_loop():
    g = torch.Generator().manual_seed(0)
    B, T = 7, 6
    lengths = [int(x) for x in torch.randint(1, T + 1, (B,), generator=g)]
    mask = per_token([1.0] * B, lengths, T)
    rewards = torch.randn(B, T, generator=g, dtype=torch.float64) * mask  # dense token rewards
    base = torch.randn(B, generator=g, dtype=torch.float64)
    a, ret = get_adv_estimator("remax")(AdvantageInputs(token_level_rewards_BT=rewards, response_mask_BT=mask,
                                                        reward_baselines_B=base, index_B=None))
    for i in range(B):
        for t in range(T):
            to_go = sum(rewards[i, k].item() for k in range(t, T) if mask[i, k] != 0)
            assert ret[i, t].item() == pytest.approx(to_go, abs=1e-12)
            want = (to_go - base[i].item()) if mask[i, t] != 0 else 0.0
            assert a[i, t].item() == pytest.approx(want, abs=1e-12), (i, t)


# --------------------------------------------------------------------------------------------------
# REINFORCE++ with a group baseline
# --------------------------------------------------------------------------------------------------


def test_reinforce_plus_plus_baseline_by_hand():
    # group a: rewards [1, 0] (lengths 1, 2), mean 0.5 -> [0.5, -0.5]; group b: [1, 1] -> [0, 0]
    # on the 5 response tokens: [0.5 | -0.5, -0.5 | 0 | 0]; batch mean -0.1, deviations
    #   [0.6, -0.4, -0.4, 0.1, 0.1], unbiased variance 0.70 / 4 = 0.175, std 0.4183300
    #   whitened: 0.6 / 0.41833 = 1.434274, -0.4 / 0.41833 = -0.956183, 0.1 / 0.41833 = 0.239046
    a, ret, m = adv("reinforce_plus_plus_baseline", [1.0, 0.0, 1.0, 1.0], [1, 2, 1, 1], ["a", "a", "b", "b"])
    s = math.sqrt(0.175 + 1e-8)
    want = [[0.6 / s, 0, 0, 0], [-0.4 / s, -0.4 / s, 0, 0], [0.1 / s, 0, 0, 0], [0.1 / s, 0, 0, 0]]
    torch.testing.assert_close(a, torch.tensor(want, dtype=torch.float64))
    torch.testing.assert_close(ret, a)


def test_reinforce_plus_plus_baseline_matches_a_plain_loop():
    scores, lengths, index = random_case(1, num_groups=6, G=3, levels=(0.0, 0.3, 1.0, 2.0))
    index[0] = "alone"  # a group of one: baseline 0
    T = 6
    a, _, m = adv("reinforce_plus_plus_baseline", scores, lengths, index, T=T)
    groups = groups_of(index)
    centred = []
    for i, g in enumerate(index):
        members = groups[g]
        mean = statistics.fmean(scores[j] for j in members) if len(members) > 1 else 0.0
        centred.append(scores[i] - mean)
    tokens = [centred[i] for i in range(len(scores)) for _ in range(lengths[i])]
    mu, var = statistics.fmean(tokens), statistics.variance(tokens)
    want = per_token([(c - mu) / math.sqrt(var + 1e-8) for c in centred], lengths, T)
    torch.testing.assert_close(a, want)


# --------------------------------------------------------------------------------------------------
# pass@k
# --------------------------------------------------------------------------------------------------


def test_passk_by_hand():
    # group a: rewards 1, 0.5, 0 -> best row 0, runner-up 0.5, margin 0.5; std (unbiased) 0.5 -> 1.0
    # group b: a tie at the top (1, 1) -> margin 0: the whole group gets 0
    a, _, m = adv("grpo_passk", [1.0, 0.5, 0.0, 1.0, 1.0], [1, 1, 1, 1, 1], ["a", "a", "a", "b", "b"],
                  norm_adv_by_std=True, epsilon=0.0)
    assert a[:, 0].tolist() == pytest.approx([1.0, 0, 0, 0, 0])
    a, _, _ = adv("grpo_passk", [1.0, 0.5, 0.0], [1, 1, 1], ["a"] * 3, norm_adv_by_std=False)
    assert a[:, 0].tolist() == pytest.approx([0.5, 0, 0])
    with pytest.raises(ValueError, match="at least 2"):
        adv("grpo_passk", [1.0, 0.0, 1.0], [1, 1, 1], ["a", "a", "b"])


@pytest.mark.parametrize("norm", [True, False])
def test_passk_matches_a_plain_loop(norm):
    scores, lengths, index = random_case(2, num_groups=8, G=4)
    T = 6
    a, _, _ = adv("grpo_passk", scores, lengths, index, T=T, norm_adv_by_std=norm)
    values = [0.0] * len(scores)
    for members in groups_of(index).values():
        vals = [scores[j] for j in members]
        ranked = sorted(vals, reverse=True)
        margin = ranked[0] - ranked[1]
        best = members[vals.index(ranked[0])]  # the first response with the top reward
        values[best] = margin / (statistics.stdev(vals) + EPS) if norm else margin
    torch.testing.assert_close(a, per_token(values, lengths, T))
    assert any(v > 0 for v in values) and any(v == 0 for v in values)


# --------------------------------------------------------------------------------------------------
# OPO
# --------------------------------------------------------------------------------------------------


def test_opo_by_hand():
    # lengths 1 and 3, rewards 1 and 0: b = (1 * 1 + 3 * 0) / 4 = 0.25 -> A = [0.75, -0.25]
    a, _, m = adv("opo", [1.0, 0.0], [1, 3], ["g", "g"])
    torch.testing.assert_close(a, torch.tensor([[0.75, 0, 0, 0], [-0.25, -0.25, -0.25, 0]], dtype=torch.float64))


def test_opo_matches_a_plain_loop():
    scores, lengths, index = random_case(3, num_groups=6, G=3, levels=(0.0, 1.0, 3.0))
    index[-1] = "alone"  # a group of one: baseline 0
    T = 6
    a, _, _ = adv("opo", scores, lengths, index, T=T)
    groups = groups_of(index)
    values = []
    for i, g in enumerate(index):
        members = groups[g]
        if len(members) == 1:
            b = 0.0
        else:
            b = sum(lengths[j] * scores[j] for j in members) / sum(lengths[j] for j in members)
        values.append(scores[i] - b)
    torch.testing.assert_close(a, per_token(values, lengths, T))


# --------------------------------------------------------------------------------------------------
# GPG (estimator)
# --------------------------------------------------------------------------------------------------


def test_gpg_estimator_by_hand():
    # B = 4 with one non-zero reward: alpha = 4 / 1 = 4; group means 0.5 and 0
    #   A = 4 * [1 - 0.5, 0 - 0.5, 0, 0] = [2, -2, 0, 0]
    a, _, _ = adv("gpg", [1.0, 0.0, 0.0, 0.0], [1] * 4, ["a", "a", "b", "b"])
    assert a[:, 0].tolist() == pytest.approx([2.0, -2.0, 0.0, 0.0])
    # two non-zero rewards: alpha = 2; means 0.5 and 1 -> [1, -1, 2, -2]
    a, _, _ = adv("gpg", [1.0, 0.0, 2.0, 0.0], [1] * 4, ["a", "a", "b", "b"])
    assert a[:, 0].tolist() == pytest.approx([1.0, -1.0, 2.0, -2.0])


def test_gpg_estimator_matches_a_plain_loop():
    scores, lengths, index = random_case(4, num_groups=7, G=3, levels=(0.0, 0.0, 1.0, -0.5))
    index[2] = "alone"  # a group of one: mean 0
    T = 6
    a, _, _ = adv("gpg", scores, lengths, index, T=T)
    groups = groups_of(index)
    alpha = len(scores) / max(sum(1 for s in scores if s != 0), 1)
    values = []
    for i, g in enumerate(index):
        members = groups[g]
        mean = statistics.fmean(scores[j] for j in members) if len(members) > 1 else 0.0
        values.append(alpha * (scores[i] - mean))
    torch.testing.assert_close(a, per_token(values, lengths, T))
    assert alpha > 1
