"""From one score per response to token-level scores (outcome reward on the last response token)."""

from __future__ import annotations

from typing import Sequence

import torch


def place_scores_on_last_token(scores_B: torch.Tensor | Sequence[float], response_mask_BR: torch.Tensor) -> torch.Tensor:
    """Token-level scores [B, R]: ``scores_B[b]`` at the last position where ``response_mask_BR[b]`` is
    1, zero elsewhere; a row whose mask is all zero (empty response) gets no score.

    Args:
        scores_B: [B] one score per response.
        response_mask_BR: [B, R] 1 on response tokens (need not be contiguous), 0 on padding.

    Returns:
        token_level_scores_BR: [B, R], the dtype of ``scores_B`` when it is floating, else float32.
    """
    scores_B = torch.as_tensor(scores_B)
    if not scores_B.is_floating_point():
        scores_B = scores_B.to(torch.float32)
    if response_mask_BR.dim() != 2 or scores_B.shape != response_mask_BR.shape[:1]:
        raise ValueError(f"expected scores [B] and mask [B, R], got {tuple(scores_B.shape)} "
                         f"and {tuple(response_mask_BR.shape)}")
    mask_BR = response_mask_BR.bool()
    R = mask_BR.shape[1]
    positions_R = torch.arange(R, device=mask_BR.device)
    last_B = torch.where(mask_BR, positions_R, -1).amax(dim=1) if R else torch.full_like(scores_B, -1, dtype=torch.long)
    out_BR = torch.zeros(mask_BR.shape, dtype=scores_B.dtype, device=mask_BR.device)
    has_B = last_B >= 0
    rows_K = torch.nonzero(has_B, as_tuple=True)[0]
    out_BR[rows_K, last_B[rows_K]] = scores_B.to(out_BR.device)[rows_K]
    return out_BR
