"""Chunked log-probs and entropy: equal to the plain computation in values and gradients, and with
less peak memory under grad mode."""

from __future__ import annotations

import pytest
import torch

from grpo_dist.core.logprobs import token_logprobs_and_entropy
from grpo_dist.core.losses import entropy_from_logits, logprobs_from_logits


def plain(logits_MV: torch.Tensor, labels_M: torch.Tensor, temperature: float):
    """The definition, one position at a time."""
    logps, ents = [], []
    for z, y in zip(logits_MV.float() / temperature, labels_M, strict=True):
        p = torch.softmax(z, -1)
        logps.append(torch.log(p[y]))
        ents.append(-(p * torch.log(p)).sum())
    return torch.stack(logps), torch.stack(ents)


def inputs(M=37, V=50, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(M, V, generator=g)).to(dtype).requires_grad_(True)
    labels = torch.randint(0, V, (M,), generator=g)
    return logits, labels


@pytest.mark.parametrize("chunk_size", [None, 1, 5, 37, 100])
def test_values_equal_the_definition(chunk_size):
    logits, labels = inputs()
    logp, ent = token_logprobs_and_entropy(logits, labels, temperature=0.7, compute_entropy=True, chunk_size=chunk_size)
    want_logp, want_ent = plain(logits.detach(), labels, 0.7)
    assert logp.dtype == torch.float32 and logp.shape == (37,)
    assert torch.allclose(logp, want_logp, atol=1e-5)
    assert torch.allclose(ent, want_ent, atol=1e-5)


@pytest.mark.parametrize("chunk_size", [1, 4, 64])
def test_gradients_equal_the_unchunked_ones(chunk_size):
    grads = []
    for cs in (None, chunk_size):
        logits, labels = inputs(seed=3)
        logp, ent = token_logprobs_and_entropy(logits, labels, temperature=1.3, compute_entropy=True, chunk_size=cs)
        (logp.square().sum() - 0.3 * ent.sum()).backward()
        grads.append(logits.grad)
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_rows_of_positions_and_bf16_logits():
    logits, labels = inputs(M=12, V=40, seed=5, dtype=torch.bfloat16)
    l3, y3 = logits.detach().view(3, 4, 40), labels.view(3, 4)
    logp, ent = token_logprobs_and_entropy(l3, y3, temperature=1.0, compute_entropy=True, chunk_size=2)
    want_logp, want_ent = plain(logits.detach(), labels, 1.0)
    assert logp.shape == (3, 4) and logp.dtype == torch.float32
    assert torch.allclose(logp.flatten(), want_logp, atol=1e-5)
    assert torch.allclose(ent.flatten(), want_ent, atol=1e-5)


def test_entropy_for_metrics_carries_no_graph():
    logits, labels = inputs()
    for cs in (None, 8):
        logp, ent = token_logprobs_and_entropy(
            logits, labels, temperature=1.0, compute_entropy=True, entropy_requires_grad=False, chunk_size=cs
        )
        assert logp.requires_grad and not ent.requires_grad
    _, none = token_logprobs_and_entropy(logits, labels, temperature=1.0, compute_entropy=False)
    assert none is None


def test_bad_arguments_are_named():
    logits, labels = inputs()
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs_and_entropy(logits, labels, temperature=0.0, compute_entropy=False)
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs_and_entropy(logits, labels, temperature=1.0, compute_entropy=False, chunk_size=0)
    with pytest.raises(ValueError, match="labels_M"):
        token_logprobs_and_entropy(logits, labels[:-1], temperature=1.0, compute_entropy=False)


def saved_bytes(compute) -> int:
    """Bytes autograd keeps for the backward of one loss over [512, 8192] logits, besides the logits."""
    logits, labels = inputs(M=512, V=8192, seed=1)
    total = 0

    def pack(t):
        nonlocal total
        if t.untyped_storage().data_ptr() != logits.untyped_storage().data_ptr():
            total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp, ent = compute(logits, labels)
    kept = total
    (logp.sum() + ent.sum()).backward()  # and the backward still works
    assert logits.grad is not None
    return kept


def test_no_float32_copy_of_the_logits_is_kept_for_the_backward():
    one_logits = 512 * 8192 * 4
    textbook = saved_bytes(lambda z, y: (logprobs_from_logits(z.float(), y), entropy_from_logits(z.float())))
    assert textbook >= 2 * one_logits, "the textbook composition keeps float32 [M, V] tensors"
    for chunk_size in (None, 64):
        ours = saved_bytes(lambda z, y: token_logprobs_and_entropy(
            z, y, temperature=0.8, compute_entropy=True, chunk_size=chunk_size))
        assert ours <= 3 * 512 * 8, f"chunk_size={chunk_size}: keeps {ours} bytes (per-position numbers only)"


# ---- fused with the output layer: from hidden states, no [M, V] logits ----
from grpo_dist.core.logprobs import linear_logprobs_and_entropy  # noqa: E402


def layer_inputs(M=23, H=12, V=50, seed=0, dtype=torch.float32, bias=True):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(M, H, generator=g).to(dtype).requires_grad_(True)
    weight = (0.5 * torch.randn(V, H, generator=g)).to(dtype).requires_grad_(True)
    b = (0.3 * torch.randn(V, generator=g)).to(dtype).requires_grad_(True) if bias else None
    labels = torch.randint(0, V, (M,), generator=g)
    return hidden, weight, b, labels


def test_fused_by_hand():
    """One position, hidden [1, 0], W rows [1, 0], [0, 1], [-1, 0] (z = [1, 0, -1]), label 0, T = 1:
    logp = 1 - log(e + 1 + 1/e), H = log(e + 1 + 1/e) - (e - 1/e) / (e + 1 + 1/e)."""
    import math

    h = torch.tensor([[1.0, 0.0]])
    w = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    logp, ent = linear_logprobs_and_entropy(h, w, None, torch.tensor([0]), temperature=1.0, compute_entropy=True)
    e = math.e
    zsum = e + 1 + 1 / e
    assert logp.item() == pytest.approx(1 - math.log(zsum), abs=1e-6)
    assert ent.item() == pytest.approx(math.log(zsum) - (e - 1 / e) / zsum, abs=1e-6)


@pytest.mark.parametrize("chunk_size", [None, 1, 4, 23, 100])
@pytest.mark.parametrize("bias", [True, False])
def test_fused_equals_the_definition_in_values_and_gradients(chunk_size, bias):
    """Against the plain loop on F.linear's logits: values, and gradients of hidden, weight and bias."""
    grads = []
    for fused in (False, True):
        hidden, weight, b, labels = layer_inputs(seed=2, bias=bias)
        if fused:
            logp, ent = linear_logprobs_and_entropy(hidden, weight, b, labels, temperature=0.7, compute_entropy=True,
                                                    chunk_size=chunk_size)
        else:
            logp, ent = plain(torch.nn.functional.linear(hidden, weight, b), labels, 0.7)
        (logp.square().sum() - 0.3 * ent.sum()).backward()
        grads.append((logp.detach(), ent.detach(), hidden.grad, weight.grad, None if b is None else b.grad))
    (lp0, en0, *g0), (lp1, en1, *g1) = grads
    assert torch.allclose(lp0, lp1, atol=1e-5) and torch.allclose(en0, en1, atol=1e-5)
    for a, c in zip(g0, g1, strict=True):
        assert (a is None) == (c is None)
        if a is not None:
            assert torch.allclose(a, c, atol=1e-5), (a - c).abs().max()


def test_fused_chunks_that_do_not_divide_the_positions():
    """A large vocabulary: the log-softmax runs a few positions at a time inside each matmul chunk, and
    neither chunking divides M evenly."""
    for chunk_size in (None, 33):
        results = []
        for fused in (False, True):
            hidden, weight, b, labels = layer_inputs(M=75, H=4, V=50_000, seed=8)
            if fused:
                logp, ent = linear_logprobs_and_entropy(hidden, weight, b, labels, temperature=1.0,
                                                        compute_entropy=True, chunk_size=chunk_size)
            else:
                logp, ent = token_logprobs_and_entropy(torch.nn.functional.linear(hidden, weight, b), labels,
                                                       temperature=1.0, compute_entropy=True)
            (logp.sum() + ent.sum()).backward()
            results.append((logp.detach(), ent.detach(), hidden.grad, weight.grad))
        for a, c in zip(*results, strict=True):
            assert torch.allclose(a, c, atol=1e-5), (a - c).abs().max()


def test_fused_logp_only_and_frozen_weight():
    """Entropy unused (None upstream), a frozen output layer: only the hidden states get a gradient."""
    hidden, weight, b, labels = layer_inputs(seed=4)
    weight.requires_grad_(False)
    b.requires_grad_(False)
    logp, ent = linear_logprobs_and_entropy(hidden, weight, b, labels, temperature=1.0, compute_entropy=False)
    assert ent is None
    logp.sum().backward()
    h2 = hidden.detach().clone().requires_grad_(True)
    want, _ = plain(torch.nn.functional.linear(h2, weight, b), labels, 1.0)
    want.sum().backward()
    assert torch.allclose(logp, want, atol=1e-5) and torch.allclose(hidden.grad, h2.grad, atol=1e-5)
    _, ent = linear_logprobs_and_entropy(hidden, weight, b, labels, temperature=1.0, compute_entropy=True,
                                         entropy_requires_grad=False)
    assert not ent.requires_grad


def test_fused_bf16_matches_the_bf16_logits_path():
    """In bf16 the fused path rounds like the logits path (logits in bf16, reduced in float32); the
    weight gradient is accumulated in float32 over the chunks."""
    hidden, weight, b, labels = layer_inputs(M=40, seed=6, dtype=torch.bfloat16)
    logp, ent = linear_logprobs_and_entropy(hidden, weight, b, labels, temperature=1.0, compute_entropy=True,
                                            chunk_size=8)
    want_logp, want_ent = token_logprobs_and_entropy(torch.nn.functional.linear(hidden, weight, b), labels,
                                                     temperature=1.0, compute_entropy=True)
    assert logp.dtype == torch.float32
    assert torch.allclose(logp, want_logp, atol=1e-6) and torch.allclose(ent, want_ent, atol=1e-6)
    logp.sum().backward()
    assert weight.grad.dtype == torch.bfloat16 and hidden.grad.dtype == torch.bfloat16


def test_fused_bad_arguments_are_named():
    hidden, weight, b, labels = layer_inputs()
    with pytest.raises(ValueError, match="temperature"):
        linear_logprobs_and_entropy(hidden, weight, b, labels, temperature=0.0, compute_entropy=False)
    with pytest.raises(ValueError, match="weight_VH"):
        linear_logprobs_and_entropy(hidden, weight.t(), b, labels, temperature=1.0, compute_entropy=False)
    with pytest.raises(ValueError, match="labels_M"):
        linear_logprobs_and_entropy(hidden, weight, b, labels[:-1], temperature=1.0, compute_entropy=False)
    with pytest.raises(ValueError, match="chunk_size"):
        linear_logprobs_and_entropy(hidden, weight, b, labels, temperature=1.0, compute_entropy=False, chunk_size=0)
