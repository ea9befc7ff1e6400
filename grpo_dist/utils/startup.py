"""Where a run's start-up goes: every process of the run records named moments, and one table shows them.

Each process (the driver, each Ray worker) calls :func:`mark` at the end of a start-up phase ("torch
imported", "engine built", ...); a phase lasts from the previous moment (at first: the process's own
start, as the operating system recorded it) to its mark. The workers hand their moments to the driver
once they are up (:func:`moments`), the driver keeps them with :func:`add_process`, and the run writes
them all to ``startup.json`` in its folder (:func:`write`). :func:`table` reads that file back (with
the first step's phase times from ``metrics.jsonl``) as a table whose times count from the driver's
start, so that one run shows the whole split. Moments are wall-clock seconds (``time.time``): the
processes of one machine share that clock.

Recording costs a list append per moment; nothing here imports more than the standard library.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

_MARKS: list[tuple[str, float]] = []
_PROCESSES: dict[str, dict[str, Any]] = {}

#: The moments the command line records before a run begins; :func:`run_begins` keeps these.
BEFORE_RUN = ("imports", "configuration")

#: The first step's phases shown in the table: ``timing_s/<phase>`` of step 1 in ``metrics.jsonl``.
FIRST_STEP_PHASES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights")


def process_start() -> float:
    """When this process started (wall clock, as the kernel recorded it; 10 ms resolution).

    From ``/proc``: the start in clock ticks since boot, and the boot time as now minus the uptime
    (``/proc/stat``'s boot time, which ``psutil`` uses, is whole seconds: processes would be up to a
    second apart on the table)."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):  # no /proc: psutil, else the first moment stands in
        try:
            import psutil

            return float(psutil.Process().create_time())
        except Exception:
            return _MARKS[0][1] if _MARKS else time.time()


def mark(name: str) -> None:
    """Record that this process reached ``name`` now (a later mark of the same name replaces it)."""
    _MARKS[:] = [m for m in _MARKS if m[0] != name]
    _MARKS.append((name, time.time()))


def moments() -> dict[str, Any]:
    """This process's moments: ``{"pid", "start", "marks": [[name, time], ...]}``."""
    return {"pid": os.getpid(), "start": process_start(), "marks": [[n, t] for n, t in _MARKS]}


def add_process(name: str, recorded: dict[str, Any]) -> None:
    """Keep another process's :func:`moments` (the driver gathers its workers')."""
    _PROCESSES[name] = recorded


def run_begins() -> None:
    """A run starts in this process: forget the moments of an earlier run in it (the in-process API may
    run several), keeping the command line's own (:data:`BEFORE_RUN`)."""
    _MARKS[:] = [m for m in _MARKS if m[0] in BEFORE_RUN]
    _PROCESSES.clear()


def write(path: str | os.PathLike[str]) -> None:
    """``startup.json``: the driver's moments and every worker process's."""
    data = {"driver": moments(), "processes": dict(_PROCESSES)}
    Path(path).write_text(json.dumps(data, indent=1))


# ---- reading it back -----------------------------------------------------------------------------
def phases(recorded: dict[str, Any]) -> list[tuple[str, float, float]]:
    """``(phase, seconds, end)`` for each moment of one process, in time order; a phase runs from the
    moment before (at first: the process's start) to its own."""
    out, prev = [], float(recorded["start"])
    for name, t in sorted(recorded["marks"], key=lambda m: m[1]):
        out.append((name, max(0.0, t - prev), t))
        prev = max(prev, t)
    return out


def first_step(metrics_path: str | os.PathLike[str]) -> dict[str, float]:
    """Step 1's ``timing_s/*`` values from a run's ``metrics.jsonl`` (empty when it has none)."""
    try:
        lines = Path(metrics_path).read_text().splitlines()
    except FileNotFoundError:
        return {}
    for line in lines:
        if not line.strip():
            continue
        row = json.loads(line)
        if row.get("training/global_step", row.get("step")) == 1:
            return {k[len("timing_s/"):]: float(v) for k, v in row.items()
                    if k.startswith("timing_s/") and isinstance(v, (int, float))}
    return {}


def rows(data: dict[str, Any], step: dict[str, float] | None = None) -> list[tuple[str, str, float, float]]:
    """The table's rows ``(process, phase, seconds, ends at)``: the driver's phases, then each worker
    process's, then the first step's (from ``step``, :func:`first_step`), times counted from the driver's
    start."""
    t0 = float(data["driver"]["start"])
    out = [("driver", name, s, end - t0) for name, s, end in phases(data["driver"])]
    for proc, recorded in data.get("processes", {}).items():
        start = float(recorded["start"])
        out.append((proc, "(process started)", 0.0, start - t0))
        out += [(proc, name, s, end - t0) for name, s, end in phases(recorded)]
    step = step or {}
    started = dict((name, end) for name, _, end in phases(data["driver"])).get("workers started")
    if started is not None and "step" in step:
        at = started - t0
        for name in FIRST_STEP_PHASES:
            if name in step:
                out.append(("first step", name, step[name], float("nan")))
        out.append(("first step", "step (all phases)", step["step"], at + step["step"]))
    return out


def time_to_first_step(data: dict[str, Any]) -> float | None:
    """Seconds from the driver's start until its workers were up and the loop could begin."""
    ends = {name: end for name, _, end in phases(data["driver"])}
    if "workers started" not in ends:
        return None
    return ends["workers started"] - float(data["driver"]["start"])


def table(data: dict[str, Any], step: dict[str, float] | None = None) -> str:
    """The start-up split as a markdown table (see :func:`rows`), with the time to first step."""
    lines = ["| process | phase | seconds | ends at (s) |", "| --- | --- | --- | --- |"]
    for proc, name, s, end in rows(data, step):
        at = "" if end != end else f"{end:.2f}"  # NaN: a first-step phase, its end not recorded
        lines.append(f"| {proc} | {name} | {s:.2f} | {at} |")
    ttfs = time_to_first_step(data)
    if ttfs is not None:
        lines.append(f"\ntime to first step: {ttfs:.2f} s (driver start -> workers started)")
    return "\n".join(lines)


def read(run_dir: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, float]]:
    """A run folder's ``startup.json`` and its first step's phase times."""
    run_dir = Path(run_dir)
    return json.loads((run_dir / "startup.json").read_text()), first_step(run_dir / "metrics.jsonl")
