"""Checkpoint folders on the driver side: naming, atomic publication, discovery, pruning.

Layout of ``<default_local_dir>/global_step_N/``:
  actor/            sharded model + optimizer + schedule + RNG (torch.distributed.checkpoint)
  huggingface/      a Hugging Face export that transformers and vLLM load (when asked)
  trainer_state.json  global step, data position, KL controller, driver RNG

A checkpoint is written under ``.global_step_N.tmp`` and renamed to ``global_step_N`` only when
complete, so a run killed while saving never leaves a folder that resume would pick up
half-written; ``latest_checkpointed_iteration.txt`` is then replaced atomically.

``manifest.json`` is written last (before the rename): every file's size and, up to
``CHECKSUM_MAX_BYTES``, its SHA-256. Resume verifies a checkpoint against it and, when the newest is
damaged (a truncated or changed file, a missing one), falls back to the newest one that verifies,
naming what it skipped and why. A folder without a manifest (written before manifests existed) is
used as it is.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

STEP_RE = re.compile(r"^global_step_(\d+)$")
LATEST_FILE = "latest_checkpointed_iteration.txt"
STATE_FILE = "trainer_state.json"
MANIFEST_FILE = "manifest.json"
CHECKSUM_MAX_BYTES = 256 * 2**20  # larger files are checked by size (hashing them would slow every save)


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_manifest(folder: Path) -> None:
    """Record every file under ``folder`` (size; SHA-256 up to ``CHECKSUM_MAX_BYTES``) in its manifest."""
    files = {}
    for p in sorted(q for q in folder.rglob("*") if q.is_file() and q.name != MANIFEST_FILE):
        size = p.stat().st_size
        files[p.relative_to(folder).as_posix()] = {"size": size, **({"sha256": _sha256(p)} if size <= CHECKSUM_MAX_BYTES else {})}
    (folder / MANIFEST_FILE).write_text(json.dumps({"files": files}, indent=1))


def verify(ckpt: str | os.PathLike) -> str | None:
    """Why ``ckpt`` does not match its manifest (the first problem found), or None when it does (or
    has no manifest)."""
    ckpt = Path(ckpt)
    manifest = ckpt / MANIFEST_FILE
    if not manifest.exists():
        return None
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError):
        return f"its {MANIFEST_FILE} is unreadable"
    for rel, want in files.items():
        p = ckpt / rel
        if not p.is_file():
            return f"{rel} is missing"
        size = p.stat().st_size
        if size != want["size"]:
            return f"{rel} has {size} bytes, {want['size']} were written"
        if "sha256" in want and _sha256(p) != want["sha256"]:
            return f"{rel} has changed since it was written (checksum)"
    return None


def tmp_dir(root: str | os.PathLike, step: int) -> Path:
    p = Path(root) / f".global_step_{step}.tmp"
    if p.exists():
        shutil.rmtree(p)
    p.mkdir(parents=True)
    return p


def publish(root: str | os.PathLike, tmp: Path, step: int, state: dict[str, Any], max_keep: int | None) -> Path:
    """Write the driver state, rename tmp -> global_step_N, update the latest marker, prune."""
    (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))
    write_manifest(tmp)
    final = Path(root) / f"global_step_{step}"
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    marker = Path(root) / LATEST_FILE
    tmp_marker = marker.with_suffix(".tmp")
    tmp_marker.write_text(str(step))
    os.replace(tmp_marker, marker)
    if max_keep:
        for old in complete_checkpoints(root)[:-max_keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def complete_checkpoints(root: str | os.PathLike) -> list[Path]:
    """Published checkpoint folders, oldest first (temporary ones are never listed)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = STEP_RE.match(p.name)
        if m and p.is_dir() and (p / STATE_FILE).exists():
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    ckpts = complete_checkpoints(root)
    return ckpts[-1] if ckpts else None


def read_state(ckpt: str | os.PathLike) -> dict[str, Any]:
    path = Path(ckpt) / STATE_FILE
    if not path.exists():
        raise FileNotFoundError(f"{ckpt} is not a complete grpo_dist checkpoint (no {STATE_FILE})")
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path} is damaged ({e}); remove {ckpt} to resume from an earlier checkpoint") from None


def clean_stale_tmp(root: str | os.PathLike) -> None:
    """Remove temporary folders left by a run killed while saving."""
    root = Path(root)
    if root.is_dir():
        for p in root.glob(".global_step_*.tmp"):
            shutil.rmtree(p, ignore_errors=True)


def resume_target(trainer_cfg: Any) -> Path | None:
    """The checkpoint a run resumes from (``trainer.resume_mode``: auto = the newest complete one in
    ``default_local_dir`` that matches its manifest, older damaged ones being skipped with a warning;
    resume_path = ``resume_from_path``, which must verify; disable = none), after removing the
    temporary folders of saves that never finished."""
    root = Path(trainer_cfg.default_local_dir)
    clean_stale_tmp(root)
    if trainer_cfg.resume_mode == "disable":
        return None
    if trainer_cfg.resume_mode == "resume_path":
        path = Path(trainer_cfg.resume_from_path)
        problem = verify(path)
        if problem:
            raise ValueError(f"trainer.resume_from_path={path} is damaged: {problem}")
        return path
    for ckpt in reversed(complete_checkpoints(root)):
        problem = verify(ckpt)
        if problem is None:
            return ckpt
        print(f"grpo_dist: warning: skipping the damaged checkpoint {ckpt}: {problem}", file=sys.stderr, flush=True)
    return None
