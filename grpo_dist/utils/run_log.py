"""Where a run's library logs go: a quiet console and one log file per output folder.

``trainer.log_level`` (or the ``GRPO_DIST_LOG_LEVEL`` environment variable, which wins when set) picks
the mode:

- ``quiet`` (the default): the console shows grpo_dist's own lines (start-up, progress bar, validation,
  summary, warnings and errors); everything else goes to ``<trainer.default_local_dir>/logs/run.log``:
  all the worker processes write (Python logging of vLLM, Ray, torch and transformers, Python warnings,
  and C-level writes to their stdout/stderr such as torch's NUMA or vLLM's tcmalloc notices), and the
  driver's library log records (Ray's notices at start, transformers, matplotlib, ...). A rerun or a
  resume into the same folder appends to the file, after a header line naming the run's start.
- ``warning`` | ``info`` | ``debug``: the console shows the libraries' log records from that level up,
  and Ray forwards the workers' output to it (prefixed with the worker's name and pid), with the
  libraries' verbosity in the workers set to that level (``warning``: vLLM's warnings, transformers'
  errors, as grpo_dist ran before quiet mode); no log file is written.

The worker processes send their file descriptors 1 and 2 to the file in :func:`worker_output_to_run_log`,
which Ray runs in every worker process before it imports anything of the run (``runtime_env``'s
``worker_process_setup_hook``), so even a worker that dies leaves what it wrote, its traceback
included, in the file (the descriptors write straight to the file, with no buffer of their own).

This module imports only the standard library: Ray imports it in every worker process.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import re
import sys
import time
from pathlib import Path

LEVELS = ("quiet", "warning", "info", "debug")
ENV_LEVEL = "GRPO_DIST_LOG_LEVEL"
#: Set for the worker processes in quiet mode: the file their stdout and stderr go to.
ENV_FILE = "GRPO_DIST_RUN_LOG"
#: Ray's ``worker_process_setup_hook`` for quiet mode (a module path: nothing to pickle).
WORKER_HOOK = "grpo_dist.utils.run_log.worker_output_to_run_log"
#: Loggers whose records are grpo_dist's own lines (the command line's sweep messages come through Hydra's).
OWN_LOGGERS = ("grpo_dist", "hydra", "__main__")


def log_level(key_value: str) -> str:
    """The run's mode: ``GRPO_DIST_LOG_LEVEL`` when set, else ``trainer.log_level``; ``ValueError``
    naming the one that holds an unknown value."""
    env = os.environ.get(ENV_LEVEL, "").strip()
    where, value = (ENV_LEVEL, env) if env else ("trainer.log_level", str(key_value))
    if value.lower() not in LEVELS:
        raise ValueError(f"{where} = {value!r} is not valid: expected one of {', '.join(LEVELS)} (quiet: the "
                         "library and worker logs go to <trainer.default_local_dir>/logs/run.log; the others show them "
                         "on the console from that level up)")
    return value.lower()


def log_path(out_dir: str | os.PathLike) -> Path:
    """The run's log file in its output folder."""
    return Path(out_dir) / "logs" / "run.log"


def worker_env_vars(level: str, log_file: str | None) -> dict[str, str]:
    """Environment of the worker processes: the libraries' own verbosity for ``level`` (a variable the
    user set wins) and, in quiet mode, the file their output goes to."""
    vllm, hf = {"quiet": ("INFO", "warning"), "warning": ("WARNING", "error"),
                "info": ("INFO", "info"), "debug": ("DEBUG", "debug")}[level]
    env = {"VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", vllm),
           "TRANSFORMERS_VERBOSITY": os.environ.get("TRANSFORMERS_VERBOSITY", hf)}
    if log_file is not None:
        env[ENV_FILE] = str(log_file)
    return env


def worker_output_to_run_log() -> None:
    """In a worker process (quiet mode): point file descriptors 1 and 2 at the run's log file, so that
    everything the process writes, from Python or from C, lands there and not on the console. Left as
    it is when the file cannot be opened (a node that does not see the output folder: the output then
    stays in Ray's own log files of that node)."""
    path = os.environ.get(ENV_FILE)
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.write(2, f"---- worker process {os.getpid()} on {os.uname().nodename} writes here from "
                f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())


class _OwnLinesOnly(logging.Filter):
    """On a console handler: pass grpo_dist's own records, and library records from ``threshold`` up."""

    def __init__(self, threshold: int) -> None:
        super().__init__()
        self.threshold = threshold

    def filter(self, record: logging.LogRecord) -> bool:
        own = any(record.name == n or record.name.startswith(n + ".") for n in OWN_LOGGERS)
        return own or record.levelno >= self.threshold


def _is_console(handler: logging.Handler) -> bool:
    if isinstance(handler, logging.FileHandler) or not isinstance(handler, logging.StreamHandler):
        return False
    return getattr(handler, "stream", None) in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)


class DriverLogs:
    """The driver process's side of the log level, for the length of one run.

    quiet: library log records (and Python warnings) leave the console and go to the run's log file; the
    records written before the file can be opened (the output folder is the run's only once its lock is
    taken) are kept in memory and written into it then. Library loggers that print through handlers of
    their own (Ray's, transformers') are made to pass their records on instead, and the Hugging Face
    progress bars (writing and loading weights) are off. warning / info / debug: library records from
    that level up reach the console. :meth:`close` puts everything back as it was."""

    def __init__(self, level: str) -> None:
        self.level = level
        self.path: Path | None = None
        self._console_filter = _OwnLinesOnly(
            {"quiet": logging.CRITICAL + 1, "warning": logging.WARNING, "info": logging.INFO,
             "debug": logging.DEBUG}[level])
        self._filtered: list[logging.Handler] = []
        self._taken: dict[str, tuple[list[logging.Handler], bool]] = {}
        self._buffer: logging.handlers.MemoryHandler | None = None
        self._file: logging.FileHandler | None = None
        self._root_level: int | None = None
        self._captured_warnings = False
        self._env_before: dict[str, str | None] = {}

    @property
    def quiet(self) -> bool:
        return self.level == "quiet"

    def start(self) -> "DriverLogs":
        root = logging.getLogger()
        for h in root.handlers:
            if _is_console(h):
                h.addFilter(self._console_filter)
                self._filtered.append(h)
        if self.level == "debug" and root.level > logging.DEBUG:
            self._root_level = root.level
            root.setLevel(logging.DEBUG)
        if not self.quiet:
            return self
        self._buffer = logging.handlers.MemoryHandler(capacity=100_000, flushLevel=logging.CRITICAL + 1)
        root.addHandler(self._buffer)
        logging.captureWarnings(True)
        self._captured_warnings = True
        self._set_env("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        self._set_env("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
        self.take_over_library_loggers()
        return self

    def _set_env(self, name: str, value: str) -> None:
        self._env_before.setdefault(name, os.environ.get(name))
        os.environ[name] = value

    def take_over_library_loggers(self) -> None:
        """quiet: a library logger that prints to the console through a handler of its own (Ray's logger
        from ``import ray``; transformers' from its import) passes its records on to the root logger
        instead, where they go to the file. Called again after such a library is first imported. The
        Hugging Face progress bars of a transformers imported before the run are switched off too."""
        if not self.quiet:
            return
        for name, lg in list(logging.root.manager.loggerDict.items()):
            if not isinstance(lg, logging.Logger) or name in self._taken:
                continue
            if any(name == n or name.startswith(n + ".") for n in OWN_LOGGERS):
                continue
            console = [h for h in lg.handlers if _is_console(h)]
            if console:
                self._taken[name] = (console, lg.propagate)
                for h in console:
                    lg.removeHandler(h)
                lg.propagate = True
        hf_logging = sys.modules.get("transformers.utils.logging")
        if hf_logging is not None and hasattr(hf_logging, "disable_progress_bar"):
            hf_logging.disable_progress_bar()
        hub_utils = sys.modules.get("huggingface_hub.utils")
        if hub_utils is not None and hasattr(hub_utils, "disable_progress_bars"):
            hub_utils.disable_progress_bars()

    def open_file(self, out_dir: str | os.PathLike, header: str) -> Path | None:
        """quiet: open ``<out_dir>/logs/run.log`` (appending after ``header``) and write the records kept so
        far into it; the file's path, or None when the level is not quiet."""
        if not self.quiet:
            return None
        path = log_path(out_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} {header}\n")
        handler = logging.FileHandler(path, mode="a", encoding="utf-8")
        handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
        if self._buffer is not None:
            self._buffer.setTarget(handler)
            self._buffer.flush()
            logging.getLogger().removeHandler(self._buffer)
            self._buffer.close()
            self._buffer = None
        logging.getLogger().addHandler(handler)
        self._file, self.path = handler, path
        return path

    def keep(self, title: str, text: str) -> None:
        """Append ``text`` (a failed worker's report from Ray, its traceback in the worker included) to the
        run's log file under ``title``; nothing when no file is open."""
        if self.path is None or self._file is None:
            return
        self._file.flush()
        text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # Ray colours the worker's name for a terminal
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} {title}\n{text.rstrip()}\n")

    def close(self) -> None:
        root = logging.getLogger()
        for h in self._filtered:
            h.removeFilter(self._console_filter)
        self._filtered = []
        if self._root_level is not None:
            root.setLevel(self._root_level)
            self._root_level = None
        for name, (handlers, propagate) in self._taken.items():
            lg = logging.getLogger(name)
            lg.propagate = propagate
            for h in handlers:
                if h not in lg.handlers:
                    lg.addHandler(h)
        self._taken = {}
        for h in (self._buffer, self._file):
            if h is not None:
                root.removeHandler(h)
                h.close()
        self._buffer = self._file = None
        if self._captured_warnings:
            logging.captureWarnings(False)
            self._captured_warnings = False
        for name, value in self._env_before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._env_before = {}
