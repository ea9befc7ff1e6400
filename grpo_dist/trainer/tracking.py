"""Metric loggers selected by ``trainer.logger`` (verl's names): console, file (metrics.jsonl),
tensorboard, wandb, mlflow.

``Tracker.log(metrics, step)`` sends one step's flat ``{name: number}`` dict to every backend, with
``time/unix`` added: the wall-clock time (``time.time()``) at which the row was logged, so the time
between steps (metrics, validation, checkpoint, next batch included) can be read from the rows.
The file backend appends one JSON object per step to ``<default_local_dir>/metrics.jsonl``; on
resume it first drops lines from steps after the checkpoint (a fresh run starts the file anew),
so the file never holds two versions of a step.

``Tracker.log_generations(samples, step)`` logs validation samples (input, output, score) as a
table (``trainer.log_val_generations``): printed by console, appended to
``val_generations.jsonl`` by file, a text table in tensorboard, a ``wandb.Table`` (one row per
validation, verl's layout) in wandb, a JSON artifact in mlflow.

The wandb and mlflow runs get the resolved configuration (wandb as its config, mlflow as flattened
parameters). wandb writes under ``default_local_dir`` unless ``WANDB_DIR`` is set (``WANDB_MODE=offline``
works without an account); mlflow logs to ``MLFLOW_TRACKING_URI`` when it is set, else into
``default_local_dir`` (``mlflow.db`` where SQLAlchemy is installed, else the file store ``mlruns/``).
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Sequence

METRICS_FILE = "metrics.jsonl"
GENERATIONS_FILE = "val_generations.jsonl"
UNIX_TIME = "time/unix"
#: The Python package each optional backend needs, and how to install it.
BACKEND_PACKAGES = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"),
                    "mlflow": ("mlflow", "mlflow-skinny")}

Sample = tuple[str, str, float]  # (input, output, score) of one validation response


def missing_backends(backends: Sequence[str]) -> str | None:
    """A message naming the requested loggers whose package is not installed, or None."""
    import importlib.util

    missing = [(b, BACKEND_PACKAGES[b][1]) for b in backends
               if b in BACKEND_PACKAGES and importlib.util.find_spec(BACKEND_PACKAGES[b][0]) is None]
    if not missing:
        return None
    names = ", ".join(repr(b) for b, _ in missing)
    pip = " ".join(p for _, p in missing)
    return (f"trainer.logger has {names} but the package is not installed here: pip install {pip} "
            "(or the [tracking] extra: pip install -e '.[tracking]'), or drop it from trainer.logger")


def _import_backend(backend: str, module: str | None = None) -> Any:
    """The package of the ``trainer.logger`` backend ``backend`` (or its ``module``), imported;
    ``RuntimeError`` with the pip command when it is not installed."""
    name, pip = BACKEND_PACKAGES[backend]
    try:
        return importlib.import_module(module or name)
    except ImportError as exc:  # pragma: no cover - depends on installed extras
        raise RuntimeError(f"trainer.logger has {backend!r} but {backend} is not installed: pip install {pip}") from exc


def _trim_jsonl(path: Path, resume_step: int) -> None:
    """A fresh run (``resume_step`` 0) starts the file anew; a resumed one keeps the rows up to its
    checkpoint and drops what an interrupted run logged after it (and lines cut by a crash)."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if resume_step > 0 and json.loads(line).get("step", 0) <= resume_step:
                keep.append(line)
        except json.JSONDecodeError:
            continue
    path.write_text("".join(k + "\n" for k in keep))


def _one_line(text: str, width: int) -> str:
    flat = text.replace("\n", "\\n")
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def generations_markdown(samples: Sequence[Sample]) -> str:
    """The samples as a Markdown table (tensorboard's text plugin renders it)."""
    def cell(t: str) -> str:
        return t.replace("|", "\\|").replace("\n", "<br>")

    rows = ["| # | input | output | score |", "| --- | --- | --- | --- |"]
    rows += [f"| {i} | {cell(a)} | {cell(b)} | {c:.4g} |" for i, (a, b, c) in enumerate(samples, 1)]
    return "\n".join(rows)


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
        self.gen_path = Path(out_dir) / GENERATIONS_FILE
        _trim_jsonl(self.path, resume_step)
        _trim_jsonl(self.gen_path, resume_step)
        self._f = open(self.path, "a", buffering=1)

    def log(self, metrics: dict[str, float], step: int) -> None:
        rec = {"step": step}
        for k, v in metrics.items():
            rec[k] = v if math.isfinite(v) else None
        self._f.write(json.dumps(rec) + "\n")

    def log_generations(self, samples: Sequence[Sample], step: int) -> None:
        with open(self.gen_path, "a") as f:
            for i, (inp, out, score) in enumerate(samples):
                f.write(json.dumps({"step": step, "index": i, "input": inp, "output": out, "score": score}) + "\n")

    def close(self) -> None:
        self._f.close()


def is_headline_validation(key: str) -> bool:
    """The validation metric a run is judged by: verl's ``val-core/<source>/<acc or reward>/mean@n`` (one per
    data source; :mod:`grpo_dist.trainer.val_metrics`)."""
    return key.startswith("val-core/") and "/mean@" in key


class ConsoleLogger:
    """Prints a compact line of the headline metrics (the progress bar carries the rest)."""

    KEYS = ("critic/score/mean", "actor/pg_loss", "actor/kl_loss", "actor/entropy", "response_length/mean", "timing_s/step")

    def __init__(self, quiet_when_progress_bar: bool) -> None:
        self.quiet = quiet_when_progress_bar

    def log(self, metrics: dict[str, float], step: int) -> None:
        val = {k: v for k, v in metrics.items() if k.startswith("val-core/") and not k.endswith("/std")}
        if self.quiet and not val:
            return
        keys = [k for k in self.KEYS if k in metrics] + sorted(val)
        text = " ".join(f"{k}={metrics[k]:.4g}" for k in keys)
        print(f"step {step}: {text}", file=sys.stderr if self.quiet else sys.stdout, flush=True)

    def log_generations(self, samples: Sequence[Sample], step: int) -> None:
        lines = [f"validation generations at step {step} ({len(samples)} sample(s)):", "  #  score   input -> output"]
        lines += [f"  {i:<2} {c:<7.4g} {_one_line(a, 60)!s} -> {_one_line(b, 60)!s}" for i, (a, b, c) in enumerate(samples, 1)]
        print("\n".join(lines), file=sys.stderr if self.quiet else sys.stdout, flush=True)

    def close(self) -> None:
        pass


class TensorboardLogger:
    def __init__(self, out_dir: Path) -> None:
        SummaryWriter = _import_backend("tensorboard", "torch.utils.tensorboard").SummaryWriter
        self.w = SummaryWriter(log_dir=str(Path(out_dir) / "tensorboard"))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            # every event carries its wall time already, and a float32 scalar would round it to minutes
            if k != UNIX_TIME:
                self.w.add_scalar(k, v, step)

    def log_generations(self, samples: Sequence[Sample], step: int) -> None:
        self.w.add_text("val/generations", generations_markdown(samples), step)

    def close(self) -> None:
        self.w.close()


class WandbLogger:
    def __init__(self, project: str, name: str, config: dict, out_dir: Path) -> None:
        self.wandb = wandb = _import_backend("wandb")
        directory = os.environ.get("WANDB_DIR") or str(out_dir)
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project, name=name, config=config, dir=directory)
        self.table_rows: list[list[Any]] = []

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_generations(self, samples: Sequence[Sample], step: int) -> None:
        # verl's layout: one row per validation, columns step, input_i, output_i, score_i; the table is
        # logged whole each time (a wandb.Table cannot grow after it is logged)
        columns = ["step"] + [f"{c}_{i + 1}" for i in range(len(samples)) for c in ("input", "output", "score")]
        row = [step] + [x for s in samples for x in s]
        if self.table_rows and len(self.table_rows[0]) != len(row):
            self.table_rows = []  # fewer validation samples than asked for: a table of its own shape
        self.table_rows.append(row)
        self.run.log({"val/generations": self.wandb.Table(columns=columns, data=[list(r) for r in self.table_rows])}, step=step)

    def close(self) -> None:
        self.run.finish()


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}/" if prefix or k else ""))
        if not d and prefix:
            out[prefix.rstrip("/")] = "{}"
        return out
    if isinstance(d, (list, tuple)):
        out[prefix.rstrip("/")] = json.dumps(d)
        return out
    out[prefix.rstrip("/")] = d
    return out


_MLFLOW_BAD = re.compile(r"[^A-Za-z0-9_\-. /]")


def mlflow_key(name: str) -> str:
    """A metric name as mlflow accepts it (letters, digits, ``_-. /``): ``@`` -> ``_at_`` (verl's
    spelling), anything else -> ``_``."""
    return _MLFLOW_BAD.sub("_", name.replace("@", "_at_"))


class MlflowLogger:
    def __init__(self, project: str, name: str, config: dict, out_dir: Path) -> None:
        self.mlflow = mlflow = _import_backend("mlflow")
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            import importlib.util

            if importlib.util.find_spec("sqlalchemy") is not None:
                mlflow.set_tracking_uri(f"sqlite:///{Path(out_dir).resolve() / 'mlflow.db'}")
            else:  # mlflow-skinny has no database store; its file store must be allowed explicitly
                os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
                mlflow.set_tracking_uri(f"file:{Path(out_dir).resolve() / 'mlruns'}")
        mlflow.set_experiment(project)
        self.run = mlflow.start_run(run_name=name)
        params = {k: v for k, v in _flatten(config).items()}
        mlflow.log_params({k: ("null" if v is None else v) for k, v in params.items()})

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.mlflow.log_metrics({mlflow_key(k): v for k, v in metrics.items() if math.isfinite(v)}, step=step)

    def log_generations(self, samples: Sequence[Sample], step: int) -> None:
        rows = [{"input": a, "output": b, "score": c} for a, b, c in samples]
        self.mlflow.log_dict({"step": step, "samples": rows}, f"val_generations/val_step{step}.json")

    def close(self) -> None:
        self.mlflow.end_run()


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
                self.loggers.append(WandbLogger(project, experiment, config, Path(out_dir)))
            elif b == "mlflow":
                self.loggers.append(MlflowLogger(project, experiment, config, Path(out_dir)))
            else:  # validated before start-up
                raise AssertionError(b)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        clean = _clean(metrics)
        clean[UNIX_TIME] = time.time()
        for lg in self.loggers:
            lg.log(clean, step)

    def log_generations(self, samples: Sequence[Sample], step: int) -> None:
        """Validation samples ``(input, output, score)`` as a table in every backend."""
        samples = [(str(a), str(b), float(c)) for a, b, c in samples]
        for lg in self.loggers:
            lg.log_generations(samples, step)

    def close(self) -> None:
        for lg in self.loggers:
            lg.close()


class Progress:
    """The progress bar over training steps (tqdm): the step's mean score, its seconds and, once
    validated, the mean held-out accuracy. Does nothing when ``enabled`` is False."""

    def __init__(self, enabled: bool, *, total: int, initial: int) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="GRPO", unit="step", dynamic_ncols=True)

    def update(self, metrics: dict[str, float], last_val: dict[str, float]) -> None:
        if self.bar is None:
            return
        post = {"score": metrics.get("critic/score/mean", math.nan), "step_s": metrics["timing_s/step"]}
        acc = [v for k, v in last_val.items() if is_headline_validation(k)]
        if acc:
            post["val_acc"] = sum(acc) / len(acc)
        self.bar.set_postfix({k: f"{v:.3g}" for k, v in post.items()})
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
