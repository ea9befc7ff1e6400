"""Policy losses, loss aggregation, entropy and log-probabilities from logits.

Shapes: ``B`` rows (responses) of a micro-batch, ``T`` padded response length, ``V`` vocabulary.
Masks are float or bool [B, T], 1 on the response tokens that count.

Loss aggregation and global normalisers
---------------------------------------
A mini-batch is sharded over data-parallel ranks and cut into micro-batches for gradient
accumulation. :func:`agg_loss` divides by counts of the WHOLE mini-batch (``AggSpec.global_tokens``,
``AggSpec.global_seqs``), so that the sum of ``agg_loss`` over all pieces, on all ranks, is exactly the
``agg_loss`` of the whole mini-batch, and so is its gradient. The micro-batch size and the number of
ranks then do not change the update. The caller must therefore SUM gradients over micro-batches and
ranks: with FSDP, which averages gradients over the data-parallel group, multiply the loss by the
data-parallel world size before ``backward`` (what verl's ``dp_size`` argument does).
"""

from dataclasses import dataclass

import torch

from grpo_dist.core.names import ALL_LOSS_AGG_MODES, LOSS_AGG_MODES, UNNORMALISED_LOSS_AGG_MODES

__all__ = [
    "LOSS_AGG_MODES",
    "UNNORMALISED_LOSS_AGG_MODES",
    "ALL_LOSS_AGG_MODES",
    "AggSpec",
    "agg_loss",
    "global_counts",
    "masked_mean",
    "ppo_clip_policy_loss",
    "entropy_from_logits",
    "logprobs_from_logits",
]

@dataclass(frozen=True)
class AggSpec:
    """How :func:`agg_loss` reduces a [B, T] loss to a scalar (``actor.loss_agg_mode``).

    Attributes:
        mode: one of :data:`ALL_LOSS_AGG_MODES`.
        global_tokens: number of mask tokens (sum of the mask) in the whole mini-batch over all
            micro-batches and data-parallel ranks; ``None``: the count of the rows passed to this call.
        global_seqs: number of sequences with at least one mask token in the whole mini-batch;
            ``None``: the count of the rows passed to this call.
        norm_constant: the constant divisor of ``seq-mean-token-sum-norm`` (Dr. GRPO), normally the
            configured maximum response length; ``None``: the padded width T of the rows passed.
    """

    mode: str
    global_tokens: float | None = None
    global_seqs: float | None = None
    norm_constant: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in ALL_LOSS_AGG_MODES:
            raise ValueError(
                f"unknown loss aggregation mode {self.mode!r} (actor.loss_agg_mode); "
                f"valid modes: {list(ALL_LOSS_AGG_MODES)}"
            )
        for name in ("global_tokens", "global_seqs"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"AggSpec.{name} must be >= 0 or None, got {value}")
        if self.norm_constant is not None and not self.norm_constant > 0:
            raise ValueError(
                f"AggSpec.norm_constant must be > 0 (the max response length) or None, got {self.norm_constant}"
            )


def _check_same_shape(a_name: str, a: torch.Tensor, b_name: str, b: torch.Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{a_name} shape {tuple(a.shape)} must equal {b_name} shape {tuple(b.shape)}")


def _masked(x_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """``x * mask`` with exact zeros where the mask is 0 (NaN/inf in padding cannot leak)."""
    m = mask_BT.to(x_BT.dtype)
    return torch.where(m != 0, x_BT * m, torch.zeros_like(x_BT))


def _safe_div(num: torch.Tensor, den: torch.Tensor | float) -> torch.Tensor:
    """``num / den``, or 0 (keeping the graph) when ``den`` is 0."""
    if isinstance(den, torch.Tensor):
        return num / torch.where(den > 0, den, torch.ones_like(den))
    return num / den if den > 0 else num * 0.0


def global_counts(mask_BT: torch.Tensor) -> tuple[float, float]:
    """``(tokens, seqs)`` of a mask: ``tokens = sum(mask)``, ``seqs = #rows with sum_t mask > 0``.

    Shapes: mask_BT [B, T] -> two python floats. Sum these over all micro-batches and ranks of a
    mini-batch (e.g. with an all-reduce) to get ``AggSpec.global_tokens`` / ``global_seqs``.
    """
    if mask_BT.dim() != 2:
        raise ValueError(f"mask_BT must be 2-D [B, T], got shape {tuple(mask_BT.shape)}")
    m = mask_BT.to(torch.float64)
    len_B = m.sum(-1)
    return float(len_B.sum().item()), float((len_B > 0).sum().item())


def masked_mean(x_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """``sum(x * mask) / sum(mask)``; 0 when the mask is empty. Shapes: [B, T], [B, T] -> scalar."""
    _check_same_shape("x_BT", x_BT, "mask_BT", mask_BT)
    return _safe_div(_masked(x_BT, mask_BT).sum(), mask_BT.to(x_BT.dtype).sum())


def agg_loss(loss_BT: torch.Tensor, mask_BT: torch.Tensor, spec: AggSpec) -> torch.Tensor:
    """Reduce a per-token loss to a scalar with global normalisers.

    With ``l = loss * mask``, ``len_i = sum_t mask[i, t]``, ``N_tok = spec.global_tokens``,
    ``N_seq = spec.global_seqs`` (sequences with ``len_i > 0``) and ``C = spec.norm_constant``::

        token-mean              = sum_{i,t} l / N_tok
        token-sum               = sum_{i,t} l                                (no normaliser)
        seq-mean-token-sum      = sum_i (sum_t l_i) / N_seq
        seq-mean-token-mean     = sum_i (sum_t l_i / max(len_i, 1)) / N_seq
        seq-mean-token-sum-norm = sum_i (sum_t l_i) / (C * N_seq)            (Dr. GRPO)

    A count left ``None`` is taken from ``mask_BT`` (so ``agg_loss(x, m, AggSpec(mode))`` is the plain
    local mean); ``C = None`` means ``T``. A zero count gives 0, never NaN. Loss values where the mask
    is 0 are ignored even if they are inf or NaN. Summing over any partition of the rows, with the
    counts of the whole, gives the result (and gradient) of the whole.

    Shapes: loss_BT [B, T], mask_BT [B, T] (float or bool) -> 0-dim tensor.
    """
    if not isinstance(spec, AggSpec):
        raise ValueError(f"spec must be an AggSpec, got {type(spec).__name__}")
    if loss_BT.dim() != 2:
        raise ValueError(f"loss_BT must be 2-D [B, T], got shape {tuple(loss_BT.shape)}")
    _check_same_shape("mask_BT", mask_BT, "loss_BT", loss_BT)
    m_BT = mask_BT.to(loss_BT.dtype)
    l_BT = _masked(loss_BT, m_BT)
    if spec.mode == "token-mean":
        tokens = spec.global_tokens if spec.global_tokens is not None else m_BT.sum()
        return _safe_div(l_BT.sum(), tokens)
    if spec.mode == "token-sum":
        return l_BT.sum()

    len_B = m_BT.sum(-1)
    seqs = spec.global_seqs if spec.global_seqs is not None else (len_B > 0).to(loss_BT.dtype).sum()
    seq_sum_B = l_BT.sum(-1)
    if spec.mode == "seq-mean-token-sum":
        return _safe_div(seq_sum_B.sum(), seqs)
    if spec.mode == "seq-mean-token-mean":
        seq_mean_B = seq_sum_B / torch.where(len_B > 0, len_B, torch.ones_like(len_B))
        return _safe_div(seq_mean_B.sum(), seqs)
    assert spec.mode == "seq-mean-token-sum-norm", spec.mode
    norm = spec.norm_constant if spec.norm_constant is not None else float(loss_BT.shape[-1])
    return _safe_div(seq_sum_B.sum(), seqs * norm)


def ppo_clip_policy_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float,
    agg: AggSpec,
    rollout_is_weights_BT: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate with asymmetric clip ("clip-higher") and dual clip (verl's ``vanilla``).

    ::

        log_ratio = clamp(logp - old_logp, -20, 20);   ratio = exp(log_ratio)
        pg1 = -A * ratio
        pg2 = -A * clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
        clipped = max(pg1, pg2)
        pg3 = -A * clip_ratio_c                          # dual clip, bounds the loss when A < 0
        per_token = where(A < 0, min(clipped, pg3), clipped)
        per_token = per_token * w                        # only with rollout_is_weights_BT (detached)
        loss = agg_loss(per_token, mask, agg)

    ``rollout_is_weights_BT`` [B, T] (optional): per-token rollout importance weights
    (:mod:`grpo_dist.core.rollout_correction`), treated as constants.

    Metrics (0-dim detached tensors, masked means over the rows of this call; the caller reduces
    them across micro-batches and ranks):

    - ``pg_clipfrac``: fraction of tokens with ``pg2 > pg1`` (the ratio clip is active);
    - ``pg_clipfrac_lower``: fraction with ``A < 0`` and ``clipped > pg3`` (the dual clip is active);
    - ``ppo_kl``: mean of ``-log_ratio`` = ``old_logp - logp`` (after the clamp, as in verl).

    Shapes: logp_BT, old_logp_BT, advantages_BT, mask_BT [B, T] -> (0-dim loss, dict). Gradients flow
    through ``logp_BT`` only. ``ValueError`` if ``clip_ratio_c <= 1`` or a clip ratio is negative.
    """
    if not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c (dual-clip lower bound) must be > 1.0, got {clip_ratio_c}")
    if not 0.0 <= clip_ratio_low <= 1.0:
        raise ValueError(f"clip_ratio_low must be in [0, 1], got {clip_ratio_low}")
    if not clip_ratio_high >= 0.0:
        raise ValueError(f"clip_ratio_high must be >= 0, got {clip_ratio_high}")
    if logp_BT.dim() != 2:
        raise ValueError(f"logp_BT must be 2-D [B, T], got shape {tuple(logp_BT.shape)}")
    _check_same_shape("old_logp_BT", old_logp_BT, "logp_BT", logp_BT)
    _check_same_shape("advantages_BT", advantages_BT, "logp_BT", logp_BT)
    _check_same_shape("mask_BT", mask_BT, "logp_BT", logp_BT)

    old_logp_BT = old_logp_BT.detach()
    advantages_BT = advantages_BT.detach()
    log_ratio_BT = torch.clamp(logp_BT - old_logp_BT, min=-20.0, max=20.0)
    ratio_BT = torch.exp(log_ratio_BT)
    pg1_BT = -advantages_BT * ratio_BT
    pg2_BT = -advantages_BT * torch.clamp(ratio_BT, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clipped_BT = torch.maximum(pg1_BT, pg2_BT)
    pg3_BT = -advantages_BT * clip_ratio_c
    dual_BT = torch.minimum(pg3_BT, clipped_BT)
    negative_BT = advantages_BT < 0
    per_token_BT = torch.where(negative_BT, dual_BT, clipped_BT)
    if rollout_is_weights_BT is not None:
        _check_same_shape("rollout_is_weights_BT", rollout_is_weights_BT, "logp_BT", logp_BT)
        per_token_BT = per_token_BT * rollout_is_weights_BT.detach().to(per_token_BT.dtype)
    loss = agg_loss(per_token_BT, mask_BT, agg)

    with torch.no_grad():
        f = logp_BT.dtype
        metrics = {
            "pg_clipfrac": masked_mean((pg2_BT > pg1_BT).to(f), mask_BT).detach(),
            "pg_clipfrac_lower": masked_mean(((clipped_BT > pg3_BT) & negative_BT).to(f), mask_BT).detach(),
            "ppo_kl": masked_mean(-log_ratio_BT, mask_BT).detach(),
        }
    return loss, metrics


def entropy_from_logits(logits_BTV: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution of each position.

    ``H = logsumexp(z) - sum_v softmax(z)_v * z_v`` (equal to ``-sum_v p_v log p_v``); entries with
    ``p_v = 0`` (e.g. ``-inf`` logits) contribute 0. Shapes: [..., V] -> [...] (e.g. [B, T, V] ->
    [B, T]), in the dtype of the logits; pass float32 logits for a float32-accurate result.
    """
    if logits_BTV.dim() < 1:
        raise ValueError("logits_BTV must have a vocabulary dimension")
    p_BTV = torch.softmax(logits_BTV, dim=-1)
    z_BTV = torch.where(p_BTV > 0, logits_BTV, torch.zeros_like(logits_BTV))
    return torch.logsumexp(logits_BTV, dim=-1) - (p_BTV * z_BTV).sum(dim=-1)


def logprobs_from_logits(logits_BTV: torch.Tensor, labels_BT: torch.Tensor) -> torch.Tensor:
    """Log-probability of each label: ``log softmax(z)[label] = z[label] - logsumexp(z)``.

    Computed as a gather minus a logsumexp, so no [B, T, V] log-softmax tensor is kept.
    Shapes: logits_BTV [..., V], labels_BT [...] (integer) -> logp_BT [...] in the logits' dtype.
    """
    if labels_BT.shape != logits_BTV.shape[:-1]:
        raise ValueError(
            f"labels_BT shape {tuple(labels_BT.shape)} must equal logits_BTV shape without its last "
            f"(vocabulary) dimension {tuple(logits_BTV.shape[:-1])}"
        )
    if labels_BT.dtype.is_floating_point or labels_BT.dtype == torch.bool:
        raise ValueError(f"labels_BT must be an integer tensor of token ids, got dtype {labels_BT.dtype}")
    picked_BT = logits_BTV.gather(-1, labels_BT.long().unsqueeze(-1)).squeeze(-1)
    return picked_BT - torch.logsumexp(logits_BTV, dim=-1)
