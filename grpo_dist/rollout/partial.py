"""Partial rollouts: generation that a weight sync interrupts and the new weights finish.

Fully asynchronous training with ``async_training.partial_rollout=true`` keeps the rollout engine
busy across weight syncs. A chunk's requests run in the background (a thread steps the engine, one
iteration at a time, under a lock); at a sync the driver pauses every engine:

1. :meth:`PartialRollouts.pause` waits for the engine iteration in progress, then aborts every
   unfinished request, keeping the tokens it sampled so far with their log-probs and the policy
   version that sampled them;
2. the weights are loaded (nothing steps the engine meanwhile);
3. :meth:`PartialRollouts.resume` gives every interrupted request back to the engine as a new
   request whose prompt is the old prompt followed by its tokens so far, for the tokens it has left
   (``max_tokens - len(tokens)``); its tokens from now on are tagged with the new version.

The prefix is recomputed with the new weights (no key/value cache of the old weights is reused), so
every token's log-prob is the log-prob under the policy of the version it is tagged with: the rollout
log-probs remain the behaviour policy's, token by token, which is what the loss's old log-probs and
rollout correction need. A response interrupted ``k`` times holds tokens of ``k + 1`` versions
(verl's ``fully_async/partial/*`` metrics count them).

Seeds: response ``j`` of prompt ``i`` starts with ``seed + i * n + j``, as an uninterrupted call's
(so a chunk that no sync interrupts samples what ``generate`` would); a continuation after ``t``
tokens is seeded with :func:`continuation_seed`. Where a pause lands depends on timing, so a run
with partial rollouts is not bit-reproducible (every framework's partial rollouts share this).

Tensor-parallel engines (``rollout.tensor_model_parallel_size > 1``): every process of the engine runs its
own scheduler, so every process must add the same requests, step, abort and pause at the same engine
iteration. Each process runs a :class:`PartialRollouts` with an :class:`Agreement`: before every iteration the
engine's first process says what it does (step, pause, or close, and how many chunks are admitted by then)
and the others do the same (one small broadcast per iteration). A chunk the first process admitted waits on
another process until that process's own ``start`` arrived; a pause lands on every process at the iteration
the first one chose; a resume waits for every process's own ``resume``.

The engine needs ``add_request(request_id, prompt_ids, sampling, deltas=True)``, ``step_deltas()``
(``[(request_id, new token ids, their log-probs or None, finish reason or None)]``) and
``abort(request_ids)``: the vLLM engine has them.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from grpo_dist.rollout.base import RolloutOutput, SamplingSettings

__all__ = ["AgreedPause", "Agreement", "PartialRollouts", "TensorParallelAgreement", "Unfinished", "continuation_seed",
           "start_stepping_thread"]

#: What an agreed engine iteration does (:class:`Agreement`).
STEP, PAUSE, CLOSE = 0, 1, 2


def start_stepping_thread(target: Any, name: str) -> threading.Thread:
    """Start the daemon thread that runs ``target`` and steps an engine from it, with this process's intra-op
    thread count (a new thread starts with OpenMP's default, and vLLM's CPU attention refuses a step whose thread
    count differs from its plan's; set through the C function, as vLLM's CPU worker makes
    ``torch.set_num_threads`` a no-op once it bound its threads)."""
    threads = torch.get_num_threads()

    def run() -> None:
        torch._C.set_num_threads(threads)
        target()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def continuation_seed(seed: int | None, tokens_done: int) -> int | None:
    """The seed of a response continued after ``tokens_done`` tokens (None stays None): a fresh stream
    per continuation point, so resuming never replays the noise of the tokens already drawn."""
    if seed is None:
        return None
    return (seed * 1_000_003 + tokens_done) % (2**31 - 1)


@dataclass
class Unfinished:
    """A response generated in pieces (one engine request per piece, a weight sync between two): what was asked
    and what was sampled so far, each token with its log-prob and the policy version that sampled it. Shared by
    the engine-call generator here and the interruptible agent-loop server (``rollout/async_server``)."""

    prompt_ids: list[int]
    sampling: SamplingSettings  # n = 1, this response's own seed and token budget
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str | None = None

    def continuation(self) -> tuple[list[int], SamplingSettings] | None:
        """The engine request that goes on from here: the prompt and the tokens so far, for the tokens left,
        seeded with :func:`continuation_seed` once tokens were drawn; None when no token is left (the engine ends
        a request at ``max_tokens`` itself, so this only guards the arithmetic)."""
        left = self.sampling.max_tokens - len(self.tokens)
        if left <= 0:
            return None
        seed = continuation_seed(self.sampling.seed, len(self.tokens)) if self.tokens else self.sampling.seed
        return self.prompt_ids + self.tokens, replace(self.sampling, max_tokens=left, seed=seed)

    def absorb(self, ids: list[int], logprobs: list[float] | None, version: int) -> None:
        """One engine iteration's new tokens, sampled by policy ``version``."""
        self.tokens.extend(ids)
        self.versions.extend([version] * len(ids))
        if logprobs is not None:
            self.logprobs.extend(logprobs)


class AgreedPause:
    """(agreement) A pause the leader's word made, until this process's ``pause()`` call hands its count over: the
    call may come before or after the word, and returns the same count on every process (0 when the engine was
    paused already by an earlier call)."""

    def __init__(self) -> None:
        self._count, self._unclaimed = 0, False

    def paused(self, interrupted: int) -> None:
        """The engine paused at the leader's word, interrupting ``interrupted`` responses."""
        self._count, self._unclaimed = interrupted, True

    def claim(self) -> int:
        """The pause's count for the first call that asks, 0 for any later one."""
        count, self._unclaimed = (self._count if self._unclaimed else 0), False
        return count

    def resumed(self) -> None:
        self._unclaimed = False


class Agreement:
    """What the processes of one tensor-parallel engine agree on before each engine iteration: the first
    process (``leader``) says ``(what, a, b)``, three integers (here: what, the chunks admitted, 0; the agent-loop
    server's: what, the requests added, up to which chunk); every other process receives the same. Subclasses
    carry it (a broadcast over the engine's processes: :class:`TensorParallelAgreement`)."""

    leader: bool

    def share(self, decision: tuple[int, int, int] | None) -> tuple[int, int, int]:
        """The leader's ``decision``, on every process (the others pass None and wait for it)."""
        raise NotImplementedError


class TensorParallelAgreement(Agreement):
    """:class:`Agreement` over a gloo group of the engine's processes (made collectively, after the engine:
    vLLM's external launcher has made the engine's processes a ``torch.distributed`` world). A process
    waits for the leader's next word for as long as the engine stays idle, so the group waits without a
    time limit worth the name."""

    def __init__(self, tp_rank: int) -> None:
        from datetime import timedelta

        import torch.distributed as dist

        self.leader = tp_rank == 0
        self._dist = dist
        self._group = dist.new_group(backend="gloo", timeout=timedelta(days=30))
        self._src = dist.get_global_rank(self._group, 0)

    def share(self, decision: tuple[int, int, int] | None) -> tuple[int, int, int]:
        t = torch.tensor(decision if self.leader else (0, 0, 0), dtype=torch.int64)
        self._dist.broadcast(t, src=self._src, group=self._group)
        what, a, b = t.tolist()
        return what, a, b


@dataclass
class _Chunk:
    responses: list[Unfinished]  # prompt-major, ``n`` per prompt
    logprobs: bool
    n: int
    busy_s: float = 0.0  # engine iterations that worked on this chunk
    taken: set[int] = field(default_factory=set)  # (streaming) prompts whose group was handed over

    @property
    def done(self) -> bool:
        return all(r.finish_reason is not None for r in self.responses)

    @property
    def groups(self) -> int:
        return len(self.responses) // self.n

    def group(self, i: int) -> list[Unfinished]:
        return self.responses[i * self.n:(i + 1) * self.n]

    def group_done(self, i: int) -> bool:
        return all(r.finish_reason is not None for r in self.group(i))


def rollout_output(responses: list[Unfinished], logprobs: bool) -> RolloutOutput:
    """Finished responses as an engine call's output, each token's version in ``token_versions``."""
    return RolloutOutput(
        response_ids=[r.tokens for r in responses],
        logprobs=[r.logprobs for r in responses] if logprobs else None,
        finished_by_eos=[r.finish_reason == "stop" for r in responses],
        token_versions=[r.versions for r in responses],
    )


def hand_over(chunks: dict[str, Any], ready: list[tuple[str, int]], output: Any) -> list[tuple[str, int, Any]]:
    """Streaming: groups ``ready`` (``(chunk id, index)``) of ``chunks`` (each with ``taken``, a set, and ``groups``,
    a count) handed over as ``(chunk id, index, output(chunk, index))``; a chunk whose groups are all taken is
    dropped from ``chunks``."""
    out = []
    for chunk_id, i in ready:
        chunk = chunks[chunk_id]
        if i in chunk.taken:
            raise ValueError(f"group {i} of chunk {chunk_id!r} was handed over already")
        chunk.taken.add(i)
        out.append((chunk_id, i, output(chunk, i)))
        if len(chunk.taken) == chunk.groups:
            del chunks[chunk_id]
    return out


class PartialRollouts:
    """Chunks generated in the background on ``engine``, interruptible by :meth:`pause` / :meth:`resume`.

    Responses run oldest first: at most ``max_running`` at once (default: the first chunk's count, so one
    chunk's worth, as a blocking call would batch it), and a response that ends makes room for the next
    waiting one (continuous batching), so a chunk's long responses overlap the next chunk's start.

    Thread safety: every engine call is made under one lock, by the stepping thread or by the caller
    of a method here; the engine is otherwise left alone only while paused (:attr:`paused`), which is
    when weights may be loaded or another caller may use the engine. A caller waiting for the lock makes
    the stepping thread stand aside after its current iteration (a plain lock is not fair: the thread
    that releases it takes it again first, and a pause would wait for the whole chunk).
    """

    def __init__(self, engine: Any, *, version: int = 0, max_running: int | None = None,
                 agreement: Agreement | None = None) -> None:
        self._engine = engine
        self._agreement = agreement  # a tensor-parallel engine's: iterations agreed with its other processes
        self._pending: deque[str] = deque()  # (agreement) chunks started here, not yet admitted by the leader
        self._admitted = 0  # (agreement) chunks admitted so far
        self._pause_wanted = False  # (agreement, leader) a pause() waits for the loop to pause every process
        self._agreed_pause = AgreedPause()  # (agreement) the last pause's count, until pause() returns it
        self._lock = threading.Condition()
        self._chunks: dict[str, _Chunk] = {}
        self._running: dict[str, tuple[_Chunk, Unfinished]] = {}  # engine request id -> its response
        self._waiting: deque[tuple[_Chunk, Unfinished]] = deque()  # oldest first; interrupted ones in front
        self._max_running = max_running
        self._version = version
        self._paused = False
        self._closed = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._next_id = 0
        self._callers = 0  # callers waiting for the lock: the stepping thread stands aside
        self._callers_lock = threading.Lock()
        self._busy_s = self._busy_handed_s = 0.0  # engine seconds so far, and up to the last take_groups

    @contextmanager
    def _held(self) -> Iterator[None]:
        """The lock, for a caller: taken after the stepping thread's current iteration."""
        with self._callers_lock:
            self._callers += 1
        self._lock.acquire()
        try:
            with self._callers_lock:
                self._callers -= 1
            self._lock.notify_all()  # the stepping thread stood aside: it may go on when this caller waits or leaves
            yield
        finally:
            self._lock.notify_all()
            self._lock.release()

    # ------------------------------------------------------------------ the driver's calls

    def start(self, chunk_id: str, prompt_ids: list[list[int]], sampling: SamplingSettings) -> None:
        """Queue ``sampling.n`` responses for each prompt of chunk ``chunk_id``; returns at once."""
        if chunk_id in self._chunks:
            raise ValueError(f"chunk {chunk_id!r} was started already")
        n = sampling.n
        responses = [
            Unfinished(list(p), replace(sampling, n=1, seed=None if sampling.seed is None else sampling.seed + i * n + j))
            for i, p in enumerate(prompt_ids) for j in range(n)
        ]
        chunk = _Chunk(responses, logprobs=sampling.logprobs, n=n)
        with self._held():
            self._raise_error()
            if self._max_running is None and responses:
                self._max_running = len(responses)
            self._chunks[chunk_id] = chunk
            if self._agreement is not None:  # admitted at an iteration every process agrees on
                self._pending.append(chunk_id)
            else:
                self._waiting.extend((chunk, r) for r in responses)
                self._fill()
            self._ensure_thread()
            self._lock.notify_all()

    def pause(self) -> int:
        """Stop generating after the engine iteration in progress; every unfinished request is aborted
        and keeps its tokens. Returns how many responses this pause interrupted (0 if generation was paused
        already), the same count on every process of a tensor-parallel engine, whether its call came before the
        leader's word or after the loop had paused on it."""
        with self._held():
            self._raise_error()
            if self._agreement is None or self._thread is None:
                return self._interrupt()
            if self._agreement.leader and not self._paused:  # the loop pauses every process at the next iteration
                self._pause_wanted = True
                self._lock.notify_all()
            while not self._paused:  # (another process: when the leader's word comes, if it has not yet)
                self._lock.wait(timeout=1.0)
                self._raise_error()
            return self._agreed_pause.claim()

    def resume(self, version: int | None = None) -> None:
        """Continue every interrupted response (prompt + its tokens so far) with the engine's weights,
        whose tokens are tagged ``version`` from now on (None: the weights did not change)."""
        with self._held():
            self._raise_error()
            if version is not None:
                self._version = version
            self._paused = False
            self._agreed_pause.resumed()
            self._fill()
            self._lock.notify_all()

    def collect(self, chunk_id: str, *, timeout_s: float | None = None) -> tuple[RolloutOutput, float]:
        """Wait for chunk ``chunk_id`` and hand it over (forgotten here): its responses prompt-major, each
        token's version in ``token_versions``; and the seconds the engine worked on it."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._held():
            if chunk_id not in self._chunks:
                raise KeyError(f"no chunk {chunk_id!r} was started (started: {sorted(self._chunks)})")
            chunk = self._chunks[chunk_id]
            while not chunk.done:
                self._raise_error()
                if self._paused:
                    raise RuntimeError(f"chunk {chunk_id!r} waits for a resume: the generation is paused")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"chunk {chunk_id!r} not finished within {timeout_s} s")
                self._lock.wait(timeout=1.0 if left is None else min(left, 1.0))
            del self._chunks[chunk_id]
        return rollout_output(chunk.responses, chunk.logprobs), chunk.busy_s

    def take_groups(self, groups: list[tuple[str, int]] | None = None, *, wait_s: float = 0.0
                    ) -> tuple[list[tuple[str, int, RolloutOutput]], float]:
        """Streaming: hand over finished groups (a prompt's ``n`` responses), forgotten here, as
        ``(chunk id, prompt index in the chunk, output)``, oldest chunk first; and the seconds the engine worked
        since the last call.

        ``groups=None``: every finished group not handed over yet, waiting up to ``wait_s`` seconds for one when
        none is; a list of ``(chunk id, prompt index)``: exactly those, waiting until they are finished here (the
        other processes of a tensor-parallel engine take what its first process took: the same iterations
        finish them on every process). A chunk whose groups were all handed over is forgotten."""
        deadline = time.monotonic() + wait_s
        with self._held():
            while True:
                self._raise_error()
                ready = self._finished_groups() if groups is None else list(groups)
                if groups is None and (ready or time.monotonic() >= deadline or self._paused):
                    break
                if groups is not None and all(self._chunks[c].group_done(i) for c, i in ready):
                    break
                self._lock.wait(timeout=max(0.001, min(deadline - time.monotonic(), 1.0)) if groups is None else 1.0)
            out = hand_over(self._chunks, ready, lambda chunk, i: rollout_output(chunk.group(i), chunk.logprobs))
            busy_s, self._busy_handed_s = self._busy_s - self._busy_handed_s, self._busy_s
        return out, busy_s

    def _finished_groups(self) -> list[tuple[str, int]]:
        return [(cid, i) for cid, c in self._chunks.items() for i in range(c.groups)
                if i not in c.taken and c.group_done(i)]

    def __repr__(self) -> str:
        return (f"PartialRollouts(chunks={list(self._chunks)}, running={len(self._running)}, waiting={len(self._waiting)}, "
                f"version={self._version}, paused={self._paused}, callers={self._callers}, error={self._error!r})")

    @property
    def active(self) -> bool:
        """Whether a chunk is started and not collected."""
        return bool(self._chunks)

    @property
    def paused(self) -> bool:
        return self._paused

    def close(self) -> None:
        with self._held():
            self._closed = True
            if self._running:
                self._engine.abort(list(self._running))
            self._running.clear()
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)

    # ------------------------------------------------------------------ inside (under the lock)

    def _interrupt(self) -> int:
        """Pause: abort every running request, which waits first again with its tokens so far."""
        self._paused = True
        if self._running:
            self._engine.abort(list(self._running))
        interrupted = list(self._running.values())
        self._running.clear()
        self._waiting.extendleft(reversed(interrupted))  # first again, in their order
        return len(interrupted)

    def _fill(self) -> None:
        """Hand the engine the oldest waiting responses while fewer than ``max_running`` run."""
        while not self._paused and self._waiting and len(self._running) < (self._max_running or 1):
            self._submit(*self._waiting.popleft())

    def _submit(self, chunk: _Chunk, r: Unfinished) -> None:
        request = r.continuation()
        if request is None:
            r.finish_reason = "length"
            return
        request_id = f"partial-{self._next_id}"
        self._next_id += 1
        self._engine.add_request(request_id, *request, deltas=True)
        self._running[request_id] = (chunk, r)

    def _ensure_thread(self) -> None:
        if self._thread is None:
            loop = self._loop if self._agreement is None else self._agreed_loop
            self._thread = start_stepping_thread(loop, "partial-rollouts")

    def _raise_error(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"the background generation failed: {self._error!r}") from self._error

    def _loop(self) -> None:
        try:
            while True:
                with self._lock:
                    while not self._closed and (self._paused or self._callers or not self._running):
                        self._lock.wait()
                    if self._closed:
                        return
                    self._iterate()
        except BaseException as exc:  # handed to the driver's next call
            self._failed(exc)

    def _iterate(self) -> None:
        """One engine iteration: new tokens to their responses (tagged with the current version), finished ones
        out, waiting ones in."""
        t0 = time.perf_counter()
        outputs = self._engine.step_deltas()
        seconds = time.perf_counter() - t0
        self._busy_s += seconds
        for chunk in {id(c): c for c, _ in self._running.values()}.values():
            chunk.busy_s += seconds
        for request_id, ids, lps, reason in outputs:
            if request_id not in self._running:
                continue  # not one of ours (or aborted meanwhile)
            _, r = self._running[request_id]
            r.absorb(ids, lps, self._version)
            if reason is not None:
                r.finish_reason = reason
                del self._running[request_id]
        self._fill()
        self._lock.notify_all()

    def _failed(self, exc: BaseException) -> None:
        with self._lock:
            self._error = exc
            self._lock.notify_all()

    def _agreed_loop(self) -> None:
        """The stepping thread of a tensor-parallel engine's process: before every iteration the leader's word
        (:class:`Agreement`), then the same work on every process."""
        agreement = self._agreement
        try:
            while True:
                decision = None
                if agreement.leader:
                    with self._lock:
                        while not (self._closed or self._pause_wanted
                                   or (not self._paused and (self._running or self._waiting or self._pending))):
                            self._lock.wait()
                        what = CLOSE if self._closed else PAUSE if self._pause_wanted else STEP
                        decision = (what, self._admitted + len(self._pending), 0)
                what, admitted, _ = agreement.share(decision)  # (outside the lock: the driver's calls go on)
                with self._lock:
                    if what == CLOSE:
                        return
                    while self._admitted < admitted:  # a chunk this process was not handed yet waits here
                        while not self._pending:
                            if self._closed:
                                return
                            self._lock.wait(timeout=1.0)
                        chunk = self._chunks[self._pending.popleft()]
                        self._waiting.extend((chunk, r) for r in chunk.responses)
                        self._admitted += 1
                    if what == PAUSE:
                        self._agreed_pause.paused(self._interrupt())
                        self._pause_wanted = False
                        self._lock.notify_all()
                        continue
                    while self._paused and not self._closed:  # this process's own resume (it refills first)
                        self._lock.wait(timeout=1.0)
                    if self._closed:
                        return
                    self._fill()
                    if self._running:
                        self._iterate()
        except BaseException as exc:  # handed to the driver's next call
            self._failed(exc)
