"""The driver's side of the profiler: which worker processes record, and when each trace starts and ends.

At the start of every step the driver calls :meth:`StepProfiler.step_begins`. A trace ends where the next
step begins unless that step belongs to it too (``profile_continuous_steps`` and the next step profiled), and
at the end of the run (:meth:`StepProfiler.finish`). The calls to the workers are sent without waiting (the
rollout engines may be generating ahead: the driver must not wait for them); Ray runs them in order with the
step's other calls (:mod:`grpo_dist.utils.profiling`). :meth:`finish` collects them: a trace that could not
be written is a warning, not a failed run.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from grpo_dist.config.profiling import ProcessProfile, ProfilePlan

__all__ = ["StepProfiler"]


class StepProfiler:
    """Begin and end the traces of ``plan`` in the processes of ``groups``, for a run on ``device``: the run's
    process-level worker groups (each rank's model process, the rollout ranks, ...), each with the roles its
    processes hold, as ``(group, roles)``."""

    def __init__(self, plan: ProfilePlan, groups: list[tuple[Any, list[str]]], device: str) -> None:
        self.plan = plan
        self.targets: list[tuple[Any, ProcessProfile]] = []
        """(Ray actor, what it records) for every process that records."""
        for group, roles in groups:
            for i, rank in enumerate(group.ranks):
                settings = plan.process(group.role, roles, rank, device)
                if settings is not None:  # (the folder as the driver names it, not relative to a worker's)
                    path = str(Path(settings.save_path).expanduser().resolve())
                    self.targets.append((group.workers[i], replace(settings, save_path=path)))
        self.open_from: int | None = None
        """The first step of the trace being recorded; None: none is."""
        self.step = 0
        """The last step begun."""
        self.refs: list = []
        self.get: Any = None
        """How the calls' results are waited for (``wait_results``: Ray's; stand-ins in tests)."""

    def _joins(self, step: int) -> bool:
        """Whether ``step`` continues the trace being recorded."""
        return self.plan.continuous and step in self.plan.steps and (step - 1) in self.plan.steps

    def step_begins(self, step: int) -> None:
        """``step`` (from 1) begins: end the trace of the steps before it unless it continues it; begin one if
        ``step`` is profiled."""
        self.step = step
        if self.open_from is not None and not self._joins(step):
            self._end(step - 1)
        if step in self.plan.steps and self.open_from is None:
            self.refs += [actor.profile_begin.remote(step, s) for actor, s in self.targets]
            self.open_from = step

    def _end(self, last_step: int) -> None:
        self.refs += [actor.profile_end.remote(last_step) for actor, _ in self.targets]
        self.open_from = None

    def finish(self, timeout_s: float = 60.0) -> list[str]:
        """End the trace still being recorded (its last step the last step begun) and wait for every call, at
        most ``timeout_s``; returns the files written. A call that failed is printed as one warning line."""
        if self.open_from is not None:
            self._end(self.step)
        refs, self.refs, written = self.refs, [], []
        if self.get is None:
            from grpo_dist.distributed.worker_group import wait_results

            self.get = wait_results
        try:
            for out in self.get(refs, timeout_s):
                written += out or []
        except Exception as exc:  # noqa: BLE001 - a lost trace is worth a line, not the run
            print(f"grpo_dist: warning: profiler: not every trace was written ({type(exc).__name__}: "
                  f"{str(exc).splitlines()[0] if str(exc) else ''})", flush=True)
        return written
