"""Streamed groups (fully asynchronous training with partial rollouts, grpo_dist/trainer/streaming.py): a step
trains on the groups that finished, oldest first, waiting only for the groups that are due; no group is older
than the freshness rule's bound, none is trained twice or lost, through a checkpoint included. The driver runs
with stand-in engines on a logical clock (a group takes a number of ticks after its chunk started; a step's
wait for a group and the actor's update advance the clock)."""

from __future__ import annotations

import math
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from grpo_dist.batch import Batch
from grpo_dist.config.spec import resolve
from grpo_dist.trainer import checkpoint
from grpo_dist.trainer.driver import GRPOTrainer
from grpo_dist.trainer.one_step_off import RolloutAhead
from grpo_dist.trainer.streaming import GroupStream, StreamedChunk, StreamedRollout
from grpo_dist.workers.common import Timed
from tests.unit.test_driver_step import ActorGroup, Rewards, config, scored_rollout
from tests.unit.test_fully_async import fully_async, run_steps
from tests.unit.test_one_step_off import Prompts, SyncRecorder


class ClockEngines:
    """One engine generating streamed groups on a logical clock: prompt ``i`` of the chunk of step ``s`` is done
    ``cost(s, i)`` ticks after the chunk started; a fetch that finds nothing done waits one tick. Records the chunks
    started (step, the engines' version, chunks then ahead of the trainer), pauses, syncs and resumes."""

    def __init__(self, trainer: GRPOTrainer, cost) -> None:
        self.trainer, self.cost, self.clock = trainer, cost, 0
        self.done_at: dict[tuple[str, int], int] = {}
        self.events: list[tuple] = []

    def __len__(self) -> int:
        return 1

    def call(self, method, *args, per_rank=None):
        if method == "start_chunk":
            (chunk_id, prompt_ids, _sampling, version), = per_rank
            step = int(chunk_id[1:]) + 1
            self.events.append(("start", step, version, self.trainer.engines.chunks_ahead() + 1))
            self.done_at.update({(chunk_id, i): self.clock + self.cost(step, i) for i in range(len(prompt_ids))})
            return [None]
        if method == "take_groups":
            (groups, wait_s), = per_rank
            assert groups is None
            found = sorted(k for k, t in self.done_at.items() if t <= self.clock)
            if not found and wait_s > 0:
                self.clock += 1
                found = sorted(k for k, t in self.done_at.items() if t <= self.clock)
            for k in found:
                del self.done_at[k]
            return [Timed([(c, i, None) for c, i in found], 0.25)]
        if method == "pause_generation":
            self.events.append(("pause",))
            return [len(self.done_at)]
        if method == "resume_generation":
            self.events.append(("resume", args[0]))
            return [None]
        raise AssertionError(method)

    def sync(self):
        self.events.append(("sync", self.trainer.policy_version))
        return {"update_weights/load": 0.01}


class TickingActor(ActorGroup):
    """The actor's update takes ``ticks`` ticks of the engines' clock."""

    def __init__(self, engines: ClockEngines, ticks: int) -> None:
        super().__init__()
        self.engines, self.ticks = engines, ticks

    def call(self, method, *args, per_rank):
        if method == "update_policy":
            self.engines.clock += self.ticks
        return super().call(method, *args, per_rank=per_rank)


def make(tmp_path, staleness: float, trigger: int, cost, *, steps: int = 8, train_ticks: int = 0):
    cfg = config(*fully_async(staleness, trigger, partial=True), f"trainer.total_training_steps={steps}")
    trainer = GRPOTrainer(resolve(cfg), model_path="unused", tokenizer=None, tokenizer_path="unused",
                          train_data=Prompts(), val_data=None, device="cpu", out_dir=str(tmp_path))
    engines = ClockEngines(trainer, cost)
    trainer.actor, trainer.ref, trainer.critic, trainer.rewards = TickingActor(engines, train_ticks), None, None, Rewards()
    trainer.rollout = trainer.engines.rollout = engines
    trainer.engines.sync = SyncRecorder(engines)
    rows = scored_rollout(cfg)([{}, {}], 0, None)[0]

    def generation_call(items, prefix, sampling):
        prompts = Batch.from_dict({"index": torch.tensor([[it["index"]] for it in items])},
                                  {"uid": [f"{prefix}-{i}" for i in range(len(items))]})
        return prompts, "generate", [([[it["index"]] for it in items], sampling)]

    def to_batch(prompt, _output):  # the stand-in's first group, with the prompt's uid
        group = rows.slice(0, 2)
        group["uid"] = [prompt["uid"][0]] * 2
        return group
    trainer._generation_call = generation_call
    trainer.engines.stream = StreamedRollout(engines, tp=1, to_batch=to_batch, per_step=2,
                                     due_age=trainer.plan.fully_async.max_ahead - 1, poll_s=0.01)
    return trainer, engines


def trained_groups(trainer: GRPOTrainer) -> list[list[tuple[int, int]]]:
    """Record, for each step, the groups the reward stage scored: (their chunk's step, prompt index)."""
    seen: list[list[tuple[int, int]]] = []
    score = trainer.rewards.score

    def recording(batch, timer=None):
        uids = list(dict.fromkeys(batch["uid"]))
        seen.append([(int(u[1:].split("-")[0]) + 1, int(u.split("-")[1])) for u in uids])
        return score(batch, timer)
    trainer.rewards.score = recording
    return seen


def test_staleness_0_and_trigger_1_trains_each_chunk_whole_at_its_own_step(tmp_path):
    trainer, eng = make(tmp_path, 0, 1, cost=lambda s, i: 1 + 3 * (i == 0), steps=4)
    seen = trained_groups(trainer)
    metrics = run_steps(trainer, 4)
    assert seen == [[(s, 0), (s, 1)] for s in range(1, 5)]  # the long response is waited for: it is due at once
    assert [m["training/sample_age"] for m in metrics] == [0.0] * 4
    assert [e[:3] for e in eng.events if e[0] == "start"] == [("start", s, s - 1) for s in range(1, 5)]


def test_a_sync_interrupts_the_engines_instead_of_waiting_for_them(tmp_path):
    trainer, eng = make(tmp_path, 1.0, 1, cost=lambda s, i: 3, steps=3)
    metrics = run_steps(trainer, 3)
    # the chunk started ahead is not waited for at a sync: paused, the weights sent, resumed with their version
    assert [e[:3] if e[0] == "start" else e for e in eng.events] == [
        ("start", 1, 0), ("start", 2, 0), ("pause",), ("sync", 1), ("resume", 1), ("start", 3, 1),
        ("pause",), ("sync", 2), ("resume", 2)]
    # chunks 1 and 2 end together, before the first sync; chunk 3 runs at the second
    assert [m.get("fully_async/partial/interrupted") for m in metrics] == [0.0, 2.0, None]
    assert [m["training/sample_age"] for m in metrics] == [0.0, 1.0, 1.0]  # counted from the version a chunk began with


def test_a_long_response_holds_up_a_step_only_once_its_chunk_is_due(tmp_path):
    # two chunks ahead (B = 2): prompt 0 of the first chunk takes 6 ticks, every other group 1
    trainer, eng = make(tmp_path, 1, 1, cost=lambda s, i: 6 if (s, i) == (1, 0) else 1, steps=4)
    seen = trained_groups(trainer)
    metrics = run_steps(trainer, 4)
    assert seen[0] == [(1, 1), (2, 0)]  # step 1 does not wait for it: the next chunk's first group stands in
    assert (1, 0) in seen[1]  # due at step 2 (its chunk is one update old): waited for
    assert sorted(g for step in seen for g in step) == [(s, i) for s in range(1, 5) for i in (0, 1)]
    assert max(m["training/sample_age"] for m in metrics) == 1.0


@pytest.mark.parametrize("staleness,trigger", [(0.0, 1), (1.0, 1), (0.5, 2), (0.1, 4), (2.0, 2), (0.0, 3)])
@pytest.mark.parametrize("train_ticks", [0, 5])
def test_the_groups_ahead_and_their_age_never_pass_the_bound_and_each_is_trained_once(tmp_path, staleness, trigger,
                                                                                     train_ticks):
    bound = math.floor((1 + staleness) * trigger)
    rng = random.Random(f"{staleness}-{trigger}-{train_ticks}")
    costs: dict[tuple[int, int], int] = {}

    def long_tailed(s, i):  # most groups quick, one in four ten times as long
        return costs.setdefault((s, i), rng.choice([1, 1, 1, 10]))
    trainer, eng = make(tmp_path, staleness, trigger, long_tailed, steps=10, train_ticks=train_ticks)
    seen = trained_groups(trainer)
    metrics = run_steps(trainer, 10)
    assert max(e[3] for e in eng.events if e[0] == "start") <= bound
    assert max(m["training/sample_age"] for m in metrics) <= bound - 1
    assert all(m["fully_async/queue_size"] <= bound for m in metrics)
    assert all(len(step) == 2 for step in seen)
    assert sorted(g for step in seen for g in step) == [(s, i) for s in range(1, 11) for i in (0, 1)]


def test_a_resume_trains_every_group_once_the_checkpoints_first(tmp_path):
    cost = lambda s, i: 8 if i == 0 else 1  # noqa: E731 - every chunk's first group is long
    whole, _ = make(tmp_path / "whole", 1.0, 2, cost, steps=8)
    whole_seen = trained_groups(whole)
    run_steps(whole, 8)

    first, _ = make(tmp_path / "a", 1.0, 2, cost, steps=8)
    seen1 = trained_groups(first)
    run_steps(first, 3)
    first.workers = SimpleNamespace(save=lambda tmp, export_hf: None, load=lambda path: None)
    saved = first.save()  # waits for every group started: they are all in the pool
    assert first.engines.stream.groups.pending == 0 and first.engines.stream.groups.pool
    pool = sorted(g.order for g in first.engines.stream.groups.pool)
    point = checkpoint.ResumePoint(path=Path(saved), state=checkpoint.read_state(saved))

    second, eng2 = make(tmp_path / "b", 1.0, 2, cost, steps=8)
    seen2 = trained_groups(second)
    second.workers = first.workers
    second.resume(point)
    assert sorted(g.order for g in second.engines.stream.groups.pool) == pool
    run_steps(second, 5)
    trained = [g for step in seen1 + seen2 for g in step]
    assert sorted(trained) == sorted(g for step in whole_seen for g in step) == [(s, i) for s in range(1, 9) for i in (0, 1)]
    assert [g for step in seen2 for g in step][:len(pool)] == pool  # the checkpoint's groups first, oldest first
    assert all(e[1] > first.engines.chunks_started for e in eng2.events if e[0] == "start")  # nothing generated twice


def group_batch(step: int, i: int) -> Batch:
    return Batch.from_dict({"x": torch.zeros(2, 1)}, {"uid": [f"s{step - 1}-{i}"] * 2})


def test_the_stream_by_hand():
    stream = GroupStream(per_step=2, due_age=1)
    for step, version in ((1, 0), (2, 1)):
        stream.started(f"s{step - 1}", StreamedChunk(step, 0, version, group_batch(step, 0).slice(0, 1).reorder([0, 0]),
                                                     offsets=[0]))
    assert stream.pending == 4 and stream.chunks_ahead() == 2
    stream.arrived("s1", 1, group_batch(2, 1))
    stream.arrived("s0", 1, group_batch(1, 1))
    with pytest.raises(ValueError, match="arrived twice"):
        stream.arrived("s0", 1, group_batch(1, 1))
    assert stream.ready(policy_version=0)  # chunk s0 (version 0) is not due before version 1
    assert not stream.ready(policy_version=1) and len(stream.pool) == 2  # now its prompt 0 is due: wait for it
    stream.arrived("s0", 0, group_batch(1, 0))
    assert stream.ready(policy_version=1)
    assert [g.order for g in stream.take()] == [(1, 0), (1, 1)]  # oldest first
    assert stream.chunks_ahead() == 1 and stream.epoch == 0
    stream.arrived("s1", 0, group_batch(2, 0))
    saved = stream.saved_chunks()
    assert [(c.step, c.version, len(c.result()[0])) for c in saved] == [(2, 1, 4)]
    again = GroupStream(per_step=2, due_age=1)
    again.load(saved + [RolloutAhead(step=3, epoch=1, version=1, finish=None,
                                     _result=(Batch.concat([group_batch(3, 0), group_batch(3, 1)]), 0.0))], n=2)
    assert sorted(g.order for g in again.pool) == [(2, 0), (2, 1), (3, 0), (3, 1)]
    assert [g.order for g in again.take()] == [(2, 0), (2, 1)] and again.epoch == 1
