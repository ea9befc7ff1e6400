"""One run per output directory: a second run is refused with a message naming the first; a lock
left by a dead run is taken over; the lock goes away when the run ends."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from grpo_dist.utils.run_lock import LOCK_NAME, RunLock, RunLockError


def test_second_run_is_refused_and_names_the_first(tmp_path):
    with RunLock(tmp_path):
        lock = tmp_path / LOCK_NAME
        owner = json.loads(lock.read_text())
        assert owner["host"] == socket.gethostname()
        # another process on the same directory
        code = (
            "import sys\nfrom grpo_dist.utils.run_lock import RunLock, RunLockError\n"
            f"try:\n    RunLock({str(tmp_path)!r}).acquire()\nexcept RunLockError as e:\n    print(e); sys.exit(3)\n"
        )
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert proc.returncode == 3, proc.stderr
        assert f"is in use by another grpo_dist run (pid {owner['pid']} on {owner['host']}" in proc.stdout
        assert "another trainer.default_local_dir" in proc.stdout
        assert lock.exists(), "the refused run must not remove the running one's lock"
    assert not (tmp_path / LOCK_NAME).exists()


def test_stale_lock_of_a_dead_run_is_taken_over(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    (tmp_path / LOCK_NAME).write_text(json.dumps({"host": socket.gethostname(), "pid": pid, "started": "x"}))
    with RunLock(tmp_path) as lock:
        assert lock.note and f"pid {pid}" in lock.note
    assert not (tmp_path / LOCK_NAME).exists()


def test_lock_from_another_host_says_how_to_clear_it(tmp_path):
    (tmp_path / LOCK_NAME).write_text(json.dumps({"host": "node-that-is-not-here", "pid": 1, "started": "x"}))
    with pytest.raises(RunLockError, match=f"if that run is gone, delete .*{LOCK_NAME}"):
        RunLock(tmp_path).acquire()
    assert (tmp_path / LOCK_NAME).exists()


def test_lock_is_released_on_an_exception(tmp_path):
    with pytest.raises(KeyError), RunLock(tmp_path):
        raise KeyError("boom")
    assert not (tmp_path / LOCK_NAME).exists()


def test_call_deadlines_follow_the_slowest_call_with_a_floor():
    """The first call of a method may load and warm up: it gets the long floor. Later calls get
    factor x the slowest later call, at least the minimum: a worker that stops answering a 0.2 s call
    is named within a minute, not after half an hour."""
    from grpo_dist.distributed.worker_group import CallDeadlines

    d = CallDeadlines(1800.0, 10.0, 20.0)
    assert d.limit("generate") == 1800.0
    assert "first generate call" in d.explain("generate") and "trainer.worker_call_timeout_s=1800" in d.explain("generate")
    d.record("generate", 40.0)  # the first call: compile, warm-up
    assert d.limit("generate") == 400.0  # until a later call is timed, the first one stands in
    d.record("generate", 2.0)
    d.record("generate", 5.0)
    d.record("generate", 1.0)
    # the first call's warm-up no longer counts; the slowest later call does
    assert d.limit("generate") == 50.0 and d.limit("update_policy") == 1800.0
    assert "slowest generate so far, 5.0s" in d.explain("generate")
    assert "trainer.worker_call_timeout_min_s=20" in d.explain("generate")
    d.record("wake_up", 0.5)
    d.record("wake_up", 0.2)
    assert d.limit("wake_up") == 20.0  # the minimum: 10 x 0.2 s would be 2 s
    assert CallDeadlines(1800.0, 10.0).limit("generate") == 1800.0
    assert CallDeadlines(1800.0, 10.0).min_s == 60.0  # the documented default
    # validation calls are timed apart from the step's calls of the same method
    d.label = "validation"
    assert d.key("generate") == "generate (validation)" and d.limit(d.key("generate")) == 1800.0
    assert CallDeadlines(0.0, 10.0).limit("generate") is None


def test_two_runs_taking_over_one_stale_lock_at_once_do_not_both_hold_it(tmp_path, monkeypatch):
    """Run B reads the dead owner's lock and is about to delete it when run A takes it over; without the
    guard B then deleted A's fresh lock and both ran. Now exactly one holds the directory."""
    import threading

    from grpo_dist.utils import run_lock

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / LOCK_NAME).write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid, "started": "x"}))
    b_read_owner, a_tried = threading.Event(), threading.Event()
    real_owner = RunLock._owner

    def slow_owner(self):
        owner = real_owner(self)
        if threading.current_thread().name == "B" and not b_read_owner.is_set():
            b_read_owner.set()
            a_tried.wait(timeout=3)  # A runs its whole acquisition here, if nothing stops it
        return owner

    monkeypatch.setattr(RunLock, "_owner", slow_owner)
    monkeypatch.setattr(run_lock, "GUARD_TIMEOUT_S", 10.0)
    results: dict[str, object] = {}

    def take(name):
        if name == "A":
            b_read_owner.wait(timeout=5)
        try:
            results[name] = RunLock(tmp_path).acquire()
        except RunLockError as exc:
            results[name] = exc
        finally:
            if name == "A":
                a_tried.set()

    threads = [threading.Thread(target=take, args=(n,), name=n) for n in ("B", "A")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    held = [n for n, r in results.items() if isinstance(r, RunLock)]
    assert held == ["B"], results  # B judged first and took it over; A then found B's lock, alive
    assert "in use by another grpo_dist run" in str(results["A"])
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
