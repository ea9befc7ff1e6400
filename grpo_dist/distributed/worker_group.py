"""Ray worker groups: one actor per rank, placed over nnodes x devices_per_node.

Placement: one placement group per node (STRICT_PACK), ``devices_per_node`` bundles each, one
bundle per rank, for each pool of ranks (a :class:`ResourcePlan`: the training ranks', or a role's
own, such as the reward model's). Rank r lives in bundle ``r % devices_per_node`` of node
``r // devices_per_node``. Colocated roles (actor, reference, rollout of a rank) are created in the
same bundle and split its resources (each process its ``num_cpus`` / ``num_gpus`` share), so they
share the rank's device. Several roles may also share one process per rank:
:meth:`WorkerGroup.view` gives each role a group of its own over the shared processes, whose calls
are routed to the role (``worker.call(role, method, ...)``, :class:`grpo_dist.workers.models.ModelWorker`).

Calls fan out to every rank and are collected with fault handling: if a worker dies or raises,
``WorkerError`` names the role and the rank, and the call never waits forever. ``WorkerError.kind``
tells the causes apart, so that the driver can say what helps: a worker ``"lost"`` (its process or
node died, e.g. killed for memory) or ``"frozen"`` (it missed its deadline) is the machine's fault,
and rerunning resumes; a worker that ``"raised"`` met an error in code or data (a reward function's
bad value, a refused checkpoint), which a rerun would meet again. A rank that raises because a peer
died (its collective broke) is not the fault to name: the group looks for the lost rank among the
others first, and a broken connection with none found is still ``"lost"``.
"""

from __future__ import annotations

import contextlib
import copy
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from grpo_dist.distributed.waiting import Waiting


class WorkerError(RuntimeError):
    """A worker failed; the message names the role, the rank and what happened.

    Attributes:
        kind: ``"lost"`` (the worker's process or node died, or Ray lost it), ``"frozen"`` (it did
            not answer within its deadline), or ``"raised"`` (code in the worker raised, or the
            worker could not start: ``cause`` is the exception when it reached the driver).
        cause: the innermost exception raised in the worker (``"raised"`` only), else None.
        detail: Ray's whole report of the failed call (for an exception raised in the worker, its
            traceback there), for the run's log file; None when Ray reported nothing.
        broken_link: the worker's collective or connection was broken by its peer's end (it is reported
            lost, but the peer is the one that failed, when it can be found).
    """

    def __init__(self, message: str, *, kind: str = "raised", cause: BaseException | None = None,
                 detail: str | None = None, broken_link: bool = False) -> None:
        super().__init__(message)
        assert kind in ("lost", "frozen", "raised"), kind
        self.kind, self.cause, self.detail, self.broken_link = kind, cause, detail, broken_link

    @property
    def rerun_helps(self) -> bool:
        """Whether running the same command again can get past it (the machine's fault, not the code's)."""
        return self.kind in ("lost", "frozen")


class RayStartError(RuntimeError):
    """Ray could not be started or reached; the message says which and what to check."""


@dataclass(frozen=True)
class ResourcePlan:
    """How many ranks, where, and what each bundle holds."""

    nnodes: int
    devices_per_node: int
    device: str  # "cpu" | "cuda"
    cpus_per_rank: float = 1.0
    keys: str = "trainer"
    """The section whose ``nnodes`` / ``n_gpus_per_node`` gave the sizes (``trainer``, or a pool of a role's
    own such as ``reward_model``), named in the messages when the cluster cannot hold the ranks."""

    @property
    def world_size(self) -> int:
        return self.nnodes * self.devices_per_node

    def bundle(self) -> dict[str, float]:
        b = {"CPU": self.cpus_per_rank}
        if self.device == "cuda":
            b["GPU"] = 1.0
        return b


def check_fits(plan: ResourcePlan) -> None:
    """Fail at once, naming the keys, when the cluster cannot hold the ranks (instead of waiting)."""
    if plan.device != "cuda":
        return
    per_node = sorted((n.get("Resources", {}).get("GPU", 0.0) for n in ray.nodes() if n.get("Alive")), reverse=True)
    fitting = sum(1 for g in per_node if g >= plan.devices_per_node)
    if fitting < plan.nnodes:
        raise WorkerError(
            f"{plan.keys}.nnodes={plan.nnodes} x {plan.keys}.n_gpus_per_node={plan.devices_per_node} does not fit the "
            f"Ray cluster: its nodes have {[int(g) for g in per_node]} GPUs, so only {fitting} node(s) can hold "
            f"{plan.devices_per_node} ranks. Lower {plan.keys}.n_gpus_per_node or {plan.keys}.nnodes."
        )


def check_pools_fit(plans: list[ResourcePlan], gpus_per_node: list[float] | None = None) -> None:
    """Fail at once, naming every pool's keys, when the GPU pools of a run (the training ranks' and, say, a
    reward model's own) each fit the Ray cluster but not all together: the second would otherwise wait
    for devices the first holds until its placement timed out. ``gpus_per_node``: the live nodes' GPUs
    (default: the cluster's)."""
    gpu = [p for p in plans if p.device == "cuda"]
    if len(gpu) < 2:
        return
    if gpus_per_node is None:
        gpus_per_node = [n.get("Resources", {}).get("GPU", 0.0) for n in ray.nodes() if n.get("Alive")]
    need, have = sum(p.world_size for p in gpu), int(sum(gpus_per_node))
    if need > have:
        pools = " + ".join(f"{p.keys}.nnodes={p.nnodes} x {p.keys}.n_gpus_per_node={p.devices_per_node}" for p in gpu)
        raise WorkerError(
            f"the run's device pools need {need} GPUs together ({pools}), and the Ray cluster has {have} "
            f"({[int(g) for g in gpus_per_node]} per node): each pool takes devices of its own. Lower one of the "
            "sizes, or share the training ranks' devices (the other pool's enable_resource_pool=false).")


def create_placement_groups(plan: ResourcePlan, timeout_s: float = 120.0) -> list[PlacementGroup]:
    """One STRICT_PACK placement group per node; waits until all are placed (or fails clearly)."""
    check_fits(plan)
    pgs = [placement_group([plan.bundle()] * plan.devices_per_node, strategy="STRICT_PACK") for _ in range(plan.nnodes)]
    ready, _ = ray.wait([pg.ready() for pg in pgs], num_returns=len(pgs), timeout=timeout_s)
    if len(ready) < len(pgs):
        avail = ray.available_resources()
        for pg in pgs:
            remove_placement_group(pg)
        raise WorkerError(
            f"could not place {plan.nnodes} node(s) x {plan.devices_per_node} bundle(s) of {plan.bundle()} within "
            f"{timeout_s:.0f}s; the Ray cluster has {len(ray.nodes())} node(s) with available resources {avail}. "
            f"Check {plan.keys}.nnodes, {plan.keys}.n_gpus_per_node and trainer.device."
        )
    return pgs


_LOST = (
    ray.exceptions.WorkerCrashedError,
    ray.exceptions.NodeDiedError,
    ray.exceptions.OutOfMemoryError,
    ray.exceptions.ObjectLostError,
    ray.exceptions.LocalRayletDiedError,
)


PEER_GRACE_S = 10.0
"""How long a group that saw a rank raise waits for its other ranks' calls, to find one that was lost
(whose death made the first one's collective fail) before naming the error raised."""

_BROKEN_LINK = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "ncclRemoteError",
                "remote process exited", "DistNetworkError")
BROKEN_LINK_NOTE = "; a process it exchanges tensors with (another rank, or a rollout engine) is gone"

_ABANDONED: list = []
"""Calls a failed :meth:`WorkerGroup.collect` stopped waiting for. Kept referenced: a call's error that
is never fetched is printed by Ray, traceback and all, when its reference is dropped, and the run has
already said what failed."""


def broken_link(cause: BaseException | None) -> bool:
    """Whether a worker's exception is a collective or connection broken by its peer's end (gloo's
    ``Connection reset by peer``, NCCL's remote errors): the peer's failure, not this worker's code."""
    if cause is None:
        return False
    text = f"{type(cause).__name__}: {cause}"
    return any(marker in text for marker in _BROKEN_LINK)


def classify(exc: BaseException) -> tuple[str, BaseException | None]:
    """(kind, cause) of a failed remote call (see :class:`WorkerError`): a dead actor or node is
    ``"lost"`` unless it died raising in its constructor; an exception raised by the worker's code
    is ``"raised"``, with the innermost exception as the cause."""
    if isinstance(exc, ray.exceptions.RayActorError):
        return ("raised", None) if exc.actor_init_failed else ("lost", None)
    if isinstance(exc, _LOST):
        return "lost", None
    cause = exc
    while isinstance(cause, ray.exceptions.RayTaskError) and getattr(cause, "cause", None) not in (None, cause):
        cause = cause.cause
    return "raised", cause


def _actor_address(handle: Any) -> tuple[str | None, str | None, int | None] | None:
    """(ip, Ray node id, pid) of an actor from Ray's actor table (no call to the actor itself, which
    may be the one not answering); None when Ray cannot say."""
    try:
        from ray._private import state

        info = state.actors(actor_id=handle._actor_id.hex())
        addr = info.get("Address") or {}
        return addr.get("IPAddress"), addr.get("NodeID"), info.get("Pid")
    except Exception:
        return None


def where_actor_runs(handle: Any) -> str:
    """``node 10.0.0.3 (Ray node 3f2a9c1d0e4b), pid 1234`` for an actor handle, from Ray's actor table;
    ``an unknown node`` when Ray cannot say."""
    found = _actor_address(handle)
    if found is None:
        return "an unknown node"
    ip, node, pid = found
    if not ip and not node:
        return "an unknown node (not placed yet)"
    return f"node {ip or '?'} (Ray node {str(node)[:12]})" + (f", pid {pid}" if pid else "")


_STATES = {
    "T": "stopped by a signal: state T",
    "t": "stopped by a debugger: state t",
    "R": "running: state R (busy: a loop that does not end, or slower than allowed)",
    "S": "sleeping: state S (waiting: a lock, a socket, a peer in a collective)",
    "D": "in uninterruptible I/O: state D (a slow or hung disk or network file system)",
    "I": "idle: state I",
}


def process_state(pid: int) -> str | None:
    """The state letter of a process of this machine (``/proc/<pid>/stat``: R, S, D, T, ...), ``?`` when
    it exists but its state cannot be read, None when it is gone (or a zombie: it has exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:  # no /proc here: whether it exists is still known
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "?"
    state = stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else "?"
    return None if state in ("Z", "X", "x") else state


def probe(handle: Any) -> tuple[str, str]:
    """Whether an actor's process is alive: (``"alive"`` | ``"gone"`` | ``"unknown"``, what was seen),
    e.g. ``("alive", "stopped by a signal: state T; node 127.0.0.1 (Ray node 3f2a9c1d0e4b), pid 1234")``.
    Only a process on the driver's node can be checked (its pid in Ray's actor table, then ``/proc``);
    one on another node is ``"unknown"``, never called dead."""
    where = where_actor_runs(handle)
    found = _actor_address(handle)
    pid = found[2] if found else None
    try:
        here = ray.get_runtime_context().get_node_id()
    except Exception:
        here = None
    if not pid or not found[1] or found[1] != here:
        return "unknown", f"{where}: on another node, whether its process is alive cannot be checked from here"
    state = process_state(int(pid))
    if state is None:
        return "gone", f"its process has exited; {where}"
    return "alive", f"{_STATES.get(state, f'state {state}')}; {where}"


def _describe(exc: BaseException) -> str:
    """One line for a remote failure: the innermost exception type and message."""
    cause = getattr(exc, "cause", None)
    if cause is not None and cause is not exc:
        return _describe(cause)
    text = str(exc).strip().splitlines()
    last = [t for t in text if t.strip()]
    msg = last[-1] if last else ""
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


class CallDeadlines:
    """How long a worker call may take, per method (and label) of one role.

    * The first call of a method gets ``first_s`` (``trainer.worker_call_timeout_s``): it may load a
      model, compile, warm caches up, and nothing is known yet of how long the method takes.
    * Every later call gets ``max(min_s, factor x the slowest later call so far)``
      (``trainer.worker_call_timeout_min_s`` and ``trainer.worker_call_timeout_factor``); until a later
      call has finished, the first call's time stands in. The first call's warm-up is not counted
      otherwise, so a slow first call does not stretch every deadline after it.

    So a worker that stops answering a fast call is named within about ``min_s`` instead of
    ``first_s``. ``label`` (:meth:`Workers.calls_labelled <grpo_dist.trainer.roles.Workers>`) sets
    calls apart whose size differs from the training step's (validation): ``generate (validation)``
    has deadlines of its own. ``first_s <= 0`` disables the deadlines.
    """

    def __init__(self, first_s: float, factor: float, min_s: float = 60.0) -> None:
        self.floor_s, self.factor, self.min_s = float(first_s), float(factor), float(min_s)
        self.first: dict[str, float] = {}
        self.slowest: dict[str, float] = {}
        self.label: str | None = None

    def key(self, method: str) -> str:
        """The name calls of ``method`` are timed and reported under (``generate (validation)``)."""
        return f"{method} ({self.label})" if self.label else method

    def limit(self, key: str) -> float | None:
        if self.floor_s <= 0:
            return None
        if key not in self.first:
            return self.floor_s
        return max(self.min_s, self.factor * self.slowest.get(key, self.first[key]))

    def record(self, key: str, seconds: float) -> None:
        if key not in self.first:
            self.first[key] = seconds
        else:
            self.slowest[key] = max(seconds, self.slowest.get(key, 0.0))

    def explain(self, key: str) -> str:
        if key not in self.first:
            return (f"the deadline of a first {key} call, which may load and warm up, is "
                    f"trainer.worker_call_timeout_s={self.floor_s:g}")
        return (f"the deadline of a later {key} call is max(trainer.worker_call_timeout_min_s={self.min_s:g}, "
                f"trainer.worker_call_timeout_factor={self.factor:g} x the slowest {key} so far, "
                f"{self.slowest.get(key, self.first[key]):.1f}s)")


class WorkerGroup:
    """Ray actors of one role: one per rank in the given placement groups, or a single one."""

    def __init__(
        self,
        role: str,
        actor_cls: Any,
        plan: ResourcePlan | None,
        pgs: Sequence[PlacementGroup] | None,
        *,
        init_kwargs: Callable[[int], dict] | dict,
        num_cpus: float,
        num_gpus: float = 0.0,
        env: dict[str, str] | None = None,
        ranks: Sequence[int] | None = None,
        deadlines: CallDeadlines | None = None,
    ) -> None:
        """``plan`` and ``pgs`` None: one worker (rank 0) placed anywhere by Ray (e.g. the reward scorer).
        ``deadlines``: how long a call may take before the group gives up on it (None: no limit)."""
        self.role = role
        self.deadlines = deadlines
        self.single = plan is None
        self.dispatch: str | None = None
        """For a :meth:`view`: the role its calls are routed to inside the shared processes."""
        self.process_roles: list[str] = [role]
        """Every role whose calls the processes of this group serve (set by the owner of the views)."""
        if plan is None:
            self.ranks = [0]
        else:
            self.ranks = list(range(plan.world_size)) if ranks is None else list(ranks)
        self.workers = []
        for rank in self.ranks:
            kwargs = init_kwargs(rank) if callable(init_kwargs) else dict(init_kwargs)
            opts: dict[str, Any] = dict(num_cpus=num_cpus, num_gpus=num_gpus, name=None, max_restarts=0,
                                        max_task_retries=0)
            if plan is not None:
                assert pgs is not None
                node, local = divmod(rank, plan.devices_per_node)
                opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    placement_group=pgs[node], placement_group_bundle_index=local
                )
            if env:
                opts["runtime_env"] = {"env_vars": dict(env)}
            self.workers.append(actor_cls.options(**opts).remote(**kwargs))

    def __len__(self) -> int:
        return len(self.workers)

    def view(self, role: str, *, roles: Sequence[str], deadlines: CallDeadlines | None = None) -> WorkerGroup:
        """A group for ``role`` over this group's processes, which hold ``roles`` each: its
        ``call(method, ...)`` runs ``worker.call(role, method, ...)`` on every rank. Errors and
        deadlines name ``role`` (and, for a lost or frozen process, the other roles it held); killing
        any view kills the shared processes."""
        v = copy.copy(self)
        v.role, v.dispatch, v.deadlines, v.process_roles = role, role, deadlines, list(roles)
        return v

    def shares_processes_with(self, other: Any) -> bool:
        """Whether rank i of both groups is the same process, for every i (two views of one group)."""
        mine, theirs = getattr(self, "workers", None), getattr(other, "workers", None)
        if not mine or not theirs or len(mine) != len(theirs):
            return False
        return all(a._actor_id == b._actor_id for a, b in zip(mine, theirs))

    # ---- calls ------------------------------------------------------------------------------
    def submit(self, method: str, *args: Any, per_rank: Sequence[tuple] | None = None, **kwargs: Any) -> list:
        """Start ``method`` on every rank; ``per_rank[i]`` gives rank i's positional args."""
        refs = []
        for i, w in enumerate(self.workers):
            a = per_rank[i] if per_rank is not None else args
            if self.dispatch is None:
                refs.append(getattr(w, method).remote(*a, **kwargs))
            else:
                refs.append(w.call.remote(self.dispatch, method, *a, **kwargs))
        return refs

    def collect(self, refs: list, what: str, timeout_s: float | None = None) -> list:
        """Wait for every rank's result; fail fast (naming the rank) on the first error. While it
        waits, :func:`grpo_dist.distributed.waiting.now` names the ranks still pending and the deadline."""
        pending = {ref: i for i, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with Waiting(lambda: self._who_of(sorted(pending.values())), what, deadline):
            while pending:
                wait_s = 5.0 if deadline is None else max(0.0, min(5.0, deadline - time.monotonic()))
                done, _ = ray.wait(list(pending), num_returns=1, timeout=wait_s)
                for ref in done:
                    i = pending.pop(ref)
                    try:
                        results[i] = ray.get(ref)
                    except Exception as exc:  # RayActorError, RayTaskError, ...
                        _ABANDONED.extend(pending)
                        raise self._failed(i, exc, what, pending, deadline) from None
                if deadline is not None and time.monotonic() > deadline and pending:
                    _ABANDONED.extend(pending)
                    raise self._not_answering(sorted(pending.values()), what, timeout_s)
        return results

    def _failed(self, i: int, exc: BaseException, what: str, pending: dict, deadline: float | None) -> WorkerError:
        """The error for rank index ``i``'s failed call (see :class:`WorkerError` for the kinds)."""
        kind, cause = classify(exc)
        note, link = "", False
        if isinstance(exc, ray.exceptions.ActorUnavailableError):
            # Ray's keepalive gave up on the actor: it may be stopped or swapping, not dead
            status, seen = probe(self.workers[i])
            if status == "alive":
                return WorkerError(f"{self._who(i)} is frozen: its process is alive but did not answer {what} "
                                   f"(Ray reports it unavailable) ({seen}){self._shared_note()}", kind="frozen",
                                   detail=str(exc))
            if status == "unknown":
                return WorkerError(f"{self._who(i)} did not answer {what}: Ray reports it unavailable ({seen})"
                                   f"{self._shared_note()}", kind="frozen", detail=str(exc))
        if kind == "raised":
            # A rank whose peer died fails too (its collective breaks), often first: the
            # dead peer is the failure to name, and a rerun helps.
            peer = self._lost_peer(pending, deadline)
            if peer is not None:
                (i, exc), kind, cause = peer, "lost", None
            elif broken_link(cause):
                kind, cause, note, link = "lost", None, BROKEN_LINK_NOTE, True
        if kind == "lost":
            note += self._shared_note()
        return WorkerError(f"{self._who(i)} failed during {what}: {_describe(exc)}{note}", kind=kind, cause=cause,
                           detail=f"{self._who(i)}, {what}: {exc}", broken_link=link)

    def _not_answering(self, stuck: list[int], what: str, timeout_s: float | None) -> WorkerError:
        """The error for ranks (indices ``stuck``) that did not answer ``what`` within its deadline:
        frozen when a process is alive (named first: the one stopped by a signal, if any), lost when
        every process is gone, and only "did not answer" for processes on other nodes."""
        seen = [(i, *probe(self.workers[i])) for i in stuck]
        order = {"alive": 0, "unknown": 1, "gone": 2}
        seen.sort(key=lambda s: (order[s[1]], "stopped by" not in s[2]))
        (i, status, detail), others = seen[0], seen[1:]
        within = f"within {timeout_s:.0f}s" if timeout_s is not None else ""
        hint = f" ({self.deadlines.explain(what)})" if self.deadlines is not None else ""
        kind = "frozen"
        if status == "alive":
            head = f"{self._who(i)} is frozen: its process is alive but did not answer {what} {within} ({detail})"
        elif status == "unknown":
            head = f"{self._who(i)} did not answer {what} {within} ({detail}): frozen, cut off, or slower than allowed"
        else:
            kind = "lost"
            head = f"{self._who(i)} failed during {what}: it did not answer {within} and {detail}"
        more = "".join(f"; rank {self.ranks[j]} did not answer either ({status_j}: {d})"
                       for j, status_j, d in others[:3])
        return WorkerError(f"{head}{more}{hint}{self._shared_note()}", kind=kind)

    def _lost_peer(self, pending: dict, deadline: float | None) -> tuple[int, BaseException] | None:
        """(index, exception) of a rank among ``pending`` that turns out lost within
        :data:`PEER_GRACE_S` (never past ``deadline``), else None. The calls that finish meanwhile
        are fetched (and leave ``pending``)."""
        end = time.monotonic() + PEER_GRACE_S
        if deadline is not None:
            end = min(end, deadline)
        while pending and time.monotonic() < end:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, end - time.monotonic()))
            for ref in done:
                j = pending.pop(ref)
                try:
                    ray.get(ref)
                except Exception as exc:
                    if classify(exc)[0] == "lost":
                        return j, exc
        return None

    def _shared_note(self) -> str:
        """For a view whose process holds other roles too: which (a lost or frozen process stops them all)."""
        others = [r for r in self.process_roles if r != self.role]
        return f"; its process also held the {', '.join(others)}" if others else ""

    def _who(self, index: int) -> str:
        return f"{self.role} worker" if self.single else f"{self.role} worker rank {self.ranks[index]}"

    def _who_of(self, indices: list[int]) -> str:
        if self.single or len(indices) == 1:
            return self._who(indices[0]) if indices else f"{self.role} worker"
        return f"{self.role} worker ranks {[self.ranks[i] for i in indices]}"

    def call(self, method: str, *args: Any, per_rank: Sequence[tuple] | None = None,
             timeout_s: float | None = None, **kwargs: Any) -> list:
        """``method`` on every rank, waiting at most ``timeout_s`` (default: the group's deadline for
        ``method``); ``WorkerError`` naming the ranks that did not answer."""
        return self.call_later(method, *args, per_rank=per_rank, timeout_s=timeout_s, **kwargs)()

    def call_later(self, method: str, *args: Any, per_rank: Sequence[tuple] | None = None,
                   timeout_s: float | None = None, **kwargs: Any) -> Callable[[], list]:
        """Start ``method`` on every rank now and return at once; the returned function waits for the results
        as :meth:`call` does, the deadline counted from now (the driver works meanwhile: one-step-off-policy
        generates the next batch while the current one trains)."""
        what = method if self.deadlines is None else self.deadlines.key(method)
        if timeout_s is None and self.deadlines is not None:
            timeout_s = self.deadlines.limit(what)
        t0 = time.monotonic()
        refs = self.submit(method, *args, per_rank=per_rank, **kwargs)

        def wait() -> list:
            left = None if timeout_s is None else max(0.0, timeout_s - (time.monotonic() - t0))
            out = self.collect(refs, what, left)
            if self.deadlines is not None:
                self.deadlines.record(what, time.monotonic() - t0)
            return out
        return wait

    def kill(self) -> None:
        for w in self.workers:
            try:
                ray.kill(w, no_restart=True)
            except Exception:  # already dead
                pass
        self.workers = []


def collect_together(*waits: Callable[[], list]) -> list[list]:
    """The results of calls of several groups started together (:meth:`WorkerGroup.call_later`) that wait on each
    other (one collective spans their groups), in order. The first to fail is raised at once (the others would
    wait for the failed side until their deadline), unless its collective was broken by its peer's end
    (``WorkerError.broken_link``): then a failure of another group that follows within :data:`PEER_GRACE_S` (the
    peer's own, which says more) is raised instead, as :meth:`WorkerGroup.collect` does within one group."""
    import queue
    import threading

    done: queue.SimpleQueue = queue.SimpleQueue()

    def run(k: int, wait: Callable[[], list]) -> None:
        try:
            done.put((k, wait(), None))
        except BaseException as exc:  # noqa: BLE001 (handed to the caller's thread)
            done.put((k, None, exc))

    for k, wait in enumerate(waits):
        threading.Thread(target=run, args=(k, wait), name=f"collect-together-{k}", daemon=True).start()

    def next_done(until: float | None) -> tuple | None:
        while until is None or time.monotonic() < until:
            try:  # a timeout keeps the main thread's signal handlers running
                return done.get(timeout=1.0 if until is None else max(0.01, min(1.0, until - time.monotonic())))
            except queue.Empty:
                continue
        return None

    def peer_broke(exc: BaseException) -> bool:
        return getattr(exc, "broken_link", False)

    results: list = [None] * len(waits)
    for n in range(len(waits)):
        k, value, exc = next_done(None)
        if exc is not None:
            if peer_broke(exc):
                until = time.monotonic() + PEER_GRACE_S
                for _ in range(len(waits) - n - 1):
                    other = next_done(until)
                    if other is None:
                        break
                    if other[2] is not None and not peer_broke(other[2]):
                        raise other[2]
            raise exc
        results[k] = value
    return results


def wait_results(refs: list, timeout_s: float) -> list:
    """The results of calls sent to workers outside a group (``ray.get``), waiting at most ``timeout_s``."""
    return ray.get(refs, timeout=timeout_s)


def cluster_cpus() -> float:
    return float(ray.cluster_resources().get("CPU", 1.0))


def cluster_gpus() -> float:
    return float(ray.cluster_resources().get("GPU", 0.0))


#: How long a driver tries to reach the address of a running cluster before it gives up with one message.
#: Ray itself retries an address nobody answers at for many minutes (measured: over 13 min with Ray 2.60).
ATTACH_PROBE_S = 30.0


def _unreachable(address: str, timeout_s: float) -> str | None:
    """Why nothing answers at ``address`` (``host:port`` or ``ray://host:port``) within ``timeout_s``, trying
    a TCP connection every second (a head node may still be starting); None when something answers, or when
    the address is not of that form (``auto``, ``local``: Ray resolves those itself and fails fast)."""
    import socket

    hostport = address.split("://", 1)[1] if address.startswith("ray://") else address
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=max(min(left, 5.0), 0.1)):
                return None
        except OSError as exc:
            last = f"{type(exc).__name__}: {exc.strerror or exc}"
        if time.monotonic() + 1.0 >= deadline:
            return f"nothing answered at {host}:{port} within {timeout_s:.0f} s ({last})"
        time.sleep(1.0)


def init_ray(*, address: str | None, num_cpus: int | None, include_dashboard: bool, min_cpus: int,
             runtime_env: dict | None = None, log_level: str = "warning", worker_log: str | None = None) -> bool:
    """Attach to ``address`` (or RAY_ADDRESS), or start a local instance. True if started here.

    A local instance gets at least ``min_cpus`` CPUs (on CPU a rank is a process, so every rank
    gets a bundle even on a small machine). It serves this machine only: every Ray process of it
    (GCS, raylet, object manager, workers, dashboard and runtime-env agents, the dashboard when on)
    listens on the loopback interface (:func:`_local_only`), and a watchdog process ends its
    processes if the driver is killed without shutting Ray down (:mod:`.ray_watchdog`). A cluster
    reached through an address keeps the binding its nodes were started with.

    ``runtime_env`` (``ray_kwargs.ray_init.runtime_env``: ``py_executable``, ``env_vars``,
    ``working_dir``) is handed to ``ray.init``; its ``env_vars`` are added to the quiet-logging
    variables set for a local instance.

    ``log_level`` (``trainer.log_level``) sets the libraries' verbosity in the workers; ``worker_log`` (quiet
    mode) is the file every worker process sends its stdout and stderr to (:mod:`grpo_dist.utils.run_log`),
    and Ray then forwards nothing of theirs to this process's console; without it the workers' output is
    forwarded, as Ray does by default.

    ``RayStartError`` with one message when Ray cannot be started or reached (an address nothing answers at
    within :data:`ATTACH_PROBE_S` is given up before Ray is asked, which would retry it for many minutes).
    """
    import os

    from grpo_dist.utils import run_log

    if ray.is_initialized():
        return False
    # Worker processes: the libraries' chatter at the run's log level (TRANSFORMERS_VERBOSITY /
    # VLLM_LOGGING_LEVEL, when set, win), and in quiet mode their output into the run's log file.
    env = {"env_vars": {
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "PYTHONWARNINGS": os.environ.get("PYTHONWARNINGS", "ignore::FutureWarning"),
        **run_log.worker_env_vars(log_level, worker_log),
    }}
    quiet = {"worker_process_setup_hook": run_log.WORKER_HOOK} if worker_log is not None else {}
    log_to_driver = worker_log is None
    address = address or os.environ.get("RAY_ADDRESS")
    # Ray starts worker processes at niceness 15 by default; training workers should compete for
    # the CPU on equal terms with everything else on the machine.
    os.environ.setdefault("RAY_worker_niceness", "0")
    # Ray starts one idle worker per CPU for the first driver; every grpo_dist role gets its own process
    # (with its own environment), so on a small machine those idle processes only hold memory (~0.15
    # GiB each) and wake the CPU while the rollout and the update run.
    os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
    user_env = {k: v for k, v in (runtime_env or {}).items() if v}
    if address:
        # A submitted job brings its own runtime environment; only what the user asked for is added, and
        # in quiet mode the workers' output to the run's log file.
        if quiet:
            user_env = {**user_env, **quiet, "env_vars": {**run_log.worker_env_vars(log_level, worker_log),
                                                          **user_env.get("env_vars", {})}}
        unreachable = _unreachable(address, ATTACH_PROBE_S)
        if unreachable:
            raise RayStartError(
                f"could not connect to the Ray cluster at {address} (ray_kwargs.ray_init.address or RAY_ADDRESS): "
                f"{unreachable}; check that the cluster is up (ray status --address {address}) and that this "
                "machine reaches it")
        try:
            with _keeping_sigterm_handler():
                ray.init(address=address, log_to_driver=log_to_driver,
                         **({"runtime_env": user_env} if user_env else {}))
        except Exception as exc:
            raise RayStartError(
                f"could not connect to the Ray cluster at {address} (ray_kwargs.ray_init.address or RAY_ADDRESS): "
                f"{_describe(exc)}; check that the cluster is up (ray status --address {address}), that this "
                "machine reaches it, and that its Ray version and authentication token match this one's") from None
        return True
    env = {**user_env, **quiet, "env_vars": {**env["env_vars"], **user_env.get("env_vars", {})}}
    kwargs = dict(
        address="local",  # a new instance even if another Ray runs on this machine (attach with an address)
        num_cpus=max(num_cpus or os.cpu_count() or 1, min_cpus),
        include_dashboard=include_dashboard,
        dashboard_host="127.0.0.1",
        runtime_env=env,
        log_to_driver=log_to_driver,
        configure_logging=False,
    )
    _local_only()
    try:
        try:
            with _keeping_sigterm_handler(), _no_dashboard_process(include_dashboard):
                ray.init(**kwargs)
        except Exception as exc:
            # Ray waits a fixed 30 s for its raylet to register; on a machine busy with other work
            # (measured: load 16 on 2 cores, a previous instance's agents still exiting) that can miss.
            # A second start then succeeds; a second failure is reported to the caller.
            if "timed out during startup" not in str(exc):
                raise
            ray.shutdown()
            time.sleep(5.0)
            with _keeping_sigterm_handler(), _no_dashboard_process(include_dashboard):
                ray.init(**kwargs)
    except Exception as exc:
        try:
            ray.shutdown()
        except Exception:
            pass
        raise RayStartError(
            f"could not start a local Ray instance: {_describe(exc)}; check free memory and free space "
            "under /tmp (Ray's session folder; RAY_TMPDIR moves it), and that no other program exhausts the "
            "machine's processes or ports. To use a running cluster instead, set ray_kwargs.ray_init.address") from None
    from grpo_dist.distributed import ray_watchdog

    ray_watchdog.start()
    return True


#: What makes Ray's node IP the loopback address: Ray treats a machine where multi-node clusters are
#: off as a single machine and then binds every server to 127.0.0.1 (``ray._private.services.
#: get_node_ip_address``). The switch is the variable Ray documents for macOS and Windows clusters;
#: off on Linux it has the same effect (checked by tests/e2e/test_reliability_e2e.py, which lists the
#: listening sockets of a run's Ray processes).
_CLUSTER_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def _local_only() -> None:
    """Make a Ray instance started by this process bind to the loopback interface only: the
    processes it starts read the environment variable; this one has already read Ray's constant."""
    import os

    os.environ[_CLUSTER_SWITCH] = "0"
    try:
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False
    except (ImportError, AttributeError):  # a Ray without the switch: its default binding stays
        pass


@contextlib.contextmanager
def _keeping_sigterm_handler():
    """``ray.init`` replaces the process's SIGTERM handler with its own (``sys.exit(15)``) while it starts;
    a program that handles SIGTERM itself (the run: one message, exit code 143) keeps its handler for
    those seconds. Without a Python handler installed, Ray's is left to do its work."""
    import signal
    import threading

    from ray._private import utils as ray_utils

    mine = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    if not callable(mine) or not hasattr(ray_utils, "set_sigterm_handler"):
        yield
        return
    original = ray_utils.set_sigterm_handler
    ray_utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler = original


@contextlib.contextmanager
def _no_dashboard_process(include_dashboard: bool):
    """Without the dashboard, a local instance starts no dashboard process at all.

    ``include_dashboard=False`` still makes ``ray.init`` start the dashboard's head process with its
    usage-statistics module only, and wait until that process has published its address: on the 2-core
    machine ~1 s of the driver's wait, and 1.2 CPU-seconds beside the workers' start-up
    (docs/benchmarks.md, "Start-up"). Nothing of a run uses it; Ray's own path for a dashboard that did
    not start (no address, no process) is taken instead. With the dashboard asked for, Ray's start is
    left as it is."""
    from ray._private import services

    original = getattr(services, "start_api_server", None)
    if include_dashboard or original is None:
        yield
        return
    services.start_api_server = lambda *args, **kwargs: (None, None)
    try:
        yield
    finally:
        services.start_api_server = original


def shutdown_ray() -> None:
    """``ray.shutdown()``, without its wait on the autoscaler's monitor.

    Ray ends a local instance's processes one by one, each with SIGTERM and up to a second to exit before
    SIGKILL. The monitor process (the autoscaler's) takes that whole second every time (measured here: 1.0 s
    of a 1.1-1.35 s shutdown); on a local instance it has started nothing of its own (the instance's node
    is this machine), so it is killed first, at once. Attached to a cluster, this driver started no
    processes and this is ``ray.shutdown()`` alone."""
    _kill_local_monitor()
    ray.shutdown()


def _kill_local_monitor() -> None:
    try:
        from ray._private import ray_constants
        from ray._private import worker as ray_worker

        node = getattr(ray_worker, "_global_node", None)
        if node is not None and ray_constants.PROCESS_TYPE_MONITOR in getattr(node, "all_processes", {}):
            node._kill_process_type(ray_constants.PROCESS_TYPE_MONITOR, allow_graceful=False, check_alive=False,
                                    wait=True)
    except Exception:  # Ray's internals moved: its own shutdown still ends the monitor, a second later
        pass


def write_timeline(path: str) -> None:
    """Ray's timeline of the run so far (chrome://tracing JSON) into ``path``
    (``ray_kwargs.timeline_json_file``)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    ray.timeline(filename=str(path))


def remove_placement_groups(pgs: Sequence[PlacementGroup]) -> None:
    for pg in pgs:
        try:
            remove_placement_group(pg)
        except Exception:
            pass
