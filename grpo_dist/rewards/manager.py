"""Batch reward scoring in worker processes, with a time limit per sample.

:class:`RewardScorer` scores a batch of decoded responses with either the scorer registry
(the scorer is picked per sample from its ``data_source``), a user function loaded from a file
(:class:`~grpo_dist.rewards.custom.CustomRewardFn`), or a module-level function with verl's
signature ``fn(data_source, solution_str, ground_truth, extra_info=None) -> float | dict``.

Workers are our own small set of processes (``forkserver`` context by default, ``spawn`` where that
is unavailable), each fed one sample at a time through its own pipe. Because the parent hands a
sample to an idle worker itself, it knows when each sample starts, so the time limit is exact and
does not include worker start-up; a sample over its limit has its worker killed (SIGKILL) and
replaced, while the other workers go on. This is what ``multiprocessing.Pool`` cannot do: it has no
way to stop one task, only the whole pool, and no way to tell when a queued task started.
"""

from __future__ import annotations

import logging
import math
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import numbers
import os
import pickle
import signal
import time
import weakref
from collections import deque
from typing import Any, Callable, Literal, Sequence

from grpo_dist.rewards.custom import CustomRewardFn
from grpo_dist.rewards.scorers import DEFAULT_REGISTRY, ScorerRegistry

logger = logging.getLogger(__name__)

WORKER_START_TIMEOUT_S = 120.0
_MAX_MESSAGE_CHARS = 300

# How a target is called: a registry scorer takes (solution_str, ground_truth, extra_info);
# a verl-style function takes keywords data_source, solution_str, ground_truth, extra_info.
_SCORER, _VERL = "scorer", "verl"


class RewardError(RuntimeError):
    """A reward function failed on a sample (raised, timed out, or returned a non-number)."""


# ----------------------------------------------------------------------------------------------
# What runs in the worker (and in-process when num_workers=0)
# ----------------------------------------------------------------------------------------------

_loaded_custom: dict[tuple[str, str], Callable] = {}


def _resolve(target: Callable | CustomRewardFn) -> Callable:
    if isinstance(target, CustomRewardFn):
        key = (target.path, target.name)
        if key not in _loaded_custom:
            _loaded_custom[key] = target.load()
        return _loaded_custom[key]
    return target


def _one_line(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= _MAX_MESSAGE_CHARS else text[:_MAX_MESSAGE_CHARS] + "..."


def _invoke(task: tuple) -> tuple[str, Any]:
    """Run one sample: ``("ok", returned value)`` or ``("raised", "ExcType: message")``."""
    target, style, data_source, solution_str, ground_truth, extra_info = task
    try:
        fn = _resolve(target)
        if style == _SCORER:
            value = fn(solution_str, ground_truth, extra_info)
        else:
            kwargs = target.kwargs if isinstance(target, CustomRewardFn) else {}
            value = fn(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth,
                       extra_info=extra_info, **kwargs)
    except Exception as exc:
        return "raised", _one_line(f"{type(exc).__name__}: {exc}")
    return "ok", value


def _worker_main(conn, preload: list) -> None:
    """Worker loop: import what the scorers need, say ready, then score one task per message."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    for item in preload:
        try:
            if isinstance(item, str):
                __import__(item)
            else:
                _resolve(item)
        except Exception:  # reported on the first sample that needs it
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
            task = pickle.loads(blob)
        except Exception as exc:
            result = ("raised", _one_line(f"the worker could not load the task ({type(exc).__name__}: {exc})"))
        else:
            result = _invoke(task)
        try:
            conn.send((index, *result))
        except OSError:  # the parent is gone
            return
        except Exception as exc:  # the returned value does not pickle
            try:
                conn.send((index, "raised", _one_line(
                    f"returned a {type(result[1]).__name__} that cannot be sent back ({type(exc).__name__}: {exc})")))
            except OSError:
                return


class _Worker:
    def __init__(self, ctx, preload: list):
        self.conn, child_conn = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child_conn, preload), daemon=True,
                                name="grpo-dist-reward-worker")
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
# The scorer
# ----------------------------------------------------------------------------------------------


class RewardScorer:
    """Scores batches of responses in parallel, each sample under a time limit.

    Args:
        fn_or_registry: a :class:`ScorerRegistry` (or None for the default one): the scorer is chosen
            per sample from its data source, in this process, so an unknown data source raises
            ``ValueError`` before anything runs; a :class:`CustomRewardFn` (a file path and function
            name, loaded in each worker); or a module-level function with verl's signature
            (picklable by reference; lambdas and nested functions are rejected).
        num_workers: worker processes. ``0`` scores in this process, which can enforce no time
            limit, so it needs ``timeout_s=None`` (meant for debugging).
        timeout_s: time limit per sample in seconds, or None for none. A sample over it counts as
            a timeout; its worker is killed and replaced.
        on_error: a sample that raises, times out, or returns None, NaN/inf, a non-number or a dict
            without a numeric ``"score"``: ``"raise"`` raises :class:`RewardError` naming the sample
            (index in the batch, data source), the function and what went wrong, in one line;
            ``"zero"`` scores it 0.0 and counts it in the stats.
        mp_context: ``"forkserver"`` (default where available) or ``"spawn"``. ``"fork"`` is refused:
            forking a process that runs threads (Ray, torch) can deadlock.

    Use as a context manager, or call :meth:`close`, to stop the workers (they are also stopped when
    the object is collected, and they die with the parent as daemons).
    """

    def __init__(
        self,
        fn_or_registry: ScorerRegistry | CustomRewardFn | Callable | None,
        *,
        num_workers: int,
        timeout_s: float | None,
        on_error: Literal["raise", "zero"],
        mp_context: str | None = None,
    ):
        if on_error not in ("raise", "zero"):
            raise ValueError(f"on_error={on_error!r}; expected 'raise' or 'zero'")
        if num_workers < 0:
            raise ValueError(f"num_workers={num_workers} must be >= 0")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s} must be positive, or None for no limit")
        if num_workers == 0 and timeout_s is not None:
            raise ValueError(
                "num_workers=0 scores in this process, where a hung function cannot be stopped, so it "
                "cannot enforce timeout_s; use num_workers >= 1, or timeout_s=None"
            )
        if mp_context is None:
            mp_context = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
        if mp_context not in ("forkserver", "spawn"):
            raise ValueError(f"mp_context={mp_context!r}; expected 'forkserver' or 'spawn'")

        if fn_or_registry is None:
            fn_or_registry = DEFAULT_REGISTRY
        self._registry: ScorerRegistry | None = None
        self._target: Callable | CustomRewardFn | None = None
        preload: list = []
        if isinstance(fn_or_registry, ScorerRegistry):
            self._registry = fn_or_registry
            # Import the scorers' modules in each worker before it takes samples, so that the first
            # sample's time limit is not spent importing them.
            modules = {getattr(fn, "__module__", None) for fn in fn_or_registry.functions()}
            preload = ["math_verify"] + sorted(m for m in modules if m and m != "__main__")
        elif isinstance(fn_or_registry, CustomRewardFn):
            fn_or_registry.load()  # fail here, with the loader's message, not in every worker
            self._target = fn_or_registry
            preload = [fn_or_registry]
        elif callable(fn_or_registry):
            if num_workers > 0:
                try:
                    pickle.dumps(fn_or_registry)
                except Exception as exc:
                    raise ValueError(
                        f"reward function {_describe(fn_or_registry)} cannot be sent to worker processes "
                        f"({type(exc).__name__}: {exc}); define it at module level, or put it in a file and "
                        f"use custom_reward_function.path / .name"
                    ) from None
            self._target = fn_or_registry
        else:
            raise ValueError(f"fn_or_registry must be a ScorerRegistry, a CustomRewardFn or a function, "
                             f"got {type(fn_or_registry).__name__}")

        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self.on_error = on_error
        self._ctx = mp.get_context(mp_context)
        self._preload = preload
        self._workers: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _shutdown, self._workers)

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the worker processes. The scorer can still be used; workers restart on demand."""
        _shutdown(self._workers)

    def __enter__(self) -> "RewardScorer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self._workers[self._workers.index(worker)] = _Worker(self._ctx, self._preload)

    # -- scoring ---------------------------------------------------------------------------------

    def score_batch(
        self,
        data_sources: Sequence[str],
        solution_strs: Sequence[str],
        ground_truths: Sequence[Any],
        extra_infos: Sequence[dict | None] | None = None,
    ) -> tuple[list[float], dict[str, list], dict[str, int]]:
        """Score B responses.

        Returns:
            scores: B floats, in input order.
            extra: for every extra key any sample's dict result had (verl's ``reward_extra_info``),
                a list of B values, None where a sample did not return that key or failed.
            stats: ``{"reward/num_errors": n, "reward/num_timeouts": n}`` (errors exclude timeouts).
        """
        n = len(solution_strs)
        if extra_infos is None:
            extra_infos = [None] * n
        lengths = {"data_sources": len(data_sources), "solution_strs": n,
                   "ground_truths": len(ground_truths), "extra_infos": len(extra_infos)}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"score_batch got lists of different lengths: {lengths}")

        tasks, names = [], []
        for i in range(n):
            if self._registry is not None:
                target, style = self._registry.get(data_sources[i]), _SCORER
            else:
                target, style = self._target, _VERL
            tasks.append((target, style, data_sources[i], solution_strs[i], ground_truths[i], extra_infos[i]))
            names.append(_describe(target))

        scores: list[float] = [0.0] * n
        extras: list[dict] = [{} for _ in range(n)]
        stats = {"reward/num_errors": 0, "reward/num_timeouts": 0}
        first_problem: list[str] = []

        def finish(i: int, status: str, payload: Any) -> None:
            if status == "ok":
                try:
                    scores[i], extras[i] = _check_value(payload)
                    return
                except ValueError as exc:
                    what = str(exc)
            elif status == "timeout":
                what = f"timed out after {self.timeout_s:g} s"
            else:
                what = payload if status == "raised" else f"{status}: {payload}"
            message = f"reward function {names[i]} failed on sample {i} of the batch " \
                      f"(data_source={data_sources[i]!r}): {what}"
            if self.on_error == "raise":
                raise RewardError(message)
            stats["reward/num_timeouts" if status == "timeout" else "reward/num_errors"] += 1
            if not first_problem:
                first_problem.append(message)

        if self.num_workers == 0:
            for i, task in enumerate(tasks):
                finish(i, *_invoke(task))
        else:
            self._run_in_workers(tasks, finish)

        if first_problem:
            logger.warning("reward: %d error(s), %d timeout(s) in a batch of %d scored 0.0; first: %s",
                           stats["reward/num_errors"], stats["reward/num_timeouts"], n, first_problem[0])
        keys = sorted({k for e in extras for k in e})
        extra = {k: [e.get(k) for e in extras] for k in keys}
        return scores, extra, stats

    def _run_in_workers(self, tasks: list[tuple], finish: Callable[..., None]) -> None:
        while len(self._workers) < self.num_workers:
            self._workers.append(_Worker(self._ctx, self._preload))
        for w in list(self._workers):
            if not w.proc.is_alive() and w.proc.exitcode is not None:
                self._replace(w)

        blobs = []
        for task in tasks:
            try:
                blobs.append(pickle.dumps(task))
            except Exception as exc:
                raise ValueError(f"a reward task cannot be sent to a worker ({type(exc).__name__}: {exc}); "
                                 f"ground truths and extra_info must be picklable") from None
        todo = deque(range(len(tasks)))
        try:
            while todo or any(w.busy for w in self._workers):
                for w in self._workers:
                    if w.ready and not w.busy and todo:
                        i = todo[0]
                        try:
                            w.conn.send((i, blobs[i]))
                        except (OSError, ValueError):  # died while idle: replace, the sample stays queued
                            self._replace(w)
                            continue
                        todo.popleft()
                        w.task = i
                        w.deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s

                waiting = [w for w in self._workers if w.busy or not w.ready]
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
                            raise RuntimeError(f"a reward worker process exited while starting "
                                               f"(exit code {w.proc.exitcode})") from None
                        i = w.task
                        self._replace(w)
                        if i is not None:
                            finish(i, "raised", f"its worker process died (exit code {w.proc.exitcode})")
                        continue
                    if message[0] == "ready":
                        w.ready = True
                        continue
                    i, status, payload = message
                    assert i == w.task, (i, w.task)
                    w.task = w.deadline = None
                    finish(i, status, payload)

                now = time.monotonic()
                for w in list(self._workers):
                    if w.busy and w.deadline is not None and now >= w.deadline:
                        i = w.task
                        self._replace(w)
                        finish(i, "timeout", None)
                    elif not w.ready and now >= w.started_at + WORKER_START_TIMEOUT_S:
                        raise RuntimeError(f"a reward worker process did not start within "
                                           f"{WORKER_START_TIMEOUT_S:g} s")
        except BaseException:
            # A RewardError (on_error="raise"), a start-up failure or Ctrl-C: samples still running
            # belong to this batch; stop their workers so the next batch starts clean.
            for w in list(self._workers):
                if w.busy:
                    self._replace(w)
            raise


def _describe(fn: Any) -> str:
    if isinstance(fn, CustomRewardFn):
        return fn.describe()
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _check_value(value: Any) -> tuple[float, dict]:
    """(score, extra metrics) from what a reward function returned; ``ValueError`` saying what is wrong."""
    extra: dict = {}
    if isinstance(value, dict):
        if "score" not in value:
            raise ValueError(f"returned a dict without a 'score' key (keys: {', '.join(map(str, value))})")
        extra = {k: v for k, v in value.items() if k != "score"}
        value = value["score"]
    if value is None:
        raise ValueError("returned None")
    if not isinstance(value, numbers.Real):  # bool, int, float and numpy scalars are numbers.Real
        raise ValueError(_one_line(f"returned a {type(value).__name__} ({value!r}), not a number"))
    score = float(value)
    if not math.isfinite(score):
        raise ValueError(f"returned {score}")
    return score, extra
