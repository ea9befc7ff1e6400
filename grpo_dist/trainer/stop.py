"""Stopping on request: SIGTERM (what Slurm and Kubernetes send some time before they kill a job).

The handler is installed when the run starts, before Ray, the trainer or any worker exists
(:func:`grpo_dist.trainer.run.run`), and what a SIGTERM does depends on where the run is:

* during start-up (loading data, starting Ray and the workers, loading a checkpoint): the run stops
  at once with one message (exit code 143); nothing was trained, so there is nothing to save.
* during training: when the end of the current step plus a checkpoint save fits in
  ``trainer.preemption_grace_s`` (estimated from the slowest step and the slowest save so far), the
  run finishes the step, saves, and stops with one message naming the checkpoint (exit code 143).
  When it would not fit, it stops at once, saying that no checkpoint was taken and which is the
  newest one. If the estimate was wrong and the grace period runs out before the checkpoint is
  complete, it stops then, with the same message (a half-written checkpoint is never published:
  see :mod:`grpo_dist.trainer.checkpoint`).
* a second SIGTERM stops at once.

A SIGTERM whose stop waits for the step boundary prints one line at once: until when, and which worker
call the run is waiting for now with its deadline (:mod:`grpo_dist.distributed.waiting`), so that a
worker that does not answer is named before its deadline passes.

Stopping "at once" raises :class:`Interrupted` (a ``BaseException``, like ``KeyboardInterrupt``, so
no library's ``except Exception`` swallows it) in the driver's main thread; the run's clean-up (stop
the workers, shut Ray down) still happens. The grace period ends ``margin_s`` before the scheduler's
kill, to leave time for that clean-up and the message.

The cluster templates set the scheduler's side to match: ``scripts/slurm/grpo_dist.sbatch`` asks
Slurm to send SIGTERM ``trainer.preemption_grace_s`` seconds before the time limit
(``#SBATCH --signal=B:TERM@...``, forwarded to the driver), and ``scripts/k8s/rayjob.yaml`` sets
``terminationGracePeriodSeconds`` and a ``preStop`` hook that passes SIGTERM on to the driver.
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any, Callable

from grpo_dist.distributed import waiting
from grpo_dist.trainer.summary import TrainingError

__all__ = ["Interrupted", "StopRequested", "StopSignal"]


class StopRequested(TrainingError):
    """The run stopped because it was asked to (SIGTERM), after saving at a step boundary."""


class Interrupted(BaseException):
    """The run stops at once (a signal during start-up, a second signal, a step that cannot end and
    be saved within the grace period); the message says what was and was not saved."""


class StopSignal:
    """SIGTERM handling (:meth:`install`); the training loop reports its steps and saves to it and
    reads :attr:`requested` at step boundaries.

    Args:
        grace_s: seconds from the signal to the scheduler's kill (``trainer.preemption_grace_s``);
            0 or less: no limit (always finish the step and save).
        out_dir: the run's output folder (named when no checkpoint exists yet).
        margin_s: how long before the end of the grace period the run gives up on a checkpoint, to
            leave time for its clean-up; None: ``min(30 s, grace_s / 10)``.
        clock: seconds, monotonic (tests pass a fake one).
        resume_settings: the run's :class:`~grpo_dist.config.launch.ResumeSettings`: the messages then say
            what a rerun will do from the checkpoints on disk (resume from step N, or start from the
            beginning); None: from the checkpoints this object was told of.
    """

    def __init__(self, grace_s: float = 0.0, out_dir: str = "", *, margin_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic, resume_settings: Any = None) -> None:
        self.grace_s = float(grace_s)
        self.margin_s = min(30.0, self.grace_s / 10) if margin_s is None else float(margin_s)
        self.out_dir, self.clock = out_dir, clock
        self.requested: str | None = None
        self.phase = "start-up"  # "start-up" | "training" | "finished"
        self.step: int | None = None  # the step now running (1-based), None between steps
        self.step_started: float | None = None
        self.slowest_step_s = 0.0  # a step's work up to its save (generation ... validation)
        self.slowest_save_s: float | None = None
        self.last_checkpoint: str | None = None
        self.resume_settings = resume_settings
        self.interrupted: Interrupted | None = None  # the last Interrupted the handler raised
        self._previous: dict[int, object] = {}
        self._timer: threading.Timer | None = None
        self._out_of_time = False
        self._redeliver: Interrupted | None = None  # raised where Python could not raise it: raise it again
        self._previous_unraisable: Callable[[Any], None] | None = None
        self.waiting_for: Callable[[], str | None] = waiting.now
        """What the run waits for now (a worker call and its deadline), named when a signal arrives."""

    # ---- installation -----------------------------------------------------------------------
    def install(self) -> None:
        """Handle SIGTERM in this, the main, thread."""
        self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._handle)
        self._previous_unraisable, sys.unraisablehook = sys.unraisablehook, self._unraisable

    def _unraisable(self, info: Any) -> None:
        """The handler's exception can land where Python cannot raise it (a fork handler of the logging module
        while Ray starts a process, a finalizer): Python would print "Exception ignored in ..." with a traceback
        and go on as if no signal had come. Say nothing and raise it again in the main thread at once."""
        if info.exc_value is not None and info.exc_value is self.interrupted:
            self._redeliver = info.exc_value
            threading.Timer(0.01, _thread.interrupt_main, args=(signal.SIGTERM,)).start()
            return
        (self._previous_unraisable or sys.__unraisablehook__)(info)

    def reassert(self) -> None:
        """Take SIGTERM back after a library replaced the handler (``ray.init`` installs its own,
        which prints a stack dump and ends the process)."""
        if self._previous:
            signal.signal(signal.SIGTERM, self._handle)

    def uninstall(self) -> None:
        """Cancel the grace period's timer and restore the handler :meth:`install` replaced."""
        self._disarm()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        if self._previous_unraisable is not None:
            sys.unraisablehook, self._previous_unraisable = self._previous_unraisable, None

    # The grace period's deadline: a timer thread that, when it fires, has the main thread run the
    # SIGTERM handler once more (``_thread.interrupt_main``), marked as the deadline (no SIGALRM: other
    # code in the process, e.g. a test runner's time limit, may own it).
    def _arm(self, seconds: float) -> None:
        self._disarm()
        timer = threading.Timer(seconds, lambda: self._deadline_passed(timer))
        timer.daemon = True
        self._timer = timer
        timer.start()

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    @property
    def deadline_armed(self) -> bool:
        return self._timer is not None and self._timer.is_alive()

    def _deadline_passed(self, timer: threading.Timer) -> None:
        if timer is not self._timer:  # disarmed meanwhile (the checkpoint was completed)
            return
        self._out_of_time = True
        _thread.interrupt_main(signal.SIGTERM)

    # ---- what the training loop reports ----------------------------------------------------------
    def training(self) -> None:
        """Start-up is over: from now on a SIGTERM waits for the step boundary when it can. A SIGTERM during
        start-up whose ``Interrupted`` a library swallowed (raised inside its C code) stops the run here."""
        if self.phase == "start-up" and self.requested:
            self._raise(f"stopped on {self.requested} during start-up; no checkpoint was taken; "
                        f"{self.where_to_resume()}")
        self.phase = "training"

    def step_begins(self, step: int) -> None:
        self.step, self.step_started = step, self.clock()

    def step_work_done(self) -> None:
        """The step's work is done; what remains is its checkpoint save, if one is due."""
        if self.step_started is not None:
            self.slowest_step_s = max(self.slowest_step_s, self.clock() - self.step_started)
        self.step_started = None

    def saved(self, path: str, seconds: float) -> None:
        self.last_checkpoint = path
        self.slowest_save_s = max(seconds, self.slowest_save_s or 0.0)
        if self.requested:  # the checkpoint is complete: the grace period's deadline no longer matters
            self._disarm()

    def finished(self) -> None:
        self.phase, self.step = "finished", None
        self._disarm()

    # ---- decisions ----------------------------------------------------------------------------
    def seconds_to_checkpoint(self) -> float:
        """Estimated seconds until the current step has ended and its checkpoint is saved: the rest
        of the slowest step so far, plus the slowest save (0 for what has not been measured yet)."""
        rest = 0.0
        if self.step_started is not None:
            rest = max(0.0, self.slowest_step_s - (self.clock() - self.step_started))
        return rest + (self.slowest_save_s or 0.0)

    def where_to_resume(self) -> str:
        """What a rerun of the same command will do."""
        if self.resume_settings is not None:
            from grpo_dist.trainer.checkpoint import what_a_rerun_does

            return what_a_rerun_does(self.resume_settings)
        if self.last_checkpoint:
            return f"the newest checkpoint is {self.last_checkpoint}: rerun the same command to resume from it"
        where = f" in {self.out_dir}" if self.out_dir else ""
        return f"this run has no checkpoint{where} yet: a rerun starts from the beginning"

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._redeliver is not None:  # the stop an ignored exception lost (see _unraisable)
            exc, self._redeliver = self._redeliver, None
            raise exc
        name = signal.Signals(signum).name
        if self._out_of_time:
            self._out_of_time = False
            if self.phase == "training":
                self._raise(
                    f"stopped on {self.requested}{self._during()}: trainer.preemption_grace_s={self.grace_s:g} ran "
                    f"out before the step and its checkpoint were done; no checkpoint was taken; "
                    f"{self.where_to_resume()}")
            return
        if self.requested:
            self._raise(f"stopped on a second {name}{self._during()}; no checkpoint was taken; "
                        f"{self.where_to_resume()}")
        self.requested = name
        if self.phase == "start-up":
            self._raise(f"stopped on {name} during start-up; no checkpoint was taken; {self.where_to_resume()}")
        if self.phase != "training":
            return
        if self.grace_s <= 0:
            self._say_what_it_waits_for(name, None)
            return
        budget = self.grace_s - self.margin_s
        need = self.seconds_to_checkpoint()
        if need > budget:
            self._raise(
                f"stopped on {name}{self._during()}: finishing the step and saving a checkpoint would take about "
                f"{need:.0f}s, more than trainer.preemption_grace_s={self.grace_s:g} allows; no checkpoint was "
                f"taken; {self.where_to_resume()}")
        self._arm(max(budget, 0.001))
        self._say_what_it_waits_for(name, budget)

    def _say_what_it_waits_for(self, name: str, budget: float | None) -> None:
        """One line, at once, on stdout: the stop is deferred to the step boundary, until when, and
        which worker call the run waits for now (a worker that does not answer would otherwise leave
        the run silent until its deadline). Written to the file descriptor: the main thread may be in
        the middle of a print of its own."""
        until = ("no time limit: trainer.preemption_grace_s=0" if budget is None else
                 f"by {time.strftime('%H:%M:%S', time.localtime(time.time() + budget))}, "
                 f"within trainer.preemption_grace_s={self.grace_s:g}")
        waiting = self.waiting_for()
        now = f"waiting for {waiting}" if waiting else "not waiting for a worker"
        line = (f"grpo_dist: {name} received{self._during()}: stopping after the step and its checkpoint ({until}); "
                f"now {now}\n")
        try:
            os.write(sys.stdout.fileno(), line.encode())
        except (OSError, ValueError, AttributeError):  # no real stdout (a test's capture): the buffered way
            sys.stdout.write(line)

    def _raise(self, msg: str) -> None:
        self.interrupted = Interrupted(msg)
        raise self.interrupted

    def interrupt_message(self) -> str:
        """The message of a Ctrl-C (SIGINT, ``KeyboardInterrupt``): it stops at once, like a second SIGTERM."""
        return (f"interrupted by SIGINT (Ctrl-C){self._during()}; no checkpoint was taken; "
                f"{self.where_to_resume()}")

    def _during(self) -> str:
        return f" during step {self.step}" if self.step is not None else ""

    def at_step_boundary(self, step: int, saved: str | None, save: Callable[[], str]) -> None:
        """End the run (``StopRequested``) at the boundary after ``step`` when a signal asked to, naming
        that step's checkpoint: ``saved`` when the loop wrote one, else ``save()`` writes it now (a signal
        that arrived after the loop's save decision, while the step's row was logged), so the stop never
        names an older checkpoint than its step, nor none. A signal after this check is handled at the
        next boundary (``requested`` is never reset)."""
        if self.requested:
            self.raise_if_requested(step, saved if saved is not None else save())

    def raise_if_requested(self, step: int, checkpoint: str | None) -> None:
        if self.requested:
            self._disarm()
            raise StopRequested(
                f"stopped on {self.requested} after step {step}; saved {checkpoint}: rerun the same command to resume"
            )
