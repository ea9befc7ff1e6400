"""The update loop shared by the FSDP2 actor, the critic and the in-process API (grpo_dist/training/update.py),
in one process: the passes over mini-batches, and one optimizer step with its skip on a non-finite norm."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from grpo_dist.training.update import clip_and_step, local_grad_norm, run_mini_batches


def test_run_mini_batches_visits_every_mini_batch_once_per_epoch_in_order():
    seen = []

    def step(rows):
        seen.append(rows.tolist())
        return {"x": float(rows.sum()), "y": 1.0}, rows[0].item() != 2

    minis = [[0, 1], [2, 3], [4, 5]]
    means, skipped = run_mini_batches(step, minis, epochs=2)
    assert seen == minis + minis
    assert means == {"x": pytest.approx((1 + 5 + 9) * 2 / 6), "y": 1.0}
    assert skipped == 2  # the mini-batch starting at row 2, in each epoch


def test_run_mini_batches_shuffles_only_within_a_mini_batch():
    seen = []

    def step(rows):
        seen.append(rows.tolist())
        return {}, True

    minis = [torch.arange(0, 8), torch.arange(8, 16)]
    run_mini_batches(step, minis, epochs=2, shuffle=torch.Generator().manual_seed(0))
    assert [sorted(r) for r in seen] == [list(range(8)), list(range(8, 16))] * 2
    assert seen[0] != list(range(8)) or seen[1] != list(range(8, 16)), "the generator should permute the rows"
    again = []
    run_mini_batches(lambda rows: (again.append(rows.tolist()), ({}, True))[1], minis, epochs=2,
                     shuffle=torch.Generator().manual_seed(0))
    assert again == seen  # seeded: the same permutation on every rank


def _model_with_grad(scale: float) -> nn.Linear:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    model(torch.ones(1, 3)).sum().mul(scale).backward()
    return model


def test_clip_and_step_clips_to_max_norm_and_reports_the_norm_before():
    model = _model_with_grad(10.0)
    grads = [p.grad.clone() for p in model.parameters()]
    want = math.sqrt(sum(float((g**2).sum()) for g in grads))
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    norm, finite = clip_and_step(model, opt, 1.0)
    assert finite and norm == pytest.approx(want)
    # SGD with lr 1 moves each weight by its clipped gradient: g * (1 / norm)
    for p, b, g in zip(model.parameters(), before, grads, strict=True):
        assert torch.allclose(b - p.detach(), g / want, atol=1e-6)
        assert p.grad is None  # zeroed for the next mini-batch


def test_clip_and_step_skips_a_non_finite_step_and_keeps_the_weights():
    model = _model_with_grad(1.0)
    model.weight.grad[0, 0] = float("nan")
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    norm, finite = clip_and_step(model, opt, 1.0)
    assert not finite and math.isnan(norm)
    assert all(torch.equal(p.detach(), b) for p, b in zip(model.parameters(), before, strict=True))
    assert all(p.grad is None for p in model.parameters())


def test_grad_norm_without_clipping_and_without_gradients():
    model = _model_with_grad(10.0)
    want = math.sqrt(sum(float((p.grad**2).sum()) for p in model.parameters()))
    grads = [p.grad.clone() for p in model.parameters()]
    assert local_grad_norm(model, 0.0) == pytest.approx(want)
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads, strict=True))  # not clipped
    assert local_grad_norm(nn.Linear(2, 2), 1.0) == 0.0
