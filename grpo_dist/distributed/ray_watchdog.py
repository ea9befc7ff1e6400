"""Clean up a locally started Ray instance whose driver died without shutting it down.

When the driver is killed outright (SIGKILL, the kernel's out-of-memory killer), Ray's GCS, raylet
and workers follow it within seconds, but its dashboard agent and runtime-env agent only notice a
minute or two later (measured on a 2-core machine: 60-65 s idle, about two minutes under load),
holding memory and ports meanwhile.

:func:`start` (called by the driver right after it started Ray) lists the driver's descendants,
which are then exactly the Ray processes of that instance, and starts this file as a small process
in a session of its own (a Ctrl-C or a signal to the driver's process group does not reach it)::

    python ray_watchdog.py DRIVER_PID DRIVER_START PID:START [PID:START ...]

It checks the driver every second, and each time adds the listed processes' new descendants to its
list: a process Ray starts (or restarts) later, e.g. an agent a loaded machine brings up after the
first listing, or a worker's own subprocesses, is ended with the rest (a process that leaves its
parent's tree, as a daemon does, is found while its parent lives). Once the driver is gone it gives
Ray's own shutdown ``GRACE_S`` seconds, then sends SIGTERM to the listed processes that still run,
SIGKILL ``KILL_AFTER_S`` seconds later, and exits. A process is matched by pid *and* start time, so a pid
reused by an unrelated process is never touched. The watchdog also exits as soon as none of the
listed processes is left (a normal shutdown). It needs only psutil and imports nothing of grpo_dist.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

POLL_S = 1.0
GRACE_S = 2.0
KILL_AFTER_S = 5.0


def _same(pid: int, start: float):
    """The psutil process ``pid`` if it is still the one that started at ``start``, else None."""
    import psutil

    try:
        p = psutil.Process(pid)
        if abs(p.create_time() - start) < 0.01 and p.status() != psutil.STATUS_ZOMBIE:
            return p
    except psutil.Error:
        pass
    return None


def _ppid_map() -> dict[int, int]:
    """pid -> parent pid of every process (psutil's own one-pass listing where it has it: ~1.6 ms for 65
    processes against ~8 ms through ``process_iter``)."""
    import psutil

    fast = getattr(psutil, "_ppid_map", None)
    if fast is not None:
        try:
            return fast()
        except Exception:
            pass
    return {p.pid: p.info["ppid"] for p in psutil.process_iter(["ppid"])}


def _with_descendants(procs: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """Those of ``procs`` still running and every descendant of theirs, as (pid, start time)."""
    import psutil

    children: dict[int, list[int]] = {}
    for pid, ppid in _ppid_map().items():
        children.setdefault(ppid, []).append(pid)
    found = {q: None for q in procs if _same(*q) is not None}
    known = {pid for pid, _ in found}
    todo = list(known)
    while todo:
        for pid in children.get(todo.pop(), []):
            if pid in known:
                continue
            try:
                found[(pid, psutil.Process(pid).create_time())] = None
            except psutil.Error:
                continue
            known.add(pid)
            todo.append(pid)
    return list(found)


def watch(driver: tuple[int, float], procs: list[tuple[int, float]], *, poll_s: float = POLL_S,
          grace_s: float = GRACE_S, kill_after_s: float = KILL_AFTER_S) -> list[int]:
    """Wait for the driver to go, then end what is left of ``procs`` and of the descendants they had
    meanwhile; the pids it signalled."""
    import psutil

    while _same(*driver) is not None:
        procs = _with_descendants(procs)  # those that ended leave the list
        if not procs:
            return []
        time.sleep(poll_s)
    time.sleep(grace_s)
    # once more: what the listed processes started since the last check (or since the listing, when the driver
    # was gone before the first check), while they are alive to be its parents
    left = [p for p in (_same(*q) for q in _with_descendants(procs)) if p is not None]
    for p in left:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(left, timeout=kill_after_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    return [p.pid for p in left]


def start(roots: list[int] | None = None) -> subprocess.Popen | None:
    """Start the watchdog for the Ray processes this (driver) process started so far (``roots``: only
    these processes of its and their descendants); None when it has none (e.g. it attached to a running
    cluster) or psutil is missing."""
    try:
        import psutil
    except ImportError:
        return None
    me = psutil.Process()
    procs = []
    try:
        tops = [me] if roots is None else [psutil.Process(pid) for pid in roots]
        listed = [q for top in tops for q in ([] if top is me else [top]) + top.children(recursive=True)]
    except psutil.Error:
        return None
    for p in listed:
        try:
            procs.append(f"{p.pid}:{p.create_time()!r}")
        except psutil.Error:
            pass
    if not procs:
        return None
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), str(me.pid), repr(me.create_time()), *procs],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True,
    )


def _parse(spec: str) -> tuple[int, float]:
    pid, _, start_time = spec.partition(":")
    return int(pid), float(start_time)


if __name__ == "__main__":
    driver_pid, driver_start, *specs = sys.argv[1:]
    watch((int(driver_pid), float(driver_start)), [_parse(s) for s in specs])
