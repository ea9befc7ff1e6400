"""What the driver is waiting for right now: the worker call a :class:`~.worker_group.WorkerGroup`
collects, and until when. The SIGTERM handler (:mod:`grpo_dist.trainer.stop`) names it at once, so
that a stop requested while a worker does not answer says what the run waits for instead of
printing nothing until the step ends. Plain Python (no Ray): read from a signal handler."""

from __future__ import annotations

import time
from typing import Callable

__all__ = ["Waiting", "now"]

_CURRENT: list["Waiting"] = []


class Waiting:
    """One wait, registered for its duration (``with Waiting(...)``).

    Args:
        who: the workers waited for, e.g. ``rollout worker rank 0``; a callable is asked when read
            (the ranks still pending change while the wait goes on).
        what: the call, e.g. ``generate``.
        deadline: ``time.monotonic()`` of the deadline, or None (no deadline).
    """

    def __init__(self, who: str | Callable[[], str], what: str, deadline: float | None) -> None:
        self.who, self.what, self.deadline = who, what, deadline

    def __enter__(self) -> "Waiting":
        _CURRENT.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if self in _CURRENT:
            _CURRENT.remove(self)

    def describe(self, *, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> str:
        """``rollout worker rank 0's generate (deadline 16:42:10, in 52 s)``."""
        who = self.who() if callable(self.who) else self.who
        if self.deadline is None:
            return f"{who}'s {self.what} (no deadline: trainer.worker_call_timeout_s=0)"
        left = self.deadline - clock()
        at = time.strftime("%H:%M:%S", time.localtime(wall() + left))
        return f"{who}'s {self.what} (deadline {at}, in {max(0, round(left))} s)"


def now() -> str | None:
    """What the driver waits for now (the innermost wait), or None when it waits for no worker."""
    try:
        return _CURRENT[-1].describe() if _CURRENT else None
    except Exception:  # read from a signal handler: never fail there
        return None
