"""Checkpoint folders on the driver side: naming, atomic publication, discovery, pruning.

Layout of ``<default_local_dir>/global_step_N/``:
  actor/            sharded model + optimizer + schedule + RNG (torch.distributed.checkpoint)
  huggingface/      a Hugging Face export that transformers and vLLM load (when asked)
  trainer_state.json  global step, data position, KL controller, driver RNG

A checkpoint is written under ``.global_step_N.tmp`` and renamed to ``global_step_N`` only when
complete, so a run killed while saving never leaves a folder that resume would pick up
half-written; ``latest_checkpointed_iteration.txt`` is then replaced atomically.

``manifest.json`` is written last (before the rename): every file's size and SHA-256. The workers
hash their files as they write them (:mod:`grpo_dist.utils.file_digest`; each leaves a record in the
folder) and :func:`write_manifest` gathers those records, hashing only the files nobody recorded (the
driver's own small files). Resume verifies a checkpoint against it, reading every file once, and, when
the newest is damaged (a truncated or changed file, a missing one), falls back to the newest one that
verifies, naming what it skipped and why. A folder without a readable ``trainer_state.json`` is
damaged too, and named.

A folder with a ``trainer_state.json`` but no manifest (written by hand, or by a grpo_dist older than
manifests) cannot be verified: ``resume_mode=auto`` stops before it, naming it and the two ways on
(resume from it explicitly with ``resume_mode=resume_path``, which loads it with a warning, or move it
away); it never resumes from it silently nor silently skips it.

The resume target is chosen on the driver before any worker starts (:func:`choose_resume`), so a
damaged checkpoint is reported in seconds; the workers then load the chosen one.

Retention (``trainer.max_actor_ckpt_to_keep``) counts checkpoints that verify, and only those older
than the one just written: it never deletes the checkpoint just written, nor a newer folder (left by
an earlier run that this one did not resume from), so it cannot delete the last good checkpoint and
keep a damaged one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from grpo_dist.distributed.worker_group import WorkerError
from grpo_dist.trainer.summary import CheckpointSaveError
from grpo_dist.utils import file_digest
from grpo_dist.utils.disk import free_bytes

STEP_RE = re.compile(r"^global_step_(\d+)$")
LATEST_FILE = "latest_checkpointed_iteration.txt"
STATE_FILE = "trainer_state.json"
MANIFEST_FILE = "manifest.json"
# torch's file writer reports a full disk as a RuntimeError of its own, not an OSError: "[enforce fail at
# inline_container.cc:...] . unexpected pos 704 vs 598", "PytorchStreamWriter failed writing file ...".
TORCH_WRITE_FAILURES = ("unexpected pos", "PytorchStreamWriter failed", "file write failed")
LOW_FREE_BYTES = 64 * 2**20  # a save that fails with less than this left on the disk failed for want of space


def write_manifest(folder: Path) -> None:
    """Record every file under ``folder`` (size, SHA-256) in its manifest, written last and atomically.

    The sizes and digests are those the writers recorded while writing (:func:`file_digest.collect`,
    whose record files are removed); a file nobody recorded is hashed here. A recorded file that is no
    longer there is listed all the same, so that the checkpoint does not verify."""
    recorded = file_digest.collect(folder)
    on_disk = sorted(q for q in folder.rglob("*") if q.is_file() and q.name != MANIFEST_FILE)
    files = {}
    for p in on_disk:
        rel = p.relative_to(folder).as_posix()
        files[rel] = recorded.pop(rel, None) or {"size": p.stat().st_size, file_digest.ALGORITHM: file_digest.digest_of(p)}
    files.update(recorded)
    tmp = folder / (MANIFEST_FILE + ".tmp")
    tmp.write_text(json.dumps({"algorithm": file_digest.ALGORITHM, "files": dict(sorted(files.items()))}, indent=1))
    os.replace(tmp, folder / MANIFEST_FILE)


def has_manifest(ckpt: str | os.PathLike) -> bool:
    return (Path(ckpt) / MANIFEST_FILE).is_file()


def verify(ckpt: str | os.PathLike, *, checksums: bool = True) -> str | None:
    """Why ``ckpt`` does not match its manifest (the first problem found), or None when it does (or
    has no manifest: see :func:`has_manifest`). Every file is read once and its SHA-256 compared;
    ``checksums=False`` checks presence and sizes only (cheap: no file is read). An entry without a
    digest (manifests written before every file was hashed held none above 256 MiB) is checked by
    size."""
    ckpt = Path(ckpt)
    manifest = ckpt / MANIFEST_FILE
    if not manifest.exists():
        return None
    try:
        files = json.loads(manifest.read_text())["files"]
        sizes = {rel: int(want["size"]) for rel, want in files.items()}
    except (ValueError, KeyError, TypeError):
        return f"its {MANIFEST_FILE} is unreadable"
    for rel, want in files.items():
        p = ckpt / rel
        if not p.is_file():
            return f"{rel} is missing"
        size = p.stat().st_size
        if size != sizes[rel]:
            return f"{rel} has {size} bytes, {sizes[rel]} were written"
    if checksums:
        for rel, want in files.items():
            if file_digest.ALGORITHM in want and file_digest.digest_of(ckpt / rel) != want[file_digest.ALGORITHM]:
                return f"{rel} has changed since it was written (checksum)"
    return None


def tmp_dir(root: str | os.PathLike, step: int) -> Path:
    p = Path(root) / f".global_step_{step}.tmp"
    if p.exists():
        shutil.rmtree(p)
    p.mkdir(parents=True)
    return p


def publish(root: str | os.PathLike, tmp: Path, step: int, state: dict[str, Any], max_keep: int | None) -> Path:
    """Write the driver state, rename tmp -> global_step_N, update the latest marker, prune
    (:func:`prune`). Until the rename, nothing a resume reads has changed."""
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
        prune(root, final, max_keep)
    return final


def save(root: str | os.PathLike, step: int, state: dict[str, Any], *, write_shards: Callable[[Path], None],
         max_keep: int | None, newest: str | None, root_key: str, resume_settings: Any = None) -> Path:
    """One step's checkpoint: ``write_shards(tmp)`` fills a fresh temporary folder (the workers'
    shards), then :func:`publish` adds the driver ``state`` and publishes it by one rename.

    A disk that refuses (an ``OSError`` here, or a worker's failure to write its shard that
    :func:`_disk_failure` recognises as the disk's) is a
    :class:`~grpo_dist.trainer.summary.CheckpointSaveError` naming the folder, the error, the space left
    when it is nearly none, and ``newest`` (the run's newest published checkpoint, which is untouched,
    as is everything a resume reads); ``root_key`` is the configuration key of ``root``, for the
    message; the message ends with what a rerun of the same command will do (:func:`what_a_rerun_does`
    with ``resume_settings``, default: resume from ``root``). The temporary folder is removed then.
    """
    tmp = Path(root) / f".global_step_{step}.tmp"
    try:
        tmp = tmp_dir(root, step)
        write_shards(tmp)
        return publish(root, tmp, step, state, max_keep)
    except OSError as exc:
        what = f"{type(exc).__name__}: {exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else "")
    except WorkerError as exc:
        if not _disk_failure(exc, root):
            raise
        what = str(exc)
    free = free_bytes(root)  # measured before the partial folder goes: what the failed write had left
    shutil.rmtree(tmp, ignore_errors=True)  # never published: a resume does not read it
    disk = f" (the disk holding it has {free / 2**20:.1f} MiB free)" if free is not None and free < LOW_FREE_BYTES else ""
    kept = f"the previous checkpoints are intact (newest: {newest})" if newest else "no earlier checkpoint of this run exists"
    raise CheckpointSaveError(
        f"could not save the checkpoint of step {step} under {tmp}: {what}{disk}; {kept}. Free space or fix the "
        f"permissions of {root_key}={root}; then {what_a_rerun_does(resume_settings or root)}")


def _disk_failure(exc: WorkerError, root: str | os.PathLike) -> bool:
    """Whether a worker's failure to write its shard is the disk's: an ``OSError`` in the worker, torch's
    own writer failing (it reports a full disk as a ``RuntimeError``), or any error raised while the
    disk holding ``root`` has almost nothing left. A lost or frozen worker is never the disk's."""
    if exc.kind != "raised":
        return False
    if isinstance(exc.cause, OSError):
        return True
    if isinstance(exc.cause, RuntimeError) and any(s in str(exc.cause) for s in TORCH_WRITE_FAILURES):
        return True
    free = free_bytes(root)
    return free is not None and free < LOW_FREE_BYTES


def prune(root: str | os.PathLike, newest: Path, keep: int) -> list[Path]:
    """Retention after ``newest`` (just written) was published: keep it and the ``keep - 1`` newest
    older checkpoints that verify (sizes; checksums would re-read every file at every save); delete
    the other older folders. Folders with a higher step than ``newest`` are left alone (an earlier
    run's, not resumed from: damaged ones are named at every resume). Returns what was deleted."""
    n = _step_of(newest)
    older = [p for s, p in step_folders(root) if s < n]
    good = [p for p in older if problem_with(p, checksums=False) is None]
    kept = set(good[len(good) - (keep - 1):]) if keep > 1 else set()
    gone = [p for p in older if p not in kept]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


def _step_of(ckpt: Path) -> int:
    m = STEP_RE.match(ckpt.name)
    assert m, ckpt
    return int(m.group(1))


def step_folders(root: str | os.PathLike) -> list[tuple[int, Path]]:
    """Every ``global_step_N`` folder (complete or not), by step, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = STEP_RE.match(p.name)
        if m and p.is_dir():
            found.append((int(m.group(1)), p))
    return sorted(found)


def complete_checkpoints(root: str | os.PathLike) -> list[Path]:
    """Published checkpoint folders (with a driver state file), oldest first (temporary ones are
    never listed)."""
    return [p for _, p in step_folders(root) if (p / STATE_FILE).exists()]


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    ckpts = complete_checkpoints(root)
    return ckpts[-1] if ckpts else None


def read_state(ckpt: str | os.PathLike) -> dict[str, Any]:
    path = Path(ckpt) / STATE_FILE
    if not path.exists():
        raise FileNotFoundError(f"{ckpt} is not a complete grpo_dist checkpoint (no {STATE_FILE})")
    try:
        state = json.loads(path.read_text())
    except (ValueError, OSError) as e:
        raise ValueError(f"{path} is damaged ({e}); remove {ckpt} to resume from an earlier checkpoint") from None
    if not isinstance(state, dict) or "global_step" not in state:
        raise ValueError(f"{path} is damaged (no global_step); remove {ckpt} to resume from an earlier checkpoint")
    return state


def problem_with(ckpt: str | os.PathLike, *, checksums: bool = True) -> str | None:
    """Why ``ckpt`` cannot be resumed from (its manifest does not verify; its driver state file is
    missing or unreadable), or None."""
    ckpt = Path(ckpt)
    problem = verify(ckpt, checksums=checksums)
    if problem:
        return problem
    if not (ckpt / STATE_FILE).is_file():
        return f"it has no {STATE_FILE} (a save that never finished, or a file removed since)"
    try:
        read_state(ckpt)
    except ValueError:
        return f"its {STATE_FILE} is unreadable"
    return None


def what_a_rerun_does(settings: Any) -> str:
    """What running the same command again will do, from the checkpoints on disk now: resume from step N
    (the newest checkpoint whose files match its manifest's sizes, as :func:`resume_target` would pick,
    less the checksums), or start from the beginning. ``settings``: the run's
    :class:`~grpo_dist.config.launch.ResumeSettings` (``default_local_dir``, ``resume_mode``,
    ``resume_from_path``), or just the checkpoint folder (``resume_mode=auto``)."""
    if isinstance(settings, (str, os.PathLike)):
        root, mode, path = Path(settings), "auto", None
    else:
        root, mode, path = Path(settings.default_local_dir), settings.resume_mode, settings.resume_from_path
    if mode == "disable":
        return "rerun the same command to start from the beginning (trainer.resume_mode=disable reads no checkpoint)"
    if mode == "resume_path":
        return f"rerun the same command to resume from trainer.resume_from_path={path} again"
    for step, ckpt in reversed(step_folders(root)):
        if problem_with(ckpt, checksums=False) is None:
            return f"rerun the same command to resume from step {step} ({ckpt}), the newest checkpoint that verifies"
    return f"this run has no checkpoint in {root} yet: rerun the same command to start from the beginning"


def clean_stale_tmp(root: str | os.PathLike) -> None:
    """Remove temporary folders left by a run killed while saving."""
    root = Path(root)
    if root.is_dir():
        for p in root.glob(".global_step_*.tmp"):
            shutil.rmtree(p, ignore_errors=True)


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a run resumes from and its driver state (``trainer_state.json``)."""

    path: Path
    state: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.state["global_step"])


def choose_resume(trainer_cfg: Any) -> ResumePoint | None:
    """The checkpoint a run resumes from, verified, with its state; run on the driver before any
    worker starts (see :func:`resume_target`). ``ValueError`` naming the key when
    ``trainer.resume_from_path`` is damaged."""
    ckpt = resume_target(trainer_cfg)
    return None if ckpt is None else ResumePoint(ckpt, read_state(ckpt))


def resume_target(trainer_cfg: Any) -> Path | None:
    """The checkpoint a run resumes from (``trainer.resume_mode``: auto = the newest ``global_step_N``
    in ``default_local_dir`` that matches its manifest and has a readable ``trainer_state.json``,
    newer damaged ones being skipped with a warning naming the folder and what is wrong;
    resume_path = ``resume_from_path``, which must verify; disable = none), after removing the
    temporary folders of saves that never finished.

    ``ValueError`` (before anything starts) when auto reaches a folder that cannot be verified (no
    manifest: :func:`unverifiable_message`); resume_path loads such a folder, with a warning."""
    root = Path(trainer_cfg.default_local_dir)
    clean_stale_tmp(root)
    if trainer_cfg.resume_mode == "disable":
        return None
    if trainer_cfg.resume_mode == "resume_path":
        path = Path(trainer_cfg.resume_from_path)
        problem = problem_with(path)
        if problem:
            raise ValueError(f"trainer.resume_from_path={path} is damaged: {problem}")
        if not has_manifest(path):
            print(f"grpo_dist: warning: resuming from {path} without verifying it: it has no {MANIFEST_FILE} "
                  "(trainer.resume_from_path names it, so it is taken as it is)", file=sys.stderr, flush=True)
        return path
    skipped = 0
    for _, ckpt in reversed(step_folders(root)):
        problem = problem_with(ckpt)
        if problem is None:
            if not has_manifest(ckpt):
                raise ValueError(unverifiable_message(ckpt, root))
            return ckpt
        skipped += 1
        print(f"grpo_dist: warning: skipping the damaged checkpoint {ckpt}: {problem}", file=sys.stderr, flush=True)
    if skipped:
        print(f"grpo_dist: warning: no checkpoint in {root} can be resumed from: starting from step 0",
              file=sys.stderr, flush=True)
    return None


def unverifiable_message(ckpt: Path, root: Path) -> str:
    """What a run says when the checkpoint it would resume from has no manifest."""
    return (f"the checkpoint to resume from, {ckpt}, cannot be verified: it has no {MANIFEST_FILE} (a folder written by hand, "
            f"or by a grpo_dist older than checkpoint manifests), so it is not resumed from automatically. To resume "
            f"from it as it is: trainer.resume_mode=resume_path trainer.resume_from_path={ckpt}; to resume from the "
            f"newest verified checkpoint instead, move it out of trainer.default_local_dir={root}; to start fresh: "
            f"trainer.resume_mode=disable")
