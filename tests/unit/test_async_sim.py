"""The async training simulator: hand-computable step times, the staleness bound, the long-tail effect."""

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "bench"))
import async_sim as sim  # noqa: E402

HW = sim.Hardware(decode_s_per_token=0.01, prefill_s=0.0, slots=4, train_s_per_token=0.001)


def test_constant_lengths_one_step_off_is_max_of_gen_and_train():
    w = sim.Workload(samples=16, mean_len=100, sigma=0.0, max_len=1000)
    # 16 samples on 2 devices x 4 slots: 2 waves of 100 tokens x 0.01 s = 2 s of generation;
    # 1600 tokens x 0.001 s on 2 trainer devices = 0.8 s of update
    sync = sim.simulate_sync(w, HW, rollout_devices=2, trainer_devices=2)
    off = sim.simulate_one_step_off(w, HW, rollout_devices=2, trainer_devices=2)
    assert sync.step_s == pytest.approx(2.0 + 0.8)
    assert off.step_s == pytest.approx(max(2.0, 0.8))
    assert off.age_max == 1 and sync.age_max == 0


def test_staleness_zero_fully_async_equals_synchronous():
    w = sim.Workload(samples=64, mean_len=300, sigma=1.0, max_len=4000, prompt_len=20)
    hw = sim.Hardware(decode_s_per_token=0.01, prefill_s=0.1, slots=4, train_s_per_token=0.001, sync_s=0.5)
    cfg = sim.AsyncConfig(mini_batch=64, require_batches=1, trigger_parameter_sync_step=1, staleness_threshold=0.0)
    a = sim.simulate_fully_async(w, hw, cfg, rollout_devices=2, trainer_devices=2, windows=2, seed=3)
    # the async run draws its lengths from the same stream: its second window is the sync run's second step
    lengths = sim.draw_lengths(w, 64 * 2, seed=3)[64:]
    gen, _ = sim.gen_makespan(lengths, 2, hw)
    upd, _ = sim.update_s(float(lengths.sum() + 20 * 64), 2, hw, recompute_logprob=False)
    assert a.step_s == pytest.approx(gen + upd + 0.5)
    assert a.age_max == 0


@pytest.mark.parametrize("staleness", [0.0, 0.3, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("seed", range(4))
def test_staleness_bound_never_exceeded(staleness, seed):
    w = sim.Workload(samples=32, mean_len=200, sigma=1.2, max_len=5000)
    cfg = sim.AsyncConfig(mini_batch=8, require_batches=1, trigger_parameter_sync_step=2,
                          staleness_threshold=staleness)
    ages: list[int] = []
    sim.simulate_fully_async(w, HW, cfg, rollout_devices=2, trainer_devices=1, windows=6, seed=seed,
                             record_ages=ages)
    assert ages and min(ages) >= 0
    assert max(ages) <= math.ceil(staleness)


def test_long_tails_widen_the_async_advantage():
    hw = sim.Hardware(decode_s_per_token=0.005, prefill_s=0.0, slots=16, train_s_per_token=0.0002)
    cfg = sim.AsyncConfig(mini_batch=64, require_batches=1, trigger_parameter_sync_step=4,
                          staleness_threshold=0.5, partial_rollout=True)

    def speedup(sigma):
        w = sim.Workload(samples=256, mean_len=500, sigma=sigma, max_len=8000)
        return (sim.simulate_sync(w, hw, 8).step_s
                / sim.simulate_fully_async(w, hw, cfg, 4, 4, seed=1).step_s)

    assert speedup(1.2) > speedup(0.05) * 1.2


def test_fit_reads_back_the_phase_times(tmp_path):
    rows = [{"timing_s/gen": 10.0, "timing_s/update_actor": 4.0, "timing_s/update_weights": 0.5,
             "response_length/mean": 100.0, "response_length/max": 400.0, "prompt_length/mean": 50.0}] * 3
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    w, hw = sim.fit_hardware(sim.read_phase_times(path), devices=2, samples=16)
    assert hw.decode_s_per_token == pytest.approx(10.0 / 400)
    assert hw.train_s_per_token == pytest.approx(4.0 * 2 / (16 * 150))
    assert hw.sync_s == 0.5 and w.max_len == 400 and w.sigma > 0


def test_missing_phase_times_are_named(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"timing_s/gen": 1.0}\n')
    with pytest.raises(ValueError, match="update_actor"):
        sim.read_phase_times(path)
