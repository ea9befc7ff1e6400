"""Stopping and resuming does not change the run: 4 steps at once == 2 steps, then resume to 4."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from tests.e2e.conftest import RESUME_ARGS, epoch_data
from tests.e2e.helpers import base_args, read_metrics, run_main

pytestmark = pytest.mark.slow
COMPARE = ["critic/score/mean", "actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/entropy",
           "response_length/mean", "critic/advantages/mean"]


def test_resume_is_exact(full_run, tiny_model_dir, reverse_data, tmp_path):
    full, proc = full_run
    assert proc.returncode == 0, proc.stderr[-4000:]
    part = tmp_path / "part"
    reverse_data = epoch_data(reverse_data, tmp_path)
    p = run_main(base_args(tiny_model_dir, reverse_data, part, steps=2) + RESUME_ARGS)
    assert p.returncode == 0, p.stderr[-4000:]
    # what a run killed while writing checkpoint 3 leaves behind: a half-written temporary folder
    (part / ".global_step_3.tmp" / "actor").mkdir(parents=True)
    (part / ".global_step_3.tmp" / "actor" / "half.bin").write_bytes(b"\0" * 10)
    p = run_main(base_args(tiny_model_dir, reverse_data, part, steps=4) + RESUME_ARGS)
    assert p.returncode == 0, p.stderr[-4000:]
    assert "resumed from" in p.stdout and "global_step_2" in p.stdout
    # a stale temporary folder (a run killed while saving) is never picked up, and is cleaned
    assert not list(part.glob(".global_step_*.tmp"))

    a, b = read_metrics(full), read_metrics(part)
    assert sorted(a) == sorted(b) == [0, 1, 2, 3, 4]  # the resumed file holds each step once
    # 8 prompts, 4 per step: the resumed run (stopped at an epoch boundary) goes on into epoch 1
    assert [b[s]["training/epoch"] for s in (1, 2, 3, 4)] == [0, 0, 1, 1]
    for step in (1, 2, 3, 4):
        for k in COMPARE:
            assert math.isclose(a[step][k], b[step][k], rel_tol=1e-4, abs_tol=1e-6), (step, k, a[step][k], b[step][k])
    wa = load_file(str(full / "global_step_4" / "huggingface" / "model.safetensors"))
    wb = load_file(str(part / "global_step_4" / "huggingface" / "model.safetensors"))
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-5, atol=1e-6)
