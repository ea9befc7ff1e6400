"""The watchdog ends what a killed driver leaves behind, and nothing else.

Stand-ins for Ray's processes: a "driver" that starts a long-lived process in a session of its own
(as Ray's agents outlive a killed driver) and is then killed with SIGKILL.
"""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from grpo_dist.distributed import ray_watchdog

STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)"
DRIVER = (
    "import subprocess, sys, time\n"
    f"p = subprocess.Popen([sys.executable, '-c', {STUBBORN!r}], start_new_session=True, stdout=subprocess.PIPE, text=True)\n"
    "p.stdout.readline()\n"
    "print(p.pid, flush=True)\n"
    "time.sleep(600)\n"
)


def spec(p: psutil.Process, start: float | None = None) -> str:
    return f"{p.pid}:{p.create_time() if start is None else start!r}"


@pytest.fixture
def started():
    procs: list[psutil.Process] = []
    yield procs
    for p in procs:  # only what this test started
        try:
            p.kill()
        except psutil.Error:
            pass


def test_killed_driver_leaves_nothing_behind_and_bystanders_are_untouched(started):
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True)
    started.append(psutil.Process(driver.pid))
    agent = psutil.Process(int(driver.stdout.readline()))  # ignores SIGTERM: needs the SIGKILL
    started.append(agent)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    started.append(psutil.Process(bystander.pid))
    d = psutil.Process(driver.pid)
    # the bystander is listed with another start time: a pid that was reused by an unrelated process
    watchdog = subprocess.Popen([sys.executable, ray_watchdog.__file__, str(d.pid), repr(d.create_time()),
                                 spec(agent), spec(started[-1], start=12345.0)])
    time.sleep(1.5)
    assert agent.is_running() and watchdog.poll() is None
    t0 = time.monotonic()
    driver.kill()
    driver.wait()
    assert watchdog.wait(timeout=30) == 0
    elapsed = time.monotonic() - t0
    assert _ended(agent)
    assert elapsed < ray_watchdog.POLL_S + ray_watchdog.GRACE_S + ray_watchdog.KILL_AFTER_S + 5
    assert started[-1].is_running(), "a process that is not the listed one was touched"


LATE_PARENT = (  # a raylet stand-in: starts its agent only once told to (after the watchdog listed it)
    "import subprocess, sys, time\n"
    "sys.stdin.readline()\n"
    f"p = subprocess.Popen([sys.executable, '-c', {STUBBORN!r}], start_new_session=True, stdout=subprocess.PIPE, text=True)\n"
    "p.stdout.readline()\n"
    "print(p.pid, flush=True)\n"
    "time.sleep(600)\n"
)


def test_a_process_started_after_the_listing_is_ended_too(started):
    """Ray starts (or restarts) an agent after the driver's processes were listed, e.g. on a loaded machine:
    the watchdog finds the listed processes' new descendants while the driver lives, and ends them too."""
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    started.append(psutil.Process(driver.pid))
    parent = subprocess.Popen([sys.executable, "-c", LATE_PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    started.append(psutil.Process(parent.pid))
    d = psutil.Process(driver.pid)
    watchdog = subprocess.Popen([sys.executable, ray_watchdog.__file__, str(d.pid), repr(d.create_time()),
                                 spec(started[-1])])
    time.sleep(1.0)  # the watchdog has listed the parent, which has no child yet
    parent.stdin.write("go\n")
    parent.stdin.flush()
    agent = psutil.Process(int(parent.stdout.readline()))  # ignores SIGTERM, in a session of its own
    started.append(agent)
    time.sleep(ray_watchdog.POLL_S * 2.5)  # a poll or two sees it
    driver.kill()
    driver.wait()
    assert watchdog.wait(timeout=30) == 0
    assert _ended(agent)
    assert parent.poll() is not None


def test_watchdog_leaves_when_the_ray_processes_are_gone(started):
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    started.append(psutil.Process(driver.pid))
    ray_proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    rp = psutil.Process(ray_proc.pid)
    started.append(rp)
    d = psutil.Process(driver.pid)
    watchdog = subprocess.Popen([sys.executable, ray_watchdog.__file__, str(d.pid), repr(d.create_time()), spec(rp)])
    ray_proc.kill()  # a normal shutdown: Ray's processes end while the driver lives on
    ray_proc.wait()
    assert watchdog.wait(timeout=15) == 0
    assert d.is_running()


def test_a_test_session_killed_before_its_teardown_leaves_no_shared_ray_cluster(tmp_path):
    """The real-stack tier's one Ray cluster (tests/shared_ray.py) is stopped by the session's teardown; a
    session killed outright (a timeout's SIGTERM, SIGKILL) has none, and the watchdog ends the cluster and the
    warm worker processes' server (tests/warm_workers.py; here importing one small module)."""
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    session = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from tests.shared_ray import SharedCluster; "
         "c = SharedCluster(Path(sys.argv[1])); print(c.proc.pid, c.warm.proc.pid, flush=True); time.sleep(600)",
         str(tmp_path)],
        cwd=root, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "GRPO_DIST_TEST_WARM_WORKERS": "1", "GRPO_DIST_TEST_WARM_PRELOAD": "json"})
    cluster = []
    try:
        head_pid, warm_pid = map(int, session.stdout.readline().split())  # printed once the cluster is up
        head = psutil.Process(head_pid)
        cluster = [head, *head.children(recursive=True), psutil.Process(warm_pid)]
        names = sorted(p.name() for p in cluster)
    finally:
        session.kill()
        session.wait()
        _, alive = psutil.wait_procs(cluster, timeout=30)
        alive = [p for p in alive if not _ended(p)]  # a zombie has ended: only its parent has not reaped it yet
        for p in alive:
            p.kill()
    assert {"gcs_server", "raylet"} <= set(names) and len(names) >= 5 and not alive, (names, alive)


def _ended(p: psutil.Process) -> bool:
    """Gone, or a zombie (it has exited; its parent has not reaped it yet)."""
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


SHUTDOWN = (
    "import json, psutil\n"
    "from grpo_dist.distributed import worker_group\n"
    "assert worker_group.init_ray(address=None, num_cpus=1, include_dashboard=False, min_cpus=1)\n"
    "me = psutil.Process()\n"
    "before = [' '.join(p.cmdline()) for p in me.children(recursive=True)]\n"
    "worker_group.shutdown_ray()\n"
    "def named(p):\n"
    "    try:\n"
    "        return '' if p.status() == psutil.STATUS_ZOMBIE else ' '.join(p.cmdline())\n"
    "    except psutil.Error:\n"
    "        return ''\n"
    "left = [p for p in me.children(recursive=True) if named(p)]\n"
    # Ray's agents end when they see their raylet gone, a moment after it; the watchdog when the instance is gone
    "_, alive = psutil.wait_procs(left, timeout=15)\n"
    "print(json.dumps([before, [named(p) for p in alive if named(p)]]), flush=True)\n"
)


def test_the_end_of_a_local_instance_leaves_none_of_its_processes():
    """A run's own Ray instance is stopped with the autoscaler's monitor killed first (shutdown_ray): every one
    of the instance's processes, the monitor included, is gone (Ray's agents and the watchdog follow their
    raylet within moments of the call)."""
    import json

    proc = subprocess.run([sys.executable, "-c", SHUTDOWN], capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "RAY_ADDRESS": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, after = json.loads(proc.stdout.strip().splitlines()[-1])
    assert any("monitor.py" in line for line in before) and any("raylet" in line for line in before), before
    assert after == [], (before, after)
