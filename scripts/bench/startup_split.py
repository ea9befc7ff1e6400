"""Where start-up goes: run the default job and a SmolLM2 run cut to one step, and print the split.

Each run goes through the normal entry point (``python -m grpo_dist.main ...``, one training step, no
validation) in a fresh folder; its ``startup.json`` (every process's start-up moments, written by the
run itself: grpo_dist/utils/startup.py) and step 1 of its ``metrics.jsonl`` give one table whose times
count from the driver's start. With ``--runs N`` each cell is the median of N runs.

``--cold``: before each run, the files the run reads (the Python libraries, grpo_dist, the models) are
evicted from the OS page cache with ``posix_fadvise(DONTNEED)``, file by file; pages that a running
process has mapped stay (so on a shared machine "cold" is only as cold as the others allow). Dropping
the whole cache (``/proc/sys/vm/drop_caches``) needs a privilege containers usually lack.

    python scripts/bench/startup_split.py                    # both jobs, warm, 3 runs each
    python scripts/bench/startup_split.py --cold --runs 1    # both jobs, cold
    python scripts/bench/startup_split.py --jobs default --runs 5 --out /tmp/split
    python scripts/bench/startup_split.py --render /tmp/split/results.json   # print it again
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from grpo_dist.utils import startup  # noqa: E402

ONE_STEP = ["trainer.total_training_steps=1", "trainer.test_freq=-1", "trainer.val_before_train=false",
            "trainer.save_freq=-1"]
JOBS = {
    "default": [],
    "smollm2": ["--config-name", "recipes/larger_smollm2_135m_cpu"],
}


def evict(paths: list[Path]) -> int:
    """Drop the page-cache pages of every file under ``paths`` (those not mapped by a live process);
    returns the number of files."""
    n = 0
    for top in paths:
        for dirpath, _, files in os.walk(top):
            for name in files:
                try:
                    fd = os.open(os.path.join(dirpath, name), os.O_RDONLY | os.O_NOFOLLOW)
                except OSError:
                    continue
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    n += 1
                except OSError:
                    pass
                finally:
                    os.close(fd)
    return n


def cold_paths() -> list[Path]:
    cache = Path(os.path.expanduser(os.environ.get("GRPO_DIST_CACHE", "~/.cache/grpo_dist")))
    libs = {Path(sysconfig.get_paths()["purelib"]), Path(sysconfig.get_paths()["stdlib"])}
    return sorted(libs) + [ROOT / "grpo_dist", ROOT / "conf", cache]


def run_once(job: str, out: Path, cold: bool) -> dict:
    """One run of ``job``: its wall time, exit code, start-up data and first step."""
    if cold:
        evict(cold_paths())
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "grpo_dist.main", *JOBS[job], *ONE_STEP, f"trainer.default_local_dir={out}",
           f"hydra.run.dir={out}"]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    (out / "stdout.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not (out / "startup.json").exists():
        raise SystemExit(f"{job}: exit {proc.returncode}; output in {out / 'stdout.txt'}:\n{proc.stderr[-2000:]}")
    data, step = startup.read(out)
    return {"wall": wall, "data": data, "step": step}


def median_table(runs: list[dict]) -> str:
    """The split of several runs of one job: each cell the median over the runs."""
    cells: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in runs:
        for proc, name, s, end in startup.rows(r["data"], r["step"]):
            cells.setdefault((proc, name), []).append((s, end))
    lines = ["| process | phase | seconds | ends at (s) |", "| --- | --- | --- | --- |"]
    for (proc, name), vals in cells.items():
        s = statistics.median(v[0] for v in vals)
        ends = [v[1] for v in vals if v[1] == v[1]]
        at = f"{statistics.median(ends):.2f}" if ends else ""
        lines.append(f"| {proc} | {name} | {s:.2f} | {at} |")
    ttfs = [startup.time_to_first_step(r["data"]) for r in runs]
    walls = [r["wall"] for r in runs]
    lines.append("")
    lines.append(f"time to first step: median {statistics.median(t for t in ttfs if t is not None):.2f} s "
                 f"({', '.join(f'{t:.2f}' for t in ttfs if t is not None)}); "
                 f"one-step job wall: median {statistics.median(walls):.2f} s ({', '.join(f'{w:.2f}' for w in walls)})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", default="default,smollm2", help="comma-separated: " + ", ".join(JOBS))
    ap.add_argument("--runs", type=int, default=3, help="runs of each job (each cell: the median)")
    ap.add_argument("--cold", action="store_true", help="evict the run's files from the page cache before each run")
    ap.add_argument("--out", default=None, help="folder for the runs (default: a temporary one)")
    ap.add_argument("--render", nargs="+", metavar="RESULTS_JSON",
                    help="print the tables of earlier calls' results.json files (their runs pooled), running nothing")
    args = ap.parse_args(argv)
    if args.render:
        pooled: dict[str, list[dict]] = {}
        for path in args.render:
            for job, runs in json.loads(Path(path).read_text()).items():
                pooled.setdefault(job, []).extend(runs)
        for job, runs in pooled.items():
            print(f"\n### {job} ({len(runs)} run(s); median)\n")
            print(median_table(runs))
        return 0
    jobs = [j.strip() for j in args.jobs.split(",") if j.strip()]
    unknown = [j for j in jobs if j not in JOBS]
    if unknown:
        ap.error(f"unknown job(s) {unknown}; valid: {', '.join(JOBS)}")
    out = Path(args.out or tempfile.mkdtemp(prefix="startup_split_"))
    results: dict[str, list[dict]] = {j: [] for j in jobs}
    for i in range(args.runs):  # the jobs in turn, so that a drift of the machine's speed hits them alike
        for job in jobs:
            results[job].append(run_once(job, out / f"{job}_{i}", args.cold))
    for job in jobs:
        print(f"\n### {job} ({'cold' if args.cold else 'warm'}, {args.runs} run(s); median)\n")
        print(median_table(results[job]))
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"\nraw data: {out}/results.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
