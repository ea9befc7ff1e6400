"""From scores to token-level scores: an outcome reward on the last response token, step rewards on the
tokens that end a step (from the text's lines, or, for a process reward model, from separator tokens)."""

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


def step_char_ends(text: str) -> list[int]:
    """Character offsets (exclusive) where the reasoning steps of ``text`` end.

    A step is a line: each ``"\\n"`` ends one (the newline belongs to it), and a non-empty last
    segment without a newline is the final step. ``"a\\nb"`` -> [2, 3]; ``"a\\n"`` -> [2]; ``""`` -> [].
    """
    ends = [i + 1 for i, ch in enumerate(text) if ch == "\n"]
    if text and (not ends or ends[-1] < len(text)):
        ends.append(len(text))
    return ends


def place_step_rewards(
    step_rewards_B: Sequence[Sequence[float] | None],
    texts_B: Sequence[str],
    token_lengths_B: Sequence[Sequence[int]],
    response_mask_BR: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Process supervision: each step's reward on the token that ends the step.

    Args:
        step_rewards_B: per response, one reward per step (line) of its text, in order.
        texts_B: the decoded responses the rewards were computed on.
        token_lengths_B: per response, the number of characters each response token decodes to
            (its cumulative sum maps a character offset to the token that contains it).
        response_mask_BR: [B, R] 1 on response tokens.

    Returns:
        rewards_BR [B, R] (float32) with the step rewards at step ends (steps that end in the same
        token add up there), and step_end_mask_BR [B, R] (float32, 1 at step ends).

    ``ValueError`` naming the response when it has no step rewards or their number differs from
    its number of steps.
    """
    B, R = response_mask_BR.shape
    rewards_BR = torch.zeros((B, R), dtype=torch.float32)
    ends_BR = torch.zeros((B, R), dtype=torch.float32)
    for b in range(B):
        ends = step_char_ends(texts_B[b])
        got = step_rewards_B[b]
        if got is None or len(got) != len(ends):
            n = "no" if got is None else str(len(got))
            raise ValueError(
                f"response {b}: the reward function returned {n} step rewards for a response with "
                f"{len(ends)} steps (lines); return {{'score': ..., 'step_rewards': [one per line]}}"
            )
        valid = torch.nonzero(response_mask_BR[b] != 0, as_tuple=True)[0].tolist()
        if not valid:
            continue
        cum, total = [], 0
        for n_chars in token_lengths_B[b][: len(valid)]:
            total += n_chars
            cum.append(total)
        for end, r in zip(ends, got):
            k = next((i for i, c in enumerate(cum) if c >= end), len(valid) - 1)
            t = valid[min(k, len(valid) - 1)]
            rewards_BR[b, t] += float(r)
            ends_BR[b, t] = 1.0
    return rewards_BR, ends_BR


class SeparatorTokens:
    """Which token ids end a reasoning step: those whose text, decoded on its own, contains
    ``separator`` (a process reward model is read there). Each id is decoded once and remembered.

    Args:
        tokenizer: the policy's tokenizer (``decode``).
        separator: the text that ends a step (non-empty), e.g. a newline.
    """

    def __init__(self, tokenizer, separator: str) -> None:
        if not separator:
            raise ValueError("the step separator must be a non-empty text")
        self.tokenizer, self.separator = tokenizer, separator
        self._ends: dict[int, bool] = {}

    def __call__(self, token_ids: Sequence[int]) -> list[bool]:
        new = sorted({int(t) for t in token_ids} - self._ends.keys())
        if new:
            pieces = self.tokenizer.batch_decode([[t] for t in new], skip_special_tokens=False)
            self._ends.update({t: self.separator in piece for t, piece in zip(new, pieces)})
        return [self._ends[int(t)] for t in token_ids]


def token_step_ends(responses_BR: torch.Tensor, response_mask_BR: torch.Tensor,
                    separator_tokens: SeparatorTokens) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each response's reasoning steps end, in tokens.

    A response token ends a step when its text contains the separator; the last response token always
    ends the last step (so a response without any separator is one step).

    Args:
        responses_BR: [B, R] token ids.
        response_mask_BR: [B, R] 1 on response tokens (contiguous from column 0), 0 on padding.
        separator_tokens: the predicate on token ids.

    Returns:
        ``(step_end_mask_BR, has_separator_B)``: [B, R] float32, 1 on step-end tokens (0 outside the
        mask; a row without response tokens has none); [B] bool, whether the response holds a separator.
    """
    if responses_BR.shape != response_mask_BR.shape or responses_BR.dim() != 2:
        raise ValueError(f"expected responses and mask of the same shape [B, R], got {tuple(responses_BR.shape)} "
                         f"and {tuple(response_mask_BR.shape)}")
    mask_BR = response_mask_BR != 0
    flat = responses_BR[mask_BR].tolist()
    is_sep = torch.zeros_like(mask_BR)
    is_sep[mask_BR] = torch.tensor(separator_tokens(flat), dtype=torch.bool) if flat else torch.zeros(0, dtype=torch.bool)
    ends_BR = is_sep.clone()
    positions_R = torch.arange(mask_BR.shape[1])
    last_B = torch.where(mask_BR, positions_R, -1).amax(dim=1) if mask_BR.shape[1] else torch.full((mask_BR.shape[0],), -1)
    rows_K = torch.nonzero(last_B >= 0, as_tuple=True)[0]
    ends_BR[rows_K, last_B[rows_K]] = True
    return ends_BR.float(), is_sep.any(dim=1)
