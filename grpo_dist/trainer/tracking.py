"""Metric loggers selected by ``trainer.logger``: console, file (metrics.jsonl), tensorboard, wandb.

``Tracker.log(metrics, step)`` sends one step's flat ``{name: number}`` dict to every backend, with
``time/unix`` added: the wall-clock time (``time.time()``) at which the row was logged, so the time
between steps (metrics, validation, checkpoint, next batch included) can be read from the rows.
The file backend appends one JSON object per step to ``<default_local_dir>/metrics.jsonl``; on
resume it first drops lines from steps after the checkpoint (a fresh run starts the file anew),
so the file never holds two versions of a step.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
UNIX_TIME = "time/unix"


def _clean(metrics: dict[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in metrics.items():
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        out[k] = f
    return out


class FileLogger:
    def __init__(self, out_dir: Path, resume_step: int = 0) -> None:
        self.path = Path(out_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            keep = []
            for line in self.path.read_text().splitlines():
                try:
                    # a fresh run (resume_step 0) starts the file anew; a resumed one keeps the
                    # steps up to its checkpoint and drops what an interrupted run logged after it
                    if resume_step > 0 and json.loads(line).get("step", 0) <= resume_step:
                        keep.append(line)
                except json.JSONDecodeError:
                    continue  # a line cut by a crash
            self.path.write_text("".join(k + "\n" for k in keep))
        self._f = open(self.path, "a", buffering=1)

    def log(self, metrics: dict[str, float], step: int) -> None:
        rec = {"step": step}
        for k, v in metrics.items():
            rec[k] = v if math.isfinite(v) else None
        self._f.write(json.dumps(rec) + "\n")

    def close(self) -> None:
        self._f.close()


class ConsoleLogger:
    """Prints a compact line of the headline metrics (the progress bar carries the rest)."""

    KEYS = ("critic/score/mean", "actor/pg_loss", "actor/kl_loss", "actor/entropy", "response_length/mean", "timing_s/step")

    def __init__(self, quiet_when_progress_bar: bool) -> None:
        self.quiet = quiet_when_progress_bar

    def log(self, metrics: dict[str, float], step: int) -> None:
        val = {k: v for k, v in metrics.items() if k.startswith("val-core/")}
        if self.quiet and not val:
            return
        keys = [k for k in self.KEYS if k in metrics] + sorted(val)
        text = " ".join(f"{k}={metrics[k]:.4g}" for k in keys)
        print(f"step {step}: {text}", file=sys.stderr if self.quiet else sys.stdout, flush=True)

    def close(self) -> None:
        pass


class TensorboardLogger:
    def __init__(self, out_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # pragma: no cover - depends on installed extras
            raise RuntimeError("trainer.logger has 'tensorboard' but tensorboard is not installed: pip install tensorboard") from exc
        self.w = SummaryWriter(log_dir=str(Path(out_dir) / "tensorboard"))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            # every event carries its wall time already, and a float32 scalar would round it to minutes
            if k != UNIX_TIME:
                self.w.add_scalar(k, v, step)

    def close(self) -> None:
        self.w.close()


class WandbLogger:
    def __init__(self, project: str, name: str, config: dict) -> None:
        try:
            import wandb
        except ImportError as exc:  # pragma: no cover
            raise RuntimeError("trainer.logger has 'wandb' but wandb is not installed: pip install wandb") from exc
        self.wandb = wandb
        self.run = wandb.init(project=project, name=name, config=config)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


class Tracker:
    def __init__(self, backends: list[str], *, out_dir: str | os.PathLike, project: str, experiment: str,
                 config: dict, resume_step: int = 0, progress_bar: bool = False) -> None:
        self.loggers: list[Any] = []
        for b in backends:
            if b == "console":
                self.loggers.append(ConsoleLogger(quiet_when_progress_bar=progress_bar))
            elif b == "file":
                self.loggers.append(FileLogger(Path(out_dir), resume_step))
            elif b == "tensorboard":
                self.loggers.append(TensorboardLogger(Path(out_dir)))
            elif b == "wandb":
                self.loggers.append(WandbLogger(project, experiment, config))
            else:  # validated before start-up
                raise AssertionError(b)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        clean = _clean(metrics)
        clean[UNIX_TIME] = time.time()
        for lg in self.loggers:
            lg.log(clean, step)

    def close(self) -> None:
        for lg in self.loggers:
            lg.close()


class Progress:
    """The progress bar over training steps (tqdm): the step's mean score, its seconds and, once
    validated, the mean held-out accuracy. Does nothing when ``enabled`` is False."""

    def __init__(self, enabled: bool, *, total: int, initial: int, val_suffix: str) -> None:
        self.val_suffix = val_suffix
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="GRPO", unit="step", dynamic_ncols=True)

    def update(self, metrics: dict[str, float], last_val: dict[str, float]) -> None:
        if self.bar is None:
            return
        post = {"score": metrics.get("critic/score/mean", math.nan), "step_s": metrics["timing_s/step"]}
        acc = [v for k, v in last_val.items() if k.endswith(self.val_suffix)]
        if acc:
            post["val_acc"] = sum(acc) / len(acc)
        self.bar.set_postfix({k: f"{v:.3g}" for k, v in post.items()})
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
