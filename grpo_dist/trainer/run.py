"""Build everything a run needs from a validated config, train, print the summary, close.

Errors a user can act on (bad data, a failing reward function, a dead worker) end the run with
one message and a non-zero exit code, never a traceback wall.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Callable

from grpo_dist.config.schema import GRPOConfig


def _fail(msg: str, code: int = 1) -> int:
    print(f"grpo_dist: error: {msg}", file=sys.stderr, flush=True)
    return code


def run(cfg: GRPOConfig, on_start: Callable[[], None] | None = None) -> int:
    """Train with a validated configuration; ``on_start`` runs once the output directory is this run's
    (its lock taken), before any worker starts (the command line writes Hydra's files there)."""
    from grpo_dist import tasks
    from grpo_dist.config.validate import logger_names
    from grpo_dist.data.dataset import PromptDataset
    from grpo_dist.data.readers import DataError, as_path_list
    from grpo_dist.trainer import build
    from grpo_dist.trainer.tracking import missing_backends
    from grpo_dist.utils.run_lock import RunLock, RunLockError

    t0 = time.perf_counter()
    try:
        model_path = tasks.resolve(cfg.actor_rollout_ref.model.path)
        tok_path = tasks.resolve(cfg.data.tokenizer) if cfg.data.tokenizer else model_path
        train_files = [tasks.resolve(p) for p in as_path_list(cfg.data.train_files)]
        val_files = [tasks.resolve(p) for p in as_path_list(cfg.data.val_files)]
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tok_path, trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code)
        build.check_model_fits(cfg, model_path, tokenizer)
        build.check_cpu_ranks(cfg, os.cpu_count())
        missing = missing_backends(logger_names(cfg.trainer.logger))
        if missing:
            raise ValueError(missing)
        if cfg.custom_reward_function.path:  # a wrong path or name is found here, not after the workers start
            from grpo_dist.rewards.custom import load_custom_reward_fn

            load_custom_reward_fn(cfg.custom_reward_function.path, cfg.custom_reward_function.name)
        d = cfg.data
        common = dict(prompt_key=d.prompt_key, max_prompt_length=d.max_prompt_length,
                      filter_overlong_prompts=d.filter_overlong_prompts, truncation=d.truncation,
                      skip_bad_rows=d.skip_bad_rows)
        train = PromptDataset.from_files(train_files, tokenizer, **common)
        val = PromptDataset.from_files(val_files, tokenizer, **common) if val_files else None
    except (DataError, ValueError, FileNotFoundError) as exc:
        return _fail(str(exc), 2)

    out_dir = Path(cfg.trainer.default_local_dir)
    lock = RunLock(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        lock.acquire()
        save_config(cfg, out_dir)
        if on_start is not None:
            on_start()
    except RunLockError as exc:
        return _fail(str(exc), 2)
    except OSError as exc:
        lock.release()
        return _fail(f"cannot write to trainer.default_local_dir={out_dir}: {exc.strerror or exc} "
                     f"({exc.filename or out_dir}); give a directory this user can create and write", 2)
    if lock.note:
        print(f"grpo_dist: {lock.note}", flush=True)
    try:
        return _run_locked(cfg, out_dir, model_path=model_path, tokenizer=tokenizer, tok_path=tok_path,
                           train=train, val=val, t0=t0)
    finally:
        lock.release()


def _run_locked(cfg: GRPOConfig, out_dir: Path, *, model_path, tokenizer, tok_path, train, val, t0: float) -> int:
    from grpo_dist.config.validate import data_parallel_size
    from grpo_dist.distributed.worker_group import WorkerError, cluster_gpus, init_ray, shutdown_ray
    from grpo_dist.trainer import build
    from grpo_dist.trainer.driver import GRPOTrainer, TrainingError
    from grpo_dist.trainer.stop import StopRequested

    ri = cfg.ray_kwargs.ray_init
    started_ray = init_ray(address=ri.address, num_cpus=ri.num_cpus, include_dashboard=ri.include_dashboard,
                           min_cpus=data_parallel_size(cfg))
    trainer = None
    try:
        device = build.choose_device(cfg.trainer.device, cluster_gpus())
        trainer = GRPOTrainer(cfg, model_path=model_path, tokenizer=tokenizer, tokenizer_path=tok_path,
                              train_data=train, val_data=val, device=device, out_dir=str(out_dir))
        trainer.stop.install()
        try:
            trainer.start_workers()
        except WorkerError as exc:
            return _fail(f"could not start the workers: {exc}")
        summary = trainer.fit()
    except StopRequested as exc:
        return _fail(str(exc), 143)
    except TrainingError as exc:
        return _fail(str(exc))
    except WorkerError as exc:
        return _fail(f"{exc}\n  rerun the same command to resume from the newest checkpoint in {out_dir} that verifies")
    except (ValueError, FileNotFoundError) as exc:
        if os.environ.get("GRPO_DIST_DEBUG"):
            raise
        return _fail(f"{exc}\n  (set GRPO_DIST_DEBUG=1 to see the traceback)", 2)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    finally:
        if trainer is not None:
            trainer.close()
        if started_ray:
            shutdown_ray()

    _print_summary(summary, time.perf_counter() - t0)
    try:
        from grpo_dist.report import write_report

        write_report(out_dir)
    except Exception as exc:  # a report must never fail a finished run
        print(f"grpo_dist: could not draw the report: {exc}", file=sys.stderr)
    return 0


def save_config(cfg: GRPOConfig, out_dir: Path) -> None:
    """The resolved configuration of the run, beside its metrics (it holds no secrets: keys such as
    wandb's API key are read from the environment by their libraries, never from the config)."""
    from dataclasses import asdict

    import yaml

    (out_dir / "config.yaml").write_text(yaml.safe_dump(asdict(cfg), sort_keys=False))


def _print_summary(s, total_s: float) -> None:
    if s.val_only:
        lines = ["", f"grpo_dist: validation finished (trainer.val_only), at step {s.steps}"]
        lines += [f"  {k:<16} {v:.3f}" for k, v in sorted(s.val_after.items())]
        lines.append(f"  wall time        {total_s:.0f} s (validation {s.wall_s:.0f} s)")
        lines.append(f"  metrics          {s.out_dir}/metrics.jsonl")
        print("\n".join(lines), flush=True)
        return
    lines = ["", "grpo_dist: training finished"]
    lines.append(f"  steps            {s.first_step} -> {s.steps}")
    for k in sorted(set(s.val_before) | set(s.val_after)):
        b, a = s.val_before.get(k), s.val_after.get(k)
        fb = f"{b:.3f}" if b is not None else "-"
        fa = f"{a:.3f}" if a is not None else "-"
        lines.append(f"  {k:<16} {fb} -> {fa}")
    lines.append(f"  wall time        {total_s:.0f} s (training loop {s.wall_s:.0f} s)")
    if s.wall_s > 0:
        lines.append(f"  tokens/s         {s.tokens / s.wall_s:.0f}")
    if s.last_checkpoint:
        lines.append(f"  checkpoint       {s.last_checkpoint}")
    lines.append(f"  metrics, report  {s.out_dir}/metrics.jsonl, {s.out_dir}/report/")
    print("\n".join(lines), flush=True)
