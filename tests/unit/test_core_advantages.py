"""Advantage estimators: hand-computed values, slow loop references, edge cases, registry."""

from __future__ import annotations

import math
import random
import statistics

import numpy as np
import pytest
import torch

from grpo_dist.core import advantage_registry
from grpo_dist.core import advantages as adv_mod
from grpo_dist.core import get_adv_estimator, list_adv_estimators, register_adv_estimator
from grpo_dist.core.advantages import AdvantageInputs, AdvantageParams, AdvEstimatorSpec

EPS = 1e-6


def run(name, gamma=1.0, lam=1.0, norm_adv_by_std=True, **inputs):
    """The estimator ``name`` called through its spec, the tensors as keywords of AdvantageInputs."""
    params = AdvantageParams(gamma=gamma, lam=lam, norm_adv_by_std=norm_adv_by_std)
    return get_adv_estimator(name)(AdvantageInputs(**inputs), params)


def outcome_batch(scores, lengths, T):
    """Rewards [B, T] with each score on the last response token; prefix masks of the given lengths."""
    B = len(scores)
    r = torch.zeros(B, T)
    m = torch.zeros(B, T)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        m[i, :n] = 1
        if n > 0:
            r[i, n - 1] = s
    return r, m


# --------------------------------------------------------------------------------------------------
# slow loop references (python floats, one response / token at a time)
# --------------------------------------------------------------------------------------------------


def ref_group_outcome(rewards, mask, index, kind, norm=True, eps=EPS):
    B, T = rewards.shape
    scores = [float(sum(rewards[i].tolist())) for i in range(B)]
    groups = {}
    for i in range(B):
        groups.setdefault(index[i], []).append(scores[i])
    out = torch.zeros(B, T, dtype=torch.float64)
    for i in range(B):
        g = groups[index[i]]
        G = len(g)
        if kind == "grpo":
            mean, std = (statistics.fmean(g), statistics.stdev(g)) if G > 1 else (0.0, 1.0)
            a = (scores[i] - mean) / (std + eps) if norm else scores[i] - mean
        else:  # rloo: reward minus the mean of the others
            a = scores[i] - (sum(g) - scores[i]) / (G - 1) if G > 1 else scores[i]
        for t in range(T):
            out[i, t] = a * float(mask[i, t])
    return out


def ref_whiten(x, mask):
    vals = [float(x[i, t]) for i in range(x.shape[0]) for t in range(x.shape[1]) if mask[i, t] != 0]
    n = len(vals)
    if n == 0:
        return torch.zeros_like(x, dtype=torch.float64)
    mean = sum(vals) / n
    var = sum((v - mean) ** 2 for v in vals) / (n - 1) if n > 1 else 0.0
    out = torch.zeros(x.shape, dtype=torch.float64)
    for i in range(x.shape[0]):
        for t in range(x.shape[1]):
            if mask[i, t] != 0:
                out[i, t] = (float(x[i, t]) - mean) / math.sqrt(var + 1e-8)
    return out


def ref_reinforce_pp(rewards, mask, gamma):
    B, T = rewards.shape
    ret = torch.zeros(B, T, dtype=torch.float64)
    for i in range(B):
        running = 0.0
        for t in reversed(range(T)):
            running = float(rewards[i, t]) + gamma * running
            ret[i, t] = running
            if mask[i, t] == 0:
                running = 0.0
    return ref_whiten(ret, mask), ret


def ref_gae(rewards, values, mask, gamma, lam):
    """Per row: TD errors and GAE over the response tokens only, skipping masked positions."""
    B, T = rewards.shape
    adv = torch.zeros(B, T, dtype=torch.float64)
    for i in range(B):
        next_v, last = 0.0, 0.0
        for t in reversed(range(T)):
            if mask[i, t] != 0:
                delta = float(rewards[i, t]) + gamma * next_v - float(values[i, t])
                last = delta + gamma * lam * last
                next_v = float(values[i, t])
            adv[i, t] = last
    ret = adv + values.double()
    return ref_whiten(adv, mask), ret


def ref_grpo_process(rewards, mask, step_end, index, norm=True, eps=EPS):
    B, T = rewards.shape
    steps = {}  # group -> list of (row, end t, reward)
    for i in range(B):
        for t in range(T):
            if step_end[i, t] != 0:
                steps.setdefault(index[i], []).append((i, t, float(rewards[i, t])))
    normed = {}
    for g, lst in steps.items():
        rs = [r for _, _, r in lst]
        mean, std = (statistics.fmean(rs), statistics.stdev(rs)) if len(rs) > 1 else (0.0, 1.0)
        for i, t, r in lst:
            normed[(i, t)] = (r - mean) / (std + eps) if norm else r - mean
    out = torch.zeros(B, T, dtype=torch.float64)
    for i in range(B):
        for t in range(T):
            if mask[i, t] != 0:
                out[i, t] = sum(v for (j, end), v in normed.items() if j == i and end >= t)
    return out


def random_groups(rng, num_groups, max_size=5):
    index = []
    for g in range(num_groups):
        index += [f"uid-{g}"] * rng.randint(1, max_size)
    rng.shuffle(index)
    return index


def random_prefix_mask(gen, B, T):
    lengths = torch.randint(0, T + 1, (B,), generator=gen)
    return (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).float()


# --------------------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------------------


def test_registry_lists_builtin_estimators_with_flags():
    assert set(list_adv_estimators()) >= {"grpo", "rloo", "reinforce_plus_plus", "gae", "grpo_process"}
    assert get_adv_estimator("grpo").group_based and get_adv_estimator("rloo").group_based
    assert not get_adv_estimator("reinforce_plus_plus").group_based
    gae = get_adv_estimator("gae")
    assert gae.needs_values and not gae.group_based and not gae.needs_step_rewards
    proc = get_adv_estimator("grpo_process")
    assert proc.group_based and proc.needs_step_rewards and not proc.needs_values
    assert not get_adv_estimator("grpo").needs_values and not get_adv_estimator("grpo").needs_step_rewards


def test_unknown_estimator_names_valid_choices():
    with pytest.raises(ValueError) as e:
        get_adv_estimator("grpoo")
    msg = str(e.value)
    assert "grpoo" in msg
    for name in ("grpo", "rloo", "reinforce_plus_plus", "gae", "grpo_process"):
        assert name in msg


def test_register_custom_estimator_and_reject_duplicates(monkeypatch):
    monkeypatch.setattr(advantage_registry, "_REGISTRY", dict(advantage_registry._REGISTRY))

    @register_adv_estimator("my_est", group_based=False)
    def my_est(inputs, params):
        return inputs.token_level_rewards_BT, inputs.token_level_rewards_BT

    spec = get_adv_estimator("my_est")
    assert isinstance(spec, AdvEstimatorSpec) and spec.fn is my_est and spec.group_based is False
    assert "my_est" in list_adv_estimators()
    register_adv_estimator("my_est", group_based=False)(my_est)  # same function again: fine
    with pytest.raises(ValueError, match="my_est"):
        register_adv_estimator("my_est", group_based=False)(lambda **kw: None)
    with pytest.raises(ValueError, match="already registered"):
        register_adv_estimator("grpo", group_based=True)(my_est)


@pytest.mark.parametrize("name, field", [("grpo", "index_B"), ("rloo", "index_B"), ("gae", "values_BT"),
                                         ("grpo_process", "step_end_mask_BT"), ("remax", "reward_baselines_B")])
def test_spec_names_the_estimator_and_the_missing_input(name, field):
    r, m = outcome_batch([1.0, 0.0], [2, 2], T=2)
    given = {"index_B": ["a", "a"], "values_BT": torch.zeros(2, 2), "step_end_mask_BT": (r != 0).float(),
             "reward_baselines_B": torch.zeros(2)}
    del given[field]
    with pytest.raises(ValueError) as e:
        get_adv_estimator(name)(AdvantageInputs(r, m, **given))
    assert f"the {name!r} advantage estimator needs {field} (" in str(e.value) and "got None" in str(e.value)


@pytest.mark.parametrize("field, bad, shapes", [
    ("response_mask_BT", torch.ones(2, 4), ["(2, 4)", "(2, 3)"]),
    ("values_BT", torch.zeros(3, 3), ["(3, 3)", "(2, 3)"]),
    ("step_end_mask_BT", torch.zeros(2), ["(2,)", "(2, 3)"]),
    ("reward_baselines_B", torch.zeros(2, 1), ["(2, 1)", "(2,)"]),
    ("index_B", ["a", "a", "b"], ["3 entries", "B=2"]),
])
def test_inputs_shape_mismatch_names_both_shapes(field, bad, shapes):
    r, m = torch.zeros(2, 3), torch.ones(2, 3)
    kw = {"token_level_rewards_BT": r, "response_mask_BT": m, field: bad}
    with pytest.raises(ValueError) as e:
        AdvantageInputs(**kw)
    assert field in str(e.value) and all(s in str(e.value) for s in shapes), str(e.value)
    with pytest.raises(ValueError, match=r"token_level_rewards_BT must be 2-D \[B, T\], got shape \(3,\)"):
        AdvantageInputs(torch.zeros(3), torch.ones(3))


def test_params_are_checked():
    for kw, msg in (({"gamma": 1.5}, "gamma"), ({"lam": -0.1}, "lam"), ({"epsilon": -1e-6}, "epsilon")):
        with pytest.raises(ValueError, match=msg):
            AdvantageParams(**kw)


def test_user_estimator_with_the_new_signature_is_called_by_its_spec(monkeypatch):
    monkeypatch.setattr(advantage_registry, "_REGISTRY", dict(advantage_registry._REGISTRY))
    calls = []

    @register_adv_estimator("scaled_reward", group_based=False, needs_values=True)
    def scaled_reward(inputs: AdvantageInputs, params: AdvantageParams):
        calls.append((inputs, params))
        adv_BT = (inputs.token_level_rewards_BT - inputs.values_BT) * params.gamma * inputs.mask_BT
        return adv_BT, inputs.token_level_rewards_BT

    r, m = outcome_batch([2.0, 1.0], [2, 1], T=2)
    inputs, params = AdvantageInputs(r, m, values_BT=torch.full((2, 2), 0.5)), AdvantageParams(gamma=0.5)
    adv, ret = get_adv_estimator("scaled_reward")(inputs, params)
    assert calls == [(inputs, params)]
    torch.testing.assert_close(adv, torch.tensor([[-0.25, 0.75], [0.25, 0.0]]))
    assert torch.equal(ret, r)
    with pytest.raises(ValueError, match="'scaled_reward' advantage estimator needs values_BT"):
        get_adv_estimator("scaled_reward")(AdvantageInputs(r, m))
    assert len(calls) == 1  # the spec refused before calling
    with pytest.raises(TypeError, match="AdvantageInputs"):
        get_adv_estimator("scaled_reward")({"token_level_rewards_BT": r, "response_mask_BT": m})  # the old keywords


# --------------------------------------------------------------------------------------------------
# grpo
# --------------------------------------------------------------------------------------------------


def test_grpo_hand_computed():
    # group a: scores [1, 0, 2] -> mean 1, unbiased std sqrt((0 + 1 + 1) / 2) = 1
    #   A = [0, -1/(1+eps), 1/(1+eps)]
    # group b: one response, score 3 -> mean 0, std 1 (verl) -> A = 3/(1+eps)
    # group c: scores [0.7, 0.7] -> A = 0 exactly (std 0, numerator 0)
    scores = [1.0, 0.0, 2.0, 3.0, 0.7, 0.7]
    lengths = [3, 4, 2, 4, 1, 4]
    r, m = outcome_batch(scores, lengths, T=4)
    index = ["a", "a", "a", "b", "c", "c"]
    adv, ret = run("grpo", token_level_rewards_BT=r, response_mask_BT=m, index_B=index)
    expected_B = torch.tensor([0.0, -1 / (1 + EPS), 1 / (1 + EPS), 3 / (1 + EPS), 0.0, 0.0])
    torch.testing.assert_close(adv, expected_B.unsqueeze(-1) * m, rtol=0, atol=1e-6)
    assert torch.equal(adv, ret)
    assert torch.equal(adv[4:], torch.zeros(2, 4))  # exact zeros, not 1e-9 / 1e-6 noise

    # Dr. GRPO (no std): A = r - mean -> [0, -1, 1], [3], [0, 0]
    adv2, _ = run("grpo", token_level_rewards_BT=r, response_mask_BT=m, index_B=index, norm_adv_by_std=False)
    expected2_B = torch.tensor([0.0, -1.0, 1.0, 3.0, 0.0, 0.0])
    torch.testing.assert_close(adv2, expected2_B.unsqueeze(-1) * m, rtol=0, atol=1e-6)


def test_grpo_matches_loop_reference_random():
    rng = random.Random(0)
    gen = torch.Generator().manual_seed(0)
    for trial in range(3):
        index = random_groups(rng, num_groups=8)
        B, T = len(index), 7
        m = random_prefix_mask(gen, B, T)
        # integer-valued scores create ties; spread rewards over several tokens
        r = torch.randint(-2, 3, (B, T), generator=gen).float() * m
        for norm in (True, False):
            got, _ = run("grpo", token_level_rewards_BT=r, response_mask_BT=m, index_B=index, norm_adv_by_std=norm)
            want = ref_group_outcome(r, m, index, "grpo", norm=norm)
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_grpo_zero_mean_and_unit_std_within_each_group():
    rng = random.Random(1)
    gen = torch.Generator().manual_seed(1)
    index = random_groups(rng, num_groups=10, max_size=6)
    B, T = len(index), 5
    r = torch.zeros(B, T)
    r[:, -1] = torch.randn(B, generator=gen)
    m = torch.ones(B, T)
    adv, _ = run("grpo", token_level_rewards_BT=r, response_mask_BT=m, index_B=index)
    a_B = adv[:, 0]
    for g in set(index):
        rows = [i for i, x in enumerate(index) if x == g]
        if len(rows) > 1:
            assert abs(float(a_B[rows].sum())) < 1e-5
            assert abs(float(a_B[rows].std()) - 1.0) < 1e-4


def test_grpo_index_types_are_equivalent():
    r, m = outcome_batch([1.0, 0.0, 5.0, 2.0, 2.5], [2, 2, 2, 2, 2], T=3)
    ids_str = ["p0", "p1", "p0", "p1", "p1"]
    ids_np = np.array(ids_str, dtype=object)
    ids_int_t = torch.tensor([7, 3, 7, 3, 3])
    a1, _ = run("grpo", token_level_rewards_BT=r, response_mask_BT=m, index_B=ids_str)
    a2, _ = run("grpo", token_level_rewards_BT=r, response_mask_BT=m, index_B=ids_np)
    a3, _ = run("grpo", token_level_rewards_BT=r, response_mask_BT=m, index_B=ids_int_t)
    a4, _ = run("grpo", token_level_rewards_BT=r, response_mask_BT=m, index_B=np.array([7, 3, 7, 3, 3]))
    assert torch.equal(a1, a2) and torch.equal(a1, a3) and torch.equal(a1, a4)
    # groups are really separated: p0 = {1, 5}: mean 3, std sqrt((4 + 4)/1) = sqrt(8)
    #   A = -2/sqrt(8) = -0.7071 (mixing in p1's rewards would change it)
    assert abs(float(a1[0, 0]) + 2 / (math.sqrt(8) + EPS)) < 1e-5


def test_grpo_bad_index_raises():
    r, m = outcome_batch([1.0, 0.0], [1, 1], T=2)
    with pytest.raises(ValueError, match="index_B"):
        run("grpo", token_level_rewards_BT=r, response_mask_BT=m, index_B=["a"])
    with pytest.raises(ValueError, match="index_B"):
        run("grpo", token_level_rewards_BT=r, response_mask_BT=m, index_B=None)
    with pytest.raises(ValueError, match="response_mask_BT"):
        run("grpo", token_level_rewards_BT=r, response_mask_BT=m[:, :1], index_B=["a", "a"])


# --------------------------------------------------------------------------------------------------
# rloo
# --------------------------------------------------------------------------------------------------


def test_rloo_hand_computed():
    # group a: scores [1, 0, 2]: A_i = r_i - mean(others)
    #   1 - (0 + 2)/2 = 0;  0 - (1 + 2)/2 = -1.5;  2 - (1 + 0)/2 = 1.5
    # group b: single response, score 3 -> A = 3 (verl keeps the raw score)
    # group c: [0.7, 0.7] -> 0 exactly
    scores = [1.0, 0.0, 2.0, 3.0, 0.7, 0.7]
    lengths = [3, 4, 2, 4, 1, 4]
    r, m = outcome_batch(scores, lengths, T=4)
    index = ["a", "a", "a", "b", "c", "c"]
    adv, ret = run("rloo", token_level_rewards_BT=r, response_mask_BT=m, index_B=index)
    expected_B = torch.tensor([0.0, -1.5, 1.5, 3.0, 0.0, 0.0])
    torch.testing.assert_close(adv, expected_B.unsqueeze(-1) * m, rtol=0, atol=1e-6)
    assert torch.equal(adv, ret)
    assert torch.equal(adv[4:], torch.zeros(2, 4))


def test_rloo_matches_loop_reference_random():
    rng = random.Random(2)
    gen = torch.Generator().manual_seed(2)
    index = random_groups(rng, num_groups=9)
    B, T = len(index), 6
    m = random_prefix_mask(gen, B, T)
    r = torch.randn(B, T, generator=gen) * m
    got, _ = run("rloo", token_level_rewards_BT=r, response_mask_BT=m, index_B=index)
    want = ref_group_outcome(r, m, index, "rloo")
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------------
# reinforce_plus_plus
# --------------------------------------------------------------------------------------------------


def test_reinforce_plus_plus_hand_computed():
    # gamma = 0.5
    # row 0: mask [1,1,1], rewards [0,0,1] -> returns t2: 1, t1: 0.5, t0: 0.25
    # row 1: mask [1,1,0], rewards [0,2,5] (5 is in the padding):
    #   t2: running = 5, returns 5, then reset to 0 (mask 0);  t1: 2;  t0: 0 + 0.5*2 = 1
    #   (without the reset t1 would be 2 + 0.5*5 = 4.5)
    # masked returns: 0.25, 0.5, 1, 1, 2 -> n = 5, mean = 4.75/5 = 0.95
    #   deviations -0.7, -0.45, 0.05, 0.05, 1.05; squares sum 0.49+0.2025+0.0025+0.0025+1.1025 = 1.8
    #   unbiased var = 1.8/4 = 0.45 -> adv = dev / sqrt(0.45 + 1e-8)
    r = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 5.0]])
    m = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = run("reinforce_plus_plus", token_level_rewards_BT=r, response_mask_BT=m, index_B=None, gamma=0.5)
    torch.testing.assert_close(ret, torch.tensor([[0.25, 0.5, 1.0], [1.0, 2.0, 5.0]]))
    s = math.sqrt(0.45 + 1e-8)
    expected = torch.tensor([[-0.7 / s, -0.45 / s, 0.05 / s], [0.05 / s, 1.05 / s, 0.0]])
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-5)


def test_reinforce_plus_plus_matches_loop_reference_random():
    gen = torch.Generator().manual_seed(3)
    B, T = 10, 8
    m = (torch.rand(B, T, generator=gen) > 0.3).float()  # holes: multi-turn style masks
    m[0] = 0  # one empty row
    r = torch.randn(B, T, generator=gen)
    for gamma in (1.0, 0.9):
        got_a, got_r = run("reinforce_plus_plus", token_level_rewards_BT=r, response_mask_BT=m, index_B=None, gamma=gamma)
        want_a, want_r = ref_reinforce_pp(r, m, gamma)
        torch.testing.assert_close(got_r.double(), want_r, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got_a.double(), want_a, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------------------------------
# gae
# --------------------------------------------------------------------------------------------------


def test_gae_hand_computed_full_mask():
    # gamma = lam = 1, rewards [0,0,1], values [0.5,0.2,0.1]
    # t2: delta = 1 + 0 - 0.1 = 0.9, gae 0.9
    # t1: delta = 0 + 0.1 - 0.2 = -0.1, gae = -0.1 + 0.9 = 0.8
    # t0: delta = 0 + 0.2 - 0.5 = -0.3, gae = -0.3 + 0.8 = 0.5
    # returns = gae + V = [1, 1, 1] (= undiscounted reward-to-go)
    # whiten [0.5, 0.8, 0.9]: mean 2.2/3, devs [-0.7, 0.2, 0.5]/3, var = (0.49+0.04+0.25)/9/2
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[0.5, 0.2, 0.1]])
    m = torch.ones(1, 3)
    adv, ret = run("gae", token_level_rewards_BT=r, response_mask_BT=m, index_B=None, values_BT=v)
    torch.testing.assert_close(ret, torch.ones(1, 3))
    s = math.sqrt(0.78 / 9 / 2 + 1e-8)
    torch.testing.assert_close(adv, torch.tensor([[-0.7 / 3 / s, 0.2 / 3 / s, 0.5 / 3 / s]]), rtol=0, atol=1e-5)


def test_gae_hand_computed_padding_is_skipped():
    # gamma = 0.9, lam = 0.8, mask [1,1,0], rewards [0,1,0], values [0.5,0.4,9.0 (garbage in padding)]
    # t2 (masked): nothing propagates; nextvalues = 0, lastgaelam = 0, adv[2] = 0
    # t1: delta = 1 + 0.9*0 - 0.4 = 0.6, gae = 0.6
    # t0: delta = 0 + 0.9*0.4 - 0.5 = -0.14, gae = -0.14 + 0.9*0.8*0.6 = 0.292
    # returns = [0.292 + 0.5, 0.6 + 0.4, 0 + 9] = [0.792, 1.0, 9.0]
    # whitening two values gives -+1/sqrt(2) (mean 0.446, unbiased var 2*0.154^2)
    r = torch.tensor([[0.0, 1.0, 0.0]])
    v = torch.tensor([[0.5, 0.4, 9.0]])
    m = torch.tensor([[1.0, 1.0, 0.0]])
    adv, ret = run("gae", token_level_rewards_BT=r, response_mask_BT=m, index_B=None, values_BT=v, gamma=0.9, lam=0.8)
    torch.testing.assert_close(ret, torch.tensor([[0.792, 1.0, 9.0]]))
    s = math.sqrt(2 * 0.154**2 + 1e-8)
    torch.testing.assert_close(adv, torch.tensor([[-0.154 / s, 0.154 / s, 0.0]]), rtol=0, atol=1e-5)


def test_gae_matches_loop_reference_random():
    gen = torch.Generator().manual_seed(4)
    B, T = 9, 7
    m = (torch.rand(B, T, generator=gen) > 0.25).float()
    m[3] = 0
    r = torch.randn(B, T, generator=gen)
    v = torch.randn(B, T, generator=gen)
    for gamma, lam in ((1.0, 1.0), (0.99, 0.95), (0.5, 0.0)):
        got_a, got_r = run("gae", token_level_rewards_BT=r, response_mask_BT=m, index_B=None, values_BT=v, gamma=gamma, lam=lam)
        want_a, want_r = ref_gae(r, v, m, gamma, lam)
        # returns: compare on mask tokens (both are documented to be verl's carried values elsewhere)
        torch.testing.assert_close(got_r.double() * m, want_r * m, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got_a.double(), want_a, rtol=1e-4, atol=1e-4)


def test_gae_requires_values():
    r, m = torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match="values_BT"):
        run("gae", token_level_rewards_BT=r, response_mask_BT=m, index_B=None)
    with pytest.raises(ValueError, match="values_BT"):
        run("gae", token_level_rewards_BT=r, response_mask_BT=m, index_B=None, values_BT=torch.zeros(2, 2))


# --------------------------------------------------------------------------------------------------
# grpo_process (process supervision)
# --------------------------------------------------------------------------------------------------


def process_example():
    # group q1, G = 2:
    #   out 0: T=6, mask 5 tokens, steps end at t=1 (reward 1.0) and t=4 (reward 0.0)
    #   out 1: mask 6 tokens,    steps end at t=2 (reward 0.5) and t=5 (reward 1.0)
    # group q2: one output, mask 4 tokens, one step ending at t=3 with reward 2.0
    # group q3: one output with no step at all
    T = 6
    r = torch.zeros(4, T)
    e = torch.zeros(4, T)
    m = torch.zeros(4, T)
    m[0, :5] = 1
    m[1, :6] = 1
    m[2, :4] = 1
    m[3, :3] = 1
    for row, t, val in ((0, 1, 1.0), (0, 4, 0.0), (1, 2, 0.5), (1, 5, 1.0), (2, 3, 2.0)):
        e[row, t] = 1
        r[row, t] = val
    return r, m, e, ["q1", "q1", "q2", "q3"]


def test_grpo_process_hand_computed():
    r, m, e, index = process_example()
    # q1 step rewards R = {1, 0, 0.5, 1}: mean 2.5/4 = 0.625
    #   deviations 0.375, -0.625, -0.125, 0.375; squares sum 0.140625+0.390625+0.015625+0.140625 = 0.6875
    #   unbiased std d = sqrt(0.6875/3); normalised n = dev/(d+eps)
    d = math.sqrt(0.6875 / 3) + EPS
    n01, n04, n12, n15 = 0.375 / d, -0.625 / d, -0.125 / d, 0.375 / d
    # out 0: t<=1 sees both steps, 2<=t<=4 only the second, t=5 is masked
    # out 1: t<=2 both steps, 3<=t<=5 the second
    # q2: single step reward -> mean 0, std 1 -> 2/(1+eps) on t <= 3
    # q3: no steps -> zeros
    expected = torch.tensor(
        [
            [n01 + n04, n01 + n04, n04, n04, n04, 0.0],
            [n12 + n15, n12 + n15, n12 + n15, n15, n15, n15],
            [2 / (1 + EPS)] * 4 + [0.0, 0.0],
            [0.0] * 6,
        ]
    )
    adv, ret = run("grpo_process", token_level_rewards_BT=r, response_mask_BT=m, index_B=index, step_end_mask_BT=e)
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-5)
    assert torch.equal(adv, ret)
    # numeric spot check of the arithmetic above: n01 + n04 = -0.25/0.47871 = -0.52223
    assert abs(float(adv[0, 0]) + 0.522233) < 1e-5

    # without the std: plain deviations
    adv2, _ = run(
        "grpo_process", token_level_rewards_BT=r, response_mask_BT=m, index_B=index, step_end_mask_BT=e,
        norm_adv_by_std=False,
    )
    expected2 = torch.tensor(
        [
            [-0.25, -0.25, -0.625, -0.625, -0.625, 0.0],
            [0.25, 0.25, 0.25, 0.375, 0.375, 0.375],
            [2.0, 2.0, 2.0, 2.0, 0.0, 0.0],
            [0.0] * 6,
        ]
    )
    torch.testing.assert_close(adv2, expected2, rtol=0, atol=1e-6)


def test_grpo_process_matches_loop_reference_random():
    rng = random.Random(5)
    gen = torch.Generator().manual_seed(5)
    index = random_groups(rng, num_groups=6, max_size=4)
    B, T = len(index), 9
    m = random_prefix_mask(gen, B, T)
    e = ((torch.rand(B, T, generator=gen) > 0.6).float()) * m
    r = torch.randn(B, T, generator=gen) * e
    for norm in (True, False):
        got, _ = run(
            "grpo_process", token_level_rewards_BT=r, response_mask_BT=m, index_B=index, step_end_mask_BT=e,
            norm_adv_by_std=norm,
        )
        want = ref_grpo_process(r, m, e, index, norm=norm)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_grpo_process_equal_step_rewards_give_zero():
    r, m, e, index = process_example()
    r = e * 0.1  # every step reward equal (0.1 is not exact in binary)
    adv, _ = run("grpo_process", token_level_rewards_BT=r, response_mask_BT=m, index_B=["g"] * 4, step_end_mask_BT=e)
    assert torch.equal(adv, torch.zeros_like(adv))


def test_grpo_process_input_errors():
    r, m, e, index = process_example()
    with pytest.raises(ValueError, match="step_end_mask_BT"):
        run("grpo_process", token_level_rewards_BT=r, response_mask_BT=m, index_B=index)
    bad_e = e.clone()
    bad_e[0, 5] = 1  # outside the response mask of row 0
    with pytest.raises(ValueError, match="response_mask_BT"):
        run("grpo_process", token_level_rewards_BT=r, response_mask_BT=m, index_B=index, step_end_mask_BT=bad_e)
    bad_r = r.clone()
    bad_r[1, 0] = -0.01  # e.g. a KL penalty folded into the rewards
    with pytest.raises(ValueError, match="step"):
        run("grpo_process", token_level_rewards_BT=bad_r, response_mask_BT=m, index_B=index, step_end_mask_BT=e)


# --------------------------------------------------------------------------------------------------
# edge cases shared by all estimators
# --------------------------------------------------------------------------------------------------


def all_estimator_kwargs(r, m, index):
    v = torch.linspace(-1, 1, r.numel()).reshape(r.shape)
    e = (r != 0).float() * m
    return {
        "grpo": dict(index_B=index),
        "rloo": dict(index_B=index),
        "reinforce_plus_plus": dict(index_B=index),
        "gae": dict(index_B=index, values_BT=v),
        "grpo_process": dict(index_B=index, step_end_mask_BT=e),
    }


def test_all_equal_rewards_in_a_group_give_zero_advantage():
    # 7 x 0.3 and 3 x 0.9: in float32 their mean is off by ~6e-8 (e.g. sum(7 x 0.3)/7 != 0.3), which
    # divided by (std + 1e-6) would give |A| ~ 0.05; group statistics must give exact zeros
    r, m = outcome_batch([0.3] * 7 + [0.9] * 3, [2, 3, 1, 3, 3, 1, 2, 3, 3, 1], T=3)
    index = ["a"] * 7 + ["b"] * 3
    for name in ("grpo", "rloo", "grpo_process"):
        kw = all_estimator_kwargs(r, m, index)[name]
        adv, _ = run(name, token_level_rewards_BT=r, response_mask_BT=m, **kw)
        assert torch.equal(adv, torch.zeros_like(adv)), name


def test_empty_mask_row_and_empty_batch_are_finite_and_zero():
    r, m = outcome_batch([1.0, 0.0, 2.0, 0.5], [3, 0, 2, 3], T=3)
    r[1, 2] = 4.0  # a reward on a row whose mask is empty
    index = ["a", "a", "b", "b"]
    for name, kw in all_estimator_kwargs(r, m, index).items():
        if name == "grpo_process":
            kw["step_end_mask_BT"] = (r != 0).float() * m
            r_use = r * m
        else:
            r_use = r
        adv, ret = run(name, token_level_rewards_BT=r_use, response_mask_BT=m, **kw)
        assert torch.isfinite(adv).all() and torch.isfinite(ret).all(), name
        assert torch.equal(adv[1], torch.zeros(3)), name
        assert adv[0].abs().sum() > 0, name  # the other rows still get signal

        # the whole batch masked out
        zm = torch.zeros_like(m)
        kw0 = dict(kw)
        r0 = r
        if name == "grpo_process":
            kw0["step_end_mask_BT"] = zm
            r0 = torch.zeros_like(r)
        adv0, ret0 = run(name, token_level_rewards_BT=r0, response_mask_BT=zm, **kw0)
        assert torch.isfinite(adv0).all() and torch.isfinite(ret0).all(), name
        assert torch.equal(adv0, torch.zeros_like(adv0)), name


def test_bool_mask_equals_float_mask():
    gen = torch.Generator().manual_seed(6)
    index = ["a", "a", "b", "b", "b"]
    m = random_prefix_mask(gen, 5, 4)
    r = torch.randn(5, 4, generator=gen) * m
    for name, kw in all_estimator_kwargs(r, m, index).items():
        a_f, r_f = run(name, token_level_rewards_BT=r, response_mask_BT=m, **kw)
        kw_b = dict(kw)
        if "step_end_mask_BT" in kw_b:
            kw_b["step_end_mask_BT"] = kw_b["step_end_mask_BT"].bool()
        a_b, r_b = run(name, token_level_rewards_BT=r, response_mask_BT=m.bool(), **kw_b)
        torch.testing.assert_close(a_f, a_b)
        torch.testing.assert_close(r_f, r_b)


def test_core_imports_only_torch_and_stdlib_basics():
    """grpo_dist/core is pure math: torch, a few standard modules, and itself."""
    import ast
    import pathlib

    import grpo_dist.core

    allowed = {"torch", "math", "dataclasses", "typing", "enum", "importlib", "pathlib", "sys", "grpo_dist"}
    core_dir = pathlib.Path(grpo_dist.core.__file__).parent
    files = sorted(core_dir.glob("*.py"))
    assert len(files) >= 4
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed, f"{path.name} imports {name}"
                assert not name.startswith("torch.distributed"), f"{path.name} imports {name}"
                if name.startswith("grpo_dist"):
                    assert name.startswith("grpo_dist.core"), f"{path.name} imports {name}"
