"""TaskPool: picklable tasks in worker processes, a time limit per task, results in input order."""

import functools
import importlib
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from grpo_dist.rewards.pool import TaskPickleError, TaskPool

TIMEOUT_S = 1.0


def gated(arg):
    """``arg = (gate, value, role)``: ``"opens"`` creates the file ``gate``, ``"waits"`` waits (up to
    60 s) until it exists, anything else just returns; the result is ``(value, this process's id)``."""
    gate, value, role = arg
    if role == "opens":
        open(gate, "w").close()
    deadline = time.monotonic() + 60
    while role == "waits" and not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)
    return value, os.getpid()


def act(arg):
    if arg == "raise":
        raise KeyError("missing")
    if arg == "exit":
        os._exit(3)
    if arg == "hang":
        time.sleep(30)
    if arg == "lock":
        return threading.Lock()  # cannot be pickled back to the parent
    return arg, os.getpid()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def pool():
    # the workers import this module when they start, so that importing it does not count against
    # the first task's time limit
    warm_up = [functools.partial(importlib.import_module, __name__)]
    with TaskPool(2, timeout_s=TIMEOUT_S, warm_up=warm_up, name="test") as p:
        yield p


@pytest.fixture(scope="module")
def unlimited_pool():
    with TaskPool(2, timeout_s=None, name="test") as p:
        yield p


def test_results_come_back_in_input_order(unlimited_pool, tmp_path):
    # task 0 waits for task 3, so the tasks finish out of order whatever the machine's load (task 3 opens
    # the gate and ends while task 0 ends in the other worker: which of the two is reported first is a race)
    args = [(str(tmp_path / "gate1"), "a", "waits"), (str(tmp_path / "gate1"), "b", ""),
            (str(tmp_path / "gate1"), "c", ""), (str(tmp_path / "gate1"), "d", "opens")]
    finished = []
    unlimited_pool.run(gated, args, lambda i, outcome: finished.append(i))
    assert finished[:2] == [1, 2] and sorted(finished[2:]) == [0, 3]
    args = [(str(tmp_path / "gate2"), *arg[1:]) for arg in args]
    outcomes = unlimited_pool.map(gated, args)
    assert [o.status for o in outcomes] == ["ok"] * 4
    assert [o.value[0] for o in outcomes] == ["a", "b", "c", "d"]
    assert len({o.value[1] for o in outcomes}) == 2  # both workers took tasks


def test_task_over_its_limit_is_reported_and_its_worker_replaced(pool):
    pool.map(act, ["x", "y"])
    before = {w.proc.pid for w in pool.workers}
    start = time.monotonic()
    outcomes = pool.map(act, ["a", "hang", "b", "c"])
    elapsed = time.monotonic() - start
    assert [o.status for o in outcomes] == ["ok", "timeout", "ok", "ok"]
    assert outcomes[1].error == "timed out after 1 s" and outcomes[1].value is None
    assert [o.value[0] for o in outcomes if o.ok] == ["a", "b", "c"]
    assert elapsed < 15  # the hung task (30 s) was stopped at its limit
    after = {w.proc.pid for w in pool.workers}
    assert len(after) == 2 and len(before & after) == 1  # one worker replaced, the other kept
    (killed,) = before - after
    assert not alive(killed)
    # the replacement takes tasks
    assert [o.value[0] for o in pool.map(act, ["d", "e", "f"])] == ["d", "e", "f"]


@pytest.mark.parametrize("arg, status, error", [
    ("raise", "raised", "KeyError: 'missing'"),
    ("exit", "died", "its worker process died (exit code 3)"),
    ("lock", "raised", "returned a lock that cannot be sent back"),
])
def test_failures_are_reported_per_task(pool, arg, status, error):
    outcomes = pool.map(act, ["a", arg, "b"])
    assert [o.status for o in outcomes] == ["ok", status, "ok"]
    assert outcomes[1].error.startswith(error) and "\n" not in outcomes[1].error
    assert [o.value[0] for o in pool.map(act, ["c", "d"])] == ["c", "d"]


def test_a_raising_callback_stops_the_running_tasks(unlimited_pool, tmp_path):
    # both workers take a task: the first waits for the second
    unlimited_pool.map(gated, [(str(tmp_path / "gate"), "x", "waits"), (str(tmp_path / "gate"), "y", "opens")])
    before = {w.proc.pid for w in unlimited_pool.workers}

    def stop(i, outcome):
        raise RuntimeError(f"stop at {i}")

    start = time.monotonic()
    with pytest.raises(RuntimeError, match="stop at 1"):
        unlimited_pool.run(act, ["hang", "a"], stop)
    assert time.monotonic() - start < 10  # did not wait for the hung task (30 s)
    assert not any(w.busy for w in unlimited_pool.workers)
    after = {w.proc.pid for w in unlimited_pool.workers}
    assert len(before & after) == 1 and not alive((before - after).pop())  # the hung task's worker was replaced
    assert [o.value[0] for o in unlimited_pool.map(act, ["b", "c"])] == ["b", "c"]


def test_unpicklable_argument_is_refused_before_anything_runs():
    p = TaskPool(1, timeout_s=None)
    with pytest.raises(TaskPickleError, match="task 1 cannot be sent"):
        p.map(act, ["a", threading.Lock()])
    assert p.workers == []


def test_in_process_mode():
    p = TaskPool(0, timeout_s=None)
    outcomes = p.map(act, ["a", "raise"])
    assert outcomes[0].value == ("a", os.getpid())
    assert outcomes[1].status == "raised" and outcomes[1].error == "KeyError: 'missing'"
    assert p.workers == []
    with pytest.raises(ValueError, match="cannot enforce timeout_s"):
        TaskPool(0, timeout_s=1.0)
    with pytest.raises(ValueError, match="mp_context='fork'"):
        TaskPool(1, timeout_s=None, mp_context="fork")


def test_workers_stop_on_close():
    p = TaskPool(2, timeout_s=None)
    pids = [o.value[1] for o in p.map(act, ["a", "b"])]
    p.close()
    assert p.workers == []
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in pids)


WORKER_PROCESS = """
import sys, time
from grpo_dist.rewards.pool import TaskPool
from grpo_dist.workers.reward import exit_at_once_on_sigterm
pool = TaskPool(2, timeout_s=None)
pool.map(abs, [-1, -2])  # starts the scoring processes
assert exit_at_once_on_sigterm(pool.kill_now)
print(" ".join(str(w.proc.pid) for w in pool.workers), flush=True)
time.sleep(60)
"""


def test_sigterm_ends_the_reward_worker_with_its_scoring_processes_and_no_traceback():
    """Ray ends a reward worker with SIGTERM, sometimes twice while it exits: the process ends at once,
    its scoring processes with it, and nothing is printed (Ray would forward a traceback to the run)."""
    proc = subprocess.Popen([sys.executable, "-c", WORKER_PROCESS], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        pids = [int(x) for x in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(alive(pid) for pid in pids)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:  # ended already
            pass
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM and err == "", err
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in pids)
