"""The benchmark in quick mode: grpo_dist through its entry point, TRL (when installed), bare vLLM and
the bare torch loop on the tiny workload, 2 steps, 1 repetition; the report table is printed."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "bench"))

import bench_report as report  # noqa: E402


def _row(text: str, first_cells: list[str]) -> list[str]:
    """Cells of the markdown table row whose first cells are ``first_cells``."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[: len(first_cells)] == first_cells:
            return cells
    raise AssertionError(f"no table row starting with {first_cells}:\n{text}")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_benchmark_prints_the_tables(tmp_path):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench" / "run_bench.py"), "--quick", "--out",
                           str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    for columns in (report.COMPARE_COLUMNS, report.PHASE_COLUMNS, report.TARGET_COLUMNS):
        assert "| " + " | ".join(columns) + " |" in out, out
    assert (tmp_path / "report.md").read_text().strip() in out

    grpo = _row(out, ["tiny", "grpo_dist"])
    wall, tokens, tok_s = (float(x) for x in grpo[2:5])
    assert wall > 0 and tokens > 0 and tok_s > 0
    trl = _row(out, ["tiny", next(c for c in ["TRL 1.16.0 GRPOTrainer", "TRL GRPOTrainer"] if c in out)])
    if importlib.util.find_spec("trl") is not None:
        assert float(trl[2]) > 0 and re.fullmatch(r"[\d.]+x", grpo[5])
    else:
        assert "skipped (trl not installed)" in trl[2]

    # every phase of the step was timed, inside the workers too, and the bare baselines ran
    for phase in ("rollout (timing_s/gen) vs LLM.generate (same prompts and seeds)", "update_actor vs torch fwd/bwd/AdamW loop"):
        cells = _row(out, [phase])
        assert float(cells[1]) > 0 and float(cells[4]) > 0 and float(cells[5]) > 0
        assert 0 < float(cells[2]) <= float(cells[1])
    for part in report.SYNC_PARTS:
        assert float(_row(out, [report.SYNC_LABEL[part]])[1]) >= 0
    # the Ray worker processes were found and their memory sampled
    for role in ("ModelWorker", "RolloutWorker", "RewardWorker"):
        assert float(_row(out, [role])[1]) > 0.05
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["summaries"][0]["name"] == "tiny"
