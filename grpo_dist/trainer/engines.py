"""The rollout engines as the loop sees them: which policy version they hold, and what they generate ahead of the
trainer.

The loop owns the policy's version (``policy_version``: the actor's updates so far) and passes it in; this object
owns the rest of the engines' side of a step:

- the version the engines hold (``version``; it trails the policy between an update and the next sync) and the
  weight sync that brings them up to date (:meth:`Engines.sync_to`; with partial rollouts it pauses and resumes
  their generation instead of waiting for it);
- the batches generated ahead, first in first out (``queue``): one-step-off-policy's next step's
  (:mod:`grpo_dist.trainer.one_step_off`, :meth:`Engines.take_ahead`) and fully asynchronous training's chunks
  with verl's freshness rule (:mod:`grpo_dist.trainer.fully_async`, :meth:`Engines.take_chunk`,
  :meth:`Engines.sync_due`), or the streamed groups of partial rollouts (:mod:`grpo_dist.trainer.streaming`);
- what of this a checkpoint holds and a resume puts back (:meth:`Engines.save`, :meth:`Engines.load`).

The colocated, synchronous loop uses only :meth:`Engines.sync_to` (after each update) and :meth:`Engines.wait_generated`
(a no-op there). Scoring, and everything after it, stays with the loop.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Callable

import torch

from grpo_dist.batch import Batch
from grpo_dist.config.driver_plan import DriverPlan
from grpo_dist.rollout.assemble import responses_to_batch
from grpo_dist.rollout.base import rollout_step_seed
from grpo_dist.trainer.fully_async import Admission, check_sample_age, chunk_metrics, load_chunks, save_chunks
from grpo_dist.trainer.metrics import Timer
from grpo_dist.trainer.one_step_off import RolloutAhead
from grpo_dist.trainer.streaming import StreamedRollout

__all__ = ["Engines"]


class Engines:
    """The engines' version and the batches started ahead of the trainer (see the module's docstring).

    Args:
        plan: the run's driver plan (sampling, seeds, the mode and its bound).
        total_steps: the run's steps (nothing is started for a step after the last).
        sampler: the prompts' sampler (its epoch is recorded with each batch started).
        next_items: draws the next step's prompts from the sampler.
        generation_call: ``(items, uid_prefix, sampling) -> (prompts, method, per_rank)``, the rollout call
            generating the responses of ``items``.
        generated: ``(prompts, results, sampling) -> (batch, busy seconds)``, the step's batch from that call's results.

    ``rollout``, ``sync`` and ``stream`` (with partial rollouts) are set by :meth:`attach` once the workers exist.
    """

    def __init__(self, plan: DriverPlan, total_steps: int, *, sampler: Any, next_items: Callable[[], list[dict]],
                 generation_call: Callable[..., tuple[Batch, str, list]],
                 generated: Callable[..., tuple[Batch, float]]) -> None:
        self.plan, self.total_steps, self.sampler = plan, total_steps, sampler
        self.next_items, self.generation_call, self.generated = next_items, generation_call, generated
        self.rollout: Any = None
        self.sync: Any = None
        self.stream: StreamedRollout | None = None
        """With partial rollouts: groups trained as they finish (:mod:`grpo_dist.trainer.streaming`)."""
        self.version = 0
        """The policy version the engines hold."""
        self.queue: deque[RolloutAhead] = deque()
        """The batches generated ahead, first in first out."""
        self.admission = Admission(plan.fully_async.max_ahead) if plan.fully_async is not None else None
        """Fully asynchronous training: the chunks the engines may still start before the next weight sync."""
        if self.admission is not None:
            self.admission.synced(0)  # the engines start with the initial policy
        self.chunks_started = 0
        """Fully asynchronous training: the chunks started so far (the last one's is this step's prompts)."""
        self.stale_samples = 0
        """Fully asynchronous training: prompts trained on with a sample age above 0 so far (verl's
        ``fully_async/count/stale_samples_processed``)."""

    def attach(self, rollout: Any, sync: Any, *, pad_id: int) -> None:
        """The rollout worker group and the weight sync into it, once the workers exist; with partial rollouts, the
        streamed groups on that group (their rows padded with ``pad_id``)."""
        self.rollout, self.sync = rollout, sync
        if self.partial_rollout:
            p = self.plan
            to_batch = partial(responses_to_batch, n=p.shape.n, pad_id=pad_id, response_length=p.response_length)
            self.stream = StreamedRollout(rollout, tp=p.rollout_tp, to_batch=to_batch, per_step=p.shape.train_batch_size,
                                          due_age=p.fully_async.max_ahead - 1)

    @property
    def partial_rollout(self) -> bool:
        """Fully asynchronous training's chunks are generated in the background and a sync interrupts them
        (:mod:`grpo_dist.rollout.partial`)."""
        return self.plan.fully_async is not None and self.plan.fully_async.partial_rollout

    @property
    def ahead(self) -> RolloutAhead | None:
        """The oldest batch generated ahead (the next step's), or None."""
        return self.queue[0] if self.queue else None

    def epoch(self, sampler_epoch: int) -> int:
        """The sampler's epoch of the prompts the next step trains on (``sampler_epoch`` when none was drawn ahead)."""
        if self.stream is not None and self.stream.groups.epoch is not None:
            return self.stream.groups.epoch
        return sampler_epoch if self.ahead is None else self.ahead.epoch

    # ================================================================ weights
    def sync_to(self, policy_version: int, timer: Timer, m: dict[str, float] | None = None) -> None:
        """Send the engines the policy (version ``policy_version``) unless they hold it, after the batch they are
        generating; its timings go to ``timer`` and its bytes to ``m`` (``perf/weight_sync_bytes``) when given."""
        if self.version == policy_version:
            return
        if self.partial_rollout:  # the engines stop after their current iteration; the new weights finish the responses
            interrupted = sum(self.rollout.call("pause_generation"))
        else:
            self.wait_generated()  # the engines finish the batches of the version they started them with
        with timer("update_weights"):
            for name, seconds in self.sync().items():
                timer.add(name, seconds)
        if m is not None:
            m["perf/weight_sync_bytes"] = float(self.sync.last_bytes)
        self.version = policy_version
        if self.partial_rollout:
            self.rollout.call("resume_generation", self.version)
            if m is not None:
                m["fully_async/partial/interrupted"] = float(interrupted)

    def wait_generated(self) -> None:
        """Wait until the engines finished every batch started (they are then idle)."""
        for chunk in self.queue:
            chunk.result()
        if self.stream is not None:
            self.stream.drain()

    # ================================================================ one-step-off-policy
    def start(self, items: list[dict], step: int, epoch: int) -> RolloutAhead | None:
        """Start generating the batch of ``step`` (1-based) from ``items`` with the engines' current weights, with
        that step's sampling seed; returns at once (:mod:`grpo_dist.trainer.one_step_off`). With partial rollouts
        its groups are streamed instead (:mod:`grpo_dist.trainer.streaming`; returns None)."""
        p = self.plan
        sampling = replace(p.train_sampling, seed=rollout_step_seed(p.rollout_seed, step - 1, p.shape.responses))
        prompts, method, per_rank = self.generation_call(items, f"s{step - 1}", sampling)
        if self.stream is not None:  # on the engines' background generators, which a weight sync interrupts
            self.stream.start(f"s{step - 1}", step=step, epoch=epoch, version=self.version, prompts=prompts,
                              method=method, per_rank=per_rank)
            return None
        wait = self.rollout.call_later(method, per_rank=per_rank)
        return RolloutAhead(step=step, epoch=epoch, version=self.version,
                            finish=lambda: self.generated(prompts, wait(), sampling))

    def take_ahead(self, step: int, items: list[dict] | None, policy_version: int, timer: Timer,
                   m: dict[str, float]) -> Batch:
        """One-step-off-policy: the batch of ``step`` (started during the previous step; at the first step from
        ``items``, now), waited for; before it returns, the engines get the policy and start the next step's batch.
        ``m`` gets ``training/sample_age`` (the policy's updates since the engines' weights sampled it) and the
        sync's bytes."""
        if self.ahead is None:
            assert items is not None, "the loop draws a step's prompts when no batch was started for it"
            self.queue.append(self.start(items, step, self.sampler.epoch))
        ahead = self.queue.popleft()
        assert ahead.step == step, (ahead.step, step)
        with timer("wait_prev_gen"):  # verl's name: the part of generation the step still waits for
            batch, busy_s = ahead.result()
        timer.add("gen/worker", busy_s)
        m["training/sample_age"] = float(policy_version - ahead.version)
        if step < self.total_steps and self.plan.one_step_off and not self.queue:  # (else a checkpoint's are next)
            self.sync_to(policy_version, timer, m)  # the engines are idle: the current policy, then the next batch
            self.queue.append(self.start(self.next_items(), step + 1, self.sampler.epoch))
        return batch

    # ================================================================ fully asynchronous
    def start_chunks(self) -> None:
        """Start generating every chunk the freshness rule admits (:class:`~grpo_dist.trainer.fully_async.Admission`),
        up to the last step's, with the engines' current weights; returns at once (the engines run them in order)."""
        while self.admission.may_start():
            step = self.chunks_started + 1
            if step > self.total_steps:
                return
            chunk = self.start(self.next_items(), step, self.sampler.epoch)
            if chunk is not None:
                self.queue.append(chunk)
            self.chunks_started = step
            self.admission.started()

    def chunks_ahead(self) -> int:
        """Chunks started and not yet trained (streamed groups: their chunks' worth, rounded up)."""
        return len(self.queue) if self.stream is None else self.stream.groups.chunks_ahead()

    def next_chunk(self, step: int, policy_version: int) -> tuple[Batch, float, torch.Tensor]:
        """The batch of ``step`` (waiting for it), the engines' busy seconds, and each row's chunk version ``[B]``:
        the oldest chunk generated ahead, or the streamed groups."""
        if self.stream is not None:
            return self.stream.next_batch(policy_version)
        chunk = self.queue.popleft()
        assert chunk.step == step, (chunk.step, step)
        batch, busy_s = chunk.result()
        return batch, busy_s, torch.full((len(batch),), chunk.version, dtype=torch.long)

    def take_chunk(self, step: int, policy_version: int, timer: Timer, m: dict[str, float]) -> Batch:
        """Fully asynchronous training: the batch of ``step`` (the oldest chunk generated ahead, or the streamed
        groups), waited for. ``m`` gets its sample age, the queue's depth and the count of stale samples (verl's
        ``fully_async/count/*``)."""
        self.start_chunks()  # the first step, or after a resume (what the admission still allows)
        with timer("wait_prev_gen"):  # the trainer's idle time
            batch, busy_s, started_B = self.next_chunk(step, policy_version)
        timer.add("gen/worker", busy_s)
        check_sample_age(policy_version - int(started_B.min()), self.plan.fully_async.age_limit, step=step)
        self.stale_samples += int((started_B < policy_version).sum()) // self.plan.shape.n
        m.update(chunk_metrics(batch, started_B, policy_version=policy_version, chunks_ahead=self.chunks_ahead(),
                               stale_samples=self.stale_samples))
        return batch

    def sync_due(self, step: int, policy_version: int, timer: Timer, m: dict[str, float]) -> None:
        """Fully asynchronous training, after step ``step``'s update: every ``trigger`` steps, the engines finish the
        chunks they generate and get the current policy; then the chunks the freshness rule admits start."""
        if step % self.plan.fully_async.trigger or step >= self.total_steps:
            return
        self.sync_to(policy_version, timer, m)
        self.admission.synced(carried=self.chunks_ahead())
        self.start_chunks()

    # ================================================================ checkpoints
    def save(self, directory: Path) -> None:
        """Write what was generated ahead into the checkpoint folder ``directory`` (waiting for what is being
        generated; streamed groups: every group started finishes first)."""
        if self.plan.fully_async is not None:  # the chunks generated ahead, trained on first after a resume
            self.wait_generated()
            save_chunks(list(self.queue) if self.stream is None else self.stream.groups.saved_chunks(), directory)
        elif self.ahead is not None:  # one-step-off: the batch generated for the next step
            self.ahead.save(directory)

    def state(self) -> dict[str, Any]:
        """The driver state's entries for the engines' schedule (fully asynchronous training's admission and count)."""
        if self.admission is None:
            return {}
        return {"fully_async": {"allowed": self.admission.allowed, "stale_samples": self.stale_samples}}

    def load(self, directory: Path, state: dict[str, Any], *, step: int, policy_version: int) -> None:
        """Send the engines the policy the workers loaded from the checkpoint ``directory`` (of ``step``, driver state
        ``state``; version ``policy_version``), and put back what it holds generated ahead."""
        self.sync()
        self.version = policy_version
        self.queue = deque(load_chunks(directory))  # the batches a one-step-off or fully asynchronous run generated ahead
        self.chunks_started = max([c.step for c in self.queue], default=step)
        if self.stream is not None:  # streamed groups: the checkpoint's go to the pool
            self.stream.groups.load(list(self.queue), self.plan.shape.n)
            self.queue.clear()
        if self.admission is not None:
            saved = state.get("fully_async")
            self.admission.synced(carried=self.chunks_ahead())  # (a checkpoint of another mode: as after a sync)
            if saved is not None:
                self.admission.allowed, self.stale_samples = int(saved["allowed"]), int(saved["stale_samples"])
