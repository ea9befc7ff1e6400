"""The asynchronous rollout server of one rollout replica: token ids in, sampled token ids (+ log-probs) out,
for many concurrent trajectories (agent loops) sharing the engine's continuous batching.

``await server.generate(request_id, prompt_ids=..., sampling_params=...)`` is verl's server call: one request,
one response (``n = 1``), :class:`~grpo_dist.rollout.base.TokenOutput` back. Any number of coroutines may await
it at once; the server queues their requests in the engine and runs engine iterations while any is
unfinished, so a request that arrives while others decode joins the running batch at the next iteration (a
trajectory's second turn does not wait for the other trajectories' first turns).

How it drives the engine
------------------------
An engine with the request-level API (``add_request`` / ``step`` / ``has_unfinished_requests`` / ``abort``:
:class:`~grpo_dist.rollout.vllm_engine.VLLMEngine`) is driven iteration by iteration from the event loop: one
``step`` (a forward over the batch) at a time, yielding to the other coroutines between steps, so tool calls
and new turns are scheduled while the batch decodes. It is the engine the synchronous path uses, in the same
process, so the weight sync, sleep and wake-up are the same calls. (vLLM's ``AsyncLLM`` would put the engine in
a child process of its own, where today's in-place weight sync cannot reach it.) An engine without that API
(the Hugging Face fallback) answers each request with a one-prompt ``generate`` in turn.

Seeds: a request's ``sampling_params["seed"]`` seeds exactly that request, so a trajectory sampled with the
seed vLLM's synchronous path gives the same prompt's sample (``seed + sample index``) gets the same tokens.

Interruptible (partial rollouts with agent loops, ``interruptible=True``): :meth:`pause` aborts the engine's
requests after the iteration in progress, keeping the tokens each sampled so far (with their log-probs and the
policy version that sampled them), and holds new requests back; while paused the engine is free (a weight sync,
another caller). :meth:`resume` re-adds every unanswered request as the prompt followed by its tokens so far,
for the tokens it has left, seeded as :func:`~grpo_dist.rollout.partial.continuation_seed` says; its tokens from
then on carry the new version. A loop awaiting ``generate`` sees nothing of this but the answer, whose
``versions`` say which policy sampled each token. The prefix is recomputed with the new weights, so every
token's log-prob is its own version's (:mod:`grpo_dist.rollout.partial` says why that is what training needs).

Lock-step (tensor-parallel engines): every process of a tensor-parallel engine runs the same agent loops on its
own server, and the engine's processes must add the same requests in the same order before each iteration. With
``lockstep=True`` the server adds requests only at a barrier: when every live trajectory (the runner says how
many: :meth:`trajectories_started`, :meth:`trajectory_ended`) is waiting for an answer, it adds the requests
that arrived, sorted by (seed, prompt) rather than by arrival, and runs one iteration. So the processes feed
their engines identically as long as the tools answer identically (deterministic tools: a tool whose answer
depends on time, like a timeout, can make them differ; the step's deadline then names the stuck rollout ranks).
Tools overlap less: an iteration waits for every running tool call.

Lock-step and interruptible (partial rollouts on a tensor-parallel engine, ``agreement`` given): the driver's
pause reaches the engine's processes at different moments, yet all must stop at the same iteration. So before
each iteration the first process (the leader) says what happens and every process does it
(:class:`~grpo_dist.rollout.partial.Agreement`, a broadcast): step, after adding how many requests (the leader
adds every request its loops have sent once all of them wait, as lock-step does; another process waits until its
own loops sent as many: the same ones), pause (every process aborts the same requests, and each one's ``pause``
returns that count), or close. A pause does not wait for running tool calls. On resume the interrupted requests
are added again at the next step, with the new ones, in the same deterministic order on every process.
"""

from __future__ import annotations

import asyncio
import math
import queue
import threading
import time
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from grpo_dist.rollout.base import SamplingSettings, TokenOutput
from grpo_dist.rollout.partial import CLOSE, PAUSE, STEP, AgreedPause, Agreement, Unfinished

__all__ = ["AsyncRolloutServer", "sampling_from_params"]

#: keys of verl's ``sampling_params`` dict that the server reads; others (``repetition_penalty`` at 1.0, ...)
#: are checked to be neutral.
_KNOWN = {"temperature", "top_p", "top_k", "logprobs", "seed", "max_tokens", "do_sample", "n", "ignore_eos"}
_NEUTRAL = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "min_p": 0.0}


def sampling_from_params(params: dict[str, Any], *, max_tokens: int) -> SamplingSettings:
    """verl's per-request ``sampling_params`` dict as :class:`SamplingSettings` (one response).

    ``max_tokens`` is the cap the server allows (the context left); a smaller ``params["max_tokens"]`` wins.
    Temperature 0 (or ``do_sample=False``) is greedy. Unknown keys with a non-neutral value are refused.
    """
    for key, value in params.items():
        if key in _KNOWN:
            continue
        if key in _NEUTRAL and (value is None or value == _NEUTRAL[key]):
            continue
        raise ValueError(f"sampling_params[{key!r}]={value!r} is not supported by the rollout server; "
                         f"it reads {', '.join(sorted(_KNOWN))}")
    if params.get("n", 1) != 1:
        raise ValueError(f"the rollout server samples one response per request; got n={params['n']}")
    asked = params.get("max_tokens")
    cap = max_tokens if asked is None else min(int(asked), max_tokens)
    if cap < 1:
        raise ValueError(f"no room left to generate (max_tokens={cap}); the prompt fills the context")
    temperature = float(params.get("temperature", 1.0))
    greedy = not params.get("do_sample", True) or temperature == 0.0
    if greedy:
        return SamplingSettings(n=1, temperature=0.0, max_tokens=cap, do_sample=False,
                                logprobs=bool(params.get("logprobs", True)), ignore_eos=bool(params.get("ignore_eos", False)))
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"sampling_params temperature must be >= 0, got {temperature}")
    return SamplingSettings(n=1, temperature=temperature, top_p=float(params.get("top_p", 1.0)),
                            top_k=int(params.get("top_k", -1)), max_tokens=cap, do_sample=True,
                            seed=params.get("seed"), logprobs=bool(params.get("logprobs", True)),
                            ignore_eos=bool(params.get("ignore_eos", False)))


#: The chunk a request belongs to, for a server with an agreement: set by the caller that starts a chunk's loops
#: (:class:`~grpo_dist.agents.chunks.AgentChunks`), inherited by every task of those loops. Chunks are numbered
#: in the order they start, the same on every process of the engine.
request_group: ContextVar[int] = ContextVar("request_group", default=0)


def _order(prompt_ids: list[int], sampling: SamplingSettings) -> tuple:
    """Where a request goes among those added at one iteration: by seed, then prompt (not by arrival, which differs
    between the processes of a tensor-parallel engine)."""
    return (-1 if sampling.seed is None else sampling.seed, len(prompt_ids), tuple(prompt_ids))


@dataclass
class _Unanswered(Unfinished):
    """An interruptible server's request: what it asked for and what it got so far, and where it is in the engine."""

    engine_id: str | None = None  # its id in the engine; None while held back (paused, or interrupted)
    submits: int = 0
    order: tuple = ()  # (agreement) (its chunk, seed, prompt): its place among the requests added at one iteration


class AsyncRolloutServer:
    """Concurrent single-response requests on one engine (see the module doc).

    Args:
        engine: a rollout engine (:class:`~grpo_dist.rollout.base.RolloutEngine`), ideally with the
            request-level API.
        max_model_len: the engine's context length: a request may generate at most
            ``max_model_len - len(prompt_ids)`` tokens.
        lockstep: add requests only at a barrier of every live trajectory (tensor-parallel engines).
        interruptible: :meth:`pause` / :meth:`resume` may interrupt requests (partial rollouts); needs the
            engine's ``step_deltas``.
        version: the policy version of the engine's weights (interruptible: every token is tagged with it).
        agreement: (lock-step and interruptible: a tensor-parallel engine's partial rollouts) how the engine's
            processes agree on every iteration; pause with :meth:`pause_agreed`, end with :meth:`close_agreed`.

    Attributes:
        busy_s: seconds spent in engine iterations so far.
    """

    def __init__(self, engine: Any, *, max_model_len: int, lockstep: bool = False, interruptible: bool = False,
                 version: int = 0, agreement: Agreement | None = None) -> None:
        self.engine = engine
        self.max_model_len = max_model_len
        self.stepping = all(hasattr(engine, a) for a in ("add_request", "step", "has_unfinished_requests"))
        if lockstep and not self.stepping:
            raise ValueError("a lock-step server needs an engine with the request-level API (vLLM)")
        if interruptible and not (self.stepping and hasattr(engine, "step_deltas")):
            raise ValueError("an interruptible server needs an engine with the request-level API and step_deltas (vLLM)")
        if (agreement is not None) != (lockstep and interruptible):
            raise ValueError("a server both lock-step and interruptible needs the engine processes' agreement, and "
                             "only such a server takes one")
        self.agreement = agreement
        self.lockstep = lockstep
        self.interruptible = interruptible
        self.version = version
        self.paused = False
        self.busy_s = 0.0
        self._unanswered: dict[str, _Unanswered] = {}  # interruptible: by request id
        self._engine_ids: dict[str, str] = {}  # interruptible: engine id -> request id, of those in the engine
        self._live = 0  # lock-step: trajectories that may still send a request
        self._arrived: list[tuple[tuple, str, list[int], SamplingSettings]] = []  # lock-step: not yet added
        self._waiting: dict[str, asyncio.Future] = {}
        self._pump: asyncio.Task | None = None
        self._lock: asyncio.Lock | None = None  # the one-request-at-a-time fallback
        self.requests = 0  # requests answered (for metrics)
        self.peak_concurrency = 0  # the most requests in flight at once
        # (agreement) the leader's pending words, the last pause's count until this process's pause returns it
        self._pause_wanted = self._close_wanted = self._closed = False
        self._agreed_pause = AgreedPause()
        self._changed: asyncio.Event | None = None  # set when paused, resumed or closed (made on the loop)
        self._sharer: threading.Thread | None = None  # (agreement) the broadcasts' thread, started at the first
        self._to_share: queue.SimpleQueue = queue.SimpleQueue()
        self._error: BaseException | None = None

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **_ignored: Any) -> TokenOutput:
        """Sample one response to ``prompt_ids``; ``request_id`` must be unique among requests in flight.
        (``image_data`` and other multi-modal arguments of verl's call are not read: text only.)"""
        if len(prompt_ids) >= self.max_model_len:
            raise ValueError(f"request {request_id}: the prompt has {len(prompt_ids)} tokens, the context only "
                             f"{self.max_model_len}; nothing can be generated")
        sampling = sampling_from_params(sampling_params, max_tokens=self.max_model_len - len(prompt_ids))
        if not self.stepping:
            return await self._generate_alone(prompt_ids, sampling)
        if request_id in self._waiting:
            raise ValueError(f"request id {request_id!r} is already in flight")
        self._raise_error()  # (agreement) the iterations stopped: no request would be answered
        future = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        self.peak_concurrency = max(self.peak_concurrency, len(self._waiting))
        if self.agreement is not None:  # added at an iteration the engine's processes agree on
            self._unanswered[request_id] = _Unanswered(list(prompt_ids), sampling,
                                                       order=(request_group.get(), *_order(prompt_ids, sampling)))
        elif self.lockstep:
            self._arrived.append((_order(prompt_ids, sampling), request_id, list(prompt_ids), sampling))
        elif self.interruptible:
            self._unanswered[request_id] = _Unanswered(list(prompt_ids), sampling)
            if not self.paused:
                try:
                    self._submit(request_id)
                except BaseException:
                    self._waiting.pop(request_id, None)
                    self._unanswered.pop(request_id, None)
                    raise
        else:
            try:
                self.engine.add_request(request_id, list(prompt_ids), sampling)
            except BaseException:
                self._waiting.pop(request_id, None)
                raise
        self._start_pump()
        try:
            out = await future
        except asyncio.CancelledError:
            if self._waiting.pop(request_id, None) is not None:
                self._abort(request_id)
            raise
        self.requests += 1
        return out

    def _start_pump(self) -> None:
        if self._pump is not None and not self._pump.done():
            return
        if self.agreement is not None:
            if not self._closed:
                self._pump = asyncio.ensure_future(self._run_agreed())
        elif not self.paused:
            self._pump = asyncio.ensure_future(self._run_engine())

    def _abort(self, request_id: str) -> None:
        """Drop a request whose caller gave up."""
        if not self.interruptible:
            self.engine.abort([request_id])
            return
        r = self._unanswered.pop(request_id, None)
        if r is not None and r.engine_id is not None:
            self._engine_ids.pop(r.engine_id, None)
            self.engine.abort([r.engine_id])

    # ------------------------------------------------------------------ interruptible (partial rollouts)

    def pause(self) -> int:
        """Interrupt the requests in the engine (between two iterations: call it on the server's event loop) and
        hold back new ones until :meth:`resume`; each keeps its tokens so far. Returns how many were interrupted."""
        if not self.interruptible:
            raise RuntimeError("pause() needs a server made with interruptible=True")
        if self.agreement is not None:
            raise RuntimeError("a server with an agreement pauses with pause_agreed(), where its processes agree")
        self.paused = True
        return self._interrupt()

    def _interrupt(self) -> int:
        interrupted = list(self._engine_ids)
        if interrupted:
            self.engine.abort(interrupted)
        for engine_id in interrupted:
            self._unanswered[self._engine_ids.pop(engine_id)].engine_id = None
        return len(interrupted)

    def resume(self, version: int | None = None) -> None:
        """Continue every unanswered request with the engine's weights, policy ``version`` from now on (None: the
        weights did not change)."""
        if not self.interruptible:
            raise RuntimeError("resume() needs a server made with interruptible=True")
        if version is not None:
            self.version = version
        self.paused = False
        if self.agreement is not None:  # the interrupted requests are added again at the next agreed iteration
            self._agreed_pause.resumed()
            self._notify()
            self._start_pump()
            return
        for request_id, r in list(self._unanswered.items()):
            if r.engine_id is None:
                self._submit(request_id)
        if self._waiting:
            self._start_pump()

    def _submit(self, request_id: str) -> None:
        """Hand an unanswered request to the engine: its prompt and tokens so far, for the tokens it has left."""
        r = self._unanswered[request_id]
        request = r.continuation()
        if request is None:
            self._answer(request_id, "length")
            return
        engine_id = request_id if r.submits == 0 else f"{request_id}#resumed{r.submits}"
        self.engine.add_request(engine_id, *request, deltas=True)
        r.engine_id, r.submits = engine_id, r.submits + 1
        self._engine_ids[engine_id] = request_id

    def _step_interruptible(self) -> None:
        """One engine iteration: new tokens to their requests, tagged with the current version."""
        for engine_id, ids, lps, reason in self.engine.step_deltas():
            request_id = self._engine_ids.get(engine_id)
            if request_id is None:
                continue  # aborted meanwhile
            r = self._unanswered[request_id]
            r.absorb(ids, lps, self.version)
            if reason is not None:
                del self._engine_ids[engine_id]
                r.engine_id = None
                self._answer(request_id, reason)

    def _answer(self, request_id: str, reason: str) -> None:
        r = self._unanswered.pop(request_id)
        future = self._waiting.pop(request_id, None)
        if future is not None and not future.done():
            future.set_result(TokenOutput(r.tokens, r.logprobs if r.sampling.logprobs else None, reason,
                                          versions=r.versions))

    async def _run_engine(self) -> None:
        """Engine iterations while requests wait; each finished request resolves its future. An engine error
        fails every waiting request with it."""
        try:
            while self._waiting and not self.paused:
                await asyncio.sleep(0)  # let coroutines that are ready add their requests first
                if self.paused:
                    break
                if self.lockstep:
                    await self._barrier()
                t0 = time.perf_counter()
                if self.interruptible:
                    self._step_interruptible()
                else:
                    for request_id, out in self.engine.step():
                        future = self._waiting.pop(request_id, None)
                        if future is not None and not future.done():
                            future.set_result(out)
                self.busy_s += time.perf_counter() - t0
                if self._waiting and not self.paused and not self.engine.has_unfinished_requests():
                    lost = ", ".join(sorted(self._waiting))
                    raise RuntimeError(f"the engine holds no request but these wait for an answer: {lost}")
        except BaseException as exc:
            self._fail_waiting(exc)
            if not isinstance(exc, Exception):
                raise

    def _fail_waiting(self, exc: BaseException) -> None:
        """The engine's iterations stopped on ``exc``: every waiting request fails with it."""
        waiting, self._waiting = self._waiting, {}
        self._unanswered.clear()
        self._engine_ids.clear()
        for future in waiting.values():
            if not future.done():
                future.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))

    # ------------------------------------------------------------------ agreed (tensor-parallel partial rollouts)

    async def pause_agreed(self) -> int:
        """:meth:`pause` on every process of a tensor-parallel engine at one iteration: the leader's call says so at
        the next iteration; another process's call returns once it paused there (its call may come before or after).
        Returns how many requests that pause interrupted (0 if paused already), the same on every process."""
        self._raise_error()
        if self.agreement.leader and not self.paused:
            self._pause_wanted = True
        self._start_pump()
        while not self.paused:
            await self._event().wait()
            self._event().clear()
            self._raise_error()
        return self._agreed_pause.claim()

    async def close_agreed(self, timeout_s: float = 30.0) -> None:
        """End the agreed iterations: the leader says so, the other processes stop on its word (waiting at most
        ``timeout_s`` for it)."""
        if self._closed:
            return
        if self.agreement.leader:
            self._close_wanted = True
        self._start_pump()
        try:
            await asyncio.wait_for(asyncio.shield(self._pump), timeout_s)
        except (asyncio.TimeoutError, Exception):
            pass

    def _event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"the rollout server stopped: {self._error!r}") from self._error

    async def _share(self, decision: tuple[int, int, int] | None) -> tuple[int, int, int]:
        """The leader's word for this iteration (the agreement's broadcast, on the server's sharing thread: a
        process waits for the word as long as the leader has nothing to say, and the event loop goes on
        meanwhile). One broadcast at a time: the iterations are sequential."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def settle(result, exc) -> None:
            if not future.done():
                future.set_exception(exc) if exc is not None else future.set_result(result)

        if self._sharer is None:
            self._sharer = threading.Thread(target=self._sharing, name="rollout-agreement", daemon=True)
            self._sharer.start()
        self._to_share.put((decision, loop, settle))
        return await future

    def _sharing(self) -> None:
        """The sharing thread: each broadcast asked for, its result (or error) handed back to the asking loop; it
        ends after the word close (or a failed broadcast: the iterations stop)."""
        while True:
            decision, loop, settle = self._to_share.get()
            try:
                result, exc = self.agreement.share(decision), None
            except BaseException as e:  # noqa: B036 (handed to the loop)
                result, exc = None, e
            last = exc is not None or result[0] == CLOSE
            if last:  # (before the loop hears of it: a later broadcast starts a new thread)
                self._sharer = None
            try:
                loop.call_soon_threadsafe(settle, result, exc)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass
            if last:
                return

    def _unsubmitted(self, up_to_group: int | None = None) -> list[str]:
        """The requests not in the engine (new, held back, or interrupted) of chunks up to ``up_to_group`` (None:
        all), in the order every process adds them."""
        ids = [rid for rid, r in self._unanswered.items()
               if r.engine_id is None and (up_to_group is None or r.order[0] <= up_to_group)]
        return sorted(ids, key=lambda rid: self._unanswered[rid].order)

    async def _leaders_word(self) -> tuple[tuple[int, int, int], list[str]]:
        """(leader) What the next iteration does, once it can be said, and the requests it adds: close or pause when
        wanted; else, once every live trajectory waits for an answer (a pause wanted meanwhile does not wait for
        that), a step after adding the requests not in the engine: how many, and up to which chunk (a chunk started
        while the word travels waits for the next iteration, on every process)."""
        while True:
            if self._close_wanted:
                return (CLOSE, 0, 0), []
            if self._pause_wanted:
                return (PAUSE, 0, 0), []
            if len(self._waiting) >= self._live:
                ready = self._unsubmitted()
                group = max((self._unanswered[rid].order[0] for rid in ready), default=0)
                return (STEP, len(ready), group), ready
            await asyncio.sleep(0.002)  # a tool call or a chat-template rendering is still running

    async def _run_agreed(self) -> None:
        """Engine iterations on the leader's word (see the module doc). The leader's pump ends when it has nothing
        to say (the others wait for its next word); another process's runs until the leader says close."""
        leader = self.agreement.leader
        try:
            while True:
                decided: list[str] = []
                if leader:
                    if not (self._close_wanted or self._pause_wanted or (self._waiting and not self.paused)):
                        return
                    decision, decided = await self._leaders_word()
                else:
                    decision = None
                what, count, group = await self._share(decision)
                if what == CLOSE:
                    self._closed = True
                    self._interrupt()
                    return
                if what == PAUSE:
                    self._agreed_pause.paused(self._interrupt())
                    self.paused, self._pause_wanted = True, False
                    self._notify()
                    continue
                while self.paused:  # (another process: the leader resumed first; this one's own resume comes)
                    await self._event().wait()
                    self._event().clear()
                ready = decided if leader else self._unsubmitted(group)
                while len(ready) < count:  # (another process: its loops have not sent them all yet)
                    await asyncio.sleep(0.002)
                    ready = self._unsubmitted(group)
                if len(ready) > count:
                    raise RuntimeError(f"this process has {len(ready)} requests to add where the first process of the "
                                       f"engine added {count}: the agent loops of the engine's processes differ")
                for request_id in ready:
                    if request_id in self._unanswered:  # (not dropped meanwhile by a caller that gave up)
                        self._submit(request_id)
                t0 = time.perf_counter()
                self._step_interruptible()
                self.busy_s += time.perf_counter() - t0
        except BaseException as exc:
            self._error = exc
            self._fail_waiting(exc)
            self._notify()
            if not isinstance(exc, Exception):
                raise

    def trajectories_started(self, count: int) -> None:
        """The runner starts ``count`` trajectories (lock-step bookkeeping; harmless otherwise)."""
        self._live += count

    def trajectory_ended(self) -> None:
        """One trajectory will send no more requests."""
        self._live -= 1

    async def _barrier(self) -> None:
        """Lock-step: wait until every live trajectory waits for an answer, then add what arrived, in a
        deterministic order."""
        while len(self._waiting) < self._live:
            await asyncio.sleep(0.002)  # a tool call or a chat-template rendering is still running
        arrived, self._arrived = sorted(self._arrived, key=lambda a: a[0]), []
        for _, request_id, prompt_ids, sampling in arrived:
            self.engine.add_request(request_id, prompt_ids, sampling)

    async def _generate_alone(self, prompt_ids: list[int], sampling: SamplingSettings) -> TokenOutput:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            self.peak_concurrency = max(self.peak_concurrency, 1)
            out = self.engine.generate([list(prompt_ids)], sampling)
        self.requests += 1
        return TokenOutput(token_ids=out.response_ids[0],
                           log_probs=None if out.logprobs is None else out.logprobs[0],
                           stop_reason="stop" if out.finished_by_eos[0] else "length")
