"""A long run, watched: does a process's memory grow, a step get slower, or the policy collapse, as steps go by?

Runs one job through the normal entry point (``python -m grpo_dist.main``; the default job unless other keys
are given after ``--``) for ``--steps`` steps without validation or checkpoints in between, and samples the
resident memory of each of its processes from outside every ``--every`` seconds (the driver, each Ray worker
by its role, summed over the processes of a role; psutil, as :mod:`bench_procmon` classifies them). The
table has one row per window of ``--window`` steps: the median step time and phase times of the window (from
``metrics.jsonl``), the window's mean score, share of groups with no learning signal and entropy, and each role's
memory at the window's end. Under it, each role's growth in MiB and in MiB
per 100 steps, from the end of the first window (the warm-up: allocators and caches fill during the first
steps) and over the second half of the run (where a leak still grows and a filled cache does not); and the
last window's median step time against the second's.

    PYTHONPATH=$PWD .venv/bin/python scripts/bench/long_run.py                        # default job, 400 steps
    PYTHONPATH=$PWD .venv/bin/python scripts/bench/long_run.py --steps 200 -- async_training.staleness_threshold=0.5 ...
    PYTHONPATH=$PWD .venv/bin/python scripts/bench/long_run.py --render /tmp/long_run/results.json

The table (markdown) is printed and written to ``OUT/report.md``, the raw samples and metrics to
``OUT/results.json``. See docs/benchmarks.md ("A long run") for the numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_procmon import ROLES, classify  # noqa: E402

SHOWN = ("main process", *ROLES)
"""The roles whose memory the table shows (Ray's daemons and idle workers are left out)."""
PHASES = ("timing_s/step", "timing_s/gen", "timing_s/reward", "timing_s/old_log_prob", "timing_s/ref",
          "timing_s/update_actor", "timing_s/update_weights")
LEARNING = (("critic/score/mean", "score"), ("training/zero_advantage_group_ratio", "no-signal groups"),
            ("actor/entropy", "entropy"))
"""How the policy learns, each a window's mean: a collapse (the score and the entropy falling, the groups with no
learning signal rising to 1) shows here as memory growth does beside it."""
QUIET = ["trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.save_freq=-1", "trainer.progress_bar=false"]


def sample_memory(root: psutil.Process) -> dict[str, float]:
    """MiB of resident memory per role over ``root`` and its descendants (the roles of :data:`SHOWN`)."""
    mib: dict[str, float] = {}
    try:
        procs = [root] + root.children(recursive=True)
    except psutil.Error:
        return mib
    for p in procs:
        try:
            role = classify(" ".join(p.cmdline()), p.pid == root.pid)
            rss = p.memory_info().rss
        except psutil.Error:
            continue
        if role in SHOWN:
            mib[role] = mib.get(role, 0.0) + rss / 2**20
    return mib


def last_step(metrics_file: Path) -> int:
    """The newest step whose metrics line is complete (0 before the first)."""
    try:
        lines = metrics_file.read_text().splitlines()
    except FileNotFoundError:
        return 0
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError):  # a line being written
            continue
    return 0


def run(steps: int, every_s: float, out: Path, overrides: list[str]) -> dict:
    """Run the job and return ``{"samples": [[seconds, newest_step, {role: MiB}], ...], "metrics": [row, ...],
    "returncode": rc, "args": [...]}``."""
    run_dir = out / "run"
    args = [f"trainer.total_training_steps={steps}", *QUIET, f"trainer.default_local_dir={run_dir}", *overrides]
    metrics_file = run_dir / "metrics.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "grpo_dist.main", *args], cwd=ROOT,
                            stdout=open(out / "stdout.txt", "w"), stderr=subprocess.STDOUT)  # noqa: SIM115
    root, t0, samples = psutil.Process(proc.pid), time.perf_counter(), []
    while proc.poll() is None:
        time.sleep(every_s)
        done = last_step(metrics_file)
        memory = sample_memory(root)
        if memory and done:
            samples.append([round(time.perf_counter() - t0, 1), done, memory])
    metrics = [json.loads(line) for line in open(metrics_file)] if metrics_file.exists() else []
    return {"samples": samples, "metrics": metrics, "returncode": proc.returncode, "args": args}


def windows(result: dict, size: int) -> list[dict]:
    """One row per window of ``size`` training steps: ``first``/``last`` step, the median of each phase in
    :data:`PHASES` over the window's steps, the mean of each metric in :data:`LEARNING`, and each role's memory at the last sample taken while one of the
    window's steps was the newest (None where no sample fell in the window; samples taken after the run's
    last step are left out)."""
    rows = [m for m in result["metrics"] if m.get("step", 0) >= 1]
    end = rows[-1]["step"] if rows else 0
    # a sample taken once the last step was logged saw the run's end (final checkpoint, report, workers leaving)
    training = [s for s in result["samples"] if s[1] < end]
    out = []
    for start in range(0, len(rows), size):
        part = rows[start:start + size]
        first, last = part[0]["step"], part[-1]["step"]
        phases = {k: statistics.median(m[k] for m in part if k in m) for k in PHASES if any(k in m for m in part)}
        learning = {k: statistics.fmean(m[k] for m in part if k in m) for k, _ in LEARNING if any(k in m for m in part)}
        inside = [s for s in training if first <= s[1] <= last]
        out.append({"first": first, "last": last, "phases": phases, "learning": learning,
                    "memory": inside[-1][2] if inside else None,
                    "memory_step": inside[-1][1] if inside else None})
    return out


def growth(rows: list[dict], since: str = "warm-up") -> tuple[int, int, dict[str, tuple[float, float]]]:
    """Each role's memory growth up to the last window's sample, ``(from_step, to_step, {role: (MiB, MiB per
    100 steps)})``: from the first window's sample (``since="warm-up"``: allocators and caches fill during the
    first steps) or from the sample of the window halfway (``since="half"``: a leak keeps growing there, a
    cache that filled does not); (0, 0, {}) with fewer than two windows holding a sample."""
    held = [r for r in rows if r["memory"]]
    if len(held) < 2:
        return 0, 0, {}
    a, b = (held[0] if since == "warm-up" else held[(len(held) - 1) // 2]), held[-1]
    span = max(1, b["memory_step"] - a["memory_step"])
    return a["memory_step"], b["memory_step"], {
        role: (b["memory"][role] - a["memory"][role], 100 * (b["memory"][role] - a["memory"][role]) / span)
        for role in SHOWN if role in a["memory"] and role in b["memory"]}


def render(result: dict, size: int) -> str:
    rows = windows(result, size)
    roles = [r for r in SHOWN if any(w["memory"] and r in w["memory"] for w in rows)]
    phases = [k for k in PHASES if any(k in w["phases"] for w in rows)]
    learning = [(k, name) for k, name in LEARNING if any(k in w.get("learning", {}) for w in rows)]
    head = ["steps", *(k.removeprefix("timing_s/") + " s" for k in phases), *(name for _, name in learning),
            *(f"{r} MiB" for r in roles)]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for w in rows:
        cells = [f"{w['first']}-{w['last']}", *(f"{w['phases'][k]:.3f}" if k in w["phases"] else "" for k in phases),
                 *(f"{w['learning'][k]:.3g}" if k in w.get("learning", {}) else "" for k, _ in learning),
                 *(f"{w['memory'][r]:.0f}" if w["memory"] and r in w["memory"] else "" for r in roles)]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for since, what in (("warm-up", "after the first window"), ("half", "over the second half")):
        a, b, grown = growth(rows, since)
        if grown:
            lines.append(f"memory {what} (step {a} to step {b}): " + "; ".join(
                f"{r} {mib:+.0f} MiB ({per:+.1f} MiB per 100 steps)" for r, (mib, per) in grown.items()))
    if len(rows) >= 3 and "timing_s/step" in rows[1]["phases"]:
        second, last = rows[1]["phases"]["timing_s/step"], rows[-1]["phases"]["timing_s/step"]
        lines.append(f"median step: {second:.3f} s in steps {rows[1]['first']}-{rows[1]['last']}, {last:.3f} s in steps "
                     f"{rows[-1]['first']}-{rows[-1]['last']} ({last / second:.2f}x)")
    lines.append(f"run: python -m grpo_dist.main {' '.join(result['args'])} (exit {result['returncode']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--window", type=int, default=50, help="steps per row of the table")
    ap.add_argument("--every", type=float, default=5.0, help="seconds between memory samples")
    ap.add_argument("--out", type=Path, default=None, help="folder for the run and the results (default: a new one)")
    ap.add_argument("--render", type=Path, default=None, help="print the table of an earlier results.json")
    a = ap.parse_args(argv)
    if a.render is not None:
        print(render(json.loads(a.render.read_text()), a.window))
        return 0
    out = a.out or Path(tempfile.mkdtemp(prefix="long_run_"))
    out.mkdir(parents=True, exist_ok=True)
    result = run(a.steps, a.every, out, overrides)
    (out / "results.json").write_text(json.dumps(result))
    text = render(result, a.window)
    (out / "report.md").write_text(text + "\n")
    print(text)
    print(f"\nraw data: {out / 'results.json'}")
    return 0 if result["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
