"""Log-probabilities and entropy of tokens from logits, chunked over tokens for large vocabularies.

Shapes: ``M`` token positions (or ``M`` rows of positions: any leading shape ``[M, ...]``), ``V``
vocabulary. ``logits_MV`` is the model's output (any float dtype); ``labels_M`` the token whose
log-probability is wanted at each position.

For one position with logits ``z`` at temperature ``tau`` (``s = z / tau`` in float32)::

    logp  = s[label] - logsumexp(s)
    H     = logsumexp(s) - sum_v softmax(s)_v * s_v

Computed on the whole ``[M, V]`` at once, autograd keeps several float32 ``[M, V]`` tensors (the
cast, the softmax, the product) until the backward: for Qwen2.5's 151,936-token vocabulary and 4,096
positions, about 2.5 GB each. :func:`token_logprobs_and_entropy` with ``chunk_size`` computes the
same numbers ``chunk_size`` positions at a time and, under grad mode, recomputes each chunk in the
backward (activation checkpointing), so besides the model's own logits only one chunk's float32
tensors are alive at any time. The results are identical to the unchunked computation; the cost is
one more pass of the cheap per-chunk arithmetic in the backward.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from grpo_dist.core.losses import entropy_from_logits, logprobs_from_logits

__all__ = ["token_logprobs_and_entropy"]


def _chunk_terms(
    logits_CV: torch.Tensor, labels_C: torch.Tensor, temperature: float, compute_entropy: bool, entropy_grad: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    s_CV = logits_CV.float() / temperature
    logp_C = logprobs_from_logits(s_CV, labels_C)
    if not compute_entropy:
        return logp_C, torch.zeros_like(logp_C)
    if entropy_grad:
        return logp_C, entropy_from_logits(s_CV)
    with torch.no_grad():
        return logp_C, entropy_from_logits(s_CV.detach())


def token_logprobs_and_entropy(
    logits_MV: torch.Tensor,
    labels_M: torch.Tensor,
    *,
    temperature: float,
    compute_entropy: bool,
    entropy_requires_grad: bool = True,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logp_M, entropy_M or None)`` in float32 from ``logits_MV`` [M, ..., V] and ``labels_M`` [M, ...].

    ``chunk_size=None`` computes everything at once; an integer ``>= 1`` computes ``chunk_size``
    entries of the leading dimension at a time, recomputing each chunk in the backward when gradients are recorded (same
    values, less memory: module docstring). ``entropy_requires_grad=False`` returns the entropy
    without a graph (for metrics) while ``logp_M`` keeps its gradient.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if logits_MV.dim() < 2 or labels_M.shape != logits_MV.shape[:-1]:
        raise ValueError(
            f"logits_MV must be [M, ..., V] and labels_M [M, ...] (its shape without V), got "
            f"{tuple(logits_MV.shape)} and {tuple(labels_M.shape)}"
        )
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be None or >= 1, got {chunk_size}")
    M = logits_MV.shape[0]
    step = M if chunk_size is None else chunk_size
    recompute = torch.is_grad_enabled() and logits_MV.requires_grad and chunk_size is not None
    logps, ents = [], []
    for start in range(0, M, max(step, 1)):
        z_CV, y_C = logits_MV[start : start + step], labels_M[start : start + step]
        if recompute:
            logp_C, ent_C = checkpoint(
                _chunk_terms, z_CV, y_C, temperature, compute_entropy, entropy_requires_grad, use_reentrant=False
            )
        else:
            logp_C, ent_C = _chunk_terms(z_CV, y_C, temperature, compute_entropy, entropy_requires_grad)
        logps.append(logp_C)
        ents.append(ent_C)
    if M == 0:
        empty = logits_MV.new_zeros(labels_M.shape, dtype=torch.float32)
        return empty, (empty.clone() if compute_entropy else None)
    logp_M = torch.cat(logps)
    return logp_M, (torch.cat(ents) if compute_entropy else None)
