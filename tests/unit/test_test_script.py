"""scripts/test.sh, the README's test command: the unit tier on two processes (pytest-xdist), the tiers
that start the real stack one test at a time, every argument passed to both, and exit codes CI reads.
Run here against a stand-in pytest that records its arguments (nothing is installed or run)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAKE_PYTHON = """#!/usr/bin/env bash
# stand-in for .venv/bin/python -m pytest: record the arguments, exit as the test asks
shift 2
echo "$*" >> "$LOG"
case " $* " in
  *" tests/unit "*) exit "${RC_UNIT:-0}" ;;
  *) exit "${RC_REST:-0}" ;;
esac
"""


def run_script(tmp_path: Path, *args: str, rc_unit: int = 0, rc_rest: int = 0) -> tuple[int, list[str]]:
    repo = tmp_path / "repo"
    if not repo.exists():
        (repo / "scripts").mkdir(parents=True)
        shutil.copy(ROOT / "scripts" / "test.sh", repo / "scripts" / "test.sh")
        (repo / "scripts" / "setup.sh").write_text("exit 0\n")  # set up already
        (repo / ".venv" / "bin").mkdir(parents=True)
        py = repo / ".venv" / "bin" / "python"
        py.write_text(FAKE_PYTHON)
        py.chmod(0o755)
        for tier in ("unit", "e2e", "ray"):
            (repo / "tests" / tier).mkdir(parents=True)
        (repo / "tests" / "unit" / "test_x.py").write_text("")
    log = tmp_path / "calls.log"
    log.unlink(missing_ok=True)
    env = dict(os.environ, LOG=str(log), RC_UNIT=str(rc_unit), RC_REST=str(rc_rest))
    proc = subprocess.run(["bash", str(repo / "scripts" / "test.sh"), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    return proc.returncode, log.read_text().splitlines() if log.exists() else []


def test_the_suite_runs_the_unit_tier_on_two_processes_and_the_rest_one_at_a_time(tmp_path):
    rc, calls = run_script(tmp_path, "-q", "-p", "no:cacheprovider", "--durations=40")
    assert rc == 0
    assert calls == ["tests/unit -n 2 -q -p no:cacheprovider --durations=40",
                     "tests --ignore=tests/unit -q -p no:cacheprovider --durations=40"]


@pytest.mark.parametrize("rc_unit, rc_rest, expected", [
    (1, 0, 1), (0, 1, 1), (2, 1, 2),  # a failure in either session fails the suite (the first one's code)
    (5, 0, 0), (0, 5, 0),  # one session deselected everything: the other one ran tests
    (5, 5, 5),  # no test at all: .ci/run reports "no tests collected"
])
def test_the_exit_code_is_the_first_failure_and_5_only_when_nothing_ran(tmp_path, rc_unit, rc_rest, expected):
    rc, calls = run_script(tmp_path, "-k", "frozen", rc_unit=rc_unit, rc_rest=rc_rest)
    assert rc == expected and len(calls) == 2, calls  # the second session runs after a failed first one
    assert all(c.endswith("-k frozen") for c in calls), calls


def test_quick_is_the_unit_tier_and_explicit_paths_run_exactly_what_is_asked(tmp_path):
    assert run_script(tmp_path, "--quick", "-x") == (0, ["tests/unit -n 2 -x"])
    assert run_script(tmp_path, "tests/e2e", "-q") == (0, ["tests/e2e -q"])
    assert run_script(tmp_path, "-q", "tests/unit/test_x.py::test_a", rc_rest=3) == (
        3, ["-q tests/unit/test_x.py::test_a"])  # its exit code, as it is
    # an option's value is not a test path, even where a file of that name exists
    assert run_script(tmp_path, "-k", "tests", rc_unit=1)[0] == 1


def test_the_test_extra_installs_pytest_xdist():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    assert any(e.startswith("pytest-xdist") for e in extras), extras
