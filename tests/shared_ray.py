"""One Ray cluster for a test session's real-stack runs.

Every ``python -m grpo_dist.main`` a test starts through ``tests/e2e/helpers.run_main`` attaches to it
(``RAY_ADDRESS`` and the cluster's token in the run's environment, as a user's run attaches to a running
cluster) instead of starting and stopping a Ray instance of its own: that saves each run about 3 s of the
2-core machine. The cluster is started once per session (``tests/e2e/conftest.py``), bound to the loopback
interface as a run's own instance would be, with the environment a run gives a local instance's workers,
and stopped at the end of the session, or, when the session is killed before its end, by the watchdog a
run's own instance has (``grpo_dist/distributed/ray_watchdog.py``). The test process's own environment is
left as it was (the tests that start Ray in-process start their own).

The cluster's worker processes, and the attached runs' drivers, are forked from one process that imported torch,
transformers and vLLM once for the session (``tests/warm_workers.py``: a run's processes then skip those imports,
most of a run's start-up here); ``GRPO_DIST_TEST_WARM_WORKERS=0`` starts them as Ray and Python do
(``GRPO_DIST_TEST_WARM_DRIVERS=0``: the drivers only). A run or a test with a Ray instance of its own uses it
only when it asks to (:func:`warm_env`, :func:`warm_runtime_env`): its workers then run in processes forked from
there (children of the warm process, not of its Ray instance's processes).

A test that checks a run's own Ray instance (its processes as children of the driver, its listening sockets,
a signal while it starts, the newcomer's console) runs with ``LOCAL_RAY`` in its environment, as do the runs
a test starts itself (``subprocess.Popen``). ``GRPO_DIST_TEST_SHARED_RAY=0`` turns the shared cluster off for
the whole session.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

from grpo_dist.distributed import ray_watchdog

#: The environment that makes ``python -m grpo_dist.main`` start its own local Ray instance.
LOCAL_RAY = {"RAY_ADDRESS": ""}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


#: What a head node's processes run (parts of their command lines): the raylet and the agents it starts.
_NODE_PROCESSES = ("raylet", "dashboard/agent.py", "runtime_env/agent/main.py")


def _wait_for_processes(root: int, parts: tuple[str, ...], timeout_s: float) -> None:
    """Wait until ``root``'s descendants include a process for each of ``parts`` (or ``timeout_s`` passed)."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            lines = [" ".join(p.cmdline()) for p in psutil.Process(root).children(recursive=True)]
        except psutil.Error:
            return
        if all(any(part in line for line in lines) for part in parts):
            return
        time.sleep(0.25)


class SharedCluster:
    """A head node started with ``ray start --block`` (its processes end with it). ``num_gpus``: the GPUs in the
    node's accounting (Ray's own count when None); ``env``: more environment for the node and its workers."""

    def __init__(self, log_dir: Path, *, num_gpus: int | None = None, env: dict[str, str] | None = None) -> None:
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        # the clients' environment: loopback binding, token authentication with a token of this session's
        self.client_env = {
            "RAY_ADDRESS": self.address,
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(16),
        }
        # what a run sets for the workers of a local instance it starts (distributed/worker_group.init_ray)
        workers = {
            "RAY_worker_niceness": "0",
            "RAY_prestart_worker_first_driver": "0",
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "PYTHONWARNINGS": os.environ.get("PYTHONWARNINGS", "ignore::FutureWarning"),
        }
        #: how a run's driver is started: ``python`` (or, with the warm server, the program that forks it from there)
        self.driver_command = [sys.executable]
        env = {**os.environ, **self.client_env, **workers, **(env or {})}
        env.pop("RAY_ADDRESS")
        from tests import warm_workers

        # the runs' worker processes forked from one that imported torch, transformers and vLLM (tests/warm_workers.py)
        self.warm = warm_workers.WarmWorkers(log_dir, env) if warm_workers.enabled() else None
        gpus = [] if num_gpus is None else [f"--num-gpus={num_gpus}"]
        self.log = open(log_dir / "shared_ray.log", "w")  # noqa: SIM115 (open for the cluster's life)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", f"--port={self.port}",
             "--node-ip-address=127.0.0.1", "--num-cpus=16", *gpus, "--include-dashboard=false",
             "--disable-usage-stats"],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 120
        while not _answers(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the shared Ray cluster did not start; see {log_dir / 'shared_ray.log'}")
            time.sleep(0.5)
        # the raylet registers a moment after the GCS answers
        time.sleep(2.0)
        # a pytest killed without its teardown (a timeout's SIGTERM, SIGKILL) does not leave the cluster behind:
        # the watchdog a run's own instance has ends its processes once this process is gone. It finds the
        # processes the cluster starts later as they come; it starts once the raylet's agents are up, which also
        # gives the tests a cluster whose node is complete (the agents import much and take long on a loaded
        # 2-core machine)
        _wait_for_processes(self.proc.pid, _NODE_PROCESSES, timeout_s=120.0)
        self.watchdog = ray_watchdog.start(roots=[self.proc.pid] + ([self.warm.proc.pid] if self.warm else []))
        if self.warm is not None:
            if self.warm.wait_ready():
                self.client_env.update(self.warm.job_env())
                if warm_workers.drivers_enabled():
                    self.driver_command = self.warm.command()
            else:
                print(f"tests: warm worker processes not available; see {log_dir / 'warm_workers.log'}", flush=True)

    def stop(self) -> None:
        if self.warm is not None:
            self.warm.stop()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        self.log.close()


_cluster: SharedCluster | None = None


def client_env() -> dict[str, str]:
    """The environment that attaches a run to the session's cluster ({} when none runs)."""
    return dict(_cluster.client_env) if _cluster is not None else {}


def warm_env() -> dict[str, str]:
    """The part of :func:`client_env` that makes a run's Ray job fork its worker processes from the session's warm
    process (tests/warm_workers.py), for a run on a cluster of its own on this machine; {} when there is none."""
    from tests import warm_workers

    env = client_env()
    return {k: env[k] for k in ("RAY_JOB_CONFIG_JSON_ENV_VAR", warm_workers.ENV_SOCKET) if k in env}


def warm_runtime_env() -> dict | None:
    """The Ray runtime environment that forks a job's worker processes from the session's warm process, for a Ray
    instance a test starts itself (``ray.init(runtime_env=...)``); None when there is none."""
    env = warm_env()
    if "RAY_JOB_CONFIG_JSON_ENV_VAR" not in env:
        return None
    return json.loads(env["RAY_JOB_CONFIG_JSON_ENV_VAR"])["runtime_env"]


def driver_command() -> list[str]:
    """The program that runs ``-m grpo_dist.main ...`` for a run attached to the session's cluster: Python, or the
    one that forks the driver from the warm server (its imports done: tests/warm_workers.py)."""
    return list(_cluster.driver_command) if _cluster is not None else [sys.executable]


def wanted() -> bool:
    return os.environ.get("GRPO_DIST_TEST_SHARED_RAY", "1") != "0" and not os.environ.get("RAY_ADDRESS")
