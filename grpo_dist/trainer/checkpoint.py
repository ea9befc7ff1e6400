"""Checkpoint folders on the driver side: naming, atomic publication, discovery, pruning.

Layout of ``<default_local_dir>/global_step_N/``:
  actor/            sharded model + optimizer + schedule + RNG (torch.distributed.checkpoint)
  huggingface/      a Hugging Face export that transformers and vLLM load (when asked)
  trainer_state.json  global step, data position, KL controller, driver RNG

A checkpoint is written under ``.global_step_N.tmp`` and renamed to ``global_step_N`` only when
complete, so a run killed while saving never leaves a folder that resume would pick up
half-written; ``latest_checkpointed_iteration.txt`` is then replaced atomically.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

STEP_RE = re.compile(r"^global_step_(\d+)$")
LATEST_FILE = "latest_checkpointed_iteration.txt"
STATE_FILE = "trainer_state.json"


def tmp_dir(root: str | os.PathLike, step: int) -> Path:
    p = Path(root) / f".global_step_{step}.tmp"
    if p.exists():
        shutil.rmtree(p)
    p.mkdir(parents=True)
    return p


def publish(root: str | os.PathLike, tmp: Path, step: int, state: dict[str, Any], max_keep: int | None) -> Path:
    """Write the driver state, rename tmp -> global_step_N, update the latest marker, prune."""
    (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))
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
    return json.loads(path.read_text())


def clean_stale_tmp(root: str | os.PathLike) -> None:
    """Remove temporary folders left by a run killed while saving."""
    root = Path(root)
    if root.is_dir():
        for p in root.glob(".global_step_*.tmp"):
            shutil.rmtree(p, ignore_errors=True)


def resume_target(trainer_cfg: Any) -> Path | None:
    """The checkpoint a run resumes from (``trainer.resume_mode``: auto = the newest complete one in
    ``default_local_dir``, resume_path = ``resume_from_path``, disable = none), after removing the
    temporary folders of saves that never finished."""
    root = Path(trainer_cfg.default_local_dir)
    clean_stale_tmp(root)
    if trainer_cfg.resume_mode == "disable":
        return None
    if trainer_cfg.resume_mode == "resume_path":
        return Path(trainer_cfg.resume_from_path)
    return latest_checkpoint(root)
