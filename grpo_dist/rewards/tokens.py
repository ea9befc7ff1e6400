"""From scores to token-level scores: an outcome reward on the last response token, step rewards on the
tokens that end a step (from the text's lines, or, for a process reward model, from separator tokens)."""

from __future__ import annotations

import bisect
from typing import Callable, Sequence

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


#: U+FFFD, what a decoder shows for bytes that are not (yet) a whole UTF-8 character.
REPLACEMENT = "\ufffd"
#: A prefix of tokens can end at most 3 bytes into an unfinished UTF-8 character (4 bytes at most).
MAX_UNFINISHED_BYTES = 3


def _common_prefix_len(a: str, b: str) -> int:
    """The length of the longest common prefix of ``a`` and ``b``."""
    if b.startswith(a):
        return len(a)
    lo, hi = 0, min(len(a), len(b))  # a[:lo] == b[:lo]; a[:hi + 1] != b[:hi + 1]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if b.startswith(a[:mid]):
            lo = mid
        else:
            hi = mid - 1
    return lo


def step_end_tokens(
    char_ends: Sequence[int],
    text: str,
    n_tokens: int,
    decode_prefixes: Callable[[list[int]], list[str]],
) -> list[int]:
    """The token that completes the last character of each step, by decoding prefixes of the response.

    ``shown(n)``, how many leading characters of ``text`` the first ``n`` tokens show, is the length of
    the common prefix of their decoded text and ``text``. So a prefix that ends inside a multi-byte
    character (decoded as U+FFFD) does not show that character yet: it belongs to the token that
    completes it; a token's leading space counts where the whole text has it (a SentencePiece piece
    decoded on its own loses it); a space that the decoder's clean-up removes once the next token is
    there is not counted. The rule: the character at offset ``c`` is in the first token that shows it,
    the smallest ``i`` with ``shown(i + 1) > c``; a step ending at offset ``e`` (exclusive) ends in the
    smallest ``i`` with ``shown(i + 1) >= e``. That is what decoding every prefix gives.

    It is found with a few decodes per step, not one per token: interpolation between the prefixes
    decoded so far, bisection when a round does not halve the range. A prefix whose text ends in U+FFFD
    may end inside a character, and a byte-fallback decoder then shows the whole run of byte tokens
    before it as U+FFFD too (``"\\n"`` + the first byte of ``"É"``: ``"\\ufffd\\ufffd"``), so it is
    credited with what the up to 3 prefixes before it show (a character has at most 4 bytes); with
    that, the characters shown never decrease as tokens are added (unless special tokens sit between the
    bytes of one character), and the search is exact.

    Args:
        char_ends: offsets (exclusive) where steps end in ``text``, ascending, each in ``[1, len(text)]``.
        text: the decoded response, as ``decode_prefixes([n_tokens])[0]`` gives it.
        n_tokens: T >= 1, the number of response tokens.
        decode_prefixes: given prefix lengths ``[n, ...]`` (each in ``[1, T]``), the texts of the first
            ``n`` response tokens, decoded as ``text`` was (the same special-token skipping and clean-up).

    Returns:
        one token index in ``[0, T)`` per end (an end beyond what all T tokens show: ``T - 1``).
    """
    raw: dict[int, tuple[int, bool]] = {0: (0, False)}  # n -> (characters shown, decoded text ends in U+FFFD)
    shown = {0: 0}  # n -> characters shown by the first n tokens, looking back over an unfinished character
    known = [0]  # the keys of ``shown``, ascending

    def learn(ns: list[int]) -> None:
        ns = sorted(set(ns) - shown.keys())
        back = {n: n for n in ns}  # the shortest prefix looked at for n
        todo = ns
        while todo:
            fresh = sorted(set(todo) - raw.keys())
            for m, piece in zip(fresh, decode_prefixes(fresh) if fresh else []):
                raw[m] = (_common_prefix_len(piece, text), piece.endswith(REPLACEMENT))
            todo = []
            for n in ns:
                if raw[back[n]][1] and n - back[n] < MAX_UNFINISHED_BYTES:
                    back[n] -= 1
                    todo.append(back[n])
        for n in ns:
            shown[n] = max(raw[m][0] for m in range(back[n], n + 1))
            bisect.insort(known, n)

    def bracket(e: int) -> tuple[int, int]:
        """(lo, hi): hi the shortest known prefix that shows >= e characters, lo the known one before it."""
        k = next(j for j, n in enumerate(known) if shown[n] >= e)
        return known[k - 1], known[k]

    learn([n_tokens])
    out = []
    for e in char_ends:
        if shown[n_tokens] < e:
            out.append(n_tokens - 1)
            continue
        lo, hi = bracket(e)
        halved = True
        while hi - lo > 1:
            # the answer lies in (lo, hi]: probe where the characters shown reach e by interpolation, and
            # the prefix before (usually that settles it); also the middle when the last round did not halve
            guess = lo + -(-(e - shown[lo]) * (hi - lo) // (shown[hi] - shown[lo]))
            probes = {guess, guess - 1} | (set() if halved else {(lo + hi) // 2})
            learn([n for n in probes if lo < n < hi])
            new_lo, new_hi = bracket(e)
            halved = 2 * (new_hi - new_lo) <= hi - lo
            lo, hi = new_lo, new_hi
        out.append(hi - 1)
    return out


def place_step_rewards(
    step_rewards_B: Sequence[Sequence[float] | None],
    texts_B: Sequence[str],
    token_ids_B: Sequence[Sequence[int]],
    response_mask_BR: torch.Tensor,
    decode: Callable[[list[list[int]]], list[str]],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Process supervision: each step's reward on the token that ends the step.

    A step is a line of the text (:func:`step_char_ends`); it ends in the response token that completes
    its last character, the first token whose prefix of the response decodes to a text showing that
    character (:func:`step_end_tokens`: exact for multi-byte characters split over tokens, SentencePiece
    leading spaces and decode clean-up, with a few decodes per step).

    Args:
        step_rewards_B: per response, one reward per step (line) of its text, in order.
        texts_B: the decoded responses the rewards were computed on: ``decode(token_ids_B)``.
        token_ids_B: per response, its T_b response token ids in order (T_b = the number of 1s in its
            row of ``response_mask_BR``).
        response_mask_BR: [B, R] 1 on response tokens (need not be contiguous).
        decode: a batch decode, ``list of id lists -> list of texts``, the one that gave ``texts_B``
            (e.g. ``tokenizer.batch_decode`` with the same ``skip_special_tokens``).

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
        ids = list(token_ids_B[b])
        if len(ids) != len(valid):
            raise ValueError(f"response {b}: {len(ids)} token ids for {len(valid)} response tokens in the mask")
        if not valid or not ends:
            continue
        at = step_end_tokens(ends, texts_B[b], len(ids), lambda ns: decode([ids[:n] for n in ns]))  # noqa: B023
        for k, r in zip(at, got):
            rewards_BR[b, valid[k]] += float(r)
            ends_BR[b, valid[k]] = 1.0
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
