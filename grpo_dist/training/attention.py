"""Attention over packed rows without an ``[N, N]`` mask: SDPA run sequence by sequence.

A packed forward (:mod:`grpo_dist.training.model_forward`) runs a micro-batch as one row ``[1, N]`` of
the real tokens of its ``S`` sequences. Hugging Face's ``sdpa`` attention sees such a row as one
sequence and builds a block-diagonal ``[N, N]`` mask from the position ids, so its attention costs
``O(N^2)`` in the packed length, more than the padded batch's ``O(B * T^2)`` it was meant to save.
flash-attention's variable-length kernel (CUDA) needs no mask; this module gives SDPA the same shape
of work: with sequence boundaries ``cu = [0, n_1, n_1 + n_2, ..., N]`` it computes, per sequence
``s`` and head,

    out[cu_s : cu_{s+1}] = softmax(q_s k_s^T * scale + causal) v_s      (sum over s of n_s^2 work)

with ``torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)`` on each sequence's
slice (its fused CPU/CUDA kernels, grouped-query heads included), and no mask tensor at all.

On CUDA the same sum is one call of PyTorch's variable-length flash kernel
(``torch.nn.attention.varlen.varlen_attn``, where the installed torch has it): the loop above costs one
kernel launch per sequence and layer and a host read of ``cu`` per layer, which on a GPU made the
packed no-grad forward about three times slower than the bare padded one (measured on an H100, see
docs/benchmarks.md). The loop stays the path on the CPU (the kernel is CUDA-only), with dropout, with
a sliding window, and wherever the kernel is missing.

The implementation is registered with transformers' ``AttentionInterface`` (and a mask function with
``AttentionMaskInterface``) under :data:`VARLEN_SDPA`; models loaded with that name behave exactly as
``sdpa`` for ordinary (padded) batches, which it delegates to. The boundaries come from the
``cu_seq_lens_q`` keyword that transformers passes through every model to its attention layers (the
packed forward passes it, as flash-attention's varlen path reads it), or, without it, from position
ids that restart at 0 for each sequence of a one-row batch without an attention mask.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

__all__ = ["VARLEN_SDPA", "segment_bounds", "varlen_sdpa_attention", "cu_seq_lens_from_position_ids"]

VARLEN_SDPA = "grpo_varlen_sdpa"
"""The ``attn_implementation`` name of :func:`varlen_sdpa_attention`."""


def cu_seq_lens_from_position_ids(position_ids_1N: torch.Tensor) -> torch.Tensor:
    """``cu`` [S+1] (int32): where the sequences of a packed row start, from position ids that restart
    at 0 for each sequence. ``[[0, 1, 2, 0, 1, 0]]`` -> ``[0, 3, 5, 6]``."""
    pos = position_ids_1N.reshape(-1)
    starts = (pos == 0).nonzero().flatten()
    if starts.numel() == 0 or int(starts[0]) != 0:
        starts = torch.cat([starts.new_zeros(1), starts])
    end = torch.tensor([pos.numel()], dtype=starts.dtype, device=starts.device)
    return torch.cat([starts, end]).to(torch.int32)


def segment_bounds(cu_seq_lens: torch.Tensor) -> list[int]:
    """Python lengths of the segments of ``cu`` (one host read), empty segments dropped."""
    cu = [int(x) for x in cu_seq_lens.reshape(-1).tolist()]
    return [b - a for a, b in zip(cu, cu[1:]) if b > a]


def _sliding_mask(n: int, window: int, device: torch.device) -> torch.Tensor:
    i = torch.arange(n, device=device)
    d = i[:, None] - i[None, :]
    return (d >= 0) & (d < window)


def varlen_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Hugging Face attention function: per-sequence SDPA for a packed row, else ``sdpa``.

    Shapes (transformers' convention): query [1, Hq, N, D], key/value [1, Hkv, N, D] -> output
    [1, N, Hq, D]. A packed row is recognised by ``cu_seq_lens_q`` in ``kwargs``, or (no mask, one
    row, no cache) by position ids that restart; anything else goes to transformers' ``sdpa``.
    """
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None and attention_mask is None and query.shape[0] == 1 and kwargs.get("position_ids") is not None:
        if query.shape[2] == key.shape[2] and query.shape[2] > 1:
            cu = cu_seq_lens_from_position_ids(kwargs["position_ids"])
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    window = kwargs.get("sliding_window")
    max_len = kwargs.get("max_length_q")
    if (cu is not None and max_len is not None and query.shape[0] == 1 and query.shape[2] == key.shape[2]
            and dropout == 0.0 and window is None and _flash_fits(query)):
        # the packed forward's own boundaries and longest sequence: no host read of cu in each layer
        return _flash_varlen(query, key, value, cu, int(max_len), scaling, bool(causal)), None
    if cu is None or query.shape[0] != 1 or query.shape[2] != key.shape[2] or int(cu[-1]) != query.shape[2]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    lengths = segment_bounds(cu)
    gqa = query.shape[1] != key.shape[1]
    outs = []
    for q, k, v in zip(query.split(lengths, dim=2), key.split(lengths, dim=2), value.split(lengths, dim=2)):
        n = q.shape[2]
        mask = None
        if window is not None and causal and n > window:
            mask = _sliding_mask(n, window, q.device)
        outs.append(F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=bool(causal and mask is None and n > 1),
            scale=scaling, enable_gqa=gqa,
        ))
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    return out.transpose(1, 2).contiguous(), None


@functools.cache
def _cuda_varlen() -> tuple[Callable, frozenset[str]] | None:
    """``(varlen_attn, its keyword names)``, or None where this torch has no variable-length kernel."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn, frozenset(inspect.signature(varlen_attn).parameters)


def _flash_fits(query: torch.Tensor) -> bool:
    """Whether the variable-length flash kernel takes this query: CUDA, half precision, a head size it
    supports, and a torch that has the kernel."""
    d = query.shape[-1]
    return (query.is_cuda and query.dtype in (torch.float16, torch.bfloat16) and d % 8 == 0 and d <= 256
            and _cuda_varlen() is not None)


def _flash_varlen(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu: torch.Tensor, max_len: int,
                  scaling: float | None, causal: bool) -> torch.Tensor:
    """Packed attention in one kernel: query [1, Hq, N, D], key/value [1, Hkv, N, D], boundaries ``cu``
    [S+1] (int32, on the device) -> [1, N, Hq, D]. Grouped-query key/value heads are repeated when the
    kernel cannot share them itself; causality is ``window_size=(-1, 0)`` (torch >= 2.11) or
    ``is_causal`` (torch 2.10)."""
    fn, names = _cuda_varlen()
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [N, H, D]
    extra: dict = {}
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" in names:
            extra["enable_gqa"] = True
        else:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    if "window_size" in names:
        extra["window_size"] = (-1, 0) if causal else (-1, -1)
    else:
        extra["is_causal"] = causal
    cu = cu.to(device=q.device, dtype=torch.int32)
    out = fn(q, k, v, cu, cu, max_len, max_len, scale=scaling, **extra)
    return out.unsqueeze(0)


def _varlen_sdpa_mask(*args, **kwargs):
    """No mask for a batch without an attention mask (the attention function handles causality and
    sequence boundaries); ``sdpa``'s mask otherwise."""
    if kwargs.get("attention_mask") is None:
        return None
    return sdpa_mask(*args, **kwargs)


AttentionInterface.register(VARLEN_SDPA, varlen_sdpa_attention)
AttentionMaskInterface.register(VARLEN_SDPA, _varlen_sdpa_mask)
assert VARLEN_SDPA in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping
