"""Watch a benchmark subprocess from outside: peak RSS per role, foreign CPU load, metrics arrival.

:class:`TreeMonitor` polls the process tree under one pid (the subprocess and all its descendants:
for grpo_dist that is the driver, Ray's daemons and the Ray worker processes, since ``ray.init``
starts a local cluster as children of the driver) with psutil:

- the peak resident set size of each process, grouped by role. A Ray actor's process title is
  ``ray::ModelWorker`` (``ray::ModelWorker.call`` while it runs a method; that process holds every
  FSDP2 model of a rank), so the role is found in the command line; processes below a role's process (e.g. the reward scorer's pool)
  count as ``<role> children``. RSS counts shared pages (Ray's object store, shared libraries) in
  every process that maps them, so the sum over processes over-counts.
- the CPU time of the tree against the machine's busy time, giving the average number of cores
  that OTHER processes used meanwhile ("foreign load": the machine is shared).
- optionally, the arrival time of every new line of a metrics.jsonl file (one line per step), from
  which the wall time between steps is measured for runs whose rows lack ``time/unix``.

Only processes under the given pid are looked at, so other users' Ray workers are never counted.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import psutil

ROLES = ("ModelWorker", "RolloutWorker", "RewardWorker")
RAY_DAEMONS = ("gcs_server", "raylet", "dashboard", "log_monitor", "autoscaler", "ray_client_server",
               "ray::DashboardAgent", "ray::RuntimeEnvAgent")


def classify(cmdline: str, is_root: bool) -> str:
    """Role of one process from its command line (Ray's process title)."""
    if is_root:
        return "main process"
    for role in ROLES:
        if f"ray::{role}" in cmdline:
            return role
    if "ray::IDLE" in cmdline or "default_worker.py" in cmdline:
        return "Ray idle workers"
    if any(d in cmdline for d in RAY_DAEMONS):
        return "Ray daemons"
    if "ray::" in cmdline:
        return "Ray idle workers"
    return "other"


def _busy_seconds() -> float:
    t = psutil.cpu_times()
    idle = t.idle + getattr(t, "iowait", 0.0)
    return sum(t) - idle


class TreeMonitor(threading.Thread):
    def __init__(self, pid: int, *, interval_s: float = 0.25, scan_interval_s: float = 1.0,
                 metrics_path: str | os.PathLike | None = None) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.interval_s = interval_s
        self.scan_interval_s = scan_interval_s
        self._procs: dict[int, psutil.Process] = {}
        self._next_scan = 0.0
        self.metrics_path = Path(metrics_path) if metrics_path else None
        self._halt = threading.Event()
        self.peak_rss: dict[str, float] = {}  # role -> peak RSS of one process of that role (bytes)
        self.peak_tree_rss = 0.0  # peak of the sum over the tree (bytes)
        self._cpu: dict[int, float] = {}  # pid -> last seen user+system seconds
        self._roles: dict[int, str] = {}
        self._cpu_role: dict[int, str] = {}  # pid -> role at its last sample (CPU time is booked there)
        self.step_arrivals: dict[int, float] = {}  # step -> perf_counter time its metrics line appeared
        self._metrics_offset = 0
        self.t0 = time.perf_counter()
        self._busy0 = _busy_seconds()
        self.t1 = self.t0
        self._busy1 = self._busy0

    # ------------------------------------------------------------------ sampling
    def run(self) -> None:
        # metrics.jsonl is checked every 20 ms (a stat), the process tree every interval_s
        next_sample = 0.0
        while not self._halt.is_set():
            now = time.perf_counter()
            if now >= next_sample:
                self.sample()
                next_sample = now + self.interval_s
            else:
                self._read_metrics(now)
            self._halt.wait(0.02)
        self.sample()

    def stop(self) -> dict:
        self._halt.set()
        if self.is_alive():
            self.join(timeout=10)
        return self.result()

    def sample(self) -> None:
        """One sample: RSS and CPU time of every known process; the tree itself (and the roles of
        processes whose role can still change) is re-read once a second, which is what costs."""
        now = time.perf_counter()
        rescan = now >= self._next_scan
        if rescan:
            self._next_scan = now + self.scan_interval_s
            try:
                root = self._procs.get(self.pid) or psutil.Process(self.pid)
                found = [root] + root.children(recursive=True)
            except psutil.NoSuchProcess:
                found = []
            for p in found:
                self._procs.setdefault(p.pid, p)
        total = 0.0
        for pid, p in list(self._procs.items()):
            try:
                with p.oneshot():
                    rss = float(p.memory_info().rss)
                    cpu = p.cpu_times()
                    role = self._roles.get(pid)
                    if role is None or (rescan and role in ("Ray idle workers", "other")):
                        role = self._role_of(p)  # a Ray worker's title changes once it hosts an actor
                        self._roles[pid] = role
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                del self._procs[pid]
                continue
            total += rss
            self.peak_rss[role] = max(self.peak_rss.get(role, 0.0), rss)
            self._cpu[pid] = cpu.user + cpu.system
            self._cpu_role[pid] = role
        self.peak_tree_rss = max(self.peak_tree_rss, total)
        self.t1, self._busy1 = now, _busy_seconds()
        self._read_metrics(now)

    def _role_of(self, p: psutil.Process) -> str:
        cmd = " ".join(p.cmdline())
        role = classify(cmd, p.pid == self.pid)
        if role == "other":
            for parent in p.parents():
                parent_role = self._roles.get(parent.pid)
                if parent_role in ROLES:
                    return f"{parent_role} children"
        return role

    def _read_metrics(self, now: float) -> None:
        if self.metrics_path is None:
            return
        try:
            st = self.metrics_path.stat()
        except FileNotFoundError:
            return
        size = st.st_size
        if size < self._metrics_offset:  # the file was rewritten
            self._metrics_offset = 0
        if size == self._metrics_offset:
            return
        with open(self.metrics_path, "rb") as f:
            f.seek(self._metrics_offset)
            data = f.read()
        end = data.rfind(b"\n")
        if end < 0:
            return
        self._metrics_offset += end + 1
        # the file's modification time is when the newest line was written (finer than the polling);
        # on the perf_counter clock. Older lines read in the same poll get the poll time (an upper bound).
        written = now - max(0.0, time.time() - st.st_mtime)
        lines = data[: end + 1].splitlines()
        for i, line in enumerate(lines):
            try:
                step = int(json.loads(line)["step"])
            except (ValueError, KeyError):
                continue
            self.step_arrivals.setdefault(step, written if i == len(lines) - 1 else now)

    # ------------------------------------------------------------------ result
    def result(self) -> dict:
        wall = max(self.t1 - self.t0, 1e-9)
        tree_cpu = sum(self._cpu.values())
        foreign = max(0.0, (self._busy1 - self._busy0) - tree_cpu) / wall
        gib = 1 << 30
        cpu_by_role: dict[str, float] = {}
        for pid, sec in self._cpu.items():
            role = self._cpu_role.get(pid, "other")
            cpu_by_role[role] = cpu_by_role.get(role, 0.0) + sec
        return {
            "cpu_s": dict(sorted(cpu_by_role.items())),
            "peak_rss_gib": {k: v / gib for k, v in sorted(self.peak_rss.items())},
            "peak_tree_rss_gib": self.peak_tree_rss / gib,
            "tree_cpu_s": tree_cpu,
            "wall_s": wall,
            "foreign_load_cores": foreign,
            "step_arrivals": {str(k): v - self.t0 for k, v in sorted(self.step_arrivals.items())},
        }
