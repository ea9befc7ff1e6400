"""Policy forward: per-token log-probabilities (and entropy) of the response tokens.

Batch layout (verl's): ``input_ids`` [B, P+R] is a left-padded prompt (P) followed by a right-padded
response (R); the logit at position ``t`` predicts token ``t+1``, so the R logits that predict the
response tokens are those at positions ``P-1 .. P+R-2``.

The model runs through :func:`grpo_dist.training.model_forward.forward_at`, the forward every role
shares: padded, or with ``remove_padding`` (verl's ``use_remove_padding``) packed into one row of
the real tokens with per-sequence boundaries, and in both layouts the output layer sees only the
``M`` positions that predict a real response token. Log-probs and entropy are then computed from
those logits a few positions at a time (:func:`grpo_dist.core.logprobs.token_logprobs_and_entropy`),
or, with ``fused``, straight from the hidden states and the output layer's weight
(:func:`grpo_dist.core.logprobs.linear_logprobs_and_entropy`: no ``[M, V]`` logits at all). Every
variant gives the same values and gradients to float rounding.

Loading and sharding the model is :mod:`grpo_dist.training.model_builder`'s job.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from grpo_dist.core.logprobs import linear_logprobs_and_entropy, token_logprobs_and_entropy
from grpo_dist.training.micro_batches import plan_micro_batches, restore_order, take_rows
from grpo_dist.training.model_forward import (
    PackedRows,
    forward_at,
    pack_rows,
    response_positions,
    to_response_grid,
)
from grpo_dist.training.settings import FORWARD_KEYS

__all__ = [
    "forward_logprobs",
    "PackedRows",
    "pack_rows",
    "trim_padding_columns",
    "batched_logprobs",
    "require_keys",
    "require_same_shape",
    "FUSED_MODEL_TYPES",
    "supports_fused_head",
]

FUSED_MODEL_TYPES: tuple[str, ...] = (
    "llama", "mistral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "olmo", "olmo2", "phi3", "smollm3",
)
"""Model types whose causal-LM forward returns the output layer's result unchanged (no soft-capping or
scaling of the logits afterwards), so the fused head may stand in for it."""


def supports_fused_head(model: nn.Module) -> bool:
    """Whether :func:`forward_logprobs` may use its fused head on ``model``: a causal LM of one of
    :data:`FUSED_MODEL_TYPES` whose output layer is a plain ``nn.Linear`` (tied or not)."""
    config = getattr(model, "config", None)
    get = getattr(model, "get_output_embeddings", None)
    layer = get() if callable(get) else None
    return (getattr(config, "model_type", None) in FUSED_MODEL_TYPES and isinstance(layer, nn.Linear)
            and getattr(config, "final_logit_softcapping", None) is None)


def require_keys(data: Mapping[str, torch.Tensor], keys: tuple[str, ...] | list[str], where: str) -> None:
    """``ValueError`` naming the first key of ``keys`` missing from ``data``."""
    missing = [k for k in keys if k not in data]
    if missing:
        raise ValueError(f"{where}: the batch lacks {missing} (has {sorted(data.keys())})")


def require_same_shape(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> None:
    """``ValueError`` unless a forward's three inputs have the same ``[B, P+R]`` shape."""
    if input_ids.shape != attention_mask.shape or input_ids.shape != position_ids.shape:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)}, attention_mask {tuple(attention_mask.shape)} and "
            f"position_ids {tuple(position_ids.shape)} must have the same [B, P+R] shape"
        )


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
    remove_padding: bool = False,
    logits_chunk_size: int | None = None,
    fused: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob (and entropy) of each response token under ``model`` at ``temperature``.

    Shapes: input_ids, attention_mask, position_ids [B, P+R] -> (logp_BR [B, R] float32,
    entropy_BR [B, R] float32 or None); positions that are not real response tokens hold 0. Logits
    are divided by ``temperature`` and cast to float32. Gradients flow when called under grad mode (to
    the entropy too unless ``entropy_requires_grad=False``: then it is computed without a graph, for
    metrics). ``remove_padding`` runs the packed forward. ``fused`` computes log-probs and entropy from
    the hidden states without forming logits (models where :func:`supports_fused_head` holds; others
    take the logits path). ``logits_chunk_size``: positions per chunk of the output layer's reduction
    (per matmul when fused; None: chosen from the vocabulary size).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    require_same_shape(input_ids, attention_mask, position_ids)
    B, total = input_ids.shape
    R = response_length
    row_M, col_M = response_positions(attention_mask, R)
    P = total - R
    if row_M.numel() == 0:  # no response token to score: nothing to run
        zeros = torch.zeros(B, R, device=input_ids.device)
        return zeros, (zeros.clone() if compute_entropy else None)
    labels_M = input_ids[row_M, P + col_M]
    reduce = dict(temperature=temperature, compute_entropy=compute_entropy,
                  entropy_requires_grad=entropy_requires_grad, chunk_size=logits_chunk_size)
    if fused and supports_fused_head(model):
        def head(h_MH, layer, _layer_forward):
            logp, ent = linear_logprobs_and_entropy(h_MH, layer.weight, layer.bias, labels_M, **reduce)
            return torch.stack([logp, ent if ent is not None else torch.zeros_like(logp)], dim=-1)

        out_M2 = forward_at(model, input_ids, attention_mask, position_ids, row_M, P - 1 + col_M,
                            remove_padding=remove_padding, head=head)
        logp_M = out_M2[:, 0]
        entropy_M = out_M2[:, 1] if compute_entropy else None
        if entropy_M is not None and not entropy_requires_grad:
            entropy_M = entropy_M.detach()
    else:
        logits_MV = forward_at(model, input_ids, attention_mask, position_ids, row_M, P - 1 + col_M,
                               remove_padding=remove_padding)
        logp_M, entropy_M = token_logprobs_and_entropy(logits_MV, labels_M, **reduce)
    logp_BR = to_response_grid(logp_M, row_M, col_M, B, R)
    entropy_BR = to_response_grid(entropy_M, row_M, col_M, B, R) if entropy_M is not None else None
    return logp_BR, entropy_BR


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
    fused: bool = False,
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
            fused=fused,
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
