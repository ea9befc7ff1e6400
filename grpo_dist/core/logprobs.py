"""Log-probabilities and entropy of tokens from logits, chunked over tokens for large vocabularies.

Shapes: ``M`` token positions (or ``M`` rows of positions: any leading shape ``[M, ...]``), ``V``
vocabulary. ``logits_MV`` is the model's output (any float dtype); ``labels_M`` the token whose
log-probability is wanted at each position.

For one position with logits ``z`` at temperature ``tau`` (``s = z / tau`` in float32)::

    logp  = s[label] - logsumexp(s)
    H     = logsumexp(s) - sum_v softmax(s)_v * s_v

Computed on the whole ``[M, V]`` at once, autograd keeps several float32 ``[M, V]`` tensors (the
cast, the softmax, the product) until the backward: for Qwen2.5's 151,936-token vocabulary and 4,096
positions, about 2.5 GB each. :func:`token_logprobs_and_entropy` keeps none of them: it saves the
logits (which the model's graph holds anyway) and two numbers per position, ``lse = logsumexp(s)``
and ``E[s] = sum_v p_v s_v``, and writes the gradient in the backward from the closed forms

    d logp / d s_v = 1[v = label] - p_v
    d H    / d s_v = -p_v (s_v - E[s])          (p = softmax(s); d/dz = d/ds / tau)

``chunk_size`` positions at a time, so only one chunk's float32 temporaries exist at any moment. Small
chunks are also faster (the temporaries stay in cache): on 2 CPU cores a chunk of ~2 MB of float32
logits ran 3-4x faster than all positions at once, for 32k and 152k vocabularies alike;
:func:`default_chunk_size` picks that size (64 MB on CUDA). Entries with ``p_v = 0`` (``-inf`` logits)
contribute 0.

Fused with the output layer
---------------------------
:func:`linear_logprobs_and_entropy` starts one step earlier, from the final hidden states ``h`` [M, H]
and the output layer ``z = h W^T + b`` (W [V, H]), so that no ``[M, V]`` tensor exists at all, not even
the logits. It computes ``z`` for ``C`` positions at a time (one matmul), reduces it as above, and
drops it; the backward recomputes each chunk's ``z`` and turns ``g = dL/dz`` (the closed forms above,
[C, V]) into

    dL/dh_C = g W        dL/dW += g^T h_C        dL/db += sum_c g_c

(``dL/dW`` and ``dL/db`` accumulated in float32). The price is one more ``C x H x V`` matmul per chunk
in the backward (the recomputed ``z``); the saving is the ``[M, V]`` logits, their gradient and the
time to write and read them. :func:`default_fused_chunk_size` picks ``C``: large enough that each
chunk's matmul reads the ``V x H`` weight once for many positions.
"""

import torch
import torch.nn.functional as F

__all__ = ["token_logprobs_and_entropy", "linear_logprobs_and_entropy", "default_chunk_size",
           "default_fused_chunk_size"]

_CHUNK_ELEMENTS = {"cpu": 2**19, "cuda": 2**24}  # float32 elements of one chunk's temporaries
_FUSED_CHUNK_ELEMENTS = {"cpu": 2**25, "cuda": 2**27}  # elements of one fused chunk's logits


def default_chunk_size(vocab_size: int, device_type: str = "cpu") -> int:
    """Positions per chunk for a ``vocab_size`` vocabulary on ``device_type`` (module docstring)."""
    return max(1, _CHUNK_ELEMENTS.get(device_type, _CHUNK_ELEMENTS["cpu"]) // max(1, vocab_size))


def default_fused_chunk_size(vocab_size: int, device_type: str = "cpu") -> int:
    """Positions per matmul of :func:`linear_logprobs_and_entropy` (at least 64)."""
    per = _FUSED_CHUNK_ELEMENTS.get(device_type, _FUSED_CHUNK_ELEMENTS["cpu"])
    return max(64, per // max(1, vocab_size))


def _softmax_terms(z_CV: torch.Tensor, temperature: float):
    """``(s, lse, p, ps)`` of one chunk in float32, ``ps = p * s`` with 0 where ``p = 0``."""
    s_CV = z_CV.float()
    if temperature != 1.0:
        s_CV = s_CV / temperature
    lse_C = torch.logsumexp(s_CV, dim=-1)
    p_CV = torch.exp(s_CV - lse_C.unsqueeze(-1))
    ps_CV = p_CV * s_CV
    if bool(torch.isneginf(s_CV).any()):
        ps_CV = torch.where(p_CV > 0, ps_CV, torch.zeros_like(ps_CV))
    return s_CV, lse_C, p_CV, ps_CV


def _chunks(shape: torch.Size, step: int):
    """Index tuples covering the leading dims of ``shape`` (all but the last), ``step`` positions of
    the last leading dim at a time: ``[M, V]`` -> ``(slice,)``; ``[B, K, V]`` -> ``(b, slice)``."""
    *outer, positions, _ = shape
    for idx in torch.cartesian_prod(*[torch.arange(n) for n in outer]).view(-1, len(outer)).tolist() if outer else [[]]:
        for start in range(0, positions, step):
            yield (*idx, slice(start, start + step))


def _grad_of_logits(z_CV, labels_C, g_logp_C, g_entropy_C, es_C, temperature: float) -> torch.Tensor:
    """``dL/dz`` [C, V] float32 of one chunk from the upstream gradients (module docstring)."""
    s_CV, _, p_CV, ps_CV = _softmax_terms(z_CV, temperature)
    del s_CV
    g_CV = torch.zeros_like(p_CV)
    if g_logp_C is not None:
        g_C = g_logp_C.unsqueeze(-1)
        g_CV -= g_C * p_CV
        g_CV.scatter_add_(-1, labels_C.unsqueeze(-1), g_C)
    if g_entropy_C is not None:
        # -p (s - E[s]) = p E[s] - p s
        g_CV += g_entropy_C.unsqueeze(-1) * (p_CV * es_C.unsqueeze(-1) - ps_CV)
    if temperature != 1.0:
        g_CV /= temperature
    return g_CV


def _check_options(temperature: float, chunk_size: int | None) -> None:
    """Refuse the keyword options both entry points take when out of range: ``temperature`` must be
    > 0 (``s = z / tau``), ``chunk_size`` None or >= 1."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be None or >= 1, got {chunk_size}")


def _outputs(logp_M: torch.Tensor, entropy_M: torch.Tensor, compute_entropy: bool,
             entropy_requires_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What both entry points return from their autograd function's ``(logp_M, entropy_M)`` [M]:
    the entropy only when asked for, detached from the graph when ``entropy_requires_grad`` is off."""
    if not compute_entropy:
        return logp_M, None
    return logp_M, (entropy_M if entropy_requires_grad else entropy_M.detach())


class _LogprobEntropy(torch.autograd.Function):
    """(logp, H) per position from logits, chunked over the leading dimension (module docstring)."""

    @staticmethod
    def forward(ctx, logits_MV, labels_M, temperature: float, step: int, compute_entropy: bool):
        logp_M = torch.empty(labels_M.shape, dtype=torch.float32, device=logits_MV.device)
        lse_M = torch.empty_like(logp_M)
        es_M = torch.empty_like(logp_M)
        for sl in _chunks(logits_MV.shape, step):
            s_CV, lse_C, _, ps_CV = _softmax_terms(logits_MV[sl], temperature)
            logp_M[sl] = s_CV.gather(-1, labels_M[sl].unsqueeze(-1)).squeeze(-1) - lse_C
            lse_M[sl] = lse_C
            es_M[sl] = ps_CV.sum(dim=-1) if compute_entropy else 0.0
        ctx.save_for_backward(logits_MV, labels_M, es_M)
        ctx.temperature, ctx.step = temperature, step
        entropy_M = lse_M - es_M
        return logp_M, entropy_M

    @staticmethod
    def backward(ctx, g_logp_M, g_entropy_M):
        logits_MV, labels_M, es_M = ctx.saved_tensors
        grad_MV = torch.empty(logits_MV.shape, dtype=logits_MV.dtype, device=logits_MV.device)
        for sl in _chunks(logits_MV.shape, ctx.step):
            g_CV = _grad_of_logits(logits_MV[sl], labels_M[sl], None if g_logp_M is None else g_logp_M[sl],
                                   None if g_entropy_M is None else g_entropy_M[sl], es_M[sl], ctx.temperature)
            grad_MV[sl] = g_CV.to(grad_MV.dtype)
        return grad_MV, None, None, None, None


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

    Works on ``chunk_size`` positions of one row at a time (``None``: the size
    :func:`default_chunk_size` picks; the values and gradients do not depend on it). Leading shapes
    ``[M]`` and ``[B, K]`` are chunked along their last dimension, so a strided ``[B, K, V]`` slice of
    a model's output needs no copy. ``entropy_requires_grad=False`` returns the entropy without a graph (for metrics)
    while ``logp_M`` keeps its gradient.
    """
    _check_options(temperature, chunk_size)
    if logits_MV.dim() < 2 or labels_M.shape != logits_MV.shape[:-1]:
        raise ValueError(
            f"logits_MV must be [M, ..., V] and labels_M [M, ...] (its shape without V), got "
            f"{tuple(logits_MV.shape)} and {tuple(labels_M.shape)}"
        )
    if logits_MV.dim() > 3:
        raise ValueError(f"logits_MV must be [M, V] or [B, K, V], got {tuple(logits_MV.shape)}")
    step = chunk_size if chunk_size is not None else default_chunk_size(logits_MV.shape[-1], logits_MV.device.type)
    logp_M, entropy_M = _LogprobEntropy.apply(logits_MV, labels_M, float(temperature), step, compute_entropy)
    return _outputs(logp_M, entropy_M, compute_entropy, entropy_requires_grad)


class _LinearLogprobEntropy(torch.autograd.Function):
    """(logp, H) per position from hidden states and the output layer, chunked (module docstring)."""

    @staticmethod
    def forward(ctx, hidden_MH, weight_VH, bias_V, labels_M, temperature: float, rows: int, sub: int,
                compute_entropy: bool):
        M = hidden_MH.shape[0]
        logp_M = torch.empty(M, dtype=torch.float32, device=hidden_MH.device)
        lse_M = torch.empty_like(logp_M)
        es_M = torch.zeros_like(logp_M)
        for start in range(0, M, rows):
            z_CV = F.linear(hidden_MH[start:start + rows], weight_VH, bias_V)
            C = z_CV.shape[0]
            for s0 in range(0, C, sub):
                sl = slice(start + s0, start + min(s0 + sub, C))
                s_cV, lse_c, _, ps_cV = _softmax_terms(z_CV[s0:s0 + sub], temperature)
                logp_M[sl] = s_cV.gather(-1, labels_M[sl].unsqueeze(-1)).squeeze(-1) - lse_c
                lse_M[sl] = lse_c
                if compute_entropy:
                    es_M[sl] = ps_cV.sum(dim=-1)
            del z_CV
        ctx.save_for_backward(hidden_MH, weight_VH, bias_V, labels_M, es_M)
        ctx.temperature, ctx.rows, ctx.sub = temperature, rows, sub
        ctx.set_materialize_grads(False)  # an unused output (the entropy) gets None, not zeros
        return logp_M, lse_M - es_M

    @staticmethod
    def backward(ctx, g_logp_M, g_entropy_M):
        hidden_MH, weight_VH, bias_V, labels_M, es_M = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias_V is not None and ctx.needs_input_grad[2]
        grad_h = torch.empty_like(hidden_MH) if need_h else None
        grad_w = torch.zeros(weight_VH.shape, dtype=torch.float32, device=weight_VH.device) if need_w else None
        grad_b = torch.zeros(bias_V.shape, dtype=torch.float32, device=bias_V.device) if need_b else None
        M, rows, sub = hidden_MH.shape[0], ctx.rows, ctx.sub
        for start in range(0, M, rows):
            h_CH = hidden_MH[start:start + rows]
            z_CV = F.linear(h_CH, weight_VH, bias_V)
            g_CV = torch.empty(z_CV.shape, dtype=torch.float32, device=z_CV.device)
            C = z_CV.shape[0]
            for s0 in range(0, C, sub):
                sl = slice(start + s0, start + min(s0 + sub, C))
                g_CV[s0:s0 + sub] = _grad_of_logits(
                    z_CV[s0:s0 + sub], labels_M[sl], None if g_logp_M is None else g_logp_M[sl],
                    None if g_entropy_M is None else g_entropy_M[sl], es_M[sl], ctx.temperature)
            del z_CV
            if need_b:
                grad_b += g_CV.sum(dim=0)
            g_CV = g_CV.to(hidden_MH.dtype)
            if need_h:
                grad_h[start:start + rows] = g_CV @ weight_VH.to(hidden_MH.dtype)
            if need_w:
                gw = g_CV.t() @ h_CH
                grad_w += gw if gw.dtype == torch.float32 else gw.float()
        return (grad_h, None if grad_w is None else grad_w.to(weight_VH.dtype),
                None if grad_b is None else grad_b.to(bias_V.dtype), None, None, None, None, None)


def linear_logprobs_and_entropy(
    hidden_MH: torch.Tensor,
    weight_VH: torch.Tensor,
    bias_V: torch.Tensor | None,
    labels_M: torch.Tensor,
    *,
    temperature: float,
    compute_entropy: bool,
    entropy_requires_grad: bool = True,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logp_M, entropy_M or None)`` in float32 of the logits ``z = hidden W^T + b`` without forming them.

    Shapes: hidden_MH [M, H], weight_VH [V, H], bias_V [V] or None, labels_M [M] -> [M], [M]. Equal
    to :func:`token_logprobs_and_entropy` on ``F.linear(hidden, weight, bias)`` in values and gradients
    (to float rounding; gradients reach ``hidden``, ``weight`` and ``bias``). ``chunk_size``: positions
    per matmul (None: :func:`default_fused_chunk_size`); no ``[M, V]`` tensor is formed either way.
    """
    _check_options(temperature, chunk_size)
    if hidden_MH.dim() != 2 or weight_VH.dim() != 2 or hidden_MH.shape[1] != weight_VH.shape[1]:
        raise ValueError(f"hidden_MH must be [M, H] and weight_VH [V, H], got {tuple(hidden_MH.shape)} and "
                         f"{tuple(weight_VH.shape)}")
    if labels_M.shape != hidden_MH.shape[:1]:
        raise ValueError(f"labels_M must be [M] = [{hidden_MH.shape[0]}], got {tuple(labels_M.shape)}")
    V, dev = weight_VH.shape[0], hidden_MH.device.type
    rows = chunk_size if chunk_size is not None else default_fused_chunk_size(V, dev)
    sub = min(rows, default_chunk_size(V, dev))
    logp_M, entropy_M = _LinearLogprobEntropy.apply(hidden_MH, weight_VH, bias_V, labels_M, float(temperature),
                                                    rows, sub, compute_entropy)
    return _outputs(logp_M, entropy_M, compute_entropy, entropy_requires_grad)
