"""torch's profiler in a worker process: the process's side of verl's profiler keys.

The driver (:class:`grpo_dist.trainer.profiling.StepProfiler`) sends a worker process ``profile_begin(step,
settings)`` at the start of a profiled step and ``profile_end(step)`` at the start of the next step that is not
part of the same trace (and at the end of the run). Ray runs an actor's calls in the order they were sent, so a
trace holds exactly the calls the driver sent the process in between. Every :func:`~grpo_dist.workers.common.timed`
method (the step's work in a worker) runs inside :func:`stage`, which marks the call in the trace with its role
and method (``actor.update_policy``) or, with ``discrete`` settings, records it as a trace of its own.

Files (Chrome trace JSON, for ``chrome://tracing``, Perfetto or TensorBoard) under the settings' ``save_path``:

- one per step, or per run of consecutive steps: ``<process>_step<k>.json``, ``<process>_step<a>-<b>.json``;
- ``discrete``: ``step<k>/<process>_<role>.<method>.json`` per call (``_2``, ``_3`` ... for repeated calls).

Calls the process runs in threads of its own (a partial rollout's engine loop) appear only as far as torch's
profiler follows threads it was not started in.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

__all__ = ["ProcessProfiler", "Profiled", "stage"]


def _profile(settings: Any) -> Any:
    """A ``torch.profiler.profile`` recording what ``settings.contents`` asks for (cpu always)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if "cuda" in settings.contents and settings.device == "cuda" and torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    return profile(activities=activities, record_shapes="shapes" in settings.contents,
                   profile_memory="memory" in settings.contents, with_stack="stack" in settings.contents)


class ProcessProfiler:
    """This process's profiling state: off, one step's (or steps') trace running, or per-call traces."""

    def __init__(self) -> None:
        self.settings: Any = None
        self.first_step = 0
        self.running: Any = None
        """The ``torch.profiler.profile`` of the trace being recorded (not discrete)."""
        self.calls: dict[str, int] = {}
        self.written: list[str] = []

    def begin(self, step: int, settings: Any) -> None:
        """Start recording (``settings``: a :class:`~grpo_dist.config.profiling.ProcessProfile`)."""
        if self.settings is not None:
            self.end(step - 1)
        self.settings, self.first_step, self.calls = settings, step, {}
        if not settings.discrete:
            self.running = _profile(settings)
            self.running.start()

    def end(self, last_step: int) -> list[str]:
        """Stop recording; the trace of steps ``first_step..last_step`` is written. Returns the files written
        since the last ``end``."""
        s, self.settings = self.settings, None
        if self.running is not None:
            running, self.running = self.running, None
            running.stop()
            steps = f"{self.first_step}" if last_step <= self.first_step else f"{self.first_step}-{last_step}"
            self._export(running, Path(s.save_path) / f"{s.name}_step{steps}.json")
        written, self.written = self.written, []
        return written

    @contextlib.contextmanager
    def stage(self, label: str) -> Iterator[None]:
        """Around one call: marked in the step's trace, or (discrete) recorded as a trace of its own."""
        s = self.settings
        if s is None:
            yield
            return
        import torch

        if self.running is not None:
            with torch.profiler.record_function(label):
                yield
            return
        n = self.calls[label] = self.calls.get(label, 0) + 1
        prof = _profile(s)
        with prof, torch.profiler.record_function(label):
            yield
        suffix = "" if n == 1 else f"_{n}"
        self._export(prof, Path(s.save_path) / f"step{self.first_step}" / f"{s.name}_{label}{suffix}.json")

    def _export(self, prof: Any, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
        self.written.append(str(path))


PROCESS = ProcessProfiler()
"""This process's profiler (one per worker process; the roles a process holds share it)."""


def stage(label: str) -> contextlib.AbstractContextManager[None]:
    """:meth:`ProcessProfiler.stage` of this process's profiler."""
    return PROCESS.stage(label)


class Profiled:
    """The two calls a worker process answers for the profiler (mixed into the Ray worker classes)."""

    def profile_begin(self, step: int, settings: Any) -> None:
        PROCESS.begin(step, settings)

    def profile_end(self, last_step: int) -> list[str]:
        return PROCESS.end(last_step)
