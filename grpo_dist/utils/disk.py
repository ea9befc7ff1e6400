"""The output folder at start-up: writes that leave no half-written file, a message that tells a full
disk from a folder this user may not write, and the removal of what a failed start created.

A run's start writes its output folder (``trainer.default_local_dir``, or Hydra's ``hydra.run.dir``):
the folder itself, the job log ``<hydra.job.name>.log``, the lock, ``config.yaml`` and Hydra's
``.hydra/`` files. :class:`StartFiles` notes which of them exist before the start, so that a start
that fails before the run owns the folder (a full disk, bad data, another run's lock) removes the
ones it created, and leaves the folder as it found it.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Iterable

__all__ = ["StartFiles", "free_bytes", "write_failure", "write_text_atomic"]

#: errno values that say the disk (or this user's share of it) is full, not that the folder is refused
FULL_DISK = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "this user's disk quota is used up"}


def free_bytes(path: str | os.PathLike) -> int | None:
    """Free bytes on the file system holding ``path`` (its nearest existing parent); None when unknown."""
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} bytes" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def write_failure(key: str, path: str | os.PathLike, exc: OSError) -> str:
    """One message for a start-up write to ``key=path`` that failed with ``exc``: a full disk (or
    quota) says so, with the space left and the file; anything else (permissions, a file where a
    folder should be, a read-only file system) asks for a directory this user can create and write."""
    where = exc.filename or path
    if exc.errno in FULL_DISK:
        free = free_bytes(where)
        left = f", {_size(free)} free" if free is not None else ""
        return (f"cannot write to {key}={path}: {FULL_DISK[exc.errno]} ({exc.strerror or exc}{left}, writing "
                f"{where}); free space on that disk, or point {key} at a directory on another one")
    return (f"cannot write to {key}={path}: {exc.strerror or exc} ({where}); give a directory this user can "
            "create and write")


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``path`` whole or not at all: a temporary file beside it, renamed over it. A failed write
    (a full disk) leaves the old file as it was, and no temporary file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class StartFiles:
    """The files and folders a start may create, and which of them existed before it.

    ``dirs``: the folders the start writes into (they and the parents it would create are tracked);
    ``files``: the files it may create in them. :meth:`remove_created` removes the files that did not
    exist when this object was made, then the tracked folders that did not exist and are now empty
    (deepest first). Nothing that existed before is touched, and a folder that holds anything else
    stays."""

    def __init__(self, dirs: Iterable[str | os.PathLike], files: Iterable[str | os.PathLike]) -> None:
        self._new_dirs: list[Path] = []
        for d in dirs:
            p = Path(os.path.abspath(d))
            while not p.exists() and p != p.parent and p not in self._new_dirs:
                self._new_dirs.append(p)
                p = p.parent
        self._new_files = [Path(os.path.abspath(f)) for f in files if not os.path.lexists(f)]

    def remove_created(self) -> None:
        for f in self._new_files:
            try:
                f.unlink(missing_ok=True)
            except OSError:
                pass
        for d in sorted(set(self._new_dirs), key=lambda p: len(p.parts), reverse=True):
            try:
                d.rmdir()  # only when empty
            except OSError:
                pass
