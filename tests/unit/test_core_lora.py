"""The merged LoRA weight against hand-computed values and a plain per-element loop."""

from __future__ import annotations

import pytest
import torch

from grpo_dist.core.lora import merge_lora


def test_merge_by_hand():
    w = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    a = torch.tensor([[1.0, -1.0]])  # r = 1
    b = torch.tensor([[2.0], [0.5]])
    # B @ A = [[2, -2], [0.5, -0.5]]; scale 0.5 -> [[1, -1], [0.25, -0.25]]
    assert merge_lora(w, a, b, 0.5).tolist() == [[2.0, 1.0], [3.25, 3.75]]


def test_merge_equals_a_plain_loop_and_keeps_the_dtype():
    g = torch.Generator().manual_seed(0)
    w, a, b = torch.randn(5, 4, generator=g), torch.randn(3, 4, generator=g), torch.randn(5, 3, generator=g)
    want = torch.empty(5, 4)
    for o in range(5):
        for i in range(4):
            want[o, i] = w[o, i] + 2.0 * sum(b[o, k] * a[k, i] for k in range(3))
    torch.testing.assert_close(merge_lora(w, a, b, 2.0), want)
    half = merge_lora(w.bfloat16(), a.bfloat16(), b.bfloat16(), 2.0)
    assert half.dtype == torch.bfloat16 and half.shape == (5, 4)
    with pytest.raises(ValueError, match="do not make a weight"):
        merge_lora(w, a, b.T, 2.0)
