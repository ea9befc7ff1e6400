"""Rollout correction (grpo_dist.core.rollout_correction): importance weights (TIS, IcePop band,
sequence level, batch normalisation), every rejection option, the weight and mismatch metrics, and
the whole-batch ``correct`` — against numbers worked out by hand and against plain loops written from
the definitions (one row, one token at a time, python floats)."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from grpo_dist.core.rollout_correction import (
    RS_OPTIONS,
    RejectionCriterion,
    RolloutCorrectionParams,
    correct,
    importance_weights,
    mismatch_metrics,
    parse_is_threshold,
    parse_rejection_criteria,
    rejection_mask,
)


def floats(metrics: dict) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()}


def tokens_of(mask_row) -> list[int]:
    return [j for j, m in enumerate(mask_row) if m != 0]


def random_log_ratios(seed: int, B: int = 9, T: int = 7, spread: float = 0.4):
    """log(pi_old / pi_rollout) per token and a mask with rows of different lengths, one empty."""
    g = torch.Generator().manual_seed(seed)
    r = spread * torch.randn(B, T, generator=g)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[3] = 0
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    r = torch.where(mask != 0, r, torch.full_like(r, 50.0))  # garbage in the padding must not matter
    return r, mask


# --------------------------------------------------------------------------------------------------
# importance weights
# --------------------------------------------------------------------------------------------------

R_HAND = torch.log(torch.tensor([[0.5, 1.0, 4.0], [2.0, 1.0, 1.0]]))
M_HAND = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_token_tis_weights_and_metrics_by_hand():
    # rho = e^r on the 5 response tokens: [0.5, 1, 4 | 2, 1]; truncation at u = 2 (lower 1/u = 0.5)
    #   w = min(rho, 2) = [0.5, 1, 2 | 2, 1]
    # metrics from rho before truncation:
    #   mean 8.5 / 5 = 1.7, min 0.5, max 4
    #   std of rho clamped to [0.5, 2] = [0.5, 1, 2, 2, 1]: mean 1.3, mean square 10.25 / 5 = 2.05,
    #     var 2.05 - 1.69 = 0.36 -> 0.6
    #   effective sample size 1 / mean((w~ / mean w~)^2) = 1.3^2 / 2.05 = 0.8243902
    #   fraction above 2: 1/5 (the 4); below 0.5: 0 (0.5 is not below); masked (band only): 0
    #   per-row means of rho: row 0 5.5 / 3 = 1.833333, row 1 3 / 2 = 1.5 -> mean 1.666667,
    #     std (unbiased, 2 rows) 0.333333 / sqrt 2 = 0.2357023, min 1.5, max 1.833333,
    #     max deviation from 1: 0.833333
    w, m = importance_weights(R_HAND, M_HAND, level="token", lower=0.5, upper=2.0, band=False)
    torch.testing.assert_close(w, torch.tensor([[0.5, 1.0, 2.0], [2.0, 1.0, 0.0]]))
    assert floats(m) == pytest.approx({
        "rollout_is_mean": 1.7, "rollout_is_std": 0.6, "rollout_is_min": 0.5, "rollout_is_max": 4.0,
        "rollout_is_eff_sample_size": 1.69 / 2.05,
        "rollout_is_ratio_fraction_high": 0.2, "rollout_is_ratio_fraction_low": 0.0, "rollout_is_masked_fraction": 0.0,
        "rollout_is_seq_mean": (5.5 / 3 + 1.5) / 2, "rollout_is_seq_std": (5.5 / 3 - 1.5) / math.sqrt(2),
        "rollout_is_seq_min": 1.5, "rollout_is_seq_max": 5.5 / 3, "rollout_is_seq_max_deviation": 5.5 / 3 - 1,
    }, rel=1e-6)


def test_icepop_band_masks_instead_of_truncating():
    # band [0.75, 3]: rho [0.5, 1, 4 | 2, 1] -> 0.5 (below) and 4 (above) get weight 0, the rest keep rho
    #   masked fraction 2/5; fraction above 3: 1/5; below 0.75: 1/5
    w, m = importance_weights(R_HAND, M_HAND, level="token", lower=0.75, upper=3.0, band=True)
    torch.testing.assert_close(w, torch.tensor([[0.0, 1.0, 0.0], [2.0, 1.0, 0.0]]))
    assert m["rollout_is_masked_fraction"].item() == pytest.approx(0.4)
    assert m["rollout_is_ratio_fraction_high"].item() == pytest.approx(0.2)
    assert m["rollout_is_ratio_fraction_low"].item() == pytest.approx(0.2)


def test_sequence_level_weights_and_batch_normalisation_by_hand():
    # sequence ratio = product over the row's tokens: row 0 0.5 * 1 * 4 = 2, row 1 4 * 1 = 4
    #   truncated at 3: [2 on 3 tokens | 3 on 2 tokens]
    r = torch.log(torch.tensor([[0.5, 1.0, 4.0], [4.0, 1.0, 9.0]]))
    w, m = importance_weights(r, M_HAND, level="sequence", lower=1 / 3, upper=3.0, band=False)
    torch.testing.assert_close(w, torch.tensor([[2.0, 2.0, 2.0], [3.0, 3.0, 0.0]]))
    # token-weighted metrics (each token carries its row's ratio): mean (3*2 + 2*4) / 5 = 2.8;
    #   fraction above 3: the 2 tokens of row 1 -> 0.4
    assert m["rollout_is_mean"].item() == pytest.approx(2.8)
    assert m["rollout_is_ratio_fraction_high"].item() == pytest.approx(0.4)
    assert m["rollout_is_max"].item() == pytest.approx(4.0) and m["rollout_is_min"].item() == pytest.approx(2.0)
    # batch normalisation at the sequence level divides by the mean over SEQUENCES: (2 + 3) / 2 = 2.5
    w, m = importance_weights(r, M_HAND, level="sequence", lower=1 / 3, upper=3.0, band=False, batch_normalize=True)
    torch.testing.assert_close(w, torch.tensor([[0.8, 0.8, 0.8], [1.2, 1.2, 0.0]]))
    assert m["rollout_is_batch_norm_factor"].item() == pytest.approx(2.5)
    # at the token level by the mean over TOKENS: (0.5 + 1 + 2 + 2 + 1) / 5 = 1.3
    w, m = importance_weights(R_HAND, M_HAND, level="token", lower=0.5, upper=2.0, band=False, batch_normalize=True)
    torch.testing.assert_close(w, torch.tensor([[0.5, 1.0, 2.0], [2.0, 1.0, 0.0]]) / 1.3)
    assert m["rollout_is_batch_norm_factor"].item() == pytest.approx(1.3)
    # the metrics describe the ratios, not the normalised weights
    assert m["rollout_is_mean"].item() == pytest.approx(1.7)


def weights_loop(r, mask, level, lower, upper, band, normalize):
    """Weights and metrics from the definitions, row by row."""
    R, M = r.tolist(), mask.tolist()
    rows = [(i, tokens_of(M[i])) for i in range(len(R)) if tokens_of(M[i])]
    rho = {}
    for i, toks in rows:
        seq = math.exp(max(min(sum(R[i][j] for j in toks), 20.0), -20.0))
        for j in toks:
            rho[i, j] = math.exp(max(min(R[i][j], 20.0), -20.0)) if level == "token" else seq
    w = {k: (v if lower <= v <= upper else 0.0) if band else min(v, upper) for k, v in rho.items()}
    if normalize:
        if level == "token":
            mean_w = sum(w.values()) / len(w)
        else:
            mean_w = statistics.fmean(w[i, toks[0]] for i, toks in rows)
        w = {k: v / mean_w for k, v in w.items()}
    vals = list(rho.values())
    clamped = [min(max(v, lower), upper) for v in vals]
    mc = statistics.fmean(clamped)
    seq_means = [statistics.fmean(rho[i, j] for j in toks) for i, toks in rows]
    metrics = {
        "rollout_is_mean": statistics.fmean(vals),
        "rollout_is_std": math.sqrt(max(statistics.fmean(c * c for c in clamped) - mc * mc, 0.0)),
        "rollout_is_min": min(vals), "rollout_is_max": max(vals),
        "rollout_is_eff_sample_size": 1.0 / statistics.fmean((c / mc) ** 2 for c in clamped),
        "rollout_is_ratio_fraction_high": sum(v > upper for v in vals) / len(vals),
        "rollout_is_ratio_fraction_low": sum(v < lower for v in vals) / len(vals),
        "rollout_is_masked_fraction": sum(not lower <= v <= upper for v in vals) / len(vals) if band else 0.0,
        "rollout_is_seq_mean": statistics.fmean(seq_means), "rollout_is_seq_std": statistics.stdev(seq_means),
        "rollout_is_seq_min": min(seq_means), "rollout_is_seq_max": max(seq_means),
        "rollout_is_seq_max_deviation": max(abs(s - 1) for s in seq_means),
    }
    W = [[w.get((i, j), 0.0) for j in range(len(R[0]))] for i in range(len(R))]
    return W, metrics


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("band", [False, True])
@pytest.mark.parametrize("normalize", [False, True])
def test_importance_weights_match_a_plain_loop(level, band, normalize):
    r, mask = random_log_ratios(1, spread=0.4 if level == "token" else 0.15)
    lower, upper = (0.7, 1.5) if band else (1 / 1.4, 1.4)
    w, m = importance_weights(r, mask, level=level, lower=lower, upper=upper, band=band, batch_normalize=normalize)
    want_w, want_m = weights_loop(r, mask, level, lower, upper, band, normalize)
    torch.testing.assert_close(w, torch.tensor(want_w), rtol=1e-5, atol=1e-6)
    got = floats(m)
    factor = got.pop("rollout_is_batch_norm_factor", None)
    assert (factor is not None) == normalize
    assert got == pytest.approx(want_m, rel=1e-5, abs=1e-6)
    assert want_m["rollout_is_ratio_fraction_high"] > 0 and want_m["rollout_is_ratio_fraction_low"] > 0


def test_weights_are_constants_and_zero_outside_the_mask():
    r, mask = random_log_ratios(2)
    r.requires_grad_(True)
    w, _ = importance_weights(r, mask, level="token", lower=0.5, upper=2.0, band=False)
    assert not w.requires_grad
    assert torch.all(w[mask == 0] == 0) and torch.all(w[mask != 0] > 0)


# --------------------------------------------------------------------------------------------------
# rejection sampling
# --------------------------------------------------------------------------------------------------

# r = log(pi_old / pi_rollout):  row 0 [0.1, -0.1, 1.0], row 1 [0.0, 0.5, (padding)]
#   k1 = -r:                 row 0 [-0.1, 0.1, -1.0]            row 1 [0, -0.5]
#   k2 = r^2 / 2:            row 0 [0.005, 0.005, 0.5]          row 1 [0, 0.125]
#   k3 = e^r - 1 - r:        row 0 [0.0051709, 0.0048374, 0.7182818]   row 1 [0, 0.1487213]
#   row sums:  k1 -1.0 | -0.5;   k2 0.51 | 0.125;   k3 0.7282901 | 0.1487213
#   row means: k1 -0.333333 | -0.25;  k2 0.17 | 0.0625;  k3 0.2427634 | 0.0743607
#   row maxes: k2 0.5 | 0.125;   k3 0.7182818 | 0.1487213
RS_R = torch.tensor([[0.1, -0.1, 1.0], [0.0, 0.5, 7.0]])
RS_M = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
RS_HAND = {
    # option, threshold -> the kept mask (a k1 threshold bounds the ratio pi_rollout / pi_old: k1 in log band)
    ("token_k1", "0.5_1.5"): [[1, 1, 0], [1, 1, 0]],  # log band [-0.693, 0.405]: -1.0 leaves it
    ("token_k2", "0.1"): [[1, 1, 0], [1, 0, 0]],  # 0.5 and 0.125 exceed 0.1
    ("token_k3", "0.2"): [[1, 1, 0], [1, 1, 0]],  # only 0.718 exceeds 0.2
    ("seq_sum_k1", "0.5_2"): [[0, 0, 0], [1, 1, 0]],  # band [-0.693, 0.693]: row 0's -1.0 leaves it
    ("seq_sum_k2", "0.1"): [[0, 0, 0], [0, 0, 0]],  # 0.51 and 0.125 both exceed 0.1
    ("seq_sum_k3", "0.5"): [[0, 0, 0], [1, 1, 0]],  # 0.728 > 0.5
    ("seq_mean_k1", "0.75_2"): [[0, 0, 0], [1, 1, 0]],  # log 0.75 = -0.288: -0.333 is below, -0.25 is not
    ("seq_mean_k2", "0.1"): [[0, 0, 0], [1, 1, 0]],  # 0.17 > 0.1, 0.0625 is not
    ("seq_mean_k3", "0.25"): [[1, 1, 1], [1, 1, 0]],  # 0.243 and 0.074 both pass
    ("seq_max_k2", "0.2"): [[0, 0, 0], [1, 1, 0]],  # 0.5 > 0.2
    ("seq_max_k3", "0.1"): [[0, 0, 0], [0, 0, 0]],  # 0.718 and 0.149 both exceed 0.1
    ("seq_max_k3", "1e-9"): [[0, 0, 0], [0, 0, 0]],
}


@pytest.mark.parametrize("option,threshold", list(RS_HAND))
def test_each_rejection_option_by_hand(option, threshold):
    (criterion,) = parse_rejection_criteria(option, threshold)
    kept, m = rejection_mask(RS_R, RS_M, (criterion,))
    torch.testing.assert_close(kept, torch.tensor(RS_HAND[option, threshold], dtype=torch.float32))
    rejected_tokens = 5 - kept.sum().item()
    rejected_rows = sum(1 for i in range(2) if (RS_M[i] - kept[i]).sum() > 0)
    assert m[f"rollout_rs_{option}_masked_fraction"].item() == pytest.approx(rejected_tokens / 5)
    assert m["rollout_rs_masked_fraction"].item() == pytest.approx(rejected_tokens / 5)
    assert m[f"rollout_rs_{option}_seq_masked_fraction"].item() == pytest.approx(rejected_rows / 2)
    assert m["rollout_rs_seq_masked_fraction"].item() == pytest.approx(rejected_rows / 2)


def test_every_rejection_option_has_a_hand_case():
    assert {opt for opt, _ in RS_HAND} == set(RS_OPTIONS)


def test_rejection_statistic_metrics_by_hand():
    # seq_sum_k2: each token carries its row's sum: [0.51 x 3 | 0.125 x 2] -> token mean (1.53 + 0.25) / 5
    (c,) = parse_rejection_criteria("seq_sum_k2", 1.0)
    _, m = rejection_mask(RS_R, RS_M, (c,))
    assert m["rollout_rs_seq_sum_k2_mean"].item() == pytest.approx((3 * 0.51 + 2 * 0.125) / 5)
    assert m["rollout_rs_seq_sum_k2_max"].item() == pytest.approx(0.51)
    assert m["rollout_rs_seq_sum_k2_min"].item() == pytest.approx(0.125)
    # token_k3: over tokens
    (c,) = parse_rejection_criteria("token_k3", 1.0)
    _, m = rejection_mask(RS_R, RS_M, (c,))
    k3 = [math.exp(0.1) - 1.1, math.exp(-0.1) - 0.9, math.e - 2, 0.0, math.exp(0.5) - 1.5]
    assert m["rollout_rs_token_k3_mean"].item() == pytest.approx(sum(k3) / 5, rel=1e-5)
    assert m["rollout_rs_token_k3_max"].item() == pytest.approx(math.e - 2, rel=1e-6)
    assert m["rollout_rs_token_k3_min"].item() == pytest.approx(0.0, abs=1e-7)


def test_several_criteria_must_all_pass():
    # token_k1 (band [0.5, 1.5]) rejects token (0, 2); seq_mean_k2 (0.1) rejects row 0 -> row 0 goes
    # entirely, row 1 stays; token_k2 alone would also have taken (1, 1)
    criteria = parse_rejection_criteria("token_k1,seq_mean_k2", "0.5_1.5,0.1")
    kept, m = rejection_mask(RS_R, RS_M, criteria)
    torch.testing.assert_close(kept, torch.tensor([[0.0, 0, 0], [1, 1, 0]]))
    assert m["rollout_rs_token_k1_masked_fraction"].item() == pytest.approx(1 / 5)
    assert m["rollout_rs_seq_mean_k2_masked_fraction"].item() == pytest.approx(3 / 5)
    assert m["rollout_rs_masked_fraction"].item() == pytest.approx(3 / 5)
    # one shared threshold for several options
    assert [c.upper for c in parse_rejection_criteria("token_k2,seq_max_k3", 0.3)] == [0.3, 0.3]


def rejection_loop(r, mask, option, lower, upper):
    R, M = r.tolist(), mask.tolist()
    kind = option[-2:]
    kept = [[0.0] * len(R[0]) for _ in R]
    stats = []
    for i in range(len(R)):
        toks = tokens_of(M[i])
        if not toks:
            continue
        per_token = {}
        for j in toks:
            x = max(min(R[i][j], 20.0), -20.0)
            per_token[j] = {"k1": -x, "k2": 0.5 * x * x, "k3": math.exp(x) - 1 - x}[kind]
        if option.startswith("token_"):
            stat = per_token
        else:
            vals = list(per_token.values())
            agg = {"seq_sum": sum(vals), "seq_mean": sum(vals) / len(vals), "seq_max": max(vals)}[option.rsplit("_", 1)[0]]
            stat = {j: agg for j in toks}
        for j in toks:
            ok = math.log(lower) <= stat[j] <= math.log(upper) if kind == "k1" else stat[j] <= upper
            kept[i][j] = 1.0 if ok else 0.0
            stats.append(stat[j])
    return kept, stats


@pytest.mark.parametrize("option", RS_OPTIONS)
def test_each_rejection_option_matches_a_plain_loop(option):
    r, mask = random_log_ratios(3, B=12, spread=0.3)
    kind = option[-2:]
    lower, upper = {
        "k1": (0.85, 1.2) if option.startswith("token") or option.startswith("seq_mean") else (0.6, 1.8),
        "k2": (None, 0.02 if option.startswith("token") or option.startswith("seq_mean") else 0.12),
        "k3": (None, 0.02 if option.startswith("token") or option.startswith("seq_mean") else 0.12),
    }[kind]
    if option.startswith("seq_max"):
        upper = 0.08
    kept, m = rejection_mask(r, mask, (RejectionCriterion(option, lower, upper),))
    want, stats = rejection_loop(r, mask, option, lower, upper)
    torch.testing.assert_close(kept, torch.tensor(want))
    n = mask.sum().item()
    rejected = n - kept.sum().item()
    assert 0 < rejected < n, "the threshold should reject some tokens, not all"
    assert m[f"rollout_rs_{option}_masked_fraction"].item() == pytest.approx(rejected / n)
    assert m[f"rollout_rs_{option}_mean"].item() == pytest.approx(statistics.fmean(stats), rel=1e-5, abs=1e-7)
    assert m[f"rollout_rs_{option}_max"].item() == pytest.approx(max(stats), rel=1e-5, abs=1e-7)
    assert m[f"rollout_rs_{option}_min"].item() == pytest.approx(min(stats), rel=1e-5, abs=1e-7)
    rows = [i for i in range(len(want)) if mask[i].sum() > 0]
    bad_rows = sum(1 for i in rows if sum(want[i]) < mask[i].sum().item())
    assert m["rollout_rs_seq_masked_fraction"].item() == pytest.approx(bad_rows / len(rows))


def test_rejection_threshold_parsing_errors_name_the_key():
    with pytest.raises(ValueError, match="unknown option 'seq_max_k1'"):
        parse_rejection_criteria("seq_max_k1", 2.0)
    with pytest.raises(ValueError, match="needs a threshold"):
        parse_rejection_criteria("token_k2", None)
    with pytest.raises(ValueError, match="2 thresholds for 3 options"):
        parse_rejection_criteria("token_k1,token_k2,token_k3", "2,0.1")
    with pytest.raises(ValueError, match="takes one upper bound"):
        parse_rejection_criteria("token_k2", "0.1_0.2")
    with pytest.raises(ValueError, match="must be > 1"):
        parse_rejection_criteria("token_k1", 0.5)
    assert parse_rejection_criteria("token_k1", 2.0) == (RejectionCriterion("token_k1", 0.5, 2.0),)


def test_is_threshold_parsing():
    assert parse_is_threshold(2.0) == (0.5, 2.0, False)
    assert parse_is_threshold("0.5_3") == (0.5, 3.0, True)
    assert parse_is_threshold("4") == (0.25, 4.0, False)
    for bad in (1.0, 0.5, None, True, "3_1", "x"):
        with pytest.raises(ValueError, match="rollout_is_threshold"):
            parse_is_threshold(bad)


# --------------------------------------------------------------------------------------------------
# mismatch metrics
# --------------------------------------------------------------------------------------------------


def test_mismatch_metrics_by_hand():
    # old (trainer) vs rollout log-probs on 3 tokens; r = old - rollout = [0.2, -0.5 | 0]
    #   kl = mean(rollout - old) = (-0.2 + 0.5 + 0) / 3 = 0.1
    #   k3_kl = mean(e^r - r - 1) = (0.0214028 + 0.1065307 + 0) / 3
    #   per-row mean log-probs: old [-1.5, -0.5], rollout [-1.35, -0.5]
    #   training_log_ppl = mean(1.5, 0.5) = 1;  training_ppl = mean(e^1.5, e^0.5)
    #   rollout_log_ppl = mean(1.35, 0.5) = 0.925;  rollout_ppl = mean(e^1.35, e^0.5)
    #   log_ppl_diff per row = rollout - old = [0.15, 0] -> mean 0.075, abs 0.075, max 0.15, min 0
    #   ppl_ratio = mean(e^0.15, 1);  chi2_token = mean(e^{2r}) - 1 = (e^0.4 + e^-1 + 1) / 3 - 1
    #   chi2_seq = mean over rows of e^{2 sum r} - 1 = (e^-0.6 + 1) / 2 - 1
    # a third row without response tokens is left out of everything
    old = torch.tensor([[-1.0, -2.0], [-0.5, 3.0], [5.0, 5.0]])
    rollout = torch.tensor([[-1.2, -1.5], [-0.5, -9.0], [0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
    want = {
        "kl": 0.1, "k3_kl": (math.exp(0.2) - 1.2 + math.exp(-0.5) - 0.5) / 3,
        "training_ppl": (math.exp(1.5) + math.exp(0.5)) / 2, "training_log_ppl": 1.0,
        "rollout_ppl": (math.exp(1.35) + math.exp(0.5)) / 2, "rollout_log_ppl": 0.925,
        "log_ppl_diff": 0.075, "log_ppl_abs_diff": 0.075, "log_ppl_diff_max": 0.15, "log_ppl_diff_min": 0.0,
        "ppl_ratio": (math.exp(0.15) + 1) / 2, "chi2_token": (math.exp(0.4) + math.exp(-1) + 1) / 3 - 1,
        "chi2_seq": (math.exp(-0.6) + 1) / 2 - 1,
    }
    assert floats(mismatch_metrics(old, rollout, mask)) == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert mismatch_metrics(old, rollout, torch.zeros_like(mask)) == {}


def mismatch_loop(old, rollout, mask):
    O, R, M = old.tolist(), rollout.tolist(), mask.tolist()
    toks = [(i, j) for i in range(len(O)) for j in tokens_of(M[i])]
    rows = [i for i in range(len(O)) if tokens_of(M[i])]
    lp_old = {i: statistics.fmean(O[i][j] for j in tokens_of(M[i])) for i in rows}
    lp_roll = {i: statistics.fmean(R[i][j] for j in tokens_of(M[i])) for i in rows}
    diff = [lp_roll[i] - lp_old[i] for i in rows]
    r = {(i, j): O[i][j] - R[i][j] for i, j in toks}
    return {
        "kl": statistics.fmean(-r[k] for k in toks),
        "k3_kl": statistics.fmean(math.exp(r[k]) - r[k] - 1 for k in toks),
        "training_ppl": statistics.fmean(math.exp(-lp_old[i]) for i in rows),
        "training_log_ppl": statistics.fmean(-lp_old[i] for i in rows),
        "rollout_ppl": statistics.fmean(math.exp(-lp_roll[i]) for i in rows),
        "rollout_log_ppl": statistics.fmean(-lp_roll[i] for i in rows),
        "log_ppl_diff": statistics.fmean(diff), "log_ppl_abs_diff": statistics.fmean(abs(x) for x in diff),
        "log_ppl_diff_max": max(diff), "log_ppl_diff_min": min(diff),
        "ppl_ratio": statistics.fmean(math.exp(x) for x in diff),
        "chi2_token": statistics.fmean(math.exp(2 * r[k]) for k in toks) - 1,
        "chi2_seq": statistics.fmean(math.exp(2 * sum(r[i, j] for j in tokens_of(M[i]))) for i in rows) - 1,
    }


def test_mismatch_metrics_match_a_plain_loop():
    r, mask = random_log_ratios(4, spread=0.2)
    g = torch.Generator().manual_seed(5)
    rollout = -1.0 - torch.rand(r.shape, generator=g)
    old = rollout + torch.where(mask != 0, r, torch.zeros_like(r))
    assert floats(mismatch_metrics(old, rollout, mask)) == pytest.approx(mismatch_loop(old, rollout, mask), rel=1e-5, abs=1e-6)


# --------------------------------------------------------------------------------------------------
# the whole correction of a batch
# --------------------------------------------------------------------------------------------------


def test_correct_weights_rejection_and_metric_names():
    rollout = torch.full((2, 3), -1.0)
    old = rollout + torch.log(torch.tensor([[0.5, 1.0, 4.0], [2.0, 1.0, 1.0]]))
    params = RolloutCorrectionParams.from_config(
        rollout_is="token", rollout_is_threshold=2.0, rollout_rs="token_k1", rollout_rs_threshold="0.3_3",
        bypass_mode=False, loss_type="ppo_clip", rollout_is_batch_normalize=False)
    w, kept, m = correct(old, rollout, M_HAND, params)
    # token_k1 keeps pi_rollout / pi_old in [0.3, 3]: the 4 (ratio 0.25) is rejected; its weight is zeroed
    torch.testing.assert_close(kept, torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]]))
    torch.testing.assert_close(w, torch.tensor([[0.5, 1.0, 0.0], [2.0, 1.0, 0.0]]))
    assert all(k.startswith("rollout_corr/") for k in m) and all(isinstance(v, float) for v in m.values())
    # the weights' metrics are over the mask BEFORE rejection (as verl): 5 tokens, mean 1.7
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx(1.7)
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(0.2)
    assert m["rollout_corr/kl"] == pytest.approx(-math.log(0.5 * 4 * 2) / 5, rel=1e-6)
    # an empty mask: zero weights, no metrics
    w, kept, m = correct(old, rollout, torch.zeros(2, 3), params)
    assert m == {} and torch.all(w == 0) and torch.all(kept == 0)
