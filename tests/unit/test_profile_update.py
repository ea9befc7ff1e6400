"""scripts/bench/profile_update.py runs: grpo_dist's actor and the bare loop in one process, on the
same packed rows, on the tiny workload (what docs/benchmarks.md tells a reader to run to separate
the actor's own cost from the multi-process layout's)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_profile_update_prints_the_actor_against_the_bare_loop(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts/bench/profile_update.py"), "--workload", "tiny",
                           "--variant", "default", "--variant", "no_entropy", "--steps", "2", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in proc.stdout.splitlines()
            if line.startswith("| ") and "---" not in line}
    assert set(rows) >= {"bare torch loop", "FSDPActor, default", "FSDPActor, no_entropy"}
    for name in ("FSDPActor, default", "FSDPActor, no_entropy"):
        update_s, vs_bare, forward_s, fwd_vs_bare = (float(x) for x in rows[name])
        assert update_s > 0 and forward_s > 0 and vs_bare > 0 and fwd_vs_bare > 0
