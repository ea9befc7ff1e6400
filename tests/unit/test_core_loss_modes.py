"""The policy-loss modes beyond vanilla (GSPO, GPG, CISPO, Clip-Cov, KL-Cov, GMPO, SAPO, DRO, DPPO, bypass mode) and the
straight-through KL kinds: each against numbers worked out by hand and against a plain loop written
from the mode's definition (one sequence, one token at a time, python floats), values AND gradients.

The loop references do not call the code under test: they compute the loss and its derivative with
respect to every ``logp[i, t]`` from the formula (the derivative worked out on paper), so a wrong
stop-gradient shows up as a gradient mismatch.
"""

from __future__ import annotations

import math

import pytest
import torch

from grpo_dist.core.kl import kl_penalty
from grpo_dist.core.losses import AggSpec
from grpo_dist.core.policy_loss import PolicyLossInputs, PolicyLossParams, get_policy_loss
from grpo_dist.core.rollout_correction import RejectionCriterion, RolloutCorrectionParams

F64 = torch.float64


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=F64)


def call(mode, logp, old, adv, mask, *, agg=None, params=None, rollout_is_weights_BT=None):
    """The mode's loss, its gradient with respect to logp, and its metrics as floats."""
    logp = logp.detach().clone().requires_grad_(True)
    inputs = PolicyLossInputs(logp, old, adv, mask, rollout_is_weights_BT=rollout_is_weights_BT)
    loss, metrics = get_policy_loss(mode).fn(inputs, agg=agg or AggSpec("token-mean"), params=params or PolicyLossParams())
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.item(), grad, {k: v.item() for k, v in metrics.items()}


def random_inputs(seed: int, B: int = 6, T: int = 7, spread: float = 0.25, token_adv: bool = False):
    """Log-probs near an old policy (some ratios outside a 0.2 clip), advantages, a mask with rows of
    different lengths and one empty row. float64."""
    g = torch.Generator().manual_seed(seed)
    old = -1.5 + 0.5 * torch.randn(B, T, generator=g, dtype=F64)
    logp = old + spread * torch.randn(B, T, generator=g, dtype=F64)
    if token_adv:
        adv = torch.randn(B, T, generator=g, dtype=F64)
    else:
        adv = torch.randn(B, 1, generator=g, dtype=F64).expand(B, T).contiguous()
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[1] = 0
    lengths[2] = T
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(F64)
    return logp, old, adv, mask


def tokens_of(mask_row) -> list[int]:
    return [j for j, m in enumerate(mask_row) if m != 0]


def clip(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)


def assert_matches(got_loss, got_grad, want_loss, want_grad, tol=1e-10):
    assert got_loss == pytest.approx(want_loss, rel=tol, abs=tol)
    torch.testing.assert_close(got_grad, torch.tensor(want_grad, dtype=F64), rtol=tol, atol=tol)
    assert got_grad.abs().sum() > 0, "a comparison of zero gradients proves nothing"


def counts(mask) -> tuple[float, float]:
    m = mask.tolist()
    return float(sum(map(sum, m))), float(sum(1 for row in m if sum(row) > 0))


# --------------------------------------------------------------------------------------------------
# vanilla (PPO clip with clip-higher and dual clip), the loop the bypass tests reuse
# --------------------------------------------------------------------------------------------------


def ppo_token(a: float, log_ratio: float, lo: float, hi: float, c: float) -> tuple[float, float]:
    """One token's PPO loss and its derivative with respect to logp: max(-A r, -A clip(r)) (no gradient
    when the clipped branch is taken), then, for A < 0, capped at -A c (no gradient when capped)."""
    r = math.exp(clip(log_ratio, -20.0, 20.0))
    pg1, pg2 = -a * r, -a * clip(r, 1 - lo, 1 + hi)
    value, slope = (pg1, -a * r) if pg1 >= pg2 else (pg2, 0.0)
    if a < 0 and value > -a * c:
        value, slope = -a * c, 0.0
    return value, slope


def vanilla_loop(logp, old, adv, mask, lo, hi, c, n_tok, w=None):
    L, O, A, M = logp.tolist(), old.tolist(), adv.tolist(), mask.tolist()
    W = w.tolist() if w is not None else None
    loss, grad = 0.0, [[0.0] * len(L[0]) for _ in L]
    for i in range(len(L)):
        for j in tokens_of(M[i]):
            value, slope = ppo_token(A[i][j], L[i][j] - O[i][j], lo, hi, c)
            wt = W[i][j] if W else 1.0
            loss += value * wt / n_tok
            grad[i][j] = slope * wt / n_tok
    return loss, grad


@pytest.mark.parametrize("seed", range(3))
def test_vanilla_matches_a_plain_loop(seed):
    logp, old, adv, mask = random_inputs(seed, spread=0.6, token_adv=True)  # wide: clip and dual clip happen
    n_tok, _ = counts(mask)
    p = PolicyLossParams(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=1.5)
    agg = AggSpec("token-mean", global_tokens=n_tok)
    loss, grad, m = call("vanilla", logp, old, adv, mask, agg=agg, params=p)
    assert_matches(loss, grad, *vanilla_loop(logp, old, adv, mask, 0.2, 0.28, 1.5, n_tok))
    assert m["pg_clipfrac"] > 0 and m["pg_clipfrac_lower"] > 0
    w = torch.rand(mask.shape, generator=torch.Generator().manual_seed(seed), dtype=F64) * 2 * mask
    loss, grad, _ = call("vanilla", logp, old, adv, mask, agg=agg, params=p, rollout_is_weights_BT=w)
    assert_matches(loss, grad, *vanilla_loop(logp, old, adv, mask, 0.2, 0.28, 1.5, n_tok, w=w))


# --------------------------------------------------------------------------------------------------
# GSPO
# --------------------------------------------------------------------------------------------------


def test_gspo_by_hand_one_ratio_per_sequence_and_its_straight_through_gradient():
    # clip 0.05 / 0.05.
    # row 0 (2 tokens, A = +1): d = logp - old = [0.2, 0.0] -> s = 0.1, r = e^0.1 = 1.105171 > 1.05:
    #   pg1 = -1.105171, pg2 = -1.05 -> max = -1.05 on both tokens (clipped: no gradient)
    # row 1 (3 tokens, A = -0.5): d = [-0.1, 0.1, 0.03] -> s = 0.01, r = e^0.01 = 1.010050 (inside):
    #   per token 0.5 * 1.010050 = 0.505025
    # seq-mean-token-mean (always, whatever agg.mode says), 2 sequences:
    #   loss = (-1.05 + 0.505025) / 2 = -0.2724874
    # gradient (straight through: the value of s_i, the gradient of logp_it): on every token of row 1
    #   d/dlogp_1t = -A * r / (len_1 * N_seq) = 0.505025 / 6 = 0.0841709, the SAME for all three tokens
    #   although their own ratios differ; row 0 is clipped -> 0
    logp = t([[-1.0, -2.0, -9.0], [-0.5, -1.5, -1.0]])
    old = t([[-1.2, -2.0, 0.0], [-0.4, -1.6, -1.03]])
    adv = t([[1.0, 1.0, 1.0], [-0.5, -0.5, -0.5]])
    mask = t([[1, 1, 0], [1, 1, 1]])
    p = PolicyLossParams(clip_ratio_low=0.05, clip_ratio_high=0.05)
    for agg_mode in ("token-mean", "seq-mean-token-sum"):  # ignored
        loss, grad, m = call("gspo", logp, old, adv, mask, agg=AggSpec(agg_mode, global_tokens=5, global_seqs=2), params=p)
        r1 = math.exp(0.01)
        assert loss == pytest.approx((-1.05 + 0.5 * r1) / 2, abs=1e-9)
        torch.testing.assert_close(grad, t([[0, 0, 0], [0.5 * r1 / 6] * 3]))
    assert m["pg_clipfrac"] == pytest.approx(2 / 5)
    assert m["pg_clipfrac_lower"] == 0.0
    assert m["ppo_kl"] == pytest.approx(-(0.2 + 0.0 - 0.1 + 0.1 + 0.03) / 5)


def gspo_loop(logp, old, adv, mask, lo, hi, w=None, n_seq=None):
    L, O, A, M = logp.tolist(), old.tolist(), adv.tolist(), mask.tolist()
    W = w.tolist() if w is not None else None
    n_seq = n_seq if n_seq is not None else sum(1 for row in M if sum(row) > 0)
    loss, grad = 0.0, [[0.0] * len(L[0]) for _ in L]
    for i in range(len(L)):
        toks = tokens_of(M[i])
        if not toks:
            continue
        n = len(toks)
        s = sum(L[i][j] - O[i][j] for j in toks) / n  # log of the length-normalised sequence ratio
        r = math.exp(min(s, 10.0))
        for j in toks:
            pg1, pg2 = -A[i][j] * r, -A[i][j] * clip(r, 1 - lo, 1 + hi)
            wt = W[i][j] if W else 1.0
            loss += max(pg1, pg2) * wt / n / n_seq
            # d(r_ij)/d(logp_ij) = r (straight through), the clipped branch has no gradient
            grad[i][j] = 0.0 if pg2 > pg1 else -A[i][j] * r * wt / n / n_seq
    return loss, grad


@pytest.mark.parametrize("seed", range(4))
def test_gspo_matches_a_plain_loop(seed):
    logp, old, adv, mask = random_inputs(seed, spread=0.1, token_adv=seed % 2 == 1)
    p = PolicyLossParams(clip_ratio_low=0.03, clip_ratio_high=0.04)
    _, seqs = counts(mask)
    agg = AggSpec("token-mean", global_tokens=999.0, global_seqs=seqs + 3)  # a larger mini-batch's count
    loss, grad, _ = call("gspo", logp, old, adv, mask, agg=agg, params=p)
    want_loss, want_grad = gspo_loop(logp, old, adv, mask, 0.03, 0.04, n_seq=seqs + 3)
    assert_matches(loss, grad, want_loss, want_grad)
    # with rollout importance weights (per token, constants)
    w = torch.rand(mask.shape, generator=torch.Generator().manual_seed(seed), dtype=F64) * 2 * mask
    loss, grad, _ = call("gspo", logp, old, adv, mask, agg=agg, params=p, rollout_is_weights_BT=w)
    assert_matches(loss, grad, *gspo_loop(logp, old, adv, mask, 0.03, 0.04, w=w, n_seq=seqs + 3))


# --------------------------------------------------------------------------------------------------
# GPG (loss)
# --------------------------------------------------------------------------------------------------


def test_gpg_loss_by_hand():
    # -A * logp, token-mean over 3 tokens: row 0: -1*-1 = 1, -1*-2 = 2; row 1: -(-2)*-0.5 = -1
    #   loss = (1 + 2 - 1) / 3 = 2/3; gradient -A / 3 = [[-1/3, -1/3, 0], [2/3, 0, 0]]; no metrics
    logp = t([[-1.0, -2.0, 5.0], [-0.5, 7.0, 7.0]])
    old = t([[0.0, 0.0, 0.0], [9.0, 9.0, 9.0]])  # not used: no ratio
    adv = t([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]])
    mask = t([[1, 1, 0], [1, 0, 0]])
    loss, grad, m = call("gpg", logp, old, adv, mask)
    assert loss == pytest.approx(2 / 3)
    torch.testing.assert_close(grad, t([[-1 / 3, -1 / 3, 0], [2 / 3, 0, 0]]))
    assert m == {}


def gpg_loop(logp, adv, mask, agg_mode, n_tok, n_seq, w=None):
    L, A, M = logp.tolist(), adv.tolist(), mask.tolist()
    W = w.tolist() if w is not None else None
    loss, grad = 0.0, [[0.0] * len(L[0]) for _ in L]
    for i in range(len(L)):
        toks = tokens_of(M[i])
        for j in toks:
            wt = W[i][j] if W else 1.0
            scale = {"token-mean": 1 / n_tok, "token-sum": 1.0, "seq-mean-token-sum": 1 / n_seq,
                     "seq-mean-token-mean": 1 / (len(toks) * n_seq)}[agg_mode]
            loss += -A[i][j] * L[i][j] * wt * scale
            grad[i][j] = -A[i][j] * wt * scale
    return loss, grad


@pytest.mark.parametrize("agg_mode", ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_gpg_loss_matches_a_plain_loop(agg_mode):
    logp, old, adv, mask = random_inputs(3, token_adv=True)
    n_tok, n_seq = counts(mask)
    w = torch.rand(mask.shape, generator=torch.Generator().manual_seed(1), dtype=F64) * mask
    agg = AggSpec(agg_mode, global_tokens=n_tok, global_seqs=n_seq)
    loss, grad, _ = call("gpg", logp, old, adv, mask, agg=agg, rollout_is_weights_BT=w)
    assert_matches(loss, grad, *gpg_loop(logp, adv, mask, agg_mode, n_tok, n_seq, w=w))


# --------------------------------------------------------------------------------------------------
# CISPO
# --------------------------------------------------------------------------------------------------


def test_cispo_by_hand_clipped_weight_is_a_constant():
    # clip 0.2 / 0.2. d = logp - old = [0.5, 0, -0.5] -> r = [1.6487, 1, 0.6065]
    #   c = sg(clip(r, 0.8, 1.2)) = [1.2, 1.0, 0.8];  A = [2, 2, -1];  logp = -1 on every token
    #   per token -c * A * logp = [2.4, 2.0, -0.8] -> token-mean 3.6 / 3 = 1.2
    #   gradient -c * A / 3 = [-0.8, -2/3, 0.8/3]: tokens 0 and 2 were clipped and STILL get a
    #   gradient (vanilla PPO would give token 0, with A > 0 and r > 1.2, none)
    logp = t([[-1.0, -1.0, -1.0]])
    old = t([[-1.5, -1.0, -0.5]])
    adv = t([[2.0, 2.0, -1.0]])
    mask = t([[1, 1, 1]])
    loss, grad, m = call("cispo", logp, old, adv, mask, params=PolicyLossParams(clip_ratio_low=0.2, clip_ratio_high=0.2))
    assert loss == pytest.approx(1.2)
    torch.testing.assert_close(grad, t([[-0.8, -2 / 3, 0.8 / 3]]))
    assert m["pg_clipfrac"] == pytest.approx(2 / 3)
    assert m["pg_clipfrac_lower"] == 0.0
    assert m["ppo_kl"] == pytest.approx(0.0)  # mean(-d) = -(0.5 + 0 - 0.5)/3
    _, vanilla_grad, _ = call("vanilla", logp, old, adv, mask, params=PolicyLossParams(clip_ratio_low=0.2, clip_ratio_high=0.2))
    assert vanilla_grad[0, 0] == 0.0 and grad[0, 0] != 0.0


def cispo_loop(logp, old, adv, mask, lo, hi, n_tok):
    L, O, A, M = logp.tolist(), old.tolist(), adv.tolist(), mask.tolist()
    loss, grad = 0.0, [[0.0] * len(L[0]) for _ in L]
    for i in range(len(L)):
        for j in tokens_of(M[i]):
            c = clip(math.exp(clip(L[i][j] - O[i][j], -20, 20)), 1 - lo, 1 + hi)  # a constant
            loss += -c * A[i][j] * L[i][j] / n_tok
            grad[i][j] = -c * A[i][j] / n_tok
    return loss, grad


@pytest.mark.parametrize("seed", range(3))
def test_cispo_matches_a_plain_loop(seed):
    logp, old, adv, mask = random_inputs(seed, spread=0.4, token_adv=True)
    n_tok, _ = counts(mask)
    loss, grad, _ = call("cispo", logp, old, adv, mask, agg=AggSpec("token-mean", global_tokens=n_tok + 5),
                         params=PolicyLossParams(clip_ratio_low=0.2, clip_ratio_high=0.28))
    assert_matches(loss, grad, *cispo_loop(logp, old, adv, mask, 0.2, 0.28, n_tok + 5))


# --------------------------------------------------------------------------------------------------
# Clip-Cov
# --------------------------------------------------------------------------------------------------


def test_clip_cov_by_hand():
    # clip 0.2 / 0.2, band (0.4, 1.0), clip_cov_ratio 0.0002 -> at most max(int(0.0002 * 4), 1) = 1 cut.
    # A = [[3, 1], [-1, -3]] (mean 0); logp = [[0, -1], [-2, -3]] (mean -1.5)
    #   cov = (A - 0) * (logp + 1.5) = [[4.5, 0.5], [0.5, 4.5]]: (0,1) and (1,0) lie in the band
    # d = logp - old = [[0, 0.5], [0, 0]]: token (0,1) has r = e^0.5 = 1.6487 > 1.2 with A > 0, so the
    #   PPO clip already holds it (pg2 > pg1): not a candidate. The one candidate, (1,0), is cut.
    # per token max(pg1, pg2): (0,0) -3; (0,1) max(-1.6487, -1.2) = -1.2; (1,0) 1 -> cut -> 0; (1,1) 3
    #   token-mean = (-3 - 1.2 + 0 + 3) / 4 = -0.3
    # gradient -A * r / 4 on the tokens neither clipped nor cut: (0,0) -0.75, (1,1) +0.75
    logp = t([[0.0, -1.0], [-2.0, -3.0]])
    old = logp - t([[0.0, 0.5], [0.0, 0.0]])
    adv = t([[3.0, 1.0], [-1.0, -3.0]])
    mask = t([[1, 1], [1, 1]])
    p = PolicyLossParams(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_cov_lb=0.4, clip_cov_ub=1.0)
    loss, grad, m = call("clip_cov", logp, old, adv, mask, params=p)
    assert loss == pytest.approx(-0.3)
    torch.testing.assert_close(grad, t([[-0.75, 0.0], [0.0, 0.75]]))
    assert m == pytest.approx({"pg_clipfrac": 0.25, "ppo_kl": -0.5 / 4})  # pg_clipfrac: the cut tokens


def clip_cov_loop(logp, old, adv, mask, p: PolicyLossParams, seed: int, n_tok: float):
    """The definition: candidates (response tokens not clipped by PPO, covariance strictly inside the
    band) in row-major order, a uniform draw of min(max(int(ratio * #tokens), 1), #candidates) of them
    (torch.randperm after torch.manual_seed(seed)), whose loss is dropped."""
    L, O, A, M = logp.tolist(), old.tolist(), adv.tolist(), mask.tolist()
    toks = [(i, j) for i in range(len(L)) for j in tokens_of(M[i])]
    mean_a = sum(A[i][j] for i, j in toks) / len(toks)
    mean_l = sum(L[i][j] for i, j in toks) / len(toks)
    pg = {}
    for i, j in toks:
        r = math.exp(clip(L[i][j] - O[i][j], -20, 20))
        pg[i, j] = (-A[i][j] * r, -A[i][j] * clip(r, 1 - p.clip_ratio_low, 1 + p.clip_ratio_high), r)
    cands = [(i, j) for i, j in toks
             if not pg[i, j][1] > pg[i, j][0]
             and p.clip_cov_lb < (A[i][j] - mean_a) * (L[i][j] - mean_l) < p.clip_cov_ub]
    cut = set()
    if cands:
        n_cut = min(max(int(p.clip_cov_ratio * len(toks)), 1), len(cands))
        torch.manual_seed(seed)
        cut = {cands[k] for k in torch.randperm(len(cands))[:n_cut].tolist()}
    loss, grad = 0.0, [[0.0] * len(L[0]) for _ in L]
    for i, j in toks:
        pg1, pg2, r = pg[i, j]
        if (i, j) in cut:
            continue
        loss += max(pg1, pg2) / n_tok
        grad[i][j] = 0.0 if pg2 > pg1 else -A[i][j] * r / n_tok
    return loss, grad, len(cut)


@pytest.mark.parametrize("seed", range(4))
def test_clip_cov_matches_a_plain_loop(seed):
    logp, old, adv, mask = random_inputs(seed, B=8, T=9, spread=0.3, token_adv=True)
    n_tok, _ = counts(mask)
    # a band and ratio that give many candidates and several (random) cuts
    p = PolicyLossParams(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_cov_lb=0.05, clip_cov_ub=5.0, clip_cov_ratio=0.1)
    torch.manual_seed(100 + seed)
    loss, grad, m = call("clip_cov", logp, old, adv, mask, agg=AggSpec("token-mean", global_tokens=n_tok), params=p)
    want_loss, want_grad, n_cut = clip_cov_loop(logp, old, adv, mask, p, 100 + seed, n_tok)
    assert n_cut >= 3, "the data should cut several tokens"
    assert_matches(loss, grad, want_loss, want_grad)
    assert m["pg_clipfrac"] == pytest.approx(n_cut / n_tok)


# --------------------------------------------------------------------------------------------------
# KL-Cov
# --------------------------------------------------------------------------------------------------


def test_kl_cov_by_hand():
    # kl_cov_ratio 0.25 -> k = max(int(0.25 * 4), 1) = 1 token gets the penalty; ppo_kl_coef 0.1.
    # A = [[3, 1], [-1, -3]] (mean 0); logp = [[0, -1], [-2, -3.2]] (mean -1.55)
    #   cov = A * (logp + 1.55) = [[4.65, 0.55], [0.45, 4.95]] -> the largest is (1,1)
    # d = [[0.1, 0], [0, -0.2]]: r = [[1.105171, 1], [1, 0.818731]]
    # per token -A * r (+ 0.1 * |d| on (1,1)): -3.315513, -1, 1, 2.456192 + 0.02 = 2.476192
    #   token-mean = -0.839321 / 4 = -0.209830
    # gradient (-A * r + 0.1 * sign(d) on (1,1)) / 4: -0.828878, -0.25, 0.25, (2.456192 - 0.1) / 4
    logp = t([[0.0, -1.0], [-2.0, -3.2]])
    old = logp - t([[0.1, 0.0], [0.0, -0.2]])
    adv = t([[3.0, 1.0], [-1.0, -3.0]])
    mask = t([[1, 1], [1, 1]])
    loss, grad, m = call("kl_cov", logp, old, adv, mask, params=PolicyLossParams(kl_cov_ratio=0.25, ppo_kl_coef=0.1))
    r00, r11 = math.exp(0.1), math.exp(-0.2)
    assert loss == pytest.approx((-3 * r00 - 1 + 1 + 3 * r11 + 0.02) / 4)
    torch.testing.assert_close(grad, t([[-3 * r00 / 4, -0.25], [0.25, (3 * r11 - 0.1) / 4]]))
    assert m == pytest.approx({"ppo_kl": 0.3 / 4})  # mean |d|, as verl


def kl_cov_loop(logp, old, adv, mask, ratio, coef, n_tok):
    L, O, A, M = logp.tolist(), old.tolist(), adv.tolist(), mask.tolist()
    toks = [(i, j) for i in range(len(L)) for j in tokens_of(M[i])]
    mean_a = sum(A[i][j] for i, j in toks) / len(toks)
    mean_l = sum(L[i][j] for i, j in toks) / len(toks)
    cov = {(i, j): (A[i][j] - mean_a) * (L[i][j] - mean_l) for i, j in toks}
    k = max(int(len(toks) * ratio), 1)
    top = set(sorted(toks, key=lambda ij: cov[ij], reverse=True)[:k])
    loss, grad = 0.0, [[0.0] * len(L[0]) for _ in L]
    for i, j in toks:
        d = clip(L[i][j] - O[i][j], -20, 20)
        r = math.exp(d)
        value, slope = -A[i][j] * r, -A[i][j] * r
        if (i, j) in top:
            value += coef * abs(d)
            slope += coef * (1.0 if d > 0 else -1.0 if d < 0 else 0.0)
        loss += value / n_tok
        grad[i][j] = slope / n_tok
    return loss, grad


@pytest.mark.parametrize("seed", range(3))
def test_kl_cov_matches_a_plain_loop(seed):
    logp, old, adv, mask = random_inputs(seed, B=8, T=9, spread=0.3, token_adv=True)
    n_tok, _ = counts(mask)
    loss, grad, _ = call("kl_cov", logp, old, adv, mask, agg=AggSpec("token-mean", global_tokens=n_tok),
                         params=PolicyLossParams(kl_cov_ratio=0.2, ppo_kl_coef=0.5))
    assert_matches(loss, grad, *kl_cov_loop(logp, old, adv, mask, 0.2, 0.5, n_tok))


# --------------------------------------------------------------------------------------------------
# GMPO (geo_mean)
# --------------------------------------------------------------------------------------------------


def test_geo_mean_by_hand():
    # clip 0.05 / 0.05, A = +1 on both tokens of one sequence.
    # d = logp - old = [0.1, -0.2]; clamped dc = [0.05, -0.05]; A > 0 takes min(d, dc) = [0.05, -0.2]
    #   ratio = exp((0.05 - 0.2) / 2) = exp(-0.075) = 0.927743;  loss = -1 * ratio / 1 sequence
    # gradient: token 0 took the clamped value (no gradient); token 1 the unclipped d:
    #   d loss / d logp_1 = -A * ratio / len = -0.927743 / 2
    logp = t([[-1.0, -1.2, 0.0]])
    old = t([[-1.1, -1.0, 0.0]])
    adv = t([[1.0, 1.0, 1.0]])
    mask = t([[1, 1, 0]])
    p = PolicyLossParams(clip_ratio_low=0.05, clip_ratio_high=0.05)
    loss, grad, m = call("geo_mean", logp, old, adv, mask, agg=AggSpec("token-mean", global_seqs=1.0), params=p)
    ratio = math.exp(-0.075)
    assert loss == pytest.approx(-ratio)
    torch.testing.assert_close(grad, t([[0.0, -ratio / 2, 0.0]]))
    assert m["pg_clipfrac"] == pytest.approx(1.0)  # both tokens differ from their clamp, A > 0
    assert m["pg_clipfrac_lower"] == 0.0
    assert m["ppo_kl"] == pytest.approx(0.05)  # mean(-d) = -(0.1 - 0.2) / 2


def geo_mean_loop(logp, old, adv, mask, lo, hi, n_seq, w=None):
    L, O, A, M = logp.tolist(), old.tolist(), adv.tolist(), mask.tolist()
    W = w.tolist() if w is not None else None
    loss, grad = 0.0, [[0.0] * len(L[0]) for _ in L]
    for i in range(len(L)):
        toks = tokens_of(M[i])
        if not toks:
            continue
        n = len(toks)
        terms, slopes = [], []
        for j in toks:
            d = L[i][j] - O[i][j]
            dc = clip(d, -lo, hi)
            # the pessimistic token log-ratio: for A > 0 the smaller, for A < 0 the larger, of d and dc
            if A[i][j] > 0:
                e, slope = (d, 1.0) if d < dc else (dc, 0.0 if dc != d else 1.0)
            elif A[i][j] < 0:
                e, slope = (d, 1.0) if d > dc else (dc, 0.0 if dc != d else 1.0)
            else:
                e, slope = 0.0, 0.0
            terms.append(e)
            slopes.append(slope)
        ratio = math.exp(sum(terms) / n)
        adv_i = sum(A[i][j] for j in toks) / n
        w_i = math.exp(sum(math.log(W[i][j] + 1e-10) for j in toks) / n) if W else 1.0
        loss += -adv_i * ratio * w_i / n_seq
        for j, slope in zip(toks, slopes):
            grad[i][j] = -adv_i * ratio * w_i * slope / n / n_seq
    return loss, grad


@pytest.mark.parametrize("seed", range(4))
def test_geo_mean_matches_a_plain_loop(seed):
    logp, old, adv, mask = random_inputs(seed, spread=0.3)
    _, n_seq = counts(mask)
    p = PolicyLossParams(clip_ratio_low=0.2, clip_ratio_high=0.28)
    agg = AggSpec("token-mean", global_seqs=n_seq + 2)
    loss, grad, _ = call("geo_mean", logp, old, adv, mask, agg=agg, params=p)
    # (the code divides by len + 1e-8, as verl: a relative difference of ~1e-8 from the exact len)
    assert_matches(loss, grad, *geo_mean_loop(logp, old, adv, mask, 0.2, 0.28, n_seq + 2), tol=1e-7)
    w = (0.5 + torch.rand(mask.shape, generator=torch.Generator().manual_seed(seed), dtype=F64)) * mask
    loss, grad, _ = call("geo_mean", logp, old, adv, mask, agg=agg, params=p, rollout_is_weights_BT=w)
    assert_matches(loss, grad, *geo_mean_loop(logp, old, adv, mask, 0.2, 0.28, n_seq + 2, w=w), tol=1e-7)


# --------------------------------------------------------------------------------------------------
# SAPO
# --------------------------------------------------------------------------------------------------


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_sapo_by_hand_soft_gate_and_per_sequence_mean():
    # tau_pos = 1, tau_neg = ln 3 (so that sigmoid(tau_neg * (2 - 1)) = 3/4)
    # row 0: d = [0, ln 2] -> r = [1, 2];  A = [2, -1]
    #   token 0 (A > 0, tau 1):    f = sigmoid(0) * 4 / 1 = 2;             loss -f A = -4
    #                              df/dlogp = 4 s (1 - s) r = 4 * 1/4 * 1 = 1 -> d(loss)/dlogp = -A = -2
    #   token 1 (A < 0, tau ln 3): f = (3/4) * 4 / ln 3 = 3 / ln 3;          loss -f A = 3 / ln 3
    #                              df/dlogp = 4 * 3/4 * 1/4 * 2 = 1.5       -> d(loss)/dlogp = 1.5
    #   row mean: (-4 + 3 / ln 3) / 2
    # row 1: one token, d = 0, A = 1: loss -2, gradient -1; row mean -2
    # seq-mean-token-mean over 2 sequences, whatever agg.mode says (token-mean here):
    #   loss = ((-4 + 3 / ln 3) / 2 - 2) / 2;  gradients [[-2 / 2, 1.5 / 2], [-1, 0]] / 2
    logp = t([[-1.0, -1.0], [-1.0, -1.0]])
    old = t([[-1.0, -1.0 - math.log(2.0)], [-1.0, -1.0]])
    adv = t([[2.0, -1.0], [1.0, 0.0]])
    mask = t([[1, 1], [1, 0]])
    params = PolicyLossParams(tau_pos=1.0, tau_neg=math.log(3.0))
    loss, grad, m = call("sapo", logp, old, adv, mask, agg=AggSpec("token-mean"), params=params)
    assert loss == pytest.approx(((-4 + 3 / math.log(3.0)) / 2 - 2) / 2)
    torch.testing.assert_close(grad, t([[-0.5, 0.375], [-0.5, 0.0]]))
    assert m["ppo_kl"] == pytest.approx(-math.log(2.0) / 3)  # mean of -d over the 3 response tokens
    assert m["pg_clipfrac"] == 0.0 and m["pg_clipfrac_lower"] == 0.0
    # on policy (r = 1 everywhere) the gradient is the plain policy gradient's, whatever the temperatures
    _, g_on, _ = call("sapo", logp, logp, adv, mask, params=params)
    _, g_pg, _ = call("gpg", logp, logp, adv, mask, agg=AggSpec("seq-mean-token-mean"))
    torch.testing.assert_close(g_on, g_pg)


def sapo_loop(logp, old, adv, mask, tau_pos, tau_neg, n_seq, w=None):
    L, O, A, M = logp.tolist(), old.tolist(), adv.tolist(), mask.tolist()
    W = w.tolist() if w is not None else None
    loss, grad = 0.0, [[0.0] * len(L[0]) for _ in L]
    for i in range(len(L)):
        toks = tokens_of(M[i])
        for j in toks:
            d = L[i][j] - O[i][j]
            r = math.exp(clip(d, -20, 20))
            tau = tau_pos if A[i][j] > 0 else tau_neg
            s = sigmoid(tau * (r - 1))
            wt = W[i][j] if W else 1.0
            loss += -s * 4 / tau * A[i][j] * wt / len(toks) / n_seq
            grad[i][j] = -A[i][j] * 4 * s * (1 - s) * r * wt / len(toks) / n_seq
    return loss, grad


@pytest.mark.parametrize("seed", range(3))
def test_sapo_matches_a_plain_loop(seed):
    logp, old, adv, mask = random_inputs(seed, spread=0.6, token_adv=True)
    _, n_seq = counts(mask)
    w = 0.5 + torch.rand(mask.shape, generator=torch.Generator().manual_seed(seed), dtype=F64)
    loss, grad, _ = call("sapo", logp, old, adv, mask, agg=AggSpec("token-mean", global_seqs=n_seq + 2),
                         params=PolicyLossParams(tau_pos=1.0, tau_neg=1.05), rollout_is_weights_BT=w)
    assert_matches(loss, grad, *sapo_loop(logp, old, adv, mask, 1.0, 1.05, n_seq + 2, w))


# --------------------------------------------------------------------------------------------------
# DRO
# --------------------------------------------------------------------------------------------------


def test_dro_by_hand_quadratic_penalty_pulls_back_to_the_sampling_policy():
    # beta = 0.5; logp = [-1, -2], old = [-1.5, -2] -> d = [0.5, 0]; A = [1, 1]
    #   per token -(logp A - beta/2 d^2) = [1 + 0.0625, 2] -> token-mean 3.0625 / 2
    #   gradient -(A - beta d) / 2 = [-(1 - 0.25) / 2, -1 / 2] = [-0.375, -0.5]
    logp, old, adv, mask = t([[-1.0, -2.0]]), t([[-1.5, -2.0]]), t([[1.0, 1.0]]), t([[1, 1]])
    loss, grad, m = call("dro", logp, old, adv, mask, params=PolicyLossParams(dro_beta=0.5))
    assert loss == pytest.approx(3.0625 / 2)
    torch.testing.assert_close(grad, t([[-0.375, -0.5]]))
    assert m == {"ppo_kl": pytest.approx(-0.25)}


def test_dro_needs_its_beta():
    logp, old, adv, mask = t([[-1.0]]), t([[-1.0]]), t([[1.0]]), t([[1]])
    with pytest.raises(ValueError, match="dro_beta must be set"):
        call("dro", logp, old, adv, mask)
    with pytest.raises(ValueError, match="dro_beta must be set"):
        get_policy_loss("dro").check_params(PolicyLossParams())
    get_policy_loss("dro").check_params(PolicyLossParams(dro_beta=0.1))
    get_policy_loss("vanilla").check_params(PolicyLossParams())  # no other mode reads it
    with pytest.raises(ValueError, match="dro_beta must be > 0"):
        PolicyLossParams(dro_beta=0.0)


@pytest.mark.parametrize("agg_mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_dro_matches_a_plain_loop(agg_mode):
    logp, old, adv, mask = random_inputs(5, spread=0.4, token_adv=True)
    n_tok, n_seq = counts(mask)
    beta = 0.3
    L, O, A, M = logp.tolist(), old.tolist(), adv.tolist(), mask.tolist()
    want, want_grad = 0.0, [[0.0] * len(L[0]) for _ in L]
    for i in range(len(L)):
        toks = tokens_of(M[i])
        norm = {"token-mean": n_tok, "seq-mean-token-sum": n_seq, "seq-mean-token-mean": n_seq * max(len(toks), 1)}[agg_mode]
        for j in toks:
            d = L[i][j] - O[i][j]
            want += -(L[i][j] * A[i][j] - beta / 2 * d * d) / norm
            want_grad[i][j] = -(A[i][j] - beta * d) / norm
    loss, grad, _ = call("dro", logp, old, adv, mask, agg=AggSpec(agg_mode), params=PolicyLossParams(dro_beta=beta))
    assert_matches(loss, grad, want, want_grad)


# --------------------------------------------------------------------------------------------------
# DPPO (binary TV and binary KL trust regions)
# --------------------------------------------------------------------------------------------------


def dppo_case():
    """Five tokens, probabilities old -> new, advantages (clip ranges 0.2 / 0.2, clip_ratio_c 3)."""
    p_old = [0.5, 0.2, 0.5, 0.1, 0.9]
    p_new = [0.6, 0.6, 0.1, 0.4, 0.1]
    adv = [1.0, 1.0, -1.0, -1.0, 1.0]
    logp = t([[math.log(p) for p in p_new]])
    old = t([[math.log(p) for p in p_old]])
    return logp, old, t([adv]), t([[1, 1, 1, 1, 1]])


def test_dppo_tv_by_hand():
    # moved p - p_old = [0.1, 0.4, -0.4, 0.3, -0.8]
    #   A > 0 valid when moved <= 0.2: tokens 0 and 4 (4 moved back); token 1 outside
    #   A < 0 valid when moved >= -0.2: token 3; token 2 outside
    # weights sg(min(r, 3)): token 0 r = 1.2; token 3 r = 4 -> 3 (truncated); token 4 r = 1/9
    # per token -A c logp: [-1.2 ln 0.6, 0, 0, 3 ln 0.4, -(1/9) ln 0.1]; token-mean over 5
    # gradient -A c / 5 on the valid tokens: [-1.2, 0, 0, 3, -1/9] / 5
    logp, old, adv, mask = dppo_case()
    loss, grad, m = call("dppo_tv", logp, old, adv, mask, params=PolicyLossParams(clip_ratio_c=3.0))
    assert loss == pytest.approx((-1.2 * math.log(0.6) + 3 * math.log(0.4) - math.log(0.1) / 9) / 5)
    torch.testing.assert_close(grad, t([[-1.2, 0.0, 0.0, 3.0, -1 / 9]]) / 5)
    assert m["pg_clipfrac"] == pytest.approx(2 / 5)  # outside the region
    assert m["pg_clipfrac_lower"] == pytest.approx(1 / 5)  # inside, weight truncated (token 3)


def test_dppo_kl_by_hand():
    # binary KL bkl = p_old ln(p_old / p) + (1 - p_old) ln((1 - p_old) / (1 - p)):
    #   token 0: 0.5 ln(0.5/0.6) + 0.5 ln(0.5/0.4) = 0.0204 <= 0.2            -> valid
    #   token 1: 0.2 ln(0.2/0.6) + 0.8 ln(0.8/0.4) = 0.3348 > 0.2, p > p_old   -> outside (A > 0)
    #   token 2: 0.5 ln(0.5/0.1) + 0.5 ln(0.5/0.9) = 0.5108 > 0.2, p < p_old   -> outside (A < 0)
    #   token 3: A < 0 and p >= p_old: moving against the advantage's push is always inside -> valid
    #   token 4: A > 0 and p <= p_old: the same -> valid, although its bkl is large (1.76)
    # valid tokens as dppo_tv's, so the same loss and gradient here
    logp, old, adv, mask = dppo_case()
    loss, grad, m = call("dppo_kl", logp, old, adv, mask, params=PolicyLossParams(clip_ratio_c=3.0))
    assert loss == pytest.approx((-1.2 * math.log(0.6) + 3 * math.log(0.4) - math.log(0.1) / 9) / 5)
    torch.testing.assert_close(grad, t([[-1.2, 0.0, 0.0, 3.0, -1 / 9]]) / 5)
    assert m["pg_clipfrac"] == pytest.approx(2 / 5) and m["pg_clipfrac_lower"] == pytest.approx(1 / 5)
    # where the two regions differ, thresholds 0.1: p 0.2 -> 0.35 with A > 0 moved 0.15 (TV: outside), its
    # bkl = 0.2 ln(0.2/0.35) + 0.8 ln(0.8/0.65) = 0.054 (KL: inside, gradient -A r = -1.75)
    one = (t([[math.log(0.35)]]), t([[math.log(0.2)]]), t([[1.0]]), t([[1]]))
    tenth = PolicyLossParams(clip_ratio_low=0.1, clip_ratio_high=0.1, clip_ratio_c=3.0)
    _, g_tv, _ = call("dppo_tv", *one, params=tenth)
    _, g_kl, _ = call("dppo_kl", *one, params=tenth)
    assert g_tv[0, 0] == 0.0 and g_kl[0, 0] == pytest.approx(-1.75)


def dppo_loop(kind, logp, old, adv, mask, lo, hi, c, n_tok):
    L, O, A, M = logp.tolist(), old.tolist(), adv.tolist(), mask.tolist()
    loss, grad = 0.0, [[0.0] * len(L[0]) for _ in L]
    for i in range(len(L)):
        for j in tokens_of(M[i]):
            p, q = math.exp(L[i][j]), math.exp(O[i][j])
            if kind == "tv":
                valid = (p - q <= hi) if A[i][j] > 0 else (p - q >= -lo)
            else:
                bkl = q * (O[i][j] - L[i][j]) + (1 - q) * math.log((1 - q + 1e-8) / (1 - p + 1e-8))
                valid = (bkl <= hi or p <= q) if A[i][j] > 0 else (bkl <= lo or p >= q)
            if valid:
                w = min(math.exp(clip(L[i][j] - O[i][j], -20, 20)), c)
                loss += -A[i][j] * w * L[i][j] / n_tok
                grad[i][j] = -A[i][j] * w / n_tok
    return loss, grad


@pytest.mark.parametrize("kind", ["tv", "kl"])
@pytest.mark.parametrize("seed", range(3))
def test_dppo_matches_a_plain_loop(kind, seed):
    logp, old, adv, mask = random_inputs(seed, spread=0.8, token_adv=True)
    logp, old = logp.clamp(max=-0.05), old.clamp(max=-0.05)  # probabilities below 1
    n_tok, _ = counts(mask)
    params = PolicyLossParams(clip_ratio_low=0.05, clip_ratio_high=0.08, clip_ratio_c=1.5)
    loss, grad, m = call(f"dppo_{kind}", logp, old, adv, mask, agg=AggSpec("token-mean", global_tokens=n_tok), params=params)
    assert_matches(loss, grad, *dppo_loop(kind, logp, old, adv, mask, 0.05, 0.08, 1.5, n_tok))
    assert 0 < m["pg_clipfrac"] < 1, m  # the region cuts some tokens and keeps others


# --------------------------------------------------------------------------------------------------
# bypass mode (rollout log-probs stand in for the old policy)
# --------------------------------------------------------------------------------------------------


def bypass_params(loss_type, *, is_level=None, upper=2.0, rejection=(), batch_normalize=False):
    rc = RolloutCorrectionParams(is_level=is_level, is_lower=1 / upper, is_upper=upper, rejection=tuple(rejection),
                                 bypass=True, loss_type=loss_type, is_batch_normalize=batch_normalize)
    return PolicyLossParams(clip_ratio_low=0.2, clip_ratio_high=0.2, rollout_correction=rc)


def test_bypass_ppo_clip_by_hand_rejection_drops_tokens_but_not_the_normaliser():
    # old_logp holds the ROLLOUT log-probs. r = logp - rollout = [0.1, 0, 2.0]; token_k1 with threshold 2
    #   keeps k1 = -r inside [log 0.5, log 2] = [-0.693, 0.693]: token 2 (k1 = -2) is rejected.
    # PPO clip 0.2 on the kept tokens, A = 1: r = [1.105171, 1] (inside) -> [-1.105171, -1]
    #   token-mean over the mini-batch's 3 tokens (counted before rejection, as verl):
    #   loss = -2.105171 / 3; gradient [-1.105171 / 3, -1 / 3, 0]
    logp = t([[-1.0, -1.0, -1.0]])
    rollout = t([[-1.1, -1.0, -3.0]])
    adv = t([[1.0, 1.0, 1.0]])
    mask = t([[1, 1, 1]])
    p = bypass_params("ppo_clip", rejection=[RejectionCriterion("token_k1", 0.5, 2.0)])
    loss, grad, m = call("bypass_mode", logp, rollout, adv, mask, agg=AggSpec("token-mean", global_tokens=3.0), params=p)
    r0 = math.exp(0.1)
    assert loss == pytest.approx(-(r0 + 1) / 3)
    torch.testing.assert_close(grad, t([[-r0 / 3, -1 / 3, 0.0]]))
    # the loss's metrics are over all 3 tokens of the call, the rejected one included (the actor weights
    # them by that count): ppo_kl = mean(rollout - logp) = -(0.1 + 0 + 2) / 3; token 2 (r = e^2) is clipped
    assert m["ppo_kl"] == pytest.approx(-0.7) and m["pg_clipfrac"] == pytest.approx(1 / 3)
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1 / 3)
    assert m["rollout_corr/rollout_rs_token_k1_masked_fraction"] == pytest.approx(1 / 3)
    # the mismatch between the policy being trained and the rollout, over all 3 tokens:
    #   kl = mean(rollout - logp) = -0.7; k3 = mean(e^r - r - 1) = (0.0051709 + 0 + 4.3890561) / 3
    #   chi2_token = mean(e^{2r}) - 1 = (e^0.2 + 1 + e^4) / 3 - 1
    assert m["rollout_corr/kl"] == pytest.approx(-0.7, rel=1e-6)
    assert m["rollout_corr/k3_kl"] == pytest.approx((math.exp(0.1) - 1.1 + math.exp(2) - 3) / 3, rel=1e-6)
    assert m["rollout_corr/chi2_token"] == pytest.approx((math.exp(0.2) + 1 + math.exp(4)) / 3 - 1, rel=1e-6)


def test_bypass_reinforce_by_hand():
    # token TIS at 1.5: w = min(e^r, 1.5) = [1.105171, 1, 1.5] (constants); A = 1; logp = -1
    #   per token -w * A * logp = w -> token-mean (1.105171 + 1 + 1.5) / 3 = 1.201724
    #   gradient -w * A / 3 = [-0.368390, -1/3, -0.5]
    # metrics: ppo_kl = mean(rollout - logp) = -0.7; rollout_is_mean = mean(e^r) (before truncation)
    #   = (1.105171 + 1 + 7.389056) / 3; fraction above 1.5: 1/3; below 1/1.5: 0
    logp = t([[-1.0, -1.0, -1.0]])
    rollout = t([[-1.1, -1.0, -3.0]])
    adv = t([[1.0, 1.0, 1.0]])
    mask = t([[1, 1, 1]])
    loss, grad, m = call("bypass_mode", logp, rollout, adv, mask, params=bypass_params("reinforce", is_level="token", upper=1.5))
    w = [math.exp(0.1), 1.0, 1.5]
    assert loss == pytest.approx(sum(w) / 3, rel=1e-6)
    torch.testing.assert_close(grad, t([[-x / 3 for x in w]]), rtol=1e-6, atol=1e-7)
    assert m["ppo_kl"] == pytest.approx(-0.7)
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx((math.exp(0.1) + 1 + math.exp(2)) / 3, rel=1e-6)
    assert m["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(1 / 3)
    assert m["rollout_corr/rollout_is_ratio_fraction_low"] == 0.0
    # without importance weights, reinforce is -A * logp
    loss, grad, _ = call("bypass_mode", logp, rollout, adv, mask, params=bypass_params("reinforce"))
    assert loss == pytest.approx(1.0)
    torch.testing.assert_close(grad, t([[-1 / 3] * 3]))


def bypass_loop(logp, rollout, adv, mask, *, loss_type, level, upper, k1_band, n_tok, clip_c=3.0):
    """The definition: r = logp - rollout per token; a row is rejected where seq_mean_k1 (the mean of
    -r over its tokens) leaves log(k1_band); token-level TIS weights min(e^r, upper) or the sequence's
    min(e^{sum r}, upper); then the PPO clip against the rollout policy (no weights) or -w * A * logp,
    over the kept tokens, divided by the token count before rejection."""
    L, R, A, M = logp.tolist(), rollout.tolist(), adv.tolist(), mask.tolist()
    loss, grad = 0.0, [[0.0] * len(L[0]) for _ in L]
    for i in range(len(L)):
        toks = tokens_of(M[i])
        if not toks:
            continue
        rs = {j: L[i][j] - R[i][j] for j in toks}
        mean_k1 = sum(-rs[j] for j in toks) / len(toks)
        if not math.log(k1_band[0]) <= mean_k1 <= math.log(k1_band[1]):
            continue  # the whole row is rejected
        seq_w = min(math.exp(clip(sum(rs.values()), -20, 20)), upper)
        for j in toks:
            a = A[i][j]
            if loss_type == "reinforce":
                w = min(math.exp(clip(rs[j], -20, 20)), upper) if level == "token" else seq_w
                loss += -w * a * L[i][j] / n_tok
                grad[i][j] = -w * a / n_tok
            else:
                value, slope = ppo_token(a, rs[j], 0.2, 0.2, clip_c)
                loss += value / n_tok
                grad[i][j] = slope / n_tok
    return loss, grad


@pytest.mark.parametrize("loss_type,level", [("ppo_clip", "token"), ("reinforce", "token"), ("reinforce", "sequence")])
def test_bypass_matches_a_plain_loop(loss_type, level):
    logp, rollout, adv, mask = random_inputs(5, B=10, T=6, spread=0.3, token_adv=True)
    n_tok, _ = counts(mask)
    band = (0.9, 1.1)
    p = bypass_params(loss_type, is_level=level, upper=1.3, rejection=[RejectionCriterion("seq_mean_k1", *band)])
    loss, grad, m = call("bypass_mode", logp, rollout, adv, mask, agg=AggSpec("token-mean", global_tokens=n_tok), params=p)
    want_loss, want_grad = bypass_loop(logp, rollout, adv, mask, loss_type=loss_type, level=level, upper=1.3,
                                       k1_band=band, n_tok=n_tok)
    assert 0 < m["rollout_corr/rollout_rs_masked_fraction"] < 1, "some rows should be rejected, not all"
    # the correction runs in float32 (weights and masks), the loss in the inputs' float64
    assert_matches(loss, grad, want_loss, want_grad, tol=1e-6)


def test_bypass_needs_its_settings():
    x = torch.zeros(1, 2, dtype=F64)
    with pytest.raises(ValueError, match="bypass_mode=true"):
        call("bypass_mode", x, x, x, x + 1)


# --------------------------------------------------------------------------------------------------
# k1+ / k3+ (straight-through KL): the value of k1 / k3, the gradient of k2
# --------------------------------------------------------------------------------------------------


def test_straight_through_kl_by_hand():
    # d = logp - ref = [0.5, -1.0]
    #   k1+ value d = [0.5, -1.0];  k3+ value e^{-d} + d - 1 = [e^-0.5 - 0.5, e^1 - 2] = [0.106531, 0.718282]
    #   gradient of k2 = d^2 / 2 with respect to logp: d = [0.5, -1.0]; with respect to ref: -d
    logp = t([[-1.0, -2.0]]).requires_grad_(True)
    ref = t([[-1.5, -1.0]]).requires_grad_(True)
    for kind, value in (("k1+", [0.5, -1.0]), ("k3+", [math.exp(-0.5) - 0.5, math.e - 2])):
        kl = kl_penalty(logp, ref, kind)
        torch.testing.assert_close(kl.detach(), t([value]))
        g_logp, g_ref = torch.autograd.grad(kl.sum(), (logp, ref))
        torch.testing.assert_close(g_logp, t([[0.5, -1.0]]))
        torch.testing.assert_close(g_ref, t([[-0.5, 1.0]]))
    # the names without '+' keep their own gradients: k1's is 1, k3's is 1 - e^{-d}
    g_k1, = torch.autograd.grad(kl_penalty(logp, ref, "k1").sum(), logp)
    torch.testing.assert_close(g_k1, t([[1.0, 1.0]]))
    g_k3, = torch.autograd.grad(kl_penalty(logp, ref, "k3").sum(), logp)
    torch.testing.assert_close(g_k3, t([[1 - math.exp(-0.5), 1 - math.e]]))


@pytest.mark.parametrize("kind", ["k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl", "k1+", "kl+", "k3+", "low_var_kl+"])
def test_every_per_token_kl_kind_matches_a_plain_loop(kind):
    """Values and gradients with respect to logp, token by token from the definitions (d = logp - ref):
    k1 d (grad 1); abs |d| (grad sign d); k2 d^2/2 (grad d); k3 e^{-d} + d - 1 with x = -d clamped to
    [-20, 20] and the value to [-10, 10] (grad 1 - e^{-d} inside the clamps, else 0); the '+' kinds the
    value of k1 / k3 and the gradient of k2."""
    g = torch.Generator().manual_seed(7)
    logp = (-2 + torch.randn(4, 5, generator=g, dtype=F64)).requires_grad_(True)
    ref = logp.detach() + 0.7 * torch.randn(4, 5, generator=g, dtype=F64)
    ref[0, 0] = logp[0, 0].item() + 30.0  # beyond k3's clamps
    ref[0, 1] = logp[0, 1].item() - 30.0
    kl = kl_penalty(logp, ref, kind)
    weights = torch.arange(1, 21, dtype=F64).view(4, 5)  # a different weight per token
    (grad,) = torch.autograd.grad((kl * weights).sum(), logp)
    base = {"kl": "k1", "k1": "k1", "abs": "abs", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3",
            "k1+": "k1", "kl+": "k1", "k3+": "k3", "low_var_kl+": "k3"}[kind]
    for i in range(4):
        for j in range(5):
            d = logp[i, j].item() - ref[i, j].item()
            x = clip(-d, -20.0, 20.0)
            k3_raw = math.exp(x) - x - 1
            value = {"k1": d, "abs": abs(d), "k2": 0.5 * d * d, "k3": clip(k3_raw, -10.0, 10.0)}[base]
            if kind.endswith("+"):
                slope = d
            else:
                k3_slope = (1 - math.exp(-d)) if (-20 < -d < 20 and -10 < k3_raw < 10) else 0.0
                slope = {"k1": 1.0, "abs": math.copysign(1.0, d), "k2": d, "k3": k3_slope}[base]
            assert kl[i, j].item() == pytest.approx(value, rel=1e-12, abs=1e-12), (i, j)
            assert grad[i, j].item() == pytest.approx(slope * weights[i, j].item(), rel=1e-12, abs=1e-12), (i, j)
