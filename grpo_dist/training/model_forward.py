"""One model-forward path for every role: a model's output at chosen positions of a batch, padded or packed.

The actor and the reference need the output layer's log-probs at the positions that predict response
tokens, the critic its value head's output there, a reward model its score head's output at the last
token of each response (or at step ends). All of them are "the output layer, applied to the final
hidden states at positions ``(rows_K, cols_K)`` of a ``[B, T]`` batch"; :func:`forward_at` computes
exactly that, in one of two layouts:

- **padded**: the batch as it is, minus the columns no row attends to (position ids are explicit, so
  dropping them changes nothing);
- **packed** (verl's ``use_remove_padding``): the attended tokens of every row concatenated into one
  row ``[1, N]`` with their own position ids and the sequence boundaries ``cu_seq_lens`` (passed to the
  attention layers as flash-attention's variable-length keywords; models built by
  :mod:`grpo_dist.training.model_builder` on SDPA use :mod:`grpo_dist.training.attention`, which runs
  each sequence on its own with no ``[N, N]`` mask; plain ``sdpa`` builds a block-diagonal mask). The
  compute saved is the padding's share of the tokens.

In both, the output layer (``lm_head``, a value or score head) runs only on the ``K`` wanted
positions: its ``forward`` is replaced for the duration of the call by one that first selects them
from the hidden states it receives. A ``head`` callable may replace the output layer's computation
itself (the fused log-prob head in :mod:`grpo_dist.training.policy` does: no ``[K, V]`` logits).
The layer is still called from inside the model's own forward, so FSDP2 has gathered its weight
there and reduces its gradient as usual.

Each row's attended tokens must be one contiguous run whose position ids count 0, 1, 2, ... (the
rollout's layout: a left-padded prompt followed by a right-padded response).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

__all__ = [
    "PackedRows",
    "pack_rows",
    "attended_span",
    "output_layer",
    "forward_at",
    "response_positions",
    "to_response_grid",
    "tokens_computed",
]

Head = Callable[[torch.Tensor, nn.Module, Callable[[torch.Tensor], torch.Tensor]], torch.Tensor]
"""``head(hidden_KH, layer, layer_forward) -> output [K, ...]``: what the output layer computes from the
hidden states of the selected positions (``layer_forward`` is the layer's own forward)."""


@dataclass(frozen=True)
class PackedRows:
    """A micro-batch's attended tokens as one row.

    ``input_ids_1N``, ``position_ids_1N`` [1, N]: the attended tokens of rows 0..B-1 in order, with their
    own position ids. ``first_B`` [B]: each row's first attended column; ``offset_B`` [B]: where the row
    starts in the packed row (padded column ``c`` of row ``b`` is packed index ``offset_b + c - first_b``).
    ``cu_seq_lens`` [S+1] (int32): the boundaries of the S non-empty rows; ``max_len``: the longest.
    """

    input_ids_1N: torch.Tensor
    position_ids_1N: torch.Tensor
    first_B: torch.Tensor
    offset_B: torch.Tensor
    cu_seq_lens: torch.Tensor
    max_len: int

    def index(self, rows_K: torch.Tensor, cols_K: torch.Tensor) -> torch.Tensor:
        """Packed index of padded positions ``(rows_K, cols_K)``."""
        return self.offset_B[rows_K] + cols_K - self.first_B[rows_K]

    def attention_kwargs(self) -> dict:
        """Sequence boundaries as transformers' flash-attention keywords (read by the varlen kernels)."""
        return dict(cu_seq_lens_q=self.cu_seq_lens, cu_seq_lens_k=self.cu_seq_lens,
                    max_length_q=self.max_len, max_length_k=self.max_len)


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> PackedRows:
    """Pack the attended tokens of ``[B, T]`` rows into one row (module docstring for the layout).

    ``ValueError`` names the first row whose attended tokens are not one run, or whose position ids do
    not count 0, 1, 2, ... over it.
    """
    B, T = input_ids.shape
    real_BT = attention_mask.bool()
    n_B = real_BT.sum(dim=1)
    first_B = torch.where(n_B > 0, real_BT.int().argmax(dim=1), torch.zeros_like(n_B))
    cols_T = torch.arange(T, device=input_ids.device)
    run_BT = (cols_T >= first_B[:, None]) & (cols_T < (first_B + n_B)[:, None])
    bad_B = (run_BT != real_BT).any(dim=1)
    pos_ok = (position_ids - (cols_T[None, :] - first_B[:, None]))[real_BT] == 0
    if bool(bad_B.any()):
        b = int(bad_B.nonzero()[0])
        raise ValueError(f"packing rows without padding: row {b} cannot be packed (its attended tokens are not one run)")
    if not bool(pos_ok.all()):
        rows_BT = torch.arange(B, device=input_ids.device)[:, None].expand(B, T)
        b = int(rows_BT[real_BT][~pos_ok][0])
        raise ValueError(f"packing rows without padding: row {b} cannot be packed "
                         "(its position ids do not count 0, 1, 2, ... over its attended tokens)")
    offset_B = torch.cumsum(n_B, dim=0) - n_B
    nonempty = n_B[n_B > 0]
    cu = torch.zeros(nonempty.numel() + 1, dtype=torch.int32, device=input_ids.device)
    cu[1:] = torch.cumsum(nonempty, dim=0)
    return PackedRows(
        input_ids_1N=input_ids[real_BT].unsqueeze(0),
        position_ids_1N=position_ids[real_BT].unsqueeze(0),
        first_B=first_B,
        offset_B=offset_B,
        cu_seq_lens=cu,
        max_len=int(nonempty.max()) if nonempty.numel() else 0,
    )


def attended_span(attention_mask: torch.Tensor) -> tuple[int, int]:
    """``(start, end)``: the columns from the first to one past the last that any row attends to."""
    cols = attention_mask.bool().any(dim=0).nonzero()
    if cols.numel() == 0:
        return 0, 0
    return int(cols[0]), int(cols[-1]) + 1


def output_layer(model: nn.Module) -> nn.Module | None:
    """The layer that turns final hidden states into outputs: the causal LM's output embeddings
    (``lm_head``; tied to the input embeddings or not), or a value / token-classification head
    (``score``, ``classifier``); None for a model with none of them (a plain module returning logits)."""
    get = getattr(model, "get_output_embeddings", None)
    layer = get() if callable(get) else None
    if isinstance(layer, nn.Module):
        return layer
    for name in ("score", "classifier", "v_head", "value_head"):
        layer = getattr(model, name, None)
        if isinstance(layer, nn.Module):
            return layer
    return None


def forward_at(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    rows_K: torch.Tensor,
    cols_K: torch.Tensor,
    *,
    remove_padding: bool,
    head: Head | None = None,
) -> torch.Tensor:
    """The model's output at positions ``(rows_K[k], cols_K[k])`` of the ``[B, T]`` batch: ``[K, ...]``.

    Shapes: input_ids, attention_mask, position_ids [B, T]; rows_K, cols_K [K] (long, attended
    positions). Returns what the output layer (or ``head``) gives for the K hidden states, e.g.
    logits [K, V] or values [K, 1]. ``remove_padding`` picks the packed layout (module docstring).
    Gradients flow under grad mode. With ``K = 0`` the model is not run and ``head`` is not called:
    an empty ``[0]`` tensor comes back.
    """
    if input_ids.shape != attention_mask.shape or input_ids.shape != position_ids.shape:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)}, attention_mask {tuple(attention_mask.shape)} and "
            f"position_ids {tuple(position_ids.shape)} must have the same [B, T] shape"
        )
    if rows_K.numel() == 0:
        return torch.zeros(0, device=input_ids.device)
    packed = pack_rows(input_ids, attention_mask, position_ids) if remove_padding else None
    if not bool(attention_mask[rows_K, cols_K].bool().all()):
        k = int((~attention_mask[rows_K, cols_K].bool()).nonzero()[0])
        raise ValueError(f"position (row {int(rows_K[k])}, column {int(cols_K[k])}) is padding: no output is read there")
    if packed is not None:
        idx_K = packed.index(rows_K, cols_K)
        call = dict(input_ids=packed.input_ids_1N, attention_mask=None, position_ids=packed.position_ids_1N,
                    **packed.attention_kwargs())

        def select(h: torch.Tensor) -> torch.Tensor:
            return h[0, idx_K]
    else:
        start, end = attended_span(attention_mask)
        call = dict(input_ids=input_ids[:, start:end], attention_mask=attention_mask[:, start:end],
                    position_ids=position_ids[:, start:end])
        local_K = cols_K - start

        def select(h: torch.Tensor) -> torch.Tensor:
            return h[rows_K, local_K]

    layer = output_layer(model)
    if layer is None:  # a model without a known output layer: its outputs at every position, then select
        if head is not None:
            raise ValueError(f"{type(model).__name__} has no output layer (lm_head, score, classifier) for a custom head")
        logits = model(**call, use_cache=False).logits
        return select(logits)
    layer_forward = layer.forward
    calls = []

    def selected_forward(hidden: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        h_KH = select(hidden)
        return head(h_KH, layer, layer_forward) if head is not None else layer_forward(h_KH)

    layer.forward = selected_forward
    try:
        out = model(**call, use_cache=False)
    finally:
        del layer.forward
    if len(calls) != 1:
        raise RuntimeError(f"{type(model).__name__}'s forward called its output layer {len(calls)} times (expected once)")
    return out.logits


def response_positions(attention_mask: torch.Tensor, response_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(row_M, col_M)``: the real response tokens of a ``[B, P+R]`` batch (``col_M`` in ``0..R-1``).

    The output that predicts response token ``(b, j)`` is read at column ``P - 1 + j``; that column
    must be attended (a response needs at least one prompt token before it): ``ValueError`` names the
    first row whose response has none.
    """
    B, total = attention_mask.shape
    R = response_length
    if not 0 < R < total:
        raise ValueError(f"response_length {R} must be in (0, {total})")
    P = total - R
    real_BT = attention_mask.bool()
    row_M, col_M = real_BT[:, P:].nonzero(as_tuple=True)
    has_resp_B = real_BT[:, P:].any(dim=1)
    orphan_B = has_resp_B & ~real_BT[:, P - 1]
    if bool(orphan_B.any()):
        b = int(orphan_B.nonzero()[0])
        raise ValueError(f"row {b} cannot be scored: its response has no attended prompt token before it")
    # within a contiguous run, response token j's predecessor P-1+j is attended when P-1 is
    return row_M, col_M


def to_response_grid(values_M: torch.Tensor, row_M: torch.Tensor, col_M: torch.Tensor, B: int, R: int) -> torch.Tensor:
    """``[B, R]`` grid with ``values_M`` at ``(row_M, col_M)`` and 0 elsewhere (differentiable)."""
    grid = values_M.new_zeros(B, R)
    return grid.index_put((row_M, col_M), values_M)


def tokens_computed(attention_mask: torch.Tensor, remove_padding: bool) -> int:
    """Tokens :func:`forward_at` runs the model on for a ``[B, T]`` micro-batch: the attended ones when
    packed, else ``B`` x the attended column span."""
    if remove_padding:
        return int(attention_mask.sum())
    start, end = attended_span(attention_mask)
    return attention_mask.shape[0] * (end - start)
