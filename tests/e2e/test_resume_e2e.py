"""Stopping and resuming does not change the run: 4 steps at once == 2 steps, then resume to 4."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from tests.e2e.conftest import RESUME_ARGS
from tests.e2e.helpers import base_args, read_metrics, run_main

pytestmark = pytest.mark.slow
COMPARE = ["critic/score/mean", "actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/entropy",
           "response_length/mean", "critic/advantages/mean"]


def test_resume_is_exact(full_run, tiny_model_dir, reverse_data, tmp_path):
    full, proc = full_run
    assert proc.returncode == 0, proc.stderr[-4000:]
    part = tmp_path / "part"
    p = run_main(base_args(tiny_model_dir, reverse_data, part, steps=2) + RESUME_ARGS)
    assert p.returncode == 0, p.stderr[-4000:]
    p = run_main(base_args(tiny_model_dir, reverse_data, part, steps=4) + RESUME_ARGS)
    assert p.returncode == 0, p.stderr[-4000:]
    assert "resumed from" in p.stdout and "global_step_2" in p.stdout

    a, b = read_metrics(full), read_metrics(part)
    assert sorted(a) == sorted(b) == [0, 1, 2, 3, 4]  # the resumed file holds each step once
    for step in (1, 2, 3, 4):
        for k in COMPARE:
            assert math.isclose(a[step][k], b[step][k], rel_tol=1e-4, abs_tol=1e-6), (step, k, a[step][k], b[step][k])
    wa = load_file(str(full / "global_step_4" / "huggingface" / "model.safetensors"))
    wb = load_file(str(part / "global_step_4" / "huggingface" / "model.safetensors"))
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-5, atol=1e-6)
