"""Process-supervision GRPO end to end: per-step rewards from a user function drive the update."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.e2e.helpers import base_args, read_metrics, run_main

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent


def test_grpo_process_trains(tiny_model_dir, reverse_data, tmp_path):
    out = tmp_path / "run"
    args = [a for a in base_args(tiny_model_dir, reverse_data, out, steps=2) if not a.startswith("trainer.n_gpus_per_node")]
    args += ["trainer.n_gpus_per_node=1", "algorithm.adv_estimator=grpo_process",
             f"custom_reward_function.path={HERE / 'reward_process.py'}", "data.max_response_length=16",
             "trainer.val_before_train=false", "trainer.test_freq=-1"]
    proc = run_main(args)
    assert proc.returncode == 0, proc.stderr[-4000:]
    m = read_metrics(out)
    assert sorted(m) == [1, 2]
    for r in m.values():
        assert math.isfinite(r["actor/pg_loss"]) and math.isfinite(r["critic/advantages/mean"])
    assert any(r["critic/advantages/max"] > 0 for r in m.values())
