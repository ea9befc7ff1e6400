"""A pool of worker processes that runs picklable tasks, each under its own time limit.

:class:`TaskPool` runs ``fn(arg)`` for each ``arg`` of a batch, spread over ``num_workers``
processes (``forkserver`` context by default, ``spawn`` where that is unavailable), each fed one
task at a time through its own pipe. Because the parent hands a task to an idle worker itself, it
knows when each task starts, so the time limit is exact and does not include worker start-up; a
task over its limit has its worker killed (SIGKILL) and replaced, while the other workers go on.
This is what ``multiprocessing.Pool`` cannot do: it has no way to stop one task, only the whole
pool, and no way to tell when a queued task started.

Workers are daemon processes that also leave when their pipe to the parent closes, so they end
with the parent. The pool knows nothing about what the tasks compute; every task comes back as a
:class:`TaskOutcome` (its value, or why there is none).
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import pickle
import signal
import time
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

WORKER_START_TIMEOUT_S = 120.0
_MAX_MESSAGE_CHARS = 300

Status = Literal["ok", "raised", "timeout", "died"]


def one_line(text: str) -> str:
    """``text`` on one line (whitespace runs become one space), cut to a few hundred characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= _MAX_MESSAGE_CHARS else text[:_MAX_MESSAGE_CHARS] + "..."


@dataclass(frozen=True)
class TaskOutcome:
    """What became of one task.

    Attributes:
        status: ``"ok"`` (``value`` holds what the function returned), ``"raised"`` (the function
            raised, or the task or its value could not be moved between processes), ``"timeout"``
            (over the pool's time limit; its worker was replaced) or ``"died"`` (its worker process
            ended while running it; it was replaced).
        value: the function's return value when ``status == "ok"``, else None.
        error: one line saying what went wrong (``"ZeroDivisionError: division by zero"``,
            ``"timed out after 5 s"``, ``"its worker process died (exit code 3)"``); ``""`` when ok.
    """

    status: Status
    value: Any = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class TaskPickleError(ValueError):
    """A task (its function or argument) cannot be pickled to be sent to a worker process."""


def _call(fn: Callable[[Any], Any], arg: Any) -> TaskOutcome:
    try:
        return TaskOutcome("ok", fn(arg))
    except Exception as exc:
        return TaskOutcome("raised", error=one_line(f"{type(exc).__name__}: {exc}"))


# ----------------------------------------------------------------------------------------------
# The worker process
# ----------------------------------------------------------------------------------------------


def _worker_main(conn, warm_up: Sequence[Callable[[], Any]]) -> None:
    """Worker loop: run the warm-up callables, say ready, then run one task per message.

    A message is ``(index, pickled (fn, arg))``; the answer is ``(index, status, value, error)``.
    ``None`` or a closed pipe ends the loop.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    for prepare in warm_up:
        try:
            prepare()
        except Exception:  # a task that needs the same thing fails with its own message
            pass
    try:
        conn.send(("ready", os.getpid()))
    except OSError:  # the parent closed the pipe (the run is ending): nobody to report to
        return
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        index, blob = message
        try:
            fn, arg = pickle.loads(blob)
        except Exception as exc:
            outcome = TaskOutcome("raised", error=one_line(
                f"the worker could not load the task ({type(exc).__name__}: {exc})"))
        else:
            outcome = _call(fn, arg)
        try:
            conn.send((index, outcome.status, outcome.value, outcome.error))
        except OSError:  # the parent is gone
            return
        except Exception as exc:  # the returned value does not pickle
            try:
                conn.send((index, "raised", None, one_line(
                    f"returned a {type(outcome.value).__name__} that cannot be sent back "
                    f"({type(exc).__name__}: {exc})")))
            except OSError:
                return


class _Worker:
    def __init__(self, ctx, warm_up: Sequence[Callable[[], Any]], name: str):
        self.conn, child_conn = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child_conn, list(warm_up)), daemon=True,
                                name=f"grpo-dist-{name}-worker")
        self.proc.start()
        child_conn.close()
        self.started_at = time.monotonic()
        self.ready = False
        self.task: int | None = None
        self.deadline: float | None = None

    @property
    def busy(self) -> bool:
        return self.task is not None

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.proc.join(timeout=2)
        self.kill()


def _shutdown(workers: list[_Worker]) -> None:
    for w in workers:
        w.kill() if w.busy else w.stop()
    workers.clear()


# ----------------------------------------------------------------------------------------------
# The pool
# ----------------------------------------------------------------------------------------------


class TaskPool:
    """Runs ``fn(arg)`` over a batch of arguments in worker processes, each call under a time limit.

    Args:
        num_workers: worker processes, started on first use. ``0`` runs the tasks in this process,
            one after the other; a hung task cannot be stopped there, so it needs ``timeout_s=None``
            (meant for debugging).
        timeout_s: time limit per task in seconds (from when a worker takes it), or None for none.
        warm_up: picklable callables without arguments that each worker runs once when it starts,
            before it takes tasks (e.g. imports), so that their time is not charged to the first
            task's limit. Their errors are ignored.
        mp_context: ``"forkserver"`` (default where available) or ``"spawn"``. ``"fork"`` is refused:
            forking a process that runs threads (Ray, torch) can deadlock.
        name: what the workers are called in process titles and error messages.

    Use as a context manager, or call :meth:`close`, to stop the workers (they are also stopped when
    the pool is collected, and they die with the parent).
    """

    def __init__(
        self,
        num_workers: int,
        *,
        timeout_s: float | None,
        warm_up: Sequence[Callable[[], Any]] = (),
        mp_context: str | None = None,
        name: str = "pool",
    ):
        if num_workers < 0:
            raise ValueError(f"num_workers={num_workers} must be >= 0")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s} must be positive, or None for no limit")
        if num_workers == 0 and timeout_s is not None:
            raise ValueError(
                "num_workers=0 runs the tasks in this process, where a hung task cannot be stopped, so it "
                "cannot enforce timeout_s; use num_workers >= 1, or timeout_s=None"
            )
        if mp_context is None:
            mp_context = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
        if mp_context not in ("forkserver", "spawn"):
            raise ValueError(f"mp_context={mp_context!r}; expected 'forkserver' or 'spawn'")
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self.name = name
        self._ctx = mp.get_context(mp_context)
        self._warm_up = list(warm_up)
        #: the live worker processes (empty until the first batch, and after :meth:`close`)
        self.workers: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _shutdown, self.workers)

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the worker processes. The pool can still be used; workers restart on demand."""
        _shutdown(self.workers)

    def kill_now(self) -> None:
        """SIGKILL every worker process, without waiting or touching the pipes: safe from a signal
        handler of a process that is ending (:meth:`close` waits for the workers to stop)."""
        for w in list(self.workers):
            try:
                os.kill(w.proc.pid, signal.SIGKILL)
            except (OSError, TypeError):  # gone already, or never started
                pass

    def __enter__(self) -> "TaskPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _new_worker(self) -> _Worker:
        return _Worker(self._ctx, self._warm_up, self.name)

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self.workers[self.workers.index(worker)] = self._new_worker()

    # -- running ---------------------------------------------------------------------------------

    def map(self, fn: Callable[[Any], Any], args: Sequence[Any]) -> list[TaskOutcome]:
        """``fn(arg)`` for every ``arg``: one :class:`TaskOutcome` per argument, in input order."""
        outcomes: list[TaskOutcome | None] = [None] * len(args)

        def keep(i: int, outcome: TaskOutcome) -> None:
            outcomes[i] = outcome

        self.run(fn, args, keep)
        assert all(o is not None for o in outcomes)
        return outcomes  # type: ignore[return-value]

    def run(self, fn: Callable[[Any], Any], args: Sequence[Any],
            on_done: Callable[[int, TaskOutcome], None]) -> None:
        """Run ``fn(arg)`` for every ``arg`` and call ``on_done(index, outcome)`` in this process as
        each task finishes (in the order they finish).

        ``fn`` must be picklable by reference (a module-level function) and every ``arg``
        picklable; otherwise :class:`TaskPickleError` is raised before any task runs. If
        ``on_done`` raises, the tasks still running are stopped (their workers replaced, so the
        next batch starts clean) and the exception propagates; so does Ctrl-C.
        """
        if self.num_workers == 0:
            for i, arg in enumerate(args):
                on_done(i, _call(fn, arg))
            return
        blobs = []
        for i, arg in enumerate(args):
            try:
                blobs.append(pickle.dumps((fn, arg)))
            except Exception as exc:
                raise TaskPickleError(f"task {i} cannot be sent to a {self.name} worker process "
                                      f"({type(exc).__name__}: {exc})") from None
        while len(self.workers) < self.num_workers:
            self.workers.append(self._new_worker())
        for w in list(self.workers):
            if not w.proc.is_alive() and w.proc.exitcode is not None:
                self._replace(w)
        try:
            self._dispatch(blobs, on_done)
        except BaseException:
            for w in list(self.workers):
                if w.busy:
                    self._replace(w)
            raise

    def _dispatch(self, blobs: list[bytes], on_done: Callable[[int, TaskOutcome], None]) -> None:
        todo = deque(range(len(blobs)))
        while todo or any(w.busy for w in self.workers):
            for w in self.workers:
                if w.ready and not w.busy and todo:
                    i = todo[0]
                    try:
                        w.conn.send((i, blobs[i]))
                    except (OSError, ValueError):  # died while idle: replace it, the task stays queued
                        self._replace(w)
                        continue
                    todo.popleft()
                    w.task = i
                    w.deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s

            waiting = [w for w in self.workers if w.busy or not w.ready]
            if not waiting:
                continue
            limits = [w.deadline for w in waiting if w.busy and w.deadline is not None]
            limits += [w.started_at + WORKER_START_TIMEOUT_S for w in waiting if not w.ready]
            wait_s = max(0.0, min(limits) - time.monotonic()) if limits else None
            by_conn = {w.conn: w for w in waiting}
            for conn in mp_connection.wait(list(by_conn), timeout=wait_s):
                w = by_conn[conn]
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    w.proc.join(timeout=5)
                    if not w.ready:
                        raise RuntimeError(f"a {self.name} worker process exited while starting "
                                           f"(exit code {w.proc.exitcode})") from None
                    i, exitcode = w.task, w.proc.exitcode
                    self._replace(w)
                    if i is not None:
                        on_done(i, TaskOutcome("died", error=f"its worker process died (exit code {exitcode})"))
                    continue
                if message[0] == "ready":
                    w.ready = True
                    continue
                i, status, value, error = message
                assert i == w.task, (i, w.task)
                w.task = w.deadline = None
                on_done(i, TaskOutcome(status, value, error))

            now = time.monotonic()
            for w in list(self.workers):
                if w.busy and w.deadline is not None and now >= w.deadline:
                    i = w.task
                    self._replace(w)
                    on_done(i, TaskOutcome("timeout", error=f"timed out after {self.timeout_s:g} s"))
                elif not w.ready and now >= w.started_at + WORKER_START_TIMEOUT_S:
                    raise RuntimeError(f"a {self.name} worker process did not start within "
                                       f"{WORKER_START_TIMEOUT_S:g} s")
