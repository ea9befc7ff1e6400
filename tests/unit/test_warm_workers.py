"""The test session's warm worker processes (tests/warm_workers.py, tests/warm_worker_exec.py) without Ray: the
requesting program's worker is a fork of the server with the requester's arguments, environment, directory and
streams; its exit status and signals pass through; it ends when the requester is killed; a module that imports
Ray is imported again in the worker; without a server the program runs the worker itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXEC = ROOT / "tests" / "warm_worker_exec.py"

WORKER = """
import json, os, sys, time
print(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv, "cwd": os.getcwd(),
                  "path0": sys.path[0], "foo": os.environ.get("FOO"), "pgid": os.getpgrp(),
                  "ray_seen": __import__("tryray").ray is not None}), flush=True)
if sys.argv[1] == "sleep":
    time.sleep(600)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("warm")
    (tmp / "lib").mkdir()
    # a module that imports Ray when it can, as vLLM's executor does: the server keeps Ray out
    (tmp / "lib" / "tryray.py").write_text("try:\n    import ray\nexcept ImportError:\n    ray = None\n")
    (tmp / "worker.py").write_text(WORKER)
    sock = tmp / "warm.sock"
    env = dict(os.environ, PYTHONPATH=f"{tmp / 'lib'}{os.pathsep}{ROOT}")
    proc = subprocess.Popen([sys.executable, "-m", "tests.warm_workers", str(sock), "json", "tryray"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while not sock.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() is not None else ""
        time.sleep(0.05)
    yield proc, tmp, env
    proc.kill()
    proc.wait()


def request(tmp: Path, env: dict, *args: str, sock: str | None = None) -> subprocess.Popen:
    env = dict(env, FOO="from-the-requester", GRPO_DIST_TEST_WARM_SOCKET=sock or str(tmp / "warm.sock"))
    return subprocess.Popen([sys.executable, str(EXEC), str(tmp / "worker.py"), *args], cwd=tmp / "lib", env=env,
                            stdout=subprocess.PIPE, text=True)


def first_line(proc: subprocess.Popen) -> dict:
    return json.loads(proc.stdout.readline())


def test_the_worker_is_a_fork_of_the_server_with_the_requesters_arguments_environment_and_streams(server):
    srv, tmp, env = server
    proc = request(tmp, env, "3")
    seen = first_line(proc)  # written by the worker to the requester's stdout
    assert proc.wait(timeout=30) == 3  # the worker's exit status is the requester's
    assert seen["ppid"] == srv.pid and seen["pid"] != proc.pid
    assert seen["argv"] == [str(tmp / "worker.py"), "3"] and seen["cwd"] == str(tmp / "lib")
    assert seen["foo"] == "from-the-requester" and seen["path0"] == str(tmp)
    assert seen["pgid"] == seen["pid"]  # a process group of its own, as Ray's workers have
    # the module that imported Ray in the server (without it) is imported again in the worker, with it
    assert seen["ray_seen"]


def test_a_signal_to_the_requester_reaches_the_worker_and_its_death_is_the_requesters(server):
    _, tmp, env = server
    proc = request(tmp, env, "sleep")
    worker = first_line(proc)["pid"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    assert not _alive(worker, timeout_s=10)


def test_a_killed_requester_takes_its_worker_with_it(server):
    _, tmp, env = server
    proc = request(tmp, env, "sleep")
    worker = first_line(proc)["pid"]
    proc.kill()  # as Ray kills a worker process: nothing of the requester runs
    proc.wait()
    assert not _alive(worker, timeout_s=10)


def test_without_a_server_the_requester_runs_the_worker_itself(server):
    _, tmp, env = server
    proc = request(tmp, env, "0", sock=str(tmp / "no-such.sock"))
    seen = first_line(proc)
    assert proc.wait(timeout=60) == 0
    assert seen["pid"] == proc.pid and seen["foo"] == "from-the-requester"


DRIVER = """
import atexit, json, os, sys, threading, time
atexit.register(lambda: print("exit handlers ran", flush=True))
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "name": __name__}))  # no flush: PYTHONUNBUFFERED says
if sys.argv[1] == "wait":
    sys.stdin.readline()
def late():
    time.sleep(0.5)
    print("non-daemon thread finished", flush=True)
threading.Thread(target=late).start()
sys.exit(int(sys.argv[2]))
"""


def test_a_module_run_with_dash_m_as_a_runs_driver_is_ended_as_python_ends_a_program(server):
    """A run's driver (``-m grpo_dist.main ...``): run as ``python -m`` runs it, its lines reach the requester as
    they are written (``PYTHONUNBUFFERED``), and its end waits for its threads and runs its exit handlers."""
    _, tmp, env = server
    (tmp / "lib" / "drivermod.py").write_text(DRIVER)
    env = dict(env, PYTHONUNBUFFERED="1", GRPO_DIST_TEST_WARM_SOCKET=str(tmp / "warm.sock"))
    proc = subprocess.Popen([sys.executable, str(EXEC), "-m", "drivermod", "wait", "5"], cwd=tmp / "lib", env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    seen = first_line(proc)  # read while the program waits: the line was not held in a buffer
    assert seen == {"argv": [str(tmp / "lib" / "drivermod.py"), "wait", "5"], "path0": str(tmp / "lib"),
                    "name": "__main__"}
    out, _ = proc.communicate("go\n", timeout=30)
    assert proc.returncode == 5
    assert out.splitlines() == ["non-daemon thread finished", "exit handlers ran"]


def _alive(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        time.sleep(0.05)
    return True
