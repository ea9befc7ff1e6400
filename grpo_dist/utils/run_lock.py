"""One run per output directory: a lock file holding the owner's host and process id.

``<default_local_dir>/.grpo_dist.lock`` is created exclusively (``O_CREAT | O_EXCL``) when a run
starts and removed when it ends. A second run on the same directory is refused with a message naming
the running one. A lock left behind by a run that no longer exists (killed with SIGKILL, a crashed
node) is stale: on the same host the owner's pid is checked and a dead owner's lock is taken over
with a note; a lock written on another host cannot be checked from here, so the message says how to
remove it once that run is known to be gone.

Taking over a stale lock is a read, a judgement and a delete: two runs started at once on the same
directory could both judge the dead owner's lock stale, and the slower one would then delete the lock
the faster one had just created, leaving both running. Every acquisition therefore happens under an
``flock`` on a guard file beside the lock (``.grpo_dist.lock.guard``, never deleted): the kernel drops
it when its holder dies, so the guard itself cannot go stale, and no two runs can be between reading the
lock and writing it at the same time.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path

__all__ = ["RunLock", "RunLockError", "LOCK_NAME", "GUARD_NAME"]

LOCK_NAME = ".grpo_dist.lock"
GUARD_NAME = LOCK_NAME + ".guard"
GUARD_TIMEOUT_S = 30.0  # an acquisition holds the guard for milliseconds; this bounds a hung file system


class RunLockError(RuntimeError):
    """Another run holds the output directory. The message is meant to be printed as is."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


class RunLock:
    """``with RunLock(out_dir): ...`` holds ``out_dir`` for this process (module docstring)."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.path = Path(directory) / LOCK_NAME
        self.note: str | None = None  # set when a stale lock was taken over
        self._held = False

    def _record(self) -> dict:
        return {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}

    def _try_create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self._record(), f)
        except BaseException:  # a full disk: no empty lock left behind to puzzle the next run
            self.path.unlink(missing_ok=True)
            raise
        return True

    def _owner(self) -> dict | None:
        try:
            owner = json.loads(self.path.read_text())
            return owner if isinstance(owner, dict) else {}
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}  # unreadable or half written: treated as unknown

    @contextlib.contextmanager
    def _guard(self):
        """Exclusive hold of the guard file for one acquisition (module docstring)."""
        fd = os.open(self.path.with_name(GUARD_NAME), os.O_CREAT | os.O_RDWR, 0o644)
        try:
            deadline = time.monotonic() + GUARD_TIMEOUT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise RunLockError(f"could not take the lock {self.path}: another process has held "
                                           f"{self.path.name}.guard for over {GUARD_TIMEOUT_S:.0f}s") from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    def acquire(self) -> RunLock:
        with self._guard():
            return self._acquire()

    def _acquire(self) -> RunLock:
        for _ in range(3):  # the owner may remove its lock between our attempts
            if self._try_create():
                self._held = True
                return self
            owner = self._owner()
            if owner is None:
                continue
            host, pid = owner.get("host"), owner.get("pid")
            here = socket.gethostname()
            if host == here and isinstance(pid, int) and not _alive(pid):
                self.note = f"took over the lock of an earlier run (pid {pid}, started {owner.get('started', '?')}) that is no longer running"
                self.path.unlink(missing_ok=True)
                continue
            who = f"pid {pid} on {host}, started {owner.get('started', '?')}" if host else "an unknown run"
            hint = (
                f"wait for it to finish, or use another trainer.default_local_dir"
                if host == here
                else f"if that run is gone, delete {self.path} and rerun"
            )
            raise RunLockError(f"{self.path.parent} is in use by another grpo_dist run ({who}): {hint}")
        raise RunLockError(f"could not take the lock {self.path}: it keeps changing hands")

    def release(self) -> None:
        if self._held:
            owner = self._owner()
            if owner and owner.get("pid") == os.getpid() and owner.get("host") == socket.gethostname():
                self.path.unlink(missing_ok=True)
            self._held = False

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
