"""Batch reward scoring in worker processes, with a time limit per sample.

:class:`RewardScorer` scores a batch of decoded responses with either the scorer registry
(the scorer is picked per sample from its ``data_source``), a user function loaded from a file
(:class:`~grpo_dist.rewards.custom.CustomRewardFn`), or a module-level function with verl's
signature ``fn(data_source, solution_str, ground_truth, extra_info=None) -> float | dict``.

The processes, and the time limit on each sample, are :class:`~grpo_dist.rewards.pool.TaskPool`'s;
this module decides what runs for each sample, checks what comes back, and applies ``on_error``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import math
import numbers
import pickle
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

from grpo_dist.rewards.custom import CustomRewardFn
from grpo_dist.rewards.pool import TaskOutcome, TaskPickleError, TaskPool, one_line
from grpo_dist.rewards.scorers import DEFAULT_REGISTRY, ScorerRegistry

logger = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class Raised:
    """What :func:`_invoke` returns when the reward function raised: the exception in one line and
    where it was raised (``at <file>:<line> (in <function>)``; see :func:`where_raised`)."""

    error: str
    where: str

    def describe(self) -> str:
        return f"raised {self.error}" + (f" {self.where}" if self.where else "")


def where_raised(exc: BaseException, fn: Callable) -> str:
    """``at <file>:<line> (in <function>)``: the line of the user's code that raised ``exc``: the last
    frame of the traceback in the file that defines ``fn`` (a raise inside a library it calls is
    shown at the user's line that called it); without one, the traceback's last frame. When the call
    itself failed (a signature that does not take verl's arguments): ``when called (<function> is
    defined at <file>:<line>)``."""
    frames = traceback.extract_tb(exc.__traceback__)[1:]  # the first frame is _invoke's call
    code = getattr(inspect.unwrap(fn), "__code__", None)
    home = code.co_filename if code is not None else None
    mine = [f for f in frames if home is not None and f.filename == home]
    if mine or frames:
        frame = (mine or frames)[-1]
        return f"at {frame.filename}:{frame.lineno} (in {frame.name})"
    if code is not None:
        return f"when called ({code.co_name} is defined at {home}:{code.co_firstlineno})"
    return ""


def _invoke(task: tuple) -> Any:
    """Score one sample: what the reward function returned (checked by the caller), or a
    :class:`Raised` saying what it raised and where."""
    target, style, data_source, solution_str, ground_truth, extra_info = task
    fn = _resolve(target)
    kwargs = target.kwargs if isinstance(target, CustomRewardFn) else {}
    try:
        if style == _SCORER:
            return fn(solution_str, ground_truth, extra_info)
        return fn(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth,
                  extra_info=extra_info, **kwargs)
    except Exception as exc:
        return Raised(one_line(f"{type(exc).__name__}: {exc}"), where_raised(exc, fn))


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
        on_error: a sample that raises, times out, or returns None, NaN/inf, a non-number, a number
            no float holds (``10**400``), a dict without a numeric ``"score"`` or with a
            ``"step_rewards"`` entry that is not a finite number: ``"raise"`` raises
            :class:`RewardError` naming the sample (index in the batch, data source, row index when the
            data has one, the start of the response), the function and what went wrong, in one line;
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

        if fn_or_registry is None:
            fn_or_registry = DEFAULT_REGISTRY
        self._registry: ScorerRegistry | None = None
        self._target: Callable | CustomRewardFn | None = None
        warm_up: list[Callable[[], Any]] = []
        if isinstance(fn_or_registry, ScorerRegistry):
            self._registry = fn_or_registry
            # Import the scorers' modules in each worker before it takes samples, so that the first
            # sample's time limit is not spent importing them.
            modules = {getattr(fn, "__module__", None) for fn in fn_or_registry.functions()}
            names = ["math_verify"] + sorted(m for m in modules if m and m != "__main__")
            warm_up = [functools.partial(importlib.import_module, name) for name in names]
        elif isinstance(fn_or_registry, CustomRewardFn):
            fn_or_registry.load()  # fail here, with the loader's message, not in every worker
            self._target = fn_or_registry
            warm_up = [functools.partial(_resolve, fn_or_registry)]
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

        self.on_error = on_error
        #: the first failed sample of the last batch (``on_error="zero"``), in one line; None when none failed
        self.last_problem: str | None = None
        self._pool = TaskPool(num_workers, timeout_s=timeout_s, warm_up=warm_up, mp_context=mp_context,
                              name="reward")

    @property
    def num_workers(self) -> int:
        return self._pool.num_workers

    @property
    def timeout_s(self) -> float | None:
        return self._pool.timeout_s

    @property
    def _workers(self) -> list:
        """The scoring processes now running (none before the first batch)."""
        return self._pool.workers

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the worker processes. The scorer can still be used; workers restart on demand."""
        self._pool.close()

    def kill_now(self) -> None:
        """SIGKILL the scoring processes at once (see :meth:`TaskPool.kill_now`)."""
        self._pool.kill_now()

    def __enter__(self) -> "RewardScorer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

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
                a list of B values, None where a sample did not return that key or failed. A sample whose
                function returned a number has ``acc`` = its score, as verl's reward managers set it (so a
                number-returning function's validation is reported as ``acc``); a failed sample's ``acc`` is its
                0.0 when no sample of the batch returned a dict.
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
        returned = [None] * n  # per sample: "number" or "dict" (None: it failed)
        stats = {"reward/num_errors": 0, "reward/num_timeouts": 0}
        first_problem: list[str] = []

        def finish(i: int, outcome: TaskOutcome) -> None:
            what = outcome.error
            if outcome.ok:
                try:
                    scores[i], extras[i] = _check_value(outcome.value)
                    returned[i] = "dict" if isinstance(outcome.value, dict) else "number"
                    return
                except ValueError as exc:
                    what = str(exc)
            message = f"reward function {names[i]} failed on sample {i} of the batch " \
                      f"(data_source={data_sources[i]!r}): {what} ({_sample_excerpt(extra_infos[i], solution_strs[i])})"
            if self.on_error == "raise":
                raise RewardError(message)
            stats["reward/num_timeouts" if outcome.status == "timeout" else "reward/num_errors"] += 1
            if not first_problem:
                first_problem.append(message)

        try:
            self._pool.run(_invoke, tasks, finish)
        except TaskPickleError as exc:
            raise ValueError(f"a reward task cannot be sent to a worker ({exc}); ground truths and "
                             f"extra_info must be picklable") from None

        self.last_problem = first_problem[0] if first_problem else None
        if first_problem:
            logger.warning("reward: %d error(s), %d timeout(s) in a batch of %d scored 0.0; first: %s",
                           stats["reward/num_errors"], stats["reward/num_timeouts"], n, first_problem[0])
        any_dict = "dict" in returned
        for i in range(n):
            if returned[i] == "number" or (returned[i] is None and not any_dict):
                extras[i]["acc"] = scores[i]
        keys = sorted({k for e in extras for k in e})
        extra = {k: [e.get(k) for e in extras] for k in keys}
        return scores, extra, stats


def _describe(fn: Any) -> str:
    if isinstance(fn, CustomRewardFn):
        return fn.describe()
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _sample_excerpt(extra_info: Any, solution_str: Any) -> str:
    """``row index 17, response 'The answer is ...'``: where the sample came from (its
    ``extra_info["index"]`` when the data has one) and the start of the scored response."""
    index = extra_info.get("index") if isinstance(extra_info, dict) else None
    text = " ".join(str(solution_str).split())
    excerpt = text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "..."
    return (f"row index {index!r}, " if index is not None else "") + f"response {excerpt!r}"


_EXCERPT_CHARS = 60


def _finite_float(value: Any, what: str) -> float:
    """``value`` as a finite float; ``ValueError`` saying what ``what`` was instead (None, a non-number,
    NaN/inf, or a number too large for a float such as ``10**400``)."""
    if value is None:
        raise ValueError(f"{what} None")
    if not isinstance(value, numbers.Real):  # bool, int, float and numpy scalars are numbers.Real
        raise ValueError(one_line(f"{what} a {type(value).__name__} ({value!r}), not a number"))
    try:
        score = float(value)
    except (OverflowError, TypeError, ValueError) as exc:
        shown = one_line(repr(value))
        shown = shown if len(shown) <= 40 else shown[:40] + "..."
        raise ValueError(f"{what} {shown}, which is not a float ({type(exc).__name__}: {exc})") from None
    if not math.isfinite(score):
        raise ValueError(f"{what} {score}")
    return score


def _check_value(value: Any) -> tuple[float, dict]:
    """(score, extra metrics) from what a reward function returned; ``ValueError`` saying what is wrong.

    The score must be a finite float (or convert to one); so must every entry of ``step_rewards``
    (process supervision) when the dict has that key."""
    extra: dict = {}
    if isinstance(value, Raised):
        raise ValueError(value.describe())
    if isinstance(value, dict):
        if "score" not in value:
            raise ValueError(f"returned a dict without a 'score' key (keys: {', '.join(map(str, value))})")
        extra = {k: v for k, v in value.items() if k != "score"}
        value = value["score"]
        if "step_rewards" in extra and extra["step_rewards"] is not None:
            steps = extra["step_rewards"]
            if isinstance(steps, (str, bytes, dict)) or not hasattr(steps, "__len__"):
                raise ValueError(one_line(f"returned step_rewards of type {type(steps).__name__}, not a list of numbers"))
            extra["step_rewards"] = [_finite_float(r, f"returned step_rewards[{k}] =") for k, r in enumerate(steps)]
    return _finite_float(value, "returned"), extra


# ----------------------------------------------------------------------------------------------
# One call before the run starts
# ----------------------------------------------------------------------------------------------


def trial_solution(ground_truth: Any) -> str:
    """The response a trial call scores: the ground truth as text (what a correct answer would say;
    a list or dict ground truth as its ``str``)."""
    return ground_truth if isinstance(ground_truth, str) else str(ground_truth)


def try_reward_fn(target: CustomRewardFn, data_source: str, ground_truth: Any, extra_info: Any, *,
                  timeout_s: float | None, mp_context: str | None = None) -> str | None:
    """Call the user's function once, as a scoring process of the run would, on one sample whose
    response is :func:`trial_solution` of ``ground_truth``; None when it returns a valid score, else
    what went wrong in one line (``raised ZeroDivisionError: ... at <file>:<line> (in <function>)``,
    ``returned a str ('1.0'), not a number``, ``timed out after 10 s``, ``its worker process died``).

    The call runs in a process of its own (started, used once and stopped), under ``timeout_s`` as a
    sample of the run would (the file's import is not counted), so that a function that hangs is
    stopped, and one that changes its process (global state, signal handlers, threads, a device
    context, ``sys.exit``) leaves the caller as it was. What it does outside its process (files it
    writes, services it calls) happens once more than the run's own calls."""
    task = (target, _VERL, data_source, trial_solution(ground_truth), ground_truth, extra_info)
    with TaskPool(1, timeout_s=timeout_s, warm_up=[functools.partial(_resolve, target)], mp_context=mp_context,
                  name="reward trial") as pool:
        try:
            outcome = pool.map(_invoke, [task])[0]
        except TaskPickleError as exc:
            return f"the sample cannot be sent to a scoring process ({exc})"
    if not outcome.ok:
        return outcome.error
    try:
        _check_value(outcome.value)
    except ValueError as exc:
        return str(exc)
    return None
