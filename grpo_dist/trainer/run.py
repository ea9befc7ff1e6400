"""Build everything a run needs from a validated config, train, print the summary, close.

Errors a user can act on (bad data, a failing reward function, a dead worker) end the run with
one message and a non-zero exit code, never a traceback wall. The message says what helps: "rerun
the same command" only where a rerun can get past the fault (a lost or frozen worker, preemption, a
full disk once freed); for a fault in code or data (a reward function's bad value, a refused
checkpoint), what to fix.

Order of start-up: the SIGTERM handler first; then the checks that need neither the data nor a process
(the files exist, the ranks fit the machine, the custom reward function imports); the output folder's
lock; the resume target, verified on the driver (a damaged checkpoint is reported in seconds); then Ray
and the workers' processes, which import their libraries (the longest part of start-up) while the
driver loads the tokenizer, checks the model against it, reads the data and tries the custom reward
function once; a fault found there stops the workers and Ray and is one message, as before. Then the
workers load their models.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from grpo_dist.config.spec import RunSpec


def choose_device(name: str, cluster_gpus: float) -> str:
    """The workers' device kind, ``"cuda"`` or ``"cpu"``, from ``trainer.device`` and what the Ray
    cluster offers (the driver itself may have no GPU)."""
    from grpo_dist.utils.devices import cuda_available

    if name == "auto":
        return "cuda" if cluster_gpus > 0 or cuda_available() else "cpu"
    if name == "cuda" and cluster_gpus <= 0:
        raise ValueError("trainer.device = 'cuda' is not valid here: the Ray cluster has no GPUs; run it where the GPUs "
                         "are (`--check` validates it for them on any machine), or use trainer.device=cpu")
    return name


def _fail(msg: str, code: int = 1) -> int:
    print(f"grpo_dist: error: {msg}", file=sys.stderr, flush=True)
    return code


class LastWord:
    """A run's failure message, printed once Ray and the workers are shut down, so that it ends the
    output (Ray forwards the workers' log lines late, and would print them after it). If closing takes
    longer than :data:`LAST_WORD_WAIT_S`, the message is printed then, so a hung shutdown never hides it."""

    def __init__(self) -> None:
        self.msg: str | None = None
        self.code = 0
        self._said = threading.Lock()
        self._timer: threading.Timer | None = None

    def __bool__(self) -> bool:
        return self.msg is not None

    def set(self, msg: str, code: int = 1) -> None:
        self.msg, self.code = msg, code

    def start_clock(self) -> None:
        if self.msg is not None:
            self._timer = threading.Timer(LAST_WORD_WAIT_S, self.say_now)
            self._timer.daemon = True
            self._timer.start()

    def say_now(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self.msg is not None and self._said.acquire(blocking=False):
            _fail(self.msg, self.code)


LAST_WORD_WAIT_S = 30.0


def run(spec: RunSpec, on_start: Callable[[], None] | None = None) -> int:
    """Train the run ``spec`` (:func:`grpo_dist.config.spec.resolve` of a validated configuration); ``on_start`` runs once the output directory is this run's
    (its lock taken), before any worker starts (the command line writes Hydra's files there)."""
    from grpo_dist.trainer.stop import StopSignal
    from grpo_dist.utils import startup
    from grpo_dist.utils.run_log import DriverLogs

    startup.run_begins()
    lp = spec.launch
    # Installed before anything starts, so that a SIGTERM during start-up ends the run with one message.
    stop = StopSignal(lp.preemption_grace_s, str(lp.out_dir), resume_settings=lp.resume)
    stop.install()
    # The libraries' log records leave the console (quiet) from here on, into the run's log file once it is open.
    logs = DriverLogs(lp.log_level).start()
    try:
        return _run(spec, lp, stop, on_start, logs)
    except BaseException as exc:  # what start-up raised before the workers' clean-up took over
        said = failure_message(exc, stop, lp.resume, log_file=logs.path)
        if said is None:
            raise
        return _fail(*said)
    finally:
        stop.uninstall()
        logs.close()


def failure_message(exc: BaseException, stop=None, resume_settings=None, *,
                    starting: bool = False, log_file=None) -> tuple[str, int] | None:
    """The one message (and exit code) for an error that ended a run, or None for one that is a bug in
    grpo_dist or a library (its traceback is then the useful report).

    A signal that the run's handler turned into ``Interrupted`` is reported as such whatever came out of
    the code it interrupted (raised inside Ray's C code, it surfaces as a ``SystemError``). Exit codes:
    143 a stop on SIGTERM, 130 Ctrl-C, 2 bad input (a ``ValueError``, an output directory in use), 1 any
    other error of a grpo_dist class (every class grpo_dist defines is one message). ``log_file``: the run's
    log file (quiet mode), where a worker's own output and traceback are."""
    from grpo_dist.distributed.worker_group import WorkerError
    from grpo_dist.trainer.stop import Interrupted, StopRequested
    from grpo_dist.utils.run_lock import RunLockError

    interrupted = getattr(stop, "interrupted", None)
    if interrupted is not None:
        return str(interrupted), 143
    if isinstance(exc, (Interrupted, StopRequested)):
        return str(exc), 143
    if isinstance(exc, KeyboardInterrupt):
        msg = stop.interrupt_message() if stop is not None else "interrupted by SIGINT (Ctrl-C) before the run began"
        return msg, 130
    if isinstance(exc, WorkerError):
        return (worker_failure_message(exc, resume_settings, starting=starting, log_file=log_file)
                if resume_settings is not None else str(exc)), 1
    if isinstance(exc, (ValueError, FileNotFoundError)):
        if os.environ.get("GRPO_DIST_DEBUG"):
            return None
        return f"{exc}\n  (set GRPO_DIST_DEBUG=1 to see the traceback)", 2
    if isinstance(exc, OSError) and resume_settings is not None:  # the output folder refused a write
        from grpo_dist.trainer.checkpoint import what_a_rerun_does

        return (f"{type(exc).__name__}: {exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else "")
                + "\n  the checkpoints already written are intact; fix the file system problem, then "
                + what_a_rerun_does(resume_settings)), 1
    if isinstance(exc, Exception) and _defined_here(type(exc)) and not os.environ.get("GRPO_DIST_DEBUG"):
        return str(exc), 2 if isinstance(exc, RunLockError) else 1
    return None


def _defined_here(cls: type) -> bool:
    """Whether ``cls`` or a base of it is an exception class grpo_dist defines."""
    return any(c.__module__.split(".")[0] == "grpo_dist" for c in cls.__mro__)


def _run(spec: RunSpec, lp, stop, on_start: Callable[[], None] | None, logs) -> int:
    from grpo_dist import tasks
    from grpo_dist.config.validate import logger_names
    from grpo_dist.data.readers import DataError, as_path_list
    from grpo_dist.trainer.tracking import missing_backends
    from grpo_dist.utils import startup
    from grpo_dist.utils.imports import import_modules
    from grpo_dist.utils.run_lock import RunLock, RunLockError

    t0 = time.perf_counter()
    for note in lp.noop_notes:
        print(f"grpo_dist: note: {note}", flush=True)
    # The checks that need no tokenizer, no data and no process: before anything starts.
    try:
        import_modules(lp.external_libs, where="in the driver")  # verl's external_lib: before any model is read
        model_path = tasks.resolve(lp.model)
        tok_path = tasks.resolve(lp.tokenizer) if lp.tokenizer else model_path
        files = ([tasks.resolve(p) for p in as_path_list(lp.train_files)],
                 [tasks.resolve(p) for p in as_path_list(lp.val_files)])
        startup.mark("model and data files")  # an embedded task's model is built here on first use
        note = spec.check_cpu_resources(model_path)
        if note:
            print(f"grpo_dist: warning: {note}", file=sys.stderr, flush=True)
        missing = missing_backends(logger_names(lp.loggers))
        if missing:
            raise ValueError(missing)
        if lp.custom_reward:  # a wrong path or name is found here, not after the workers start
            from grpo_dist.rewards.custom import load_custom_reward_fn

            load_custom_reward_fn(*lp.custom_reward)
        startup.mark("checks")
    except (DataError, ValueError, FileNotFoundError) as exc:
        return _fail(str(exc), 2)

    out_dir = Path(lp.out_dir)
    lock = RunLock(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        lock.acquire()
        log_file = logs.open_file(out_dir, f"run started, pid {os.getpid()}: {' '.join(sys.argv)}")
    except RunLockError as exc:
        return _fail(str(exc), 2)
    except OSError as exc:
        lock.release()
        return _fail(_write_failure(out_dir, exc), 2)
    for key, folder in lp.dump_dirs.items():  # the generation dumps' folders (grpo_dist.trainer.dumps)
        try:
            Path(folder).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            from grpo_dist.utils.disk import write_failure

            lock.release()
            return _fail(write_failure(key, folder, exc), 2)
    if lock.note:
        print(f"grpo_dist: {lock.note}", flush=True)
    if log_file is not None:
        print(f"grpo_dist: the workers' output and the libraries' logs go to {log_file} "
              "(trainer.log_level=info or GRPO_DIST_LOG_LEVEL=info shows them here)", flush=True)
    startup.mark("output folder")
    try:
        return _run_locked(spec, lp, out_dir, stop, model_path=model_path, tok_path=tok_path, files=files, t0=t0,
                           logs=logs, on_start=on_start)
    finally:
        lock.release()


def _tokenizer_and_data(spec: RunSpec, lp, logs, *, model_path: str, tok_path: str, files) -> tuple:
    """The tokenizer, the checks that need it, the training and validation data, and the custom reward
    function's trial on the first training row: ``(tokenizer, train, val)``. Done while the workers'
    processes import their libraries; a ``DataError`` or ``ValueError`` is the user's to fix."""
    from transformers import AutoTokenizer

    from grpo_dist.data.dataset import PromptDataset
    from grpo_dist.utils import startup

    logs.take_over_library_loggers()  # transformers prints through a handler of its own
    tokenizer = AutoTokenizer.from_pretrained(tok_path, trust_remote_code=lp.tokenizer_trust_remote_code)
    if lp.chat_template:
        tokenizer.chat_template = lp.chat_template
    startup.mark("tokenizer loaded")
    spec.check_model_fits(model_path, tokenizer)
    sample = dict(sample_seed=lp.sample_seed, sample_randomly=lp.sample_shuffle)
    train_files, val_files = files
    train = PromptDataset.from_files(train_files, tokenizer, **lp.dataset, max_samples=lp.train_max_samples, **sample,
                                     key="data.train_files")
    val = (PromptDataset.from_files(val_files, tokenizer, **lp.dataset, max_samples=lp.val_max_samples, **sample,
                                    key="data.val_files")
           if val_files else None)
    if lp.custom_reward:  # its type and value errors before any model is loaded
        from grpo_dist.trainer.reward_trial import try_custom_reward

        warning = try_custom_reward(*lp.custom_reward, train[0], **lp.reward_trial)
        if warning:
            print(f"grpo_dist: warning: {warning}", file=sys.stderr, flush=True)
    startup.mark("checks and data")
    return tokenizer, train, val


def _write_failure(out_dir: Path, exc: OSError) -> str:
    from grpo_dist.utils.disk import write_failure

    return write_failure("trainer.default_local_dir", out_dir, exc)


def _run_locked(spec: RunSpec, lp, out_dir: Path, stop, *, model_path, tok_path, files, t0: float, logs,
                on_start: Callable[[], None] | None) -> int:
    from grpo_dist.data.readers import DataError
    from grpo_dist.distributed.worker_group import (
        RayStartError,
        WorkerError,
        cluster_gpus,
        init_ray,
        shutdown_ray,
        write_timeline,
    )
    from grpo_dist.trainer import checkpoint
    from grpo_dist.trainer.roles import create_workers
    from grpo_dist.utils import startup

    startup.mark("ray's client")

    # The checkpoint to resume from is chosen (and verified) before any worker starts.
    try:
        resume = checkpoint.choose_resume(lp.resume)
    except (ValueError, OSError) as exc:
        return _fail(str(exc), 2)
    if resume is not None:
        stop.last_checkpoint = str(resume.path)
        print(f"grpo_dist: resuming from {resume.path} (step {resume.step})", flush=True)

    logs.take_over_library_loggers()  # Ray's logger prints through a handler of its own
    log_file = None if logs.path is None else str(logs.path)
    try:
        started_ray = init_ray(**lp.ray_init, log_level=lp.log_level, worker_log=log_file)
    except BaseException as exc:
        if stop.interrupted is None:
            if isinstance(exc, RayStartError):
                return _fail(str(exc))
            raise
        # A SIGTERM while Ray started (init_ray keeps the run's handler): stop what had begun, then say so.
        try:
            shutdown_ray()
        except Exception:
            pass
        raise stop.interrupted from None
    stop.reassert()  # ray.init installs a SIGTERM handler of its own (a stack dump, then exit)
    startup.mark("ray started")
    trainer = workers = report = None
    failure = LastWord()  # said once the workers and Ray are gone: their late log lines come before it
    try:
        device = choose_device(lp.device, cluster_gpus())
        # The workers' processes start now and import their libraries (seconds: torch, vLLM) while this
        # process loads the tokenizer and reads the data; a fault found there stops them, one message.
        try:
            workers = create_workers(spec, device, model_path, tok_path)
            startup.mark("workers created")
        except WorkerError as exc:
            _keep_report(logs, exc)
            failure.set(*(failure_message(exc, stop, lp.resume, starting=True, log_file=log_file) or (str(exc), 1)))
        if not failure:
            try:
                tokenizer, train, val = _tokenizer_and_data(spec, lp, logs, model_path=model_path, tok_path=tok_path,
                                                            files=files)
            except (DataError, ValueError, FileNotFoundError) as exc:
                if os.environ.get("GRPO_DIST_DEBUG"):
                    raise
                failure.set(str(exc), 2)
        if not failure:  # the run's files, once its data passed (a start refused for its data leaves none)
            try:
                save_config(spec, out_dir)
                if on_start is not None:
                    on_start()
            except OSError as exc:
                failure.set(_write_failure(out_dir, exc), 2)
        if not failure:
            from grpo_dist.trainer.driver import GRPOTrainer

            startup.mark("driver's modules")  # the loop's (torch, tensordict)
            trainer = GRPOTrainer(spec, model_path=model_path, tokenizer=tokenizer, tokenizer_path=tok_path,
                                  train_data=train, val_data=val, device=device, out_dir=str(out_dir), stop=stop)
            try:
                trainer.start_workers(workers)
                startup.mark("workers started")
                _write_startup(out_dir)
            except WorkerError as exc:
                _keep_report(logs, exc)
                failure.set(*(failure_message(exc, stop, lp.resume, starting=True, log_file=log_file)
                              or (str(exc), 1)))
        if not failure:
            summary = trainer.fit(resume)
            report = _ReportDrawing(out_dir)  # drawn while the workers and Ray shut down
    except BaseException as exc:  # noqa: B036 (Ctrl-C and the stop signal too: said once all is shut down)
        _keep_report(logs, exc)
        said = failure_message(exc, stop, lp.resume, log_file=log_file)
        if said is None:
            raise
        failure.set(*said)
    finally:
        failure.start_clock()
        try:
            if trainer is not None:
                trainer.close()
            elif workers is not None:
                workers.close()
            if lp.timeline_file:
                try:
                    write_timeline(lp.timeline_file)
                except Exception as exc:  # a timeline must never fail a run
                    print(f"grpo_dist: could not write ray_kwargs.timeline_json_file: {exc}", file=sys.stderr)
            if started_ray:
                shutdown_ray()
        finally:
            failure.say_now()
    if failure:
        if report is not None:
            report.finish(say=False)  # the failure's message stays the last thing printed
        return failure.code

    _print_summary(summary, time.perf_counter() - t0)
    report.finish()
    return 0


class _ReportDrawing:
    """The run's report (:func:`grpo_dist.report.write_report`) drawn on a thread of its own from the end of
    training, while the workers and Ray shut down (mostly waiting: 1-2 s with a local instance, as long as the
    drawing); :meth:`finish` waits for it and says a failure in one line (a report never fails a run)."""

    def __init__(self, out_dir: Path) -> None:
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._draw, args=(out_dir,), name="grpo_dist-report", daemon=True)
        self._thread.start()

    def _draw(self, out_dir: Path) -> None:
        try:
            from grpo_dist.report import write_report

            write_report(out_dir)
        except Exception as exc:
            self.error = exc

    def finish(self, say: bool = True) -> None:
        self._thread.join()
        if self.error is not None and say:
            print(f"grpo_dist: could not draw the report: {self.error}", file=sys.stderr)


def _keep_report(logs, exc: BaseException) -> None:
    """A failed worker's whole report from Ray (the traceback in the worker, for an exception raised there)
    into the run's log file, which the one-message failure names."""
    from grpo_dist.distributed.worker_group import WorkerError

    if isinstance(exc, WorkerError) and exc.detail:
        logs.keep(f"the run stops: {exc}", exc.detail)


def _write_startup(out_dir: Path) -> None:
    """``startup.json``: where the start-up went (:mod:`grpo_dist.utils.startup`); never fails a run."""
    from grpo_dist.utils import startup

    try:
        startup.write(out_dir / "startup.json")
    except OSError as exc:
        print(f"grpo_dist: could not write {out_dir / 'startup.json'}: {exc}", file=sys.stderr)


def worker_failure_message(exc, resume_settings, *, starting: bool = False, log_file=None) -> str:
    """What a user reads when a worker failed: the failure, then what helps. A rerun gets past a lost or
    frozen worker, and the message says what it will do (resume from step N, or start from the
    beginning: ``resume_settings`` is the run's :class:`~grpo_dist.config.launch.ResumeSettings`, or its
    checkpoint folder); a fault in code or data (a reward function's bad value, a refused checkpoint, an
    error raised in a worker) would be met again, so the message says what to fix. ``log_file`` (quiet mode):
    the run's log file, which holds what the worker wrote, its traceback included; else Ray's logs do."""
    from grpo_dist.rewards.manager import RewardError
    from grpo_dist.trainer.checkpoint import what_a_rerun_does
    from grpo_dist.training.errors import UnsafeCheckpointError

    text = without_ray_boilerplate(str(exc))
    head = f"could not start the workers: {text}" if starting else text
    resume = what_a_rerun_does(resume_settings)
    worker_log = f"{log_file}" if log_file is not None else "Ray's logs under /tmp/ray/session_latest/logs"
    if exc.kind == "lost":
        last = f"; what it wrote last is in {log_file}" if log_file is not None else ""
        return f"{head}\n  the worker's process or its node died (killed for memory, a crash, a lost node{last}); {resume}"
    if exc.kind == "frozen":
        return (f"{head}\n  {resume}; if the call is only slow (a large model, a busy machine), raise the key the "
                "deadline above names (trainer.worker_call_timeout_s for a first call, "
                "trainer.worker_call_timeout_min_s or _factor for a later one)")
    cause = exc.cause
    if isinstance(cause, RewardError):
        hint = ("the reward function is at fault, not the machine (a rerun would meet the same sample again): fix it "
                "(custom_reward_function.path / .name), or set reward_model.on_error=zero to score such samples 0 "
                "and count them (reward/num_errors)")
    elif isinstance(cause, UnsafeCheckpointError):
        hint = ("grpo_dist never unpickles Python objects from a checkpoint: move that checkpoint folder out of "
                "trainer.default_local_dir (the newest one before it is then used), point trainer.resume_from_path "
                "at another one, or start afresh with trainer.resume_mode=disable")
    elif isinstance(cause, OSError):
        hint = f"fix what the operating system reports (space, permissions, a missing file), then {resume}"
    else:
        hint = ("an error raised by code in the worker, which a rerun of the same command would meet again: fix what it "
                f"names (GRPO_DIST_DEBUG=1 shows the driver's traceback; the worker's own is in {worker_log})")
    return f"{head}\n  {hint}"


# Ray's advice after an actor's death, about its own cluster setup (common causes of a dead worker, its
# resource-isolation mode): it names nothing of this run and the message says what helps instead.
_RAY_ADVICE = (re.compile(r"\s*Some common causes include:[^;\n]*"),
               re.compile(r"[^.;\n]*consider enabling resource isolation[^;\n]*"))


def without_ray_boilerplate(text: str) -> str:
    for pattern in _RAY_ADVICE:
        text = pattern.sub("", text)
    return text


def save_config(spec: RunSpec, out_dir: Path) -> None:
    """The resolved configuration of the run, beside its metrics (it holds no secrets: keys such as
    wandb's API key are read from the environment by their libraries, never from the config)."""
    import yaml

    from grpo_dist.utils.disk import write_text_atomic

    write_text_atomic(out_dir / "config.yaml", yaml.safe_dump(spec.as_dict(), sort_keys=False))


def _summarised(key: str) -> bool:
    """The validation metrics the summary shows: verl's val-core means (mean@n, best@k/mean, maj@k/mean); their
    spreads and the val-aux metrics are in metrics.jsonl."""
    return key.startswith("val-core/") and not key.endswith("/std")


def _print_summary(s, total_s: float) -> None:
    if s.val_only:
        lines = ["", f"grpo_dist: validation finished (trainer.val_only), at step {s.steps}"]
        lines += [f"  {k:<16} {v:.3f}" for k, v in sorted(s.val_after.items()) if _summarised(k)]
        lines.append(f"  wall time        {total_s:.0f} s (validation {s.wall_s:.0f} s)")
        lines.append(f"  metrics          {s.out_dir}/metrics.jsonl")
        print("\n".join(lines), flush=True)
        return
    lines = ["", "grpo_dist: training finished"]
    lines.append(f"  steps            {s.first_step} -> {s.steps}")
    for k in sorted(k for k in set(s.val_before) | set(s.val_after) if _summarised(k)):
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
    lines += [line for line in [s.rewards.summary_line()] if line]
    print("\n".join(lines), flush=True)
    if s.rewards.warning():
        print(f"grpo_dist: warning: {s.rewards.warning()}", file=sys.stderr, flush=True)
