"""Policy forward: per-token log-probabilities (and entropy) of the response tokens.

Batch layout (verl's): ``input_ids`` [B, P+R] is a left-padded prompt (P) followed by a right-padded
response (R); the logit at position ``t`` predicts token ``t+1``, so the R logits that predict the
response tokens are those at positions ``P-1 .. P+R-2``.

With ``remove_padding`` (verl's ``use_remove_padding``) the forward runs on the real tokens only:
the rows of a micro-batch are concatenated into one row ``[1, N]`` (``N`` = real tokens) whose position
ids restart at 0 for each sequence, which Hugging Face attention reads as sequence boundaries
(flash-attention's variable-length kernels on CUDA, a block-diagonal mask with SDPA/eager), and only
the ``M`` positions that predict a response token reach the output layer. Results equal the padded
path's to float rounding; the compute saved is the padding's share of the tokens.

Loading and sharding the model is :mod:`grpo_dist.training.model_builder`'s job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from grpo_dist.core.logprobs import token_logprobs_and_entropy
from grpo_dist.training.micro_batches import plan_micro_batches, restore_order, take_rows
from grpo_dist.training.settings import FORWARD_KEYS

__all__ = [
    "forward_logprobs",
    "PackedRows",
    "pack_rows",
    "trim_padding_columns",
    "batched_logprobs",
    "require_keys",
]


def require_keys(data: Mapping[str, torch.Tensor], keys: tuple[str, ...] | list[str], where: str) -> None:
    """``ValueError`` naming the first key of ``keys`` missing from ``data``."""
    missing = [k for k in keys if k not in data]
    if missing:
        raise ValueError(f"{where}: the batch lacks {missing} (has {sorted(data.keys())})")


def trim_padding_columns(attention_mask: torch.Tensor, response_length: int) -> tuple[int, int]:
    """``(start, kept_response)``: columns that no row of this micro-batch attends to can be dropped.

    ``start`` is the first column any row attends to (within the left-padded prompt);
    ``kept_response`` is the number of response columns up to the last one any row attends to
    (at least 1). Dropping the rest changes no attended token (position ids are passed explicitly).
    """
    total = attention_mask.shape[1]
    prompt_length = total - response_length
    any_col = attention_mask.bool().any(dim=0)
    prompt_cols = any_col[:prompt_length].nonzero()
    start = int(prompt_cols[0]) if prompt_cols.numel() else max(prompt_length - 1, 0)
    start = min(start, max(prompt_length - 1, 0))  # keep the column whose logit predicts response[0]
    resp_cols = any_col[prompt_length:].nonzero()
    kept = int(resp_cols[-1]) + 1 if resp_cols.numel() else 1
    return start, max(kept, 1)


@dataclass(frozen=True)
class PackedRows:
    """A micro-batch's real tokens as one row, and where its response predictions are.

    ``input_ids_1N``, ``position_ids_1N`` [1, N]: the real tokens of rows 0..B-1, in order, with their
    own position ids (0-based per sequence). ``keep_M`` [M]: packed positions whose logit predicts a
    real response token; ``labels_M`` [M]: that token; ``row_M``, ``col_M`` [M]: where its log-prob
    goes in the ``[B, R]`` response grid.
    """

    input_ids_1N: torch.Tensor
    position_ids_1N: torch.Tensor
    keep_M: torch.Tensor
    labels_M: torch.Tensor
    row_M: torch.Tensor
    col_M: torch.Tensor


def pack_rows(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, response_length: int
) -> PackedRows:
    """Pack the attended tokens of ``[B, P+R]`` rows (left-padded prompt, right-padded response).

    Each row's attended tokens must be one contiguous run that starts inside the prompt (at least one
    prompt token) and whose position ids count 0, 1, 2, ...; ``ValueError`` names the first row that
    is not. A row with no response token contributes only context; a row with no token, nothing.
    """
    B, total = input_ids.shape
    P = total - response_length
    real_BT = attention_mask.bool()
    n_B = real_BT.sum(dim=1)
    first_B = torch.where(n_B > 0, real_BT.int().argmax(dim=1), torch.full_like(n_B, P))
    end_B = first_B + n_B  # one past the last real column, if the run is contiguous
    cols_T = torch.arange(total, device=input_ids.device)
    run_BT = (cols_T >= first_B[:, None]) & (cols_T < end_B[:, None])
    bad = (run_BT != real_BT).any(dim=1) | ((n_B > 0) & (first_B > P - 1))
    real_pos_ok = (position_ids - (cols_T[None, :] - first_B[:, None]))[real_BT] == 0
    if bool(bad.any()) or not bool(real_pos_ok.all()):
        if bool(bad.any()):
            b = int(bad.nonzero()[0])
            why = "its attended tokens are not one run starting inside the prompt"
        else:
            rows_BT = torch.arange(B, device=input_ids.device)[:, None].expand(B, total)
            b = int(rows_BT[real_BT][~real_pos_ok][0])
            why = "its position ids do not count 0, 1, 2, ... over its attended tokens"
        raise ValueError(f"packing rows without padding: row {b} cannot be packed ({why})")
    offset_B = torch.cumsum(n_B, dim=0) - n_B  # packed index of each row's first token
    input_ids_1N = input_ids[real_BT].unsqueeze(0)
    position_ids_1N = position_ids[real_BT].unsqueeze(0)
    # response column j of row b is predicted by padded column P-1+j, i.e. packed offset_b + P-1+j - first_b
    resp_real_BR = real_BT[:, P:]
    row_M, col_M = resp_real_BR.nonzero(as_tuple=True)
    keep_M = offset_B[row_M] + (P - 1 + col_M) - first_B[row_M]
    labels_M = input_ids_1N[0, keep_M + 1]
    return PackedRows(input_ids_1N, position_ids_1N, keep_M, labels_M, row_M, col_M)


def _forward_packed(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    *,
    response_length: int,
    temperature: float,
    compute_entropy: bool,
    entropy_requires_grad: bool,
    logits_chunk_size: int | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    packed = pack_rows(input_ids, attention_mask, position_ids, response_length)
    B = input_ids.shape[0]
    if packed.keep_M.numel() == 0:  # no response token to score: nothing to run
        zeros = torch.zeros(B, response_length, device=input_ids.device)
        return zeros, (zeros.clone() if compute_entropy else None)
    out = model(
        input_ids=packed.input_ids_1N,
        attention_mask=None,  # sequence boundaries come from the position ids
        position_ids=packed.position_ids_1N,
        use_cache=False,
        logits_to_keep=packed.keep_M,
    )
    logits = out.logits[0]
    if logits.shape[0] != packed.keep_M.shape[0]:  # a model that ignores logits_to_keep
        logits = logits[packed.keep_M]
    logp_M, entropy_M = token_logprobs_and_entropy(
        logits, packed.labels_M, temperature=temperature, compute_entropy=compute_entropy,
        entropy_requires_grad=entropy_requires_grad, chunk_size=logits_chunk_size,
    )

    def to_grid(values_M: torch.Tensor) -> torch.Tensor:
        grid = values_M.new_zeros(B, response_length)
        return grid.index_put((packed.row_M, packed.col_M), values_M)

    logp_BR = to_grid(logp_M)
    entropy_BR = to_grid(entropy_M) if entropy_M is not None else None
    return logp_BR, entropy_BR


def forward_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    *,
    response_length: int,
    temperature: float,
    compute_entropy: bool,
    entropy_requires_grad: bool = True,
    remove_padding: bool = False,
    logits_chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob (and entropy) of each response token under ``model`` at ``temperature``.

    Shapes: input_ids, attention_mask, position_ids [B, P+R] -> (logp_BR [B, R] float32,
    entropy_BR [B, R] float32 or None). Logits are divided by ``temperature`` and cast to float32.
    Padding columns that no row attends to are trimmed before the forward; response positions beyond
    the last attended column get 0. Gradients flow when called under grad mode (to the entropy too
    unless ``entropy_requires_grad=False``: then it is computed from detached logits, for metrics).
    ``remove_padding=True`` runs the packed forward (module docstring); response positions that are
    padding then hold 0. ``logits_chunk_size`` computes log-probs and entropy about that many
    positions at a time (None: a size chosen from the vocabulary), recomputed in the backward (:mod:`grpo_dist.core.logprobs`: same values, far less memory
    for large vocabularies).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if input_ids.shape != attention_mask.shape or input_ids.shape != position_ids.shape:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)}, attention_mask {tuple(attention_mask.shape)} and "
            f"position_ids {tuple(position_ids.shape)} must have the same [B, P+R] shape"
        )
    R = response_length
    if not 0 < R < input_ids.shape[1]:
        raise ValueError(f"response_length {R} must be in (0, {input_ids.shape[1]})")
    if remove_padding:
        return _forward_packed(
            model, input_ids, attention_mask, position_ids, response_length=R, temperature=temperature,
            compute_entropy=compute_entropy, entropy_requires_grad=entropy_requires_grad,
            logits_chunk_size=logits_chunk_size,
        )
    start, kept = trim_padding_columns(attention_mask, R)
    end = input_ids.shape[1] - R + kept
    out = model(
        input_ids=input_ids[:, start:end],
        attention_mask=attention_mask[:, start:end],
        position_ids=position_ids[:, start:end],
        use_cache=False,
        logits_to_keep=kept + 1,
    )
    # K = kept response columns; slicing from the end also works for a model that ignores logits_to_keep
    logits_BKV = out.logits[:, -(kept + 1) : -1, :]
    labels_BK = input_ids[:, end - kept : end]
    logp_BK, entropy_BK = token_logprobs_and_entropy(
        logits_BKV, labels_BK, temperature=temperature, compute_entropy=compute_entropy,
        entropy_requires_grad=entropy_requires_grad, chunk_size=logits_chunk_size,
    )
    if kept < R:
        pad = (0, R - kept)
        logp_BK = nn.functional.pad(logp_BK, pad)
        entropy_BK = nn.functional.pad(entropy_BK, pad) if entropy_BK is not None else None
    return logp_BK, entropy_BK


@torch.no_grad()
def batched_logprobs(
    model: nn.Module,
    data: Mapping[str, torch.Tensor],
    *,
    device: torch.device,
    micro_batch_size: int | None,
    max_token_len: int | None,
    temperature: float,
    compute_entropy: bool,
    remove_padding: bool = False,
    logits_chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """No-grad log-probs (and entropy) of every row of ``data``, micro-batch by micro-batch.

    Collective under FSDP2: all ranks run the same number of forwards (see ``plan_micro_batches``).
    Returns CPU float32 tensors [B, R] in the original row order.
    """
    require_keys(data, FORWARD_KEYS, "compute_log_prob")
    R = data["responses"].shape[1]
    mbs = plan_micro_batches(data["attention_mask"], micro_batch_size=micro_batch_size, max_token_len=max_token_len)
    logps, ents = [], []
    for idx in mbs:
        mb = take_rows({k: data[k] for k in FORWARD_KEYS}, idx)
        mb = {k: v.to(device, non_blocking=True) for k, v in mb.items()}
        logp, ent = forward_logprobs(
            model,
            mb["input_ids"],
            mb["attention_mask"],
            mb["position_ids"],
            response_length=R,
            temperature=temperature,
            compute_entropy=compute_entropy,
            remove_padding=remove_padding,
            logits_chunk_size=logits_chunk_size,
        )
        logps.append(logp.cpu())
        if ent is not None:
            ents.append(ent.cpu())
    if not mbs:
        empty = torch.zeros(0, R)
        return empty, (empty.clone() if compute_entropy else None)
    logp_BR = restore_order(logps, mbs)
    entropy_BR = restore_order(ents, mbs) if compute_entropy else None
    return logp_BR, entropy_BR
