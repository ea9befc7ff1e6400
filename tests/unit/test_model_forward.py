"""The shared model-forward path: packed (per-sequence SDPA, no [N, N] mask) equals padded in values and
gradients for the policy's log-probs (plain and fused heads, tied and untied output layers) and for a
value head; outputs at arbitrary positions (a reward model's last token) equal a plain forward."""

from __future__ import annotations

import pytest
import torch

import grpo_dist.training.attention as attention
from grpo_dist.training.attention import VARLEN_SDPA, cu_seq_lens_from_position_ids
from grpo_dist.training.critic import forward_values
from grpo_dist.training.model_forward import forward_at, pack_rows
from grpo_dist.training.policy import forward_logprobs, supports_fused_head

V = 96


def qwen2(attn: str, *, tied: bool = False, heads: int = 4, kv_heads: int = 2, token_classification: bool = False):
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForTokenClassification

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, head_dim=32, intermediate_size=96, tie_word_embeddings=tied,
                         attn_implementation=attn, num_labels=1)
    cls = Qwen2ForTokenClassification if token_classification else Qwen2ForCausalLM
    model = cls(config).eval()
    for module in model.modules():  # dropout off, as the model builder does
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    with torch.no_grad():  # non-zero biases: a mis-indexed bias cannot look right by accident
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.05)
    return model


def llama_tied(attn: str):
    """SmolLM2's shape of model: Llama with the output layer tied to the input embeddings."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    config = LlamaConfig(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=32, intermediate_size=96, tie_word_embeddings=True,
                         attn_implementation=attn)
    model = LlamaForCausalLM(config).eval()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    return model


def batch(prompt_lengths, response_lengths, P=7, R=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    B = len(prompt_lengths)
    ids = torch.randint(0, V, (B, P + R), generator=g)
    am = torch.zeros(B, P + R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lengths, response_lengths, strict=True)):
        am[i, P - p : P + r] = 1
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    return ids, am, pos, am[:, P:].bool()


SHAPES = [([2, 7, 3, 5], [6, 1, 4, 0]), ([7], [6]), ([1, 1, 6], [6, 6, 2])]


def policy_loss_and_grads(model, ids, am, pos, m, **kw):
    model.zero_grad(set_to_none=True)
    logp, ent = forward_logprobs(model, ids, am, pos, response_length=m.shape[1], temperature=0.8,
                                 compute_entropy=True, **kw)
    (-(logp * m).sum() - 0.1 * (ent * m).sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), ent.detach(), grads


def assert_same(a, b, m, atol=2e-5):
    (lp0, en0, g0), (lp1, en1, g1) = a, b
    assert (lp0 - lp1)[m].abs().max() < atol and (en0 - en1)[m].abs().max() < atol
    assert torch.all(lp1[~m] == 0) and torch.all(en1[~m] == 0)
    assert g0.keys() == g1.keys() and g0
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], atol=atol, rtol=1e-4, msg=name)


def test_cu_seq_lens_from_position_ids():
    assert cu_seq_lens_from_position_ids(torch.tensor([[0, 1, 2, 0, 1, 0]])).tolist() == [0, 3, 5, 6]
    assert cu_seq_lens_from_position_ids(torch.tensor([[0, 1, 2, 3]])).tolist() == [0, 4]
    ids, am, pos, _ = batch([2, 7, 3], [6, 0, 4])
    packed = pack_rows(ids, am, pos)
    assert packed.cu_seq_lens.tolist() == [0, 8, 15, 22] and packed.max_len == 8
    assert torch.equal(cu_seq_lens_from_position_ids(packed.position_ids_1N), packed.cu_seq_lens)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("attn", [VARLEN_SDPA, "sdpa", "eager"])
def test_packed_policy_forward_equals_padded(attn, shape):
    """Every attention kernel, grouped-query heads: the packed path gives the padded path's log-probs,
    entropies and parameter gradients."""
    model = qwen2(attn).train()
    ids, am, pos, m = batch(*shape, seed=len(shape[0]))
    padded = policy_loss_and_grads(model, ids, am, pos, m, remove_padding=False)
    packed = policy_loss_and_grads(model, ids, am, pos, m, remove_padding=True)
    assert_same(padded, packed, m)


def test_varlen_sdpa_attends_one_sequence_at_a_time(monkeypatch):
    """The packed row's attention runs one causal SDPA per sequence (no call sees the whole row) and
    no [N, N] mask is built."""
    model = qwen2(VARLEN_SDPA)
    ids, am, pos, m = batch([2, 7, 3, 5], [6, 1, 4, 2])
    lengths = am.sum(-1).tolist()
    seen = []
    real_sdpa = attention.F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append((q.shape[2], kw.get("attn_mask"), kw.get("is_causal")))
        return real_sdpa(q, k, v, **kw)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    with torch.no_grad():
        forward_logprobs(model, ids, am, pos, response_length=6, temperature=1.0, compute_entropy=False,
                         remove_padding=True)
    assert [n for n, _, _ in seen] == lengths * 2  # 2 layers, one call per sequence
    assert all(mask is None and causal for _, mask, causal in seen)


def _kernel_stand_in(window_api: bool, gqa_api: bool, calls: list):
    """A CPU stand-in for torch's CUDA variable-length kernel with either keyword set: [N, H, D] inputs,
    per-sequence SDPA, the causal flag read from ``window_size`` or ``is_causal``."""
    def kernel(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, **kw):
        assert torch.equal(cu_q, cu_k) and max_q == max_k and cu_q.dtype == torch.int32
        causal = kw["window_size"] == (-1, 0) if window_api else kw["is_causal"]
        gqa = bool(kw.get("enable_gqa", False))
        assert gqa_api or (not gqa and q.shape[1] == k.shape[1])  # heads repeated when it cannot share them
        calls.append((q.shape, k.shape, causal, max_q))
        cu = cu_q.tolist()
        outs = [torch.nn.functional.scaled_dot_product_attention(
            q[a:b].transpose(0, 1), k[a:b].transpose(0, 1), v[a:b].transpose(0, 1), is_causal=causal, scale=scale,
            enable_gqa=gqa).transpose(0, 1) for a, b in zip(cu, cu[1:])]
        return torch.cat(outs, dim=0)

    names = {"scale", "window_size" if window_api else "is_causal"} | ({"enable_gqa"} if gqa_api else set())
    return kernel, frozenset(names)


@pytest.mark.parametrize("window_api,gqa_api", [(True, True), (True, False), (False, False)])
def test_packed_forward_through_the_cuda_kernel_equals_the_loop(monkeypatch, window_api, gqa_api):
    """Where the CUDA kernel takes the query (monkeypatched here: CUDA, half precision), the packed
    forward calls it once per layer with the row's boundaries, whichever keywords this torch's kernel has
    (torch 2.10's ``is_causal``, 2.11's ``window_size``, with or without grouped-query heads), and gives
    the per-sequence loop's log-probs and gradients."""
    model = qwen2(VARLEN_SDPA).train()
    ids, am, pos, m = batch([2, 7, 3, 5], [6, 1, 4, 2])
    loop = policy_loss_and_grads(model, ids, am, pos, m, remove_padding=True)
    calls: list = []
    monkeypatch.setattr(attention, "_cuda_varlen", lambda: _kernel_stand_in(window_api, gqa_api, calls))
    monkeypatch.setattr(attention, "_flash_fits", lambda q: True)
    kernel = policy_loss_and_grads(model, ids, am, pos, m, remove_padding=True)
    assert len(calls) == 2  # one call per layer (2 layers), none per sequence
    n = int(am.sum())
    assert all(qs[0] == n and causal and mx == int(am.sum(-1).max()) for qs, _, causal, mx in calls)
    assert_same(loop, kernel, m)


@pytest.mark.skipif(not torch.cuda.is_available() or attention._cuda_varlen() is None,
                    reason="needs CUDA and torch's variable-length attention kernel")
def test_cuda_kernel_equals_the_loop_on_a_gpu(monkeypatch):
    """On a GPU, in bf16: the packed forward through torch's variable-length kernel gives the
    per-sequence loop's log-probs, entropies and gradients (to bf16 rounding)."""
    model = qwen2(VARLEN_SDPA).train().to("cuda", torch.bfloat16)
    ids, am, pos, m = (t.cuda() for t in batch([2, 7, 3, 5, 40], [6, 1, 4, 2, 30], P=40, R=30))
    kernel = policy_loss_and_grads(model, ids, am, pos, m, remove_padding=True)
    monkeypatch.setattr(attention, "_flash_fits", lambda q: False)
    loop = policy_loss_and_grads(model, ids, am, pos, m, remove_padding=True)
    (lp0, en0, g0), (lp1, en1, g1) = loop, kernel
    assert (lp0 - lp1)[m].abs().max() < 0.05 and (en0 - en1)[m].abs().max() < 0.05
    for name in g0:
        err = (g1[name].float() - g0[name].float()).norm() / g0[name].float().norm().clamp_min(1e-6)
        assert err < 0.05, name


def test_flash_kernel_only_for_cuda_half_precision():
    q = torch.zeros(1, 4, 10, 16)
    assert not attention._flash_fits(q)  # CPU
    assert not attention._flash_fits(q.bfloat16())


@pytest.mark.parametrize("remove_padding", [False, True])
@pytest.mark.parametrize("make", [lambda: qwen2(VARLEN_SDPA), lambda: qwen2(VARLEN_SDPA, tied=True),
                                  lambda: llama_tied(VARLEN_SDPA)], ids=["qwen2", "qwen2_tied", "llama_tied"])
def test_fused_head_equals_the_logits_path(make, remove_padding):
    """Log-probs and entropy from the hidden states (no logits) equal the logits path in values and
    gradients, including a tied output layer (whose gradient is the sum of both uses)."""
    model = make().train()
    assert supports_fused_head(model)
    ids, am, pos, m = batch([2, 7, 3, 5], [6, 1, 4, 3], seed=4)
    plain = policy_loss_and_grads(model, ids, am, pos, m, remove_padding=remove_padding)
    for chunk in (None, 5):
        fused = policy_loss_and_grads(model, ids, am, pos, m, remove_padding=remove_padding, fused=True,
                                      logits_chunk_size=chunk)
        assert_same(plain, fused, m)


def test_fused_head_never_forms_logits(monkeypatch):
    """With the fused head the output layer's own forward is never run and no matmul with its weight
    covers more than one chunk of positions: no [M, V] tensor."""
    import grpo_dist.core.logprobs as logprobs

    model = qwen2(VARLEN_SDPA)
    layer_calls, matmul_rows = [], []
    real_forward, real_linear = torch.nn.Linear.forward, logprobs.F.linear

    def forward_spy(self, x):
        if self is model.lm_head:
            layer_calls.append(tuple(x.shape))
        return real_forward(self, x)

    def linear_spy(x, w, b=None):
        if w is model.lm_head.weight:
            matmul_rows.append(x.shape[0])
        return real_linear(x, w, b)

    monkeypatch.setattr(torch.nn.Linear, "forward", forward_spy)
    monkeypatch.setattr(logprobs.F, "linear", linear_spy)
    ids, am, pos, m = batch([2, 7], [6, 3])
    logp, ent = forward_logprobs(model, ids, am, pos, response_length=6, temperature=1.0, compute_entropy=True,
                                 fused=True, logits_chunk_size=4)
    (logp.sum() + ent.sum()).backward()
    assert layer_calls == []
    assert matmul_rows and max(matmul_rows) <= 4 and sum(matmul_rows) == 2 * int(m.sum())  # forward + backward
    forward_logprobs(model, ids, am, pos, response_length=6, temperature=1.0, compute_entropy=True)
    assert layer_calls == [(int(m.sum()), 64)], "the logits path runs the layer on the response positions only"


def test_a_soft_capped_model_is_not_fused():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(vocab_size=V, hidden_size=32, num_hidden_layers=1, num_attention_heads=1,
                          num_key_value_heads=1, head_dim=32, intermediate_size=32)
    assert not supports_fused_head(Gemma2ForCausalLM(config))


@pytest.mark.parametrize("shape", SHAPES)
def test_packed_values_equal_padded(shape):
    """The critic's value forward through the shared path: packed = padded in values and gradients,
    and equal to the head's output of a plain forward at the positions that predict the responses."""
    model = qwen2(VARLEN_SDPA, token_classification=True).train()
    ids, am, pos, m = batch(*shape, seed=3)
    R = m.shape[1]
    results = []
    for remove_padding in (False, True):
        model.zero_grad(set_to_none=True)
        v = forward_values(model, ids, am, pos, response_length=R, remove_padding=remove_padding)
        (v * m).square().sum().backward()
        results.append((v.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (v0, g0), (v1, g1) = results
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=am, position_ids=pos).logits[:, -R - 1 : -1, 0]
    assert (v0 - want)[m].abs().max() < 1e-5 and (v1 - want)[m].abs().max() < 1e-5
    assert torch.all(v1[~m] == 0)
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], atol=2e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("remove_padding", [False, True])
def test_outputs_at_any_position(remove_padding):
    """A reward model's read: the score head at each response's last token, in both layouts."""
    model = qwen2(VARLEN_SDPA, token_classification=True)
    ids, am, pos, m = batch([2, 7, 3], [6, 2, 4], seed=5)
    rows = torch.arange(3)
    last = am.shape[1] - 1 - am.flip(-1).int().argmax(-1)  # last attended column of each row
    with torch.no_grad():
        got = forward_at(model, ids, am, pos, rows, last, remove_padding=remove_padding)
        plain = model(input_ids=ids, attention_mask=am, position_ids=pos).logits
    assert got.shape == (3, 1)
    torch.testing.assert_close(got[:, 0], plain[rows, last, 0], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"position \(row 0, column 0\) is padding"):
        forward_at(model, ids, am, pos, torch.tensor([0]), torch.tensor([0]), remove_padding=remove_padding)
