"""Policy forward: per-token log-probabilities (and entropy) of the response tokens.

Batch layout (verl's): ``input_ids`` [B, P+R] is a left-padded prompt (P) followed by a right-padded
response (R); the logit at position ``t`` predicts token ``t+1``, so the R logits that predict the
response tokens are those at positions ``P-1 .. P+R-2``.

Loading and sharding the model is :mod:`grpo_dist.training.model_builder`'s job.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from grpo_dist.core.losses import entropy_from_logits, logprobs_from_logits
from grpo_dist.training.micro_batches import plan_micro_batches, restore_order, take_rows
from grpo_dist.training.settings import FORWARD_KEYS

__all__ = [
    "forward_logprobs",
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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob (and entropy) of each response token under ``model`` at ``temperature``.

    Shapes: input_ids, attention_mask, position_ids [B, P+R] -> (logp_BR [B, R] float32,
    entropy_BR [B, R] float32 or None). Logits are divided by ``temperature`` and cast to float32.
    Padding columns that no row attends to are trimmed before the forward; response positions beyond
    the last attended column get 0. Gradients flow when called under grad mode (to the entropy too
    unless ``entropy_requires_grad=False``: then it is computed from detached logits, for metrics).
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
    logits_BKV = out.logits[:, -(kept + 1) : -1, :].float() / temperature
    labels_BK = input_ids[:, end - kept : end]
    logp_BK = logprobs_from_logits(logits_BKV, labels_BK)
    entropy_BK = None
    if compute_entropy:
        if entropy_requires_grad:
            entropy_BK = entropy_from_logits(logits_BKV)
        else:
            with torch.no_grad():
                entropy_BK = entropy_from_logits(logits_BKV.detach())
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
