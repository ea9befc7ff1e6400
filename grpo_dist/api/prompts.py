"""Prompts: a LongTensor ``[N, P]`` of token ids, left-padded with the pad id, or (with a tokenizer)
a list of strings; checked and turned into the id tensor that sampling starts from.
"""

from __future__ import annotations

from typing import Any

import torch


def prompt_mask(ids_NP: torch.Tensor, pad_token_id: int | None) -> torch.Tensor:
    """1 from each row's first non-pad token on (left padding); all 1 without a pad id."""
    if pad_token_id is None:
        return torch.ones_like(ids_NP)
    return ((ids_NP != pad_token_id).long().cumsum(-1) > 0).long()


def prompt_tensor(prompts: Any, *, tokenizer: Any, pad_token_id: int | None,
                  vocab_size: int) -> tuple[torch.Tensor, list[str] | None]:
    """Check and tokenize ``prompts``: the [N, P] id tensor, and the strings when given as strings.
    ``ValueError`` for the wrong type, dtype or shape, ids outside ``[0, vocab_size)``, rows that are
    all padding, or strings without a tokenizer."""
    if isinstance(prompts, torch.Tensor):
        if prompts.dtype.is_floating_point or prompts.dtype.is_complex or prompts.dtype == torch.bool:
            raise ValueError(f"GRPO prompts must be a LongTensor of token ids [N, P], got dtype {prompts.dtype}")
        if prompts.dim() != 2 or prompts.shape[0] < 1 or prompts.shape[1] < 1:
            raise ValueError(f"GRPO prompts must be a 2-D tensor [N, P] of token ids with N, P >= 1, "
                             f"got shape {tuple(prompts.shape)}")
        ids = prompts.long()
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"GRPO prompts hold token ids in [{lo}, {hi}]; the model's vocabulary is "
                             f"[0, {vocab_size - 1}]")
        empty = (~prompt_mask(ids, pad_token_id).bool().any(-1)).nonzero().flatten().tolist()
        if empty:
            raise ValueError(f"GRPO prompts rows {empty[:5]} are all padding (pad_token_id={pad_token_id}); "
                             "every prompt needs at least one token")
        return ids, None
    if isinstance(prompts, (list, tuple)) and prompts and all(isinstance(p, str) for p in prompts):
        if tokenizer is None:
            raise ValueError("GRPO prompts are strings: pass tokenizer=... to GRPO, or give a LongTensor [N, P] of ids")
        rows = [list(tokenizer(p)["input_ids"]) for p in prompts]
        empty = [i for i, r in enumerate(rows) if not r]
        if empty:
            raise ValueError(f"GRPO prompts {empty[:5]} tokenize to nothing; every prompt needs at least one token")
        if pad_token_id is None and len({len(r) for r in rows}) > 1:
            raise ValueError("GRPO prompts of different lengths need a pad id: the tokenizer has none; pass pad_token_id=...")
        width = max(len(r) for r in rows)
        pad = pad_token_id if pad_token_id is not None else 0
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        ids, _ = prompt_tensor(ids, tokenizer=tokenizer, pad_token_id=pad_token_id, vocab_size=vocab_size)
        return ids, list(prompts)
    raise ValueError(f"GRPO prompts must be a LongTensor [N, P] of token ids or (with a tokenizer) a non-empty "
                     f"list of strings, got {type(prompts).__name__}")
