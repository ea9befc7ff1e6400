"""Stopping and resuming does not change the run: 4 steps at once == 2 steps, then resume to 4, past a
newer checkpoint whose shard was damaged (the fallback to the previous intact checkpoint, end to end)."""

from __future__ import annotations

import math
import shutil

import pytest
import torch
from safetensors.torch import load_file

from grpo_dist.trainer import checkpoint
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
    # and a newer checkpoint damaged on disk: the step-4 checkpoint of the same run (the full run's), one
    # byte of its largest model/optimizer shard flipped, the file's size unchanged
    damaged = part / "global_step_4"
    shutil.copytree(full / "global_step_4", damaged)
    shard = max((damaged / "actor" / "dcp").glob("*.distcp"), key=lambda f: f.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    p = run_main(base_args(tiny_model_dir, reverse_data, part, steps=4) + RESUME_ARGS)
    assert p.returncode == 0, p.stderr[-4000:]
    rel = shard.relative_to(damaged).as_posix()
    assert (f"grpo_dist: warning: skipping the damaged checkpoint {damaged}: {rel} has changed since it was written "
            "(checksum)") in p.stderr, p.stderr[-4000:]
    assert f"resumed from {part / 'global_step_2'} (step 2)" in p.stdout
    # training went on from step 2 and wrote a new step-4 checkpoint over the damaged one, which verifies
    assert checkpoint.verify(damaged) is None and (damaged / checkpoint.MANIFEST_FILE).is_file()
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
