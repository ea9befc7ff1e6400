"""The start-up split (grpo_dist/utils/startup.py): the moments a process records, and the table read
back from a run's startup.json and metrics.jsonl."""

from __future__ import annotations

import json
import math

import pytest

from grpo_dist.utils import startup

DRIVER = {"pid": 1, "start": 1000.0, "marks": [["imports", 1002.0], ["configuration", 1002.5],
                                               ["ray started", 1005.0], ["workers started", 1011.0]]}
ROLLOUT = {"pid": 2, "start": 1005.5, "marks": [["engine built", 1010.5], ["constructor", 1006.5],
                                                ["torch imported", 1008.0]]}


@pytest.fixture
def clean_moments():
    saved = (list(startup._MARKS), dict(startup._PROCESSES))
    startup._MARKS.clear()
    startup._PROCESSES.clear()
    yield
    startup._MARKS[:], startup._PROCESSES = saved[0], saved[1]


def test_phases_run_from_the_moment_before_in_time_order():
    assert startup.phases(ROLLOUT) == [("constructor", 1.0, 1006.5), ("torch imported", 1.5, 1008.0),
                                       ("engine built", 2.5, 1010.5)]
    # a moment recorded before the process's start (the clock's 10 ms grain) is a phase of 0 s, not negative
    assert startup.phases({"start": 10.0, "marks": [["a", 9.99], ["b", 11.0]]}) == [("a", 0.0, 9.99), ("b", 1.0, 11.0)]


def test_rows_count_every_process_from_the_drivers_start_and_add_the_first_step():
    step = {"gen": 1.25, "ref": 0.5, "update_actor": 2.0, "step": 4.0, "gen/worker": 1.0}
    rows = startup.rows({"driver": DRIVER, "processes": {"rollout rank 0": ROLLOUT}}, step)
    assert rows[:4] == [("driver", "imports", 2.0, 2.0), ("driver", "configuration", 0.5, 2.5),
                        ("driver", "ray started", 2.5, 5.0), ("driver", "workers started", 6.0, 11.0)]
    assert rows[4:8] == [("rollout rank 0", "(process started)", 0.0, 5.5),
                         ("rollout rank 0", "constructor", 1.0, 6.5), ("rollout rank 0", "torch imported", 1.5, 8.0),
                         ("rollout rank 0", "engine built", 2.5, 10.5)]
    first = [(p, n, s) for p, n, s, _ in rows[8:]]
    assert first == [("first step", "gen", 1.25), ("first step", "ref", 0.5), ("first step", "update_actor", 2.0),
                     ("first step", "step (all phases)", 4.0)]
    assert rows[-1][3] == 15.0 and all(math.isnan(r[3]) for r in rows[8:-1])
    assert startup.time_to_first_step({"driver": DRIVER}) == 11.0


def test_a_run_that_never_got_its_workers_has_no_time_to_first_step():
    cut = {**DRIVER, "marks": DRIVER["marks"][:3]}
    assert startup.time_to_first_step({"driver": cut}) is None
    text = startup.table({"driver": cut, "processes": {}}, {"step": 3.0})
    assert "time to first step" not in text and "first step" not in text


def test_first_step_reads_step_1_of_metrics_jsonl(tmp_path):
    rows = [{"step": 0, "timing_s/testing": 9.0}, {"step": 1, "timing_s/gen": 1.5, "timing_s/step": 3.0, "actor/lr": 1.0},
            {"step": 2, "timing_s/gen": 7.0}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert startup.first_step(tmp_path / "metrics.jsonl") == {"gen": 1.5, "step": 3.0}
    assert startup.first_step(tmp_path / "missing.jsonl") == {}


def test_marks_are_kept_once_and_a_new_run_forgets_the_last_ones(clean_moments):
    startup.mark("imports")
    startup.mark("ray started")
    startup.mark("ray started")  # again: the later one counts
    startup.add_process("reward", ROLLOUT)
    names = [n for n, _ in startup.moments()["marks"]]
    assert names == ["imports", "ray started"]
    startup.run_begins()
    assert [n for n, _ in startup.moments()["marks"]] == ["imports"] and not startup._PROCESSES


def test_written_file_reads_back_as_the_table(tmp_path, clean_moments):
    startup.mark("configuration")
    startup.mark("workers started")
    startup.add_process("rollout rank 0", ROLLOUT)
    startup.write(tmp_path / "startup.json")
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "timing_s/gen": 0.75, "timing_s/step": 2.0}) + "\n")
    data, step = startup.read(tmp_path)
    assert data["driver"]["start"] <= data["driver"]["marks"][0][1]
    assert data["processes"] == {"rollout rank 0": ROLLOUT} and step == {"gen": 0.75, "step": 2.0}
    text = startup.table(data, step)
    assert "| rollout rank 0 | engine built | 2.50 |" in text
    assert "| first step | gen | 0.75 |  |" in text
    assert f"time to first step: {startup.time_to_first_step(data):.2f} s" in text


def test_the_script_pools_runs_into_medians(tmp_path, capsys):
    """scripts/bench/startup_split.py --render: each cell is the median over the runs of every file."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "bench"))
    import startup_split

    def run(shift: float, wall: float) -> dict:
        marks = [[n, t + shift] for n, t in DRIVER["marks"]]
        return {"wall": wall, "data": {"driver": {**DRIVER, "marks": marks}, "processes": {}}, "step": {"step": 2.0}}

    (tmp_path / "a.json").write_text(json.dumps({"default": [run(0.0, 20.0), run(3.0, 26.0)]}))
    (tmp_path / "b.json").write_text(json.dumps({"default": [run(1.0, 21.0)]}))
    assert startup_split.main(["--render", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    assert "### default (3 run(s); median)" in out
    assert "| driver | imports | 3.00 | 3.00 |" in out  # runs of 2, 3 and 5 s
    assert "| driver | workers started | 6.00 | 12.00 |" in out
    assert "time to first step: median 12.00 s (11.00, 14.00, 12.00); one-step job wall: median 21.00 s" in out


def test_a_process_start_is_read_to_the_clock_tick():
    """A child started now is found to have started now (within the kernel's 10 ms tick and the child's own
    start-up), not up to a second off as with whole-second boot times."""
    import subprocess
    import sys
    import time

    t0 = time.time()
    out = subprocess.run([sys.executable, "-c", "from grpo_dist.utils import startup; print(startup.process_start())"],
                         capture_output=True, text=True, check=True).stdout
    assert t0 - 0.05 <= float(out) <= time.time()
