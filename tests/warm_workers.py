"""Warm worker processes for the test session's Ray cluster: each Ray worker process is forked from one process
that has already imported torch, transformers and vLLM, instead of importing them again.

Every real-stack run of the suite starts three to five Ray worker processes, and each imports torch (and the
rollout's vLLM, the models' transformers) before it does anything of the run: on two cores that is most of a
run's start-up (docs/benchmarks.md, "Where the suite's half hour goes"). Here the session starts one *server*
process that imports those libraries once and then waits. A run attached to the session's cluster gets a
``py_executable`` in its Ray job's runtime environment (Ray's own hook for a custom worker command, set through
``RAY_JOB_CONFIG_JSON_ENV_VAR`` as Ray's job submission does: the run's configuration is not touched), which
starts :mod:`tests.warm_worker_exec` instead of Python: that small program asks the server for a process, and the
server forks one that becomes the Ray worker (``default_worker.py`` with Ray's arguments), with the requesting
program's environment, working directory, standard streams and exit status. Ray itself is imported only in
the forked process, so Ray's state, the run's environment and its log set-up are the worker's own as before.

What a fork inherits that a fresh process would not, and what is done about it:

- environment variables the libraries read at import: the server starts with the cluster's environment (the one
  Ray gives its workers), and after the fork the libraries whose verbosity a run sets (``VLLM_LOGGING_LEVEL``,
  ``TRANSFORMERS_VERBOSITY``) are set up again from the worker's environment; the variables the imports themselves
  set (vLLM's ``env_override``) are kept;
- Ray: kept out of the server (vLLM imports it when it can; Ray's native library reads the environment when it
  loads): the modules that tried to import it are imported again in the worker, with Ray there;
- the objects the imports made are frozen for the garbage collector (``gc.freeze``, as a server that forks should):
  a worker's collections skip them, as the rollout engine's build does anyway (``freeze_heap_for_build``);
- nothing else runs in the server: no torch operation (no thread pool, no device), no grpo_dist module.

The worker's lifetime is the requesting program's: a signal sent to it is passed to the worker, the worker's
exit status is its own, and when it is killed (Ray kills a worker's process), the worker, which watches a pipe
whose other end only that program holds, ends too.

The drivers of the attached runs (``python -m grpo_dist.main ...`` started by ``tests/e2e/helpers.run_main``) are
forked the same way (``warm_worker_exec.py -m grpo_dist.main ...``): ``-m`` runs the module as Python's ``-m`` does,
the standard streams are buffered as the requester's environment says (``PYTHONUNBUFFERED``: a test reads a run's
lines as they come), and a forked process ends as the interpreter ends a program (non-daemon threads joined, exit
handlers run), with ``KeyboardInterrupt`` ending it by SIGINT.

``GRPO_DIST_TEST_WARM_WORKERS=0`` turns this off (the workers then start as Ray starts them, the drivers as Python
does); ``GRPO_DIST_TEST_WARM_DRIVERS=0`` only for the drivers.
"""

from __future__ import annotations

import gc
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

#: The variable naming the server's socket, in the environment of a run's workers.
ENV_SOCKET = "GRPO_DIST_TEST_WARM_SOCKET"
#: What the server imports once (the third-party libraries the workers import; never grpo_dist nor Ray).
PRELOAD = (
    "torch", "torch.distributed.fsdp", "torch.distributed.tensor", "torch.distributed.checkpoint.state_dict",
    "transformers", "transformers.modeling_utils", "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto", "transformers.integrations.sdpa_attention",
    "transformers.masking_utils", "transformers.models.qwen2.modeling_qwen2", "transformers.models.llama.modeling_llama",
    "peft", "vllm", "vllm.entrypoints.llm", "vllm.inputs", "vllm.sampling_params",
    # what vLLM's CPU engine imports while it is built (0.8 of a 1.9 s build of the tiny model's engine)
    "vllm.v1.worker.cpu_worker", "vllm.v1.worker.cpu_model_runner", "vllm.model_executor.model_loader",
    "vllm.model_executor.models.qwen2", "vllm.model_executor.models.llama", "vllm.v1.sample.sampler",
    "vllm.v1.core.kv_cache_manager", "vllm.lora.worker_manager",
)


def enabled() -> bool:
    return os.environ.get("GRPO_DIST_TEST_WARM_WORKERS", "1") != "0"


def drivers_enabled() -> bool:
    """The attached runs' drivers forked too (``GRPO_DIST_TEST_WARM_DRIVERS=0``: started by Python)."""
    return os.environ.get("GRPO_DIST_TEST_WARM_DRIVERS", "1") != "0"


# ---------------------------------------------------------------------------------------------- the session's side
class WarmWorkers:
    """The server process, started for the session with the cluster's worker environment ``env``; its socket
    in ``log_dir``. :meth:`job_env` is what a run's environment needs to have its workers forked from it."""

    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        self.socket = str(log_dir / "warm_workers.sock")
        self.log = open(log_dir / "warm_workers.log", "w")  # noqa: SIM115 (open for the server's life)
        modules = [m for m in os.environ.get("GRPO_DIST_TEST_WARM_PRELOAD", "").split(",") if m]  # (tests: fewer)
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.warm_workers", self.socket, *modules], env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     cwd=str(Path(__file__).resolve().parents[1]))

    def wait_ready(self, timeout_s: float = 300.0) -> bool:
        """Wait until the server listens (its imports done); False when it died or did not get there in time."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            if os.path.exists(self.socket):
                return True
            time.sleep(0.25)
        return False

    def command(self) -> list[str]:
        """The program that asks the server for a process (what follows it: Python's arguments, ``-m`` included)."""
        return [sys.executable, str(Path(__file__).with_name("warm_worker_exec.py"))]

    def job_env(self) -> dict[str, str]:
        """The environment that makes a run's Ray job start its workers through the server (and its driver, when
        started with :meth:`command`)."""
        runtime_env = {"py_executable": " ".join(self.command()), "env_vars": {ENV_SOCKET: self.socket}}
        return {"RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps({"runtime_env": runtime_env}), ENV_SOCKET: self.socket}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


# ---------------------------------------------------------------------------------------------- the server
class _NoRay:
    """Keeps Ray out of the server's imports (vLLM imports it when it can): Ray's native library reads the process's
    environment when it loads, so it must load in the worker, with the worker's. Records the modules that tried."""

    def __init__(self) -> None:
        self.importers: set[str] = set()

    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            frame = sys._getframe(1)
            while frame is not None and frame.f_globals.get("__name__", "").startswith(("importlib", "_frozen")):
                frame = frame.f_back
            if frame is not None:
                self.importers.add(frame.f_globals.get("__name__", ""))
            raise ImportError(f"{name} is imported in the worker, not in the warm-worker server")
        return None


def _preload(modules: tuple[str, ...]) -> tuple[dict[str, str], set[str]]:
    """Import ``modules`` without Ray; the environment variables the imports set, and the modules that tried to
    import Ray (they are imported again in the worker, where Ray is there)."""
    import importlib

    before = dict(os.environ)
    blocker = _NoRay()
    sys.meta_path.insert(0, blocker)
    t0 = time.perf_counter()
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # an optional library (peft) missing: the worker imports what it needs itself
            print(f"warm_workers: {name} not preloaded: {exc!r}", flush=True)
    sys.meta_path.remove(blocker)
    assert "ray" not in sys.modules, "Ray was imported by the warm-worker server"
    gc.freeze()  # what the imports made is never collected: the workers' collections skip it, and leave its pages shared
    print(f"warm_workers: imports took {time.perf_counter() - t0:.1f} s; imported again in each worker: "
          f"{sorted(blocker.importers)}", flush=True)
    return {k: v for k, v in os.environ.items() if before.get(k) != v}, blocker.importers


def _forget(modules: set[str]) -> None:
    """Drop ``modules`` (and their names in their packages), so that the next import runs them again."""
    for name in modules:
        if sys.modules.pop(name, None) is None:
            continue
        parent, _, child = name.rpartition(".")
        if parent in sys.modules and hasattr(sys.modules[parent], child):
            delattr(sys.modules[parent], child)


def _become_worker(request: dict, fds: list[int], set_by_imports: dict[str, str], without_ray: set[str]) -> None:
    """In the forked process: take the requester's streams, environment and directory, and run Ray's worker."""
    stdin, stdout, stderr, lifeline = fds
    os.setpgid(0, 0)  # a process group of its own, as Ray gives a worker: Ray ends a worker's group when it exits
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)

    def watch() -> None:  # the requester is gone (killed): so is this worker
        while os.read(lifeline, 1):
            pass
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=watch, daemon=True, name="warm-worker-lifeline").start()
    os.environ.clear()
    os.environ.update({**request["env"], **set_by_imports})
    os.chdir(request["cwd"])
    argv = list(request["argv"])
    module = argv[1] if argv[0] == "-m" else None  # ``-m module args`` (a run's driver) or ``script args``
    _fresh_sys_path(None if module else argv[0])
    _streams_from_env()
    _forget(without_ray)
    _library_logging_from_env()
    import runpy

    if module:
        sys.argv = argv[1:]  # run_module sets sys.argv[0] to the module's file, as ``python -m`` does
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        runpy.run_path(sys.argv[0], run_name="__main__")


def _fresh_sys_path(script: str | None) -> None:
    """``sys.path`` as ``python <script>`` (``python -m``: ``script`` None) with this environment's ``PYTHONPATH``
    starts with: the script's folder (the working directory), then ``PYTHONPATH``, then the interpreter's own
    entries (the server's first entry and ``PYTHONPATH`` dropped)."""
    own = [p for p in sys.path[1:] if p not in _SERVER_PYTHONPATH]
    env = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    first = os.getcwd() if script is None else os.path.dirname(os.path.abspath(script))
    sys.path[:] = [first, *env, *own]


def _streams_from_env() -> None:
    """Buffer the standard streams as a fresh process with this environment would: the server's were set up for
    its log file. ``PYTHONUNBUFFERED``: every write goes out at once (a test reads a run's lines as they come);
    a terminal: line by line; otherwise in blocks."""
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    for stream in (sys.stdout, sys.stderr):
        lines = stream is sys.stderr or unbuffered or os.isatty(stream.fileno())
        stream.reconfigure(line_buffering=lines, write_through=unbuffered or stream is sys.stderr)


_SERVER_PYTHONPATH = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]


def _library_logging_from_env() -> None:
    """Set the preloaded libraries' verbosity up again from this worker's environment (they read it at import)."""
    level = os.environ.get("TRANSFORMERS_VERBOSITY")
    if level:
        import transformers

        transformers.utils.logging.set_verbosity(transformers.utils.logging.log_levels[level])
    vllm_logger = sys.modules.get("vllm.logger")
    if vllm_logger is not None:
        vllm_logger._configure_vllm_root_logger()


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    """One request: its JSON (length-prefixed, sent with the four descriptors) and the descriptors."""
    head, fds, _flags, _addr = socket.recv_fds(conn, 8, 4)
    size = int.from_bytes(head, "big")
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("request cut short")
        data += chunk
    return json.loads(data), fds


def _fork_worker(request: dict, fds: list[int], prepared: tuple[dict[str, str], set[str]], close: list) -> int:
    """Fork the process that becomes the requested worker; its pid (in the parent). ``close``: the server's own
    sockets and descriptors, closed in the worker."""
    pid = os.fork()
    if pid:
        for fd in fds:
            os.close(fd)
        return pid
    code, by_signal = 1, 0
    try:
        for obj in close:
            os.close(obj) if isinstance(obj, int) else obj.close()
        _become_worker(request, fds, *prepared)
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
    except BaseException as exc:
        import traceback

        traceback.print_exc()
        by_signal = signal.SIGINT if isinstance(exc, KeyboardInterrupt) else 0
    finally:
        _end_as_python_does(code, by_signal)


def _end_as_python_does(code: int, by_signal: int) -> None:
    """End the forked process as the interpreter ends a program: wait for its non-daemon threads, run its exit
    handlers (Ray's shutdown, logging's flush), flush the streams; a ``KeyboardInterrupt`` ends it by SIGINT."""
    import atexit

    try:
        threading._shutdown()  # (what the interpreter calls before its exit handlers)
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001 (ending anyway)
        pass
    if by_signal:
        signal.signal(by_signal, signal.SIG_DFL)
        os.kill(os.getpid(), by_signal)
    os._exit(code)


def _reap(children: dict[int, socket.socket]) -> None:
    """Send the requester of every worker that ended its exit status, as ``os.waitpid`` gives it."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(status.to_bytes(8, "big", signed=True))
            except OSError:
                pass
            conn.close()


def serve(path: str, modules: tuple[str, ...] = PRELOAD) -> None:
    """Import ``modules``, then fork a worker for every request on the socket ``path`` until the parent is gone."""
    prepared = _preload(modules)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path + ".tmp")
    server.listen(64)
    os.rename(path + ".tmp", path)  # the socket appears once it listens: the session waits for it
    sel = selectors.DefaultSelector()
    sel.register(server, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}
    parent = os.getppid()
    while os.getppid() == parent:  # the test session is gone (killed): so is the server
        for key, _ in sel.select(timeout=2.0):
            if key.fileobj is not server:  # SIGCHLD
                os.read(wake_r, 4096)
                _reap(children)
                continue
            conn, _ = server.accept()
            conn.settimeout(10.0)  # a requester that connects and says nothing does not hold the others up
            try:
                request, fds = _receive(conn)
            except (OSError, ValueError) as exc:
                print(f"warm_workers: bad request: {exc!r}", flush=True)
                conn.close()
                continue
            pid = _fork_worker(request, fds, prepared, [sel, server, conn, *children.values(), wake_r, wake_w])
            print(f"warm_workers: worker process {pid} forked", flush=True)
            try:
                conn.sendall(pid.to_bytes(8, "big"))
            except OSError:  # the requester is gone: the worker ends by its lifeline
                pass
            children[pid] = conn


if __name__ == "__main__":
    serve(sys.argv[1], tuple(sys.argv[2:]) or PRELOAD)
