"""The asynchronous modes' benchmark (scripts/bench/one_step_off.py): its learning table reads each mode's
held-out accuracy at every validated step across seeded runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "one_step_off.py"


def bench():
    spec = importlib.util.spec_from_file_location("one_step_off_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_learning_table_shows_each_modes_mean_and_range_per_validated_step():
    rows = [("colocated", 0, {"acc": {0: 0.1, 5: 0.3, 10: 0.4}}),
            ("one-step-off", 0, {"acc": {0: 0.1, 5: 0.25, 10: 0.35}}),
            ("colocated", 1, {"acc": {0: 0.2, 5: 0.2, 10: 0.6}})]
    lines = bench().learning_table(rows)
    assert lines[0] == "| mode | runs | acc @ step 0 | acc @ step 5 | acc @ step 10 |"
    assert lines[2] == "| colocated | 2 | 0.150 [0.100, 0.200] | 0.250 [0.200, 0.300] | 0.500 [0.400, 0.600] |"
    assert lines[3] == "| one-step-off | 1 | 0.100 [0.100, 0.100] | 0.250 [0.250, 0.250] | 0.350 [0.350, 0.350] |"


def test_a_run_without_validation_is_summarized_with_its_phases_over_the_steps_that_log_them():
    """The GPU workload validates nothing: no accuracy (nan), the rest as usual. A one-step-off run's last step
    syncs no weights (it starts no next batch), so the sync's median is over the steps that synced."""
    import math

    step = lambda s, sync: {"timing_s/step": 2.0 + s, "timing_s/wait_prev_gen": 0.5, "timing_s/gen/worker": 1.5,
                            "timing_s/update_actor": 1.0 * s, "response_length/mean": 40.0 + s,
                            **({"timing_s/update_weights": 0.1 * s} if sync else {})}
    metrics = {1: step(1, True), 2: step(2, True), 3: step(3, True), 4: step(4, False)}
    s = bench().summarize(metrics, wall=30.0, responses=256)
    assert math.isnan(s["acc_before"]) and math.isnan(s["acc_after"]) and s["acc"] == {}
    assert s["step_s"] == 5.0 and s["samples_per_s"] == 256 / 5.0 and s["trainer_idle"] == 0.5 / 5.0
    assert s["phases"] == {"gen/worker": 1.5, "wait_prev_gen": 0.5, "update_actor": 3.0,
                           "update_weights": 0.25}  # steps 2 and 3
    assert s["response_tokens"] == 43.0
