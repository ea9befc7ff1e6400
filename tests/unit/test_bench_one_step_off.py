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
