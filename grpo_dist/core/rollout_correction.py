"""Rollout correction: importance weights and rejection masks for the gap between the rollout
engine's sampling distribution and the trainer's (verl's ``algorithm.rollout_correction``).

The rollout engine samples from ``pi_rollout`` (its own kernels and dtype, perhaps older weights);
the update treats the samples as if drawn from ``pi_old``, the trainer's distribution at the start
of the step. Per response token, with ``r = old_logp - rollout_logp = log(pi_old / pi_rollout)``:

Importance sampling (``rollout_is``, ``rollout_is_threshold``)::

    token:     rho_t = exp(clamp(r_t, -20, 20))
    sequence:  rho_t = exp(clamp(sum_t' r_t' * mask_t', -20, 20))   (the same for every token of a row)

    threshold u (a number, truncated IS "TIS"):      w = min(rho, u)
    threshold "lo_hi" (a band, IcePop masking):      w = rho  if lo <= rho <= hi  else 0
    rollout_is_batch_normalize:                      w = w / mean(w)
        (token level: the mean over response tokens; sequence level: over sequences)

The weights multiply the per-token policy loss as constants (no gradient flows through them).

Rejection sampling (``rollout_rs``, ``rollout_rs_threshold``): one or more comma-separated criteria,
all of which must pass; rejected tokens leave the response mask. Each criterion reads a per-token
divergence, an estimator of ``KL(pi_rollout || pi_old)``::

    k1 = -r        k2 = r^2 / 2        k3 = exp(r) - 1 - r          (r clamped to [-20, 20])

    token_k1                  keep a token if log(lo) <= k1 <= log(hi)
    token_k2, token_k3        keep a token if k <= hi
    seq_sum_k{1,2,3}          the row's statistic is the sum of its tokens' values
    seq_mean_k{1,2,3}         ... their mean
    seq_max_k{2,3}            ... their max
                              (a whole row is kept or rejected; k1 rows by the band, others by hi)

A k1 threshold is ``"lo_hi"`` or one number ``hi`` (then ``lo = 1/hi``): bounds on the ratio
``pi_rollout / pi_old`` (its geometric mean for ``seq_mean_k1``, its product for ``seq_sum_k1``).
Other criteria take one upper bound. Several criteria take one threshold each, comma-separated, or
one shared threshold.

Metrics carry verl's names under ``rollout_corr/`` (see :func:`correct`). Everything here is pure
torch; masks are float or bool [B, T], 1 on response tokens.
"""


import math

import torch

from grpo_dist.core import rollout_correction_params
from grpo_dist.core.rollout_correction_params import (
    IS_LEVELS,
    LOSS_TYPES,
    RS_OPTIONS,
    SAFETY_BOUND,
    RejectionCriterion,
    RolloutCorrectionParams,
    parse_is_threshold,
    parse_rejection_criteria,
)

__all__ = [
    *rollout_correction_params.__all__,  # the settings, exported from here too
    "importance_weights",
    "rejection_mask",
    "mismatch_metrics",
    "correct",
]

# --------------------------------------------------------------------------------------------------
# math
# --------------------------------------------------------------------------------------------------


def _check(log_ratio_BT: torch.Tensor, mask_BT: torch.Tensor) -> None:
    if log_ratio_BT.dim() != 2 or log_ratio_BT.shape != mask_BT.shape:
        raise ValueError(f"log_ratio_BT and mask_BT must be [B, T] of one shape, got "
                         f"{tuple(log_ratio_BT.shape)} and {tuple(mask_BT.shape)}")


def _mmean(x_BT: torch.Tensor, m_BT: torch.Tensor) -> torch.Tensor:
    """Masked mean; 0 for an empty mask."""
    n = m_BT.sum()
    return torch.where(m_BT != 0, x_BT, torch.zeros_like(x_BT)).mul(m_BT).sum() / n.clamp_min(1.0)


def _mmax(x_BT: torch.Tensor, keep_BT: torch.Tensor) -> torch.Tensor:
    return x_BT.masked_fill(~keep_BT, float("-inf")).max() if keep_BT.any() else x_BT.new_zeros(())


def _mmin(x_BT: torch.Tensor, keep_BT: torch.Tensor) -> torch.Tensor:
    return x_BT.masked_fill(~keep_BT, float("inf")).min() if keep_BT.any() else x_BT.new_zeros(())


def _row_sum(x_BT: torch.Tensor, m_BT: torch.Tensor) -> torch.Tensor:
    return torch.where(m_BT != 0, x_BT, torch.zeros_like(x_BT)).mul(m_BT).sum(-1)


@torch.no_grad()
def importance_weights(
    log_ratio_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    level: str,
    lower: float,
    upper: float,
    band: bool,
    batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Rollout importance weights (formula in the module docstring).

    Args:
        log_ratio_BT: [B, T] ``log(pi_old / pi_rollout)`` per token.
        mask_BT: [B, T] 1 on response tokens.
        level: ``"token"`` or ``"sequence"``.
        lower, upper, band: from :func:`parse_is_threshold`.
        batch_normalize: divide by the mean weight (over tokens, or over sequences).

    Returns ``(w_BT, metrics)``: ``w_BT`` [B, T] float, detached, 0 outside the mask; metrics
    (0-dim tensors, over the response tokens of the call, from the ratios ``rho`` BEFORE truncation
    or masking): ``rollout_is_mean``, ``_std`` (of ``rho`` clamped to ``[lower, upper]``), ``_min``,
    ``_max``, ``rollout_is_eff_sample_size`` (``1 / mean((w~/mean w~)^2)`` with ``w~ = clamp(rho,
    lower, upper)``, in (0, 1]), ``rollout_is_ratio_fraction_high`` / ``_low`` (tokens with ``rho``
    above ``upper`` / below ``lower``), ``rollout_is_masked_fraction`` (tokens whose weight is 0
    after the band; 0 for truncation), the per-sequence means of ``rho``
    (``rollout_is_seq_mean``, ``_std``, ``_min``, ``_max``, ``_max_deviation`` = max |mean - 1|),
    and with batch normalisation ``rollout_is_batch_norm_factor``.

    Deviations from verl: (1) the ``"lo_hi"`` band (IcePop masking) is grpo_dist's: verl's
    ``rollout_is_threshold`` is one truncation bound. (2) At the sequence level every metric is a
    mean over response TOKENS, each carrying its row's ratio (verl counts sequences, empty rows
    included, for ``_ratio_fraction_high/_low``, and takes ``_min``/``_max`` from the unclamped
    log-ratio sums): token means are what the bypass-mode loss can combine over micro-batches.
    (3) Rows without response tokens are left out of the ``rollout_is_seq_*`` metrics (verl averages
    them in as 0). verl's ``rollout_is_seq_fraction_high/_low`` are not reported.
    """
    _check(log_ratio_BT, mask_BT)
    if level not in IS_LEVELS:
        raise ValueError(f"level must be one of {list(IS_LEVELS)}, got {level!r}")
    m_BT = mask_BT.to(torch.float32)
    r_BT = log_ratio_BT.detach().float()
    keep_BT = m_BT != 0
    if level == "token":
        rho_BT = torch.exp(r_BT.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    else:
        rho_B = torch.exp(_row_sum(r_BT, m_BT).clamp(-SAFETY_BOUND, SAFETY_BOUND))
        rho_BT = rho_B.unsqueeze(-1).expand_as(r_BT)
    rho_BT = torch.where(keep_BT, rho_BT, torch.zeros_like(rho_BT))
    if band:
        inside_BT = (rho_BT >= lower) & (rho_BT <= upper)
        w_BT = torch.where(inside_BT, rho_BT, torch.zeros_like(rho_BT))
    else:
        inside_BT = torch.ones_like(keep_BT)
        w_BT = rho_BT.clamp(max=upper)

    f = torch.float32
    clamped_BT = rho_BT.clamp(lower, upper)
    mean_clamped = _mmean(clamped_BT, m_BT)
    var = (_mmean(clamped_BT.square(), m_BT) - mean_clamped.square()).clamp_min(0.0)
    normed_BT = clamped_BT / (mean_clamped + 1e-8)
    second = _mmean(normed_BT.square(), m_BT)
    rows_B = m_BT.sum(-1) > 0
    seq_mean_B = (_row_sum(rho_BT, m_BT) / m_BT.sum(-1).clamp_min(1.0))[rows_B]
    metrics = {
        "rollout_is_mean": _mmean(rho_BT, m_BT),
        "rollout_is_std": var.sqrt(),
        "rollout_is_min": _mmin(rho_BT, keep_BT),
        "rollout_is_max": _mmax(rho_BT, keep_BT),
        "rollout_is_eff_sample_size": torch.where(second > 0, 1.0 / second.clamp_min(1e-12), torch.zeros_like(second)),
        "rollout_is_ratio_fraction_high": _mmean((rho_BT > upper).to(f), m_BT),
        "rollout_is_ratio_fraction_low": _mmean((rho_BT < lower).to(f), m_BT),
        "rollout_is_masked_fraction": _mmean((~inside_BT).to(f), m_BT),
        "rollout_is_seq_mean": seq_mean_B.mean() if seq_mean_B.numel() else r_BT.new_zeros(()),
        "rollout_is_seq_std": seq_mean_B.std() if seq_mean_B.numel() > 1 else r_BT.new_zeros(()),
        "rollout_is_seq_min": seq_mean_B.min() if seq_mean_B.numel() else r_BT.new_zeros(()),
        "rollout_is_seq_max": seq_mean_B.max() if seq_mean_B.numel() else r_BT.new_zeros(()),
        "rollout_is_seq_max_deviation": (seq_mean_B - 1).abs().max() if seq_mean_B.numel() else r_BT.new_zeros(()),
    }
    if batch_normalize:
        if level == "token":
            mean_w = _mmean(w_BT, m_BT)
        else:
            w_B = _row_sum(w_BT, m_BT) / m_BT.sum(-1).clamp_min(1.0)  # each row's (constant) weight
            mean_w = w_B[rows_B].mean() if bool(rows_B.any()) else w_BT.new_zeros(())
        factor = mean_w if float(mean_w) > 1e-8 else w_BT.new_ones(())
        w_BT = w_BT / factor
        metrics["rollout_is_batch_norm_factor"] = factor
    return w_BT * m_BT, metrics


def _divergences(log_ratio_BT: torch.Tensor) -> dict[str, torch.Tensor]:
    r_BT = log_ratio_BT.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {"k1": -r_BT, "k2": 0.5 * r_BT.square(), "k3": torch.exp(r_BT) - 1.0 - r_BT}


@torch.no_grad()
def rejection_mask(
    log_ratio_BT: torch.Tensor, mask_BT: torch.Tensor, criteria: tuple[RejectionCriterion, ...]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The response mask with the tokens (or rows) that fail any criterion removed.

    Returns ``(mask_BT, metrics)``: the new mask in ``mask_BT``'s dtype; per criterion ``opt``
    (0-dim tensors): ``rollout_rs_{opt}_mean`` (mean of the statistic over response tokens; for
    sequence criteria each token carries its row's statistic), ``_max``, ``_min``,
    ``rollout_rs_{opt}_masked_fraction`` (response tokens it rejects),
    ``rollout_rs_{opt}_seq_masked_fraction`` (rows with a token it rejects); and over all criteria
    ``rollout_rs_masked_fraction`` and ``rollout_rs_seq_masked_fraction``.

    Deviations from verl: the sequence fractions are over rows with response tokens (verl divides
    ``rollout_rs_seq_masked_fraction`` by all rows), and a sequence statistic's mean divides by the
    row's token count (verl adds 1e-8). verl's per-option ``_std``, ``_fraction_high/_low`` and
    ``_seq_*`` metrics are not reported.
    """
    _check(log_ratio_BT, mask_BT)
    m_BT = mask_BT.to(torch.float32)
    resp_BT = m_BT != 0
    rows_B = resp_BT.any(-1)
    n_rows = rows_B.sum().clamp_min(1).to(torch.float32)
    div = _divergences(log_ratio_BT.detach().float())
    keep_all_BT = torch.ones_like(resp_BT)
    metrics: dict[str, torch.Tensor] = {}
    for c in criteria:
        kind = c.option[-2:]
        tok_BT = div[kind]
        if c.option.startswith("token_"):
            stat_BT = tok_BT
        elif c.option.startswith("seq_sum_"):
            stat_BT = _row_sum(tok_BT, m_BT).unsqueeze(-1).expand_as(tok_BT)
        elif c.option.startswith("seq_mean_"):
            stat_BT = (_row_sum(tok_BT, m_BT) / m_BT.sum(-1).clamp_min(1.0)).unsqueeze(-1).expand_as(tok_BT)
        else:
            assert c.option.startswith("seq_max_"), c.option
            row_max_B = tok_BT.masked_fill(~resp_BT, float("-inf")).max(-1).values
            row_max_B = torch.where(rows_B, row_max_B, torch.zeros_like(row_max_B))
            stat_BT = row_max_B.unsqueeze(-1).expand_as(tok_BT)
        if kind == "k1":
            assert c.lower is not None
            keep_BT = (stat_BT >= math.log(c.lower)) & (stat_BT <= math.log(c.upper))
        else:
            keep_BT = stat_BT <= c.upper
        rejected_BT = ~keep_BT & resp_BT
        keep_all_BT &= keep_BT
        p = f"rollout_rs_{c.option}"
        metrics[f"{p}_mean"] = _mmean(stat_BT, m_BT)
        metrics[f"{p}_max"] = _mmax(stat_BT, resp_BT)
        metrics[f"{p}_min"] = _mmin(stat_BT, resp_BT)
        metrics[f"{p}_masked_fraction"] = _mmean(rejected_BT.float(), m_BT)
        metrics[f"{p}_seq_masked_fraction"] = rejected_BT.any(-1).float().sum() / n_rows
    rejected_BT = ~keep_all_BT & resp_BT
    metrics["rollout_rs_masked_fraction"] = _mmean(rejected_BT.float(), m_BT)
    metrics["rollout_rs_seq_masked_fraction"] = rejected_BT.any(-1).float().sum() / n_rows
    new_mask_BT = torch.where(rejected_BT, torch.zeros_like(mask_BT), mask_BT)
    return new_mask_BT, metrics


@torch.no_grad()
def mismatch_metrics(
    old_logp_BT: torch.Tensor, rollout_logp_BT: torch.Tensor, mask_BT: torch.Tensor
) -> dict[str, torch.Tensor]:
    """How far ``pi_old`` (the trainer) is from ``pi_rollout`` on the sampled tokens.

    With ``r = old_logp - rollout_logp`` and per-row means ``lp_old_i``, ``lp_roll_i`` of the
    log-probs over the row's response tokens (rows without tokens are left out)::

        kl               = mean_tokens(rollout_logp - old_logp)       k1 estimate of KL(rollout || old)
        k3_kl            = mean_tokens(exp(r) - r - 1)                k3 estimate of the same
        training_log_ppl = mean_rows(-lp_old_i);   training_ppl = mean_rows(exp(-lp_old_i))
        rollout_log_ppl  = mean_rows(-lp_roll_i);  rollout_ppl  = mean_rows(exp(-lp_roll_i))
        log_ppl_diff     = mean_rows(lp_roll_i - lp_old_i)   (also _abs_diff, _diff_max, _diff_min)
        ppl_ratio        = mean_rows(exp(lp_roll_i - lp_old_i))
        chi2_token       = mean_tokens(exp(2 r)) - 1
        chi2_seq         = mean_rows(exp(2 * sum_t r)) - 1      (r and its sums clamped to [-20, 20])

    Returns 0-dim tensors; ``{}`` when the mask is empty.

    Deviations from verl: rows without response tokens are left out of the per-row means (verl
    counts such a row with perplexity 1, log-ppl 0 and sequence ratio 1), and ``k3_kl`` uses ``r``
    clamped to [-20, 20] as the chi-square terms do (verl's ``k3_kl`` does not clamp).
    """
    _check(old_logp_BT - rollout_logp_BT, mask_BT)
    m_BT = mask_BT.to(torch.float32)
    rows_B = m_BT.sum(-1) > 0
    if not bool(rows_B.any()):
        return {}
    old_BT, roll_BT = old_logp_BT.detach().float(), rollout_logp_BT.detach().float()
    r_BT = old_BT - roll_BT
    lens_B = m_BT.sum(-1).clamp_min(1.0)
    lp_old_B = (_row_sum(old_BT, m_BT) / lens_B)[rows_B]
    lp_roll_B = (_row_sum(roll_BT, m_BT) / lens_B)[rows_B]
    diff_B = lp_roll_B - lp_old_B
    rc_BT = r_BT.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    seq_B = _row_sum(r_BT, m_BT)[rows_B].clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {
        "kl": _mmean(roll_BT - old_BT, m_BT),
        "k3_kl": _mmean(torch.exp(rc_BT) - rc_BT - 1.0, m_BT),
        "training_ppl": torch.exp(-lp_old_B).mean(),
        "training_log_ppl": (-lp_old_B).mean(),
        "rollout_ppl": torch.exp(-lp_roll_B).mean(),
        "rollout_log_ppl": (-lp_roll_B).mean(),
        "log_ppl_diff": diff_B.mean(),
        "log_ppl_abs_diff": diff_B.abs().mean(),
        "log_ppl_diff_max": diff_B.max(),
        "log_ppl_diff_min": diff_B.min(),
        "ppl_ratio": torch.exp(diff_B).mean(),
        "chi2_token": _mmean(torch.exp(2.0 * rc_BT), m_BT) - 1.0,
        "chi2_seq": torch.exp(2.0 * seq_B).mean() - 1.0,
    }


@torch.no_grad()
def correct(
    old_logp_BT: torch.Tensor,
    rollout_logp_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    params: RolloutCorrectionParams,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """The whole correction of a step's batch (verl's decoupled mode): weights, rejection, metrics.

    ``log_ratio = old_logp - rollout_logp``; the weights come from :func:`importance_weights`
    (None when ``params.is_level`` is None), the new mask from :func:`rejection_mask` (the old mask
    when there are no criteria). The weights are computed on the mask BEFORE rejection and then
    zeroed where the new mask is 0. Metrics: those of the three functions, as floats, each named
    ``rollout_corr/<name>``; ``{}``-valued parts are left out for an empty mask.

    Shapes: three [B, T] -> (weights [B, T] or None, mask [B, T], dict).
    """
    log_ratio_BT = old_logp_BT.float() - rollout_logp_BT.float()
    metrics: dict[str, torch.Tensor] = {}
    weights_BT = None
    if mask_BT.to(torch.float32).sum() > 0:
        if params.is_level is not None:
            weights_BT, m = importance_weights(log_ratio_BT, mask_BT, level=params.is_level, lower=params.is_lower,
                                               upper=params.is_upper, band=params.is_band,
                                               batch_normalize=params.is_batch_normalize)
            metrics.update(m)
        new_mask_BT = mask_BT
        if params.rejection:
            new_mask_BT, m = rejection_mask(log_ratio_BT, mask_BT, params.rejection)
            metrics.update(m)
        metrics.update(mismatch_metrics(old_logp_BT, rollout_logp_BT, mask_BT))
    else:
        new_mask_BT = mask_BT
        if params.is_level is not None:
            weights_BT = torch.zeros_like(log_ratio_BT)
    if weights_BT is not None:
        weights_BT = weights_BT * new_mask_BT.to(weights_BT.dtype)
    return weights_BT, new_mask_BT, {f"rollout_corr/{k}": float(v) for k, v in metrics.items()}
