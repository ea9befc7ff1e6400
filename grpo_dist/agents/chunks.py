"""Partial rollouts through agent loops (``rollout.mode=async`` with ``async_training.partial_rollout=true``):
fully asynchronous training's chunks run their trajectories in the background, and a weight sync interrupts
the requests in the engine instead of waiting for the chunks.

:class:`AgentChunks` runs an event loop on a thread of its own, with one interruptible
:class:`~grpo_dist.rollout.async_server.AsyncRolloutServer` on the replica's engine. :meth:`AgentChunks.start`
schedules a chunk's trajectories (:func:`~grpo_dist.agents.runner.run_trajectories`) on it and returns at once;
chunks started later join the same continuous batch. :meth:`AgentChunks.pause` interrupts the engine's requests
between two iterations (tool calls and chat-template work go on; a loop's next request is held back), so the
engine is free for a weight sync or another caller; :meth:`AgentChunks.resume` continues every request with the
new weights. :meth:`AgentChunks.collect` waits for a chunk and converts it
(:func:`~grpo_dist.agents.collect.to_rollout_output`), each token carrying the policy version that sampled it.

This is the same contract as :class:`~grpo_dist.rollout.partial.PartialRollouts` (the driver calls both the
same way); the difference is who issues the requests: agent loops, several per trajectory, instead of one per
response.

On a tensor-parallel engine (``agreement`` given) every process of the engine runs the same chunks' loops on its
own server, in lock step, and the processes agree on every iteration (the server's agreed mode): a pause stops
all of them at the same iteration.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from grpo_dist.agents.collect import to_rollout_output
from grpo_dist.agents.runner import run_trajectories
from grpo_dist.agents.settings import AgentSettings
from grpo_dist.rollout.async_server import AsyncRolloutServer, request_group
from grpo_dist.rollout.base import RolloutOutput, SamplingSettings
from grpo_dist.rollout.partial import Agreement, hand_over, start_stepping_thread

__all__ = ["AgentChunks"]

T = TypeVar("T")


@dataclass
class _AgentChunk:
    future: Future  # -> (the loops' outputs, engine seconds while the chunk ran)
    versions: list[list[int]]  # filled by the runner: each trajectory's sampled tokens' versions
    sampling: SamplingSettings
    settings: AgentSettings
    version: int  # the policy version when the chunk started
    groups: int  # its rows
    finished: dict[int, list[Any]] = field(default_factory=dict)  # (streaming) rows whose trajectories all ended
    taken: set[int] = field(default_factory=set)  # (streaming) rows handed over

    def output(self, i: int, outs: list[Any]) -> RolloutOutput:
        """Row ``i``'s trajectories as one output."""
        n = self.sampling.n
        return to_rollout_output(outs, logprobs=self.sampling.logprobs, response_length=self.settings.response_length,
                                 versions=self.versions[i * n:(i + 1) * n], default_version=self.version)


class AgentChunks:
    """Chunks of agent-loop trajectories generated in the background on ``engine`` (see the module doc).

    Args:
        engine: the replica's engine (vLLM: it needs ``step_deltas``).
        max_model_len: the context length (prompt + response) a request may use.
        tokenizer: the policy's tokenizer, handed to the loops.
        version: the policy version of the engine's weights.
        agreement: a tensor-parallel engine's (:class:`~grpo_dist.rollout.partial.TensorParallelAgreement`): the
            loops run in lock step and every iteration is agreed with the engine's other processes.
    """

    def __init__(self, engine: Any, *, max_model_len: int, tokenizer: Any, version: int = 0,
                 agreement: Agreement | None = None) -> None:
        self.server = AsyncRolloutServer(engine, max_model_len=max_model_len, interruptible=True, version=version,
                                         lockstep=agreement is not None, agreement=agreement)
        self._tokenizer = tokenizer
        self._chunks: dict[str, _AgentChunk] = {}
        self._started = 0  # chunks started so far
        self._group_ended = threading.Condition()  # (streaming) a row's trajectories all ended
        self._busy_handed_s = 0.0  # the server's busy seconds up to the last take_groups
        self._loop = asyncio.new_event_loop()
        self._thread = start_stepping_thread(self._loop.run_forever, "agent-chunks")  # the engine steps on it

    def _on_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the loop's thread, between two of its steps (so never during an engine iteration); a
        coroutine function is awaited there."""
        async def call() -> T:
            out = fn(*args)
            return await out if asyncio.iscoroutine(out) else out

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result()

    def start(self, chunk_id: str, rows: list[dict[str, Any]], sampling: SamplingSettings,
              settings: AgentSettings) -> None:
        """Run the trajectories of chunk ``chunk_id`` (``sampling.n`` per row, prompt-major) in the background."""
        if chunk_id in self._chunks:
            raise ValueError(f"chunk {chunk_id!r} was started already")
        versions: list[list[int]] = []
        group = self._started  # (a tensor-parallel engine's processes add a chunk's requests by its number)
        self._started += 1

        def group_done(i: int, outs: list[Any]) -> None:
            with self._group_ended:
                self._chunks[chunk_id].finished[i] = outs
                self._group_ended.notify_all()

        async def chunk() -> tuple[list[Any], float]:
            request_group.set(group)  # for every task of this chunk's loops
            busy_at_start = self.server.busy_s
            try:
                outs = await run_trajectories(rows, sampling, server=self.server, tokenizer=self._tokenizer,
                                              settings=settings, versions_out=versions, group_done=group_done)
            finally:
                with self._group_ended:  # (a take_groups waiting on a chunk that failed hears of it)
                    self._group_ended.notify_all()
            return outs, self.server.busy_s - busy_at_start

        with self._group_ended:  # (registered before any of its rows can end)
            self._chunks[chunk_id] = _AgentChunk(None, versions, sampling, settings, self.server.version, len(rows))
            self._chunks[chunk_id].future = asyncio.run_coroutine_threadsafe(chunk(), self._loop)

    def pause(self) -> int:
        """Interrupt the engine's requests after its current iteration (a tensor-parallel engine: the iteration its
        processes agree on); how many were interrupted."""
        return self._on_loop(self.server.pause if self.server.agreement is None else self.server.pause_agreed)

    def resume(self, version: int | None = None) -> None:
        """Continue every interrupted or held request with the engine's weights, policy ``version`` from now on
        (None: the weights did not change)."""
        self._on_loop(self.server.resume, version)

    def collect(self, chunk_id: str, *, timeout_s: float | None = None) -> tuple[RolloutOutput, float]:
        """Wait for chunk ``chunk_id`` and hand it over (forgotten here), with the engine's seconds while it ran.

        Raises:
            RuntimeError: the generation is paused (the chunk would never finish), or a loop failed (its message).
            TimeoutError: not finished within ``timeout_s``.
        """
        if chunk_id not in self._chunks:
            raise KeyError(f"no chunk {chunk_id!r} was started (started: {sorted(self._chunks)})")
        c = self._chunks[chunk_id]
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not c.future.done():
            if self.server.paused:
                raise RuntimeError(f"chunk {chunk_id!r} waits for a resume: the generation is paused")
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"chunk {chunk_id!r} not finished within {timeout_s} s")
            try:
                c.future.exception(timeout=1.0 if left is None else min(left, 1.0))
            except TimeoutError:
                continue
        del self._chunks[chunk_id]  # handed over, or failed: either way no longer generated here
        outs, busy_s = c.future.result()
        return to_rollout_output(outs, logprobs=c.sampling.logprobs, response_length=c.settings.response_length,
                                 versions=c.versions, default_version=c.version), busy_s

    def take_groups(self, groups: list[tuple[str, int]] | None = None, *, wait_s: float = 0.0
                    ) -> tuple[list[tuple[str, int, RolloutOutput]], float]:
        """Streaming: hand over the rows whose trajectories all ended, forgotten here, as ``(chunk id, row
        index in the chunk, output)``, oldest chunk first; and the engine's seconds since the last call. The same
        contract as :meth:`~grpo_dist.rollout.partial.PartialRollouts.take_groups` (``groups=None``: every ended
        row, waiting up to ``wait_s`` for one; a list: exactly those, waiting for them).

        Raises:
            RuntimeError: a loop of a chunk failed (its message).
        """
        deadline = time.monotonic() + wait_s
        with self._group_ended:
            while True:
                for cid, c in self._chunks.items():
                    if c.future.done() and not c.future.cancelled() and c.future.exception() is not None:
                        c.future.result()  # the loop's error, as collect raises it
                ready = ([(cid, i) for cid, c in self._chunks.items() for i in sorted(c.finished) if i not in c.taken]
                         if groups is None else list(groups))
                left = deadline - time.monotonic()
                if groups is None and (ready or left <= 0 or self.server.paused):
                    break
                if groups is not None and all(i in self._chunks[cid].finished for cid, i in ready):
                    break
                self._group_ended.wait(timeout=max(0.001, min(left, 1.0)) if groups is None else 1.0)
            out = hand_over(self._chunks, ready, lambda c, i: c.output(i, c.finished.pop(i)))
        busy = self.server.busy_s
        busy_s, self._busy_handed_s = busy - self._busy_handed_s, busy
        return out, busy_s

    @property
    def active(self) -> bool:
        """Whether a chunk is started and not collected."""
        return bool(self._chunks)

    @property
    def paused(self) -> bool:
        return self.server.paused

    def close(self) -> None:
        """Stop: the engine's requests are aborted, the chunks not collected are cancelled."""
        if not self._loop.is_running():
            return
        try:
            self._on_loop(self.server.pause if self.server.agreement is None else self.server.close_agreed)
        except Exception:  # a failed engine: nothing left to abort
            pass
        for c in self._chunks.values():
            c.future.cancel()
        self._chunks.clear()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
