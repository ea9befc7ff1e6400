"""scripts/bench/long_run.py: the windows of its table (time, learning, memory), the memory growth it reports, and
that the keys it adds to a job leave a valid run of the default job."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench"
sys.path.insert(0, str(BENCH))

import long_run as bench  # noqa: E402


def result(steps: int, step_s, memory) -> dict:
    """A run of ``steps`` steps (a step-0 validation row first) sampled once per step: ``step_s(k)`` its time,
    ``memory(k)`` the roles' MiB while step ``k`` was the newest."""
    metrics = [{"step": 0, "val-core/x/acc/mean@1": 0.1}]
    metrics += [{"step": k, "timing_s/step": step_s(k), "timing_s/gen": step_s(k) / 4} for k in range(1, steps + 1)]
    samples = [[float(k), k, memory(k)] for k in range(1, steps + 1)]
    return {"samples": samples, "metrics": metrics, "returncode": 0, "args": ["trainer.total_training_steps=%d" % steps]}


def test_windows_take_each_windows_median_and_the_memory_at_its_end():
    r = result(10, step_s=lambda k: float(k), memory=lambda k: {"ModelWorker": 100.0 + k, "RolloutWorker": 200.0})
    rows = bench.windows(r, 4)
    assert [(w["first"], w["last"]) for w in rows] == [(1, 4), (5, 8), (9, 10)]  # the validation row is no step
    assert [w["phases"]["timing_s/step"] for w in rows] == [2.5, 6.5, 9.5]
    assert [w["phases"]["timing_s/gen"] for w in rows] == [0.625, 1.625, 2.375]
    # the memory at each window's last sample; the sample at step 10, the run's last, saw the run's end
    assert [w["memory"]["ModelWorker"] for w in rows] == [104.0, 108.0, 109.0]
    assert [w["memory_step"] for w in rows] == [4, 8, 9]


def test_growth_counts_from_the_end_of_the_warm_up_window_and_over_the_second_half():
    # the rollout: 50 MiB while warming up (steps 1-4), then 1 MiB a step (a leak); the model worker: 20 MiB
    # more by step 8 (a cache filling), then flat
    def memory(k):
        return {"RolloutWorker": 100.0 + 50 * min(k, 4) / 4 + max(0, k - 4), "ModelWorker": 300.0 + 5 * min(k, 8),
                "main process": 600.0}

    r = result(16, step_s=lambda k: 1.0, memory=memory)
    rows = bench.windows(r, 4)  # samples at steps 4, 8, 12, 15
    first, last, grown = bench.growth(rows)
    assert (first, last) == (4, 15)
    assert grown["RolloutWorker"] == pytest.approx((11.0, 100.0))
    assert grown["ModelWorker"] == pytest.approx((20.0, 2000 / 11))
    assert grown["main process"] == (0.0, 0.0)
    first, last, grown = bench.growth(rows, "half")  # from the sample of the window halfway (step 8)
    assert (first, last) == (8, 15)
    assert grown["RolloutWorker"] == pytest.approx((7.0, 100.0)) and grown["ModelWorker"] == (0.0, 0.0)
    text = bench.render(r, 4)
    assert ("memory after the first window (step 4 to step 15): main process +0 MiB (+0.0 MiB per 100 steps); "
            "ModelWorker +20 MiB (+181.8 MiB per 100 steps); RolloutWorker +11 MiB (+100.0 MiB per 100 steps)") in text
    assert "memory over the second half (step 8 to step 15): main process +0 MiB" in text
    assert "median step: 1.000 s in steps 5-8, 1.000 s in steps 13-16 (1.00x)" in text


def test_a_window_without_a_sample_leaves_its_memory_cells_empty():
    r = result(6, step_s=lambda k: 1.0, memory=lambda k: {"ModelWorker": 100.0})
    r["samples"] = [s for s in r["samples"] if s[1] > 3]  # nothing sampled during steps 1-3
    rows = bench.windows(r, 3)
    assert rows[0]["memory"] is None and rows[1]["memory"] == {"ModelWorker": 100.0}
    assert bench.growth(rows) == (0, 0, {})  # one window with a sample: no growth to report
    assert "| 1-3 | 1.000 | 0.250 |  |" in bench.render(r, 3)


def test_the_keys_it_adds_leave_a_valid_default_job():
    from tests.configs import cfg_of

    cfg = cfg_of("trainer.total_training_steps=400", *bench.QUIET, "trainer.default_local_dir=/tmp/long_run/run")
    assert cfg.trainer.test_freq == -1 and cfg.trainer.val_before_train is False and cfg.trainer.save_freq == -1


def test_windows_show_how_the_policy_learns():
    """The window's mean score, share of groups with no learning signal and entropy: a collapse shows."""
    r = result(8, step_s=lambda k: 1.0, memory=lambda k: {"ModelWorker": 100.0})
    for m in r["metrics"][1:]:
        k = m["step"]
        m.update({"critic/score/mean": 0.5 if k <= 4 else 0.0, "training/zero_advantage_group_ratio": 0.4 if k <= 4 else 1.0,
                  "actor/entropy": 0.3 if k <= 4 else 0.01 * k})
    rows = bench.windows(r, 4)
    assert rows[1]["learning"] == pytest.approx({"critic/score/mean": 0.0, "training/zero_advantage_group_ratio": 1.0,
                                                 "actor/entropy": 0.065})
    text = bench.render(r, 4)
    assert "| steps | step s | gen s | score | no-signal groups | entropy | ModelWorker MiB |" in text
    assert "| 1-4 | 1.000 | 0.250 | 0.5 | 0.4 | 0.3 | 100 |" in text and "| 5-8 | 1.000 | 0.250 | 0 | 1 | 0.065 | 100 |" in text
