"""A local sandbox for model-written Python: a child process with limits, killed with its children.

Each run gets:

- a fresh temporary directory as its working directory (removed afterwards), the code in ``main.py``;
- its own session and process group (``start_new_session``), so the whole group is killed at the end;
- limits set in the child before the code starts (``resource.setrlimit``): CPU seconds (``RLIMIT_CPU``),
  address space (``RLIMIT_AS``, the memory limit), the size of a file it writes (``RLIMIT_FSIZE``) and the
  number of processes (``RLIMIT_NPROC``). The kernel does not apply ``RLIMIT_NPROC`` to root (nor to a
  process holding ``CAP_SYS_RESOURCE``), so a sandbox started by root runs the code with the real and
  effective user ``nobody`` (``SandboxLimits.unprivileged_uid``), keeping root only as the filesystem
  user so that the interpreter's standard library (which may sit under a private ``/root``) stays
  readable. ``RLIMIT_NPROC`` counts every process of the real user, so the limit is set to that user's
  count at the start plus ``max_processes``;
- a wall-time limit: past it the process group is killed (``SIGKILL``);
- an output cap: stdout and stderr together keep at most ``max_output_bytes``; past it the group is killed
  and the text ends with a note saying it was cut;
- a clean end: after the main process exits, whatever is left in its group or session (background
  children) is killed too.

``SandboxPool`` bounds how many runs are in flight at once (an asyncio semaphore), so a batch of
trajectories cannot start hundreds of interpreters on a small machine.

This is process isolation against runaway code, not a security boundary against a hostile program: the
code shares the machine's filesystem (as root's filesystem user when started by root) and network, and a
process that starts a session of its own (``setsid``) leaves the group that is killed. Use a Sandbox Fusion
server (``sandbox_fusion_tools``) where that matters.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

# The child's program: apply the limits, leave root for the process count (see the module doc), then run
# main.py as ``__main__`` in this same interpreter. A traceback shows only main.py's frames. Argument: the
# limits as JSON.
_LAUNCHER = """
import ctypes, json, os, resource, sys, traceback
lim = json.loads(sys.argv[1])
def cap(kind, soft, hard=None):
    try:
        resource.setrlimit(kind, (soft, soft if hard is None else hard))
    except (ValueError, OSError):
        pass  # a limit the OS does not allow here is skipped; the wall-time kill still applies
if lim["cpu_s"]:
    cap(resource.RLIMIT_CPU, lim["cpu_s"], lim["cpu_s"] + 1)
if lim["memory_bytes"]:
    cap(resource.RLIMIT_AS, lim["memory_bytes"])
if lim["file_size_bytes"]:
    cap(resource.RLIMIT_FSIZE, lim["file_size_bytes"])
cap(resource.RLIMIT_CORE, 0)
if lim["uid"] is not None:
    libc = ctypes.CDLL(None, use_errno=True)
    os.setgroups([])
    os.setresgid(lim["uid"], lim["uid"], 0)
    os.setresuid(lim["uid"], lim["uid"], 0)
    libc.setfsuid(0)
    libc.setfsgid(0)
if lim["nproc"]:
    cap(resource.RLIMIT_NPROC, lim["nproc"])
sys.argv = ["main.py"]
sys.dont_write_bytecode = True
with open("main.py", encoding="utf-8") as f:
    source = f.read()
del ctypes, json, resource, lim, cap, f
try:
    code = compile(source, "main.py", "exec")
    exec(code, {"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__})
except SyntaxError:
    traceback.print_exc(limit=0)
    sys.exit(1)
except BaseException as exc:
    if isinstance(exc, SystemExit):
        raise
    traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
    sys.exit(1)
"""

STOP_REASONS = {
    "wall_time": "wall time limit",
    "cpu_time": "CPU time limit",
    "memory": "memory limit",
    "file_size": "file size limit",
    "output": "output limit",
}


@dataclass(frozen=True)
class SandboxLimits:
    """What one run may use. 0 (or None) turns a limit off."""

    wall_s: float = 10.0
    """Wall-clock seconds before the process group is killed."""
    cpu_s: int = 10
    """CPU seconds (``RLIMIT_CPU``): past it the kernel sends ``SIGXCPU``."""
    memory_mb: int = 1024
    """Address space in MiB (``RLIMIT_AS``): an allocation past it fails (``MemoryError``)."""
    file_size_mb: int = 16
    """Largest file the code may write, in MiB (``RLIMIT_FSIZE``)."""
    max_processes: int = 16
    """Processes (and threads) the code may add (``RLIMIT_NPROC`` over the run user's count at the start)."""
    max_output_bytes: int = 64 * 1024
    """stdout + stderr kept; past it the run is stopped and the text cut with a note."""
    unprivileged_uid: int | None = 65534
    """When the sandbox is started by root, the real and effective user (and group) the code runs as (files
    are still read and written as root); None keeps root, and then the process limit does not apply."""


@dataclass
class SandboxResult:
    """The outcome of one run."""

    stdout: str
    stderr: str
    exit_code: int | None
    """The process's exit status; negative: killed by that signal; None: it never started."""
    stopped: bool = False
    """Whether a limit stopped it."""
    reason: str | None = None
    """Which limit (a key of ``STOP_REASONS``), or None."""
    truncated: bool = False
    """Whether the output was cut at ``max_output_bytes``."""
    wall_s: float = 0.0
    pgid: int | None = field(default=None, repr=False)
    """The process group the run had (for checking that nothing is left of it)."""

    def to_dict(self) -> dict:
        return asdict(self)

    def model_text(self) -> str:
        """The text to give the model: stdout, then stderr, then a line naming the limit that stopped it."""
        text = self.stdout
        if self.stderr:
            text += ("\n" if text and not text.endswith("\n") else "") + self.stderr
        if self.stopped:
            text += ("\n" if text and not text.endswith("\n") else "") + f"[stopped: {STOP_REASONS[self.reason]}]"
        return text


def _proc_stat(pid: str) -> tuple[str, int, int] | None:
    """``(state, pgid, sid)`` of a process from ``/proc/<pid>/stat``; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return fields[0], int(fields[2]), int(fields[3])


def live_processes(pgid: int) -> list[int]:
    """The processes still alive (zombies excluded) in process group or session ``pgid``."""
    out = []
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not pid.isdigit():
            continue
        st = _proc_stat(pid)
        if st and st[0] != "Z" and (st[1] == pgid or st[2] == pgid):
            out.append(int(pid))
    return out


def kill_group(pgid: int, rounds: int = 20) -> None:
    """Kill the process group and session ``pgid`` (children that started a new group of their own inside
    the session included), repeating while forks race the kill."""
    for _ in range(rounds):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        left = live_processes(pgid)
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)


def _user_process_count(uid: int) -> int:
    """Tasks (processes and threads) owned by ``uid``: what ``RLIMIT_NPROC`` counts."""
    count = 0
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not pid.isdigit():
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                count += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            continue
    return count


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _signal_reason(exit_code: int | None, stderr: str) -> str | None:
    if exit_code == -signal.SIGXCPU:
        return "cpu_time"
    if exit_code == -signal.SIGXFSZ or (exit_code not in (0, None) and "File too large" in stderr[-2000:]):
        return "file_size"  # Python ignores SIGXFSZ, so a write past the limit fails with EFBIG instead
    if exit_code not in (0, None) and "MemoryError" in stderr[-2000:]:
        return "memory"
    return None


async def run_python(code: str, limits: SandboxLimits = SandboxLimits(), *, stdin: str | None = None) -> SandboxResult:
    """Run ``code`` as ``main.py`` in a fresh temporary directory under ``limits`` (see the module doc)."""
    workdir = tempfile.mkdtemp(prefix="grpo_sandbox_")
    run_as = limits.unprivileged_uid if os.geteuid() == 0 else None
    try:
        with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as f:
            f.write(code)
        if run_as is not None:
            os.chown(workdir, run_as, run_as)
            os.chown(os.path.join(workdir, "main.py"), run_as, run_as)
        uid = run_as if run_as is not None else os.getuid()
        spec = {
            "cpu_s": int(limits.cpu_s or 0),
            "memory_bytes": int(limits.memory_mb or 0) * 1024 * 1024,
            "file_size_bytes": int(limits.file_size_mb or 0) * 1024 * 1024,
            "uid": run_as, "gid": run_as,
            "nproc": (_user_process_count(uid) + 1 + limits.max_processes) if limits.max_processes else 0,
        }
        env = {"PATH": os.defpath, "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
               "PYTHONIOENCODING": "utf-8"}
        return await _run(workdir, spec, env, limits, stdin)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


async def _run(workdir: str, spec: dict, env: dict, limits: SandboxLimits, stdin: str | None) -> SandboxResult:
    start = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-c", _LAUNCHER, json.dumps(spec), cwd=workdir, env=env,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
    pgid = proc.pid
    cap = limits.max_output_bytes or 0
    kept = {"stdout": bytearray(), "stderr": bytearray()}
    state = {"total": 0, "over_in": None}
    over_cap = asyncio.Event()

    async def drain(name: str, stream: asyncio.StreamReader) -> None:
        while True:
            chunk = await stream.read(65536)
            if not chunk:
                return
            if cap and state["total"] + len(chunk) > cap:
                chunk = chunk[: max(0, cap - state["total"])]
                state["over_in"] = state["over_in"] or name
                over_cap.set()
            state["total"] += len(chunk)
            kept[name] += chunk

    async def feed() -> None:
        try:
            proc.stdin.write(stdin.encode())
            await proc.stdin.drain()
            proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass

    readers = asyncio.gather(drain("stdout", proc.stdout), drain("stderr", proc.stderr))
    feeder = asyncio.ensure_future(feed()) if stdin is not None else None
    reason = None
    waiter = asyncio.ensure_future(proc.wait())
    capper = asyncio.ensure_future(over_cap.wait())
    deadline = start + limits.wall_s if limits.wall_s else None
    try:
        # Poll for the main process's exit too: ``wait()`` also waits for the pipes, which a background
        # child may hold open; once the main process is gone, its group is killed.
        while proc.returncode is None:
            step = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
            if step <= 0:
                reason = "wall_time"
                break
            done, _ = await asyncio.wait({waiter, capper}, timeout=step, return_when=asyncio.FIRST_COMPLETED)
            if capper in done and proc.returncode is None:
                reason = "output"
                break
    finally:
        capper.cancel()
        if feeder is not None:
            feeder.cancel()
        await asyncio.to_thread(kill_group, pgid)  # the whole group, on every path: nothing is left running
        for _ in range(200):  # the exit is reported shortly after the kill (not via wait(): see above)
            if proc.returncode is not None:
                break
            await asyncio.sleep(0.01)
        exit_code = proc.returncode
    try:
        await asyncio.wait_for(readers, timeout=2.0)
    except (asyncio.TimeoutError, TimeoutError):
        readers.cancel()  # a pipe still held by a process that left the session: what was read is kept
        transport = getattr(proc, "_transport", None)  # asyncio offers no public close of a process's pipes
        if transport is not None:
            transport.close()
    if not waiter.done():
        waiter.cancel()
    stdout, stderr = _decode(bytes(kept["stdout"])), _decode(bytes(kept["stderr"]))
    if reason is None:
        reason = _signal_reason(exit_code, stderr)
    truncated = state["over_in"] is not None
    note = f"\n... [output truncated: more than {cap} bytes]" if truncated else ""
    if state["over_in"] == "stderr":
        stderr += note
    else:
        stdout += note
    return SandboxResult(stdout=stdout, stderr=stderr, exit_code=exit_code, stopped=reason is not None,
                         reason=reason, truncated=truncated, wall_s=time.monotonic() - start, pgid=pgid)


class SandboxPool:
    """Runs code in the sandbox with at most ``max_concurrency`` runs in flight (others wait their turn).

    Usable from several event loops (one semaphore per loop)."""

    def __init__(self, max_concurrency: int = 4, limits: SandboxLimits = SandboxLimits()):
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.max_concurrency = max_concurrency
        self.limits = limits
        self._semaphores: dict[int, asyncio.Semaphore] = {}
        self.in_flight = 0
        self.peak_in_flight = 0

    def _semaphore(self) -> asyncio.Semaphore:
        loop_id = id(asyncio.get_running_loop())
        if loop_id not in self._semaphores:
            self._semaphores = {loop_id: asyncio.Semaphore(self.max_concurrency)}
        return self._semaphores[loop_id]

    async def run(self, code: str, *, stdin: str | None = None, limits: SandboxLimits | None = None) -> SandboxResult:
        async with self._semaphore():
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            try:
                return await run_python(code, limits or self.limits, stdin=stdin)
            finally:
                self.in_flight -= 1
