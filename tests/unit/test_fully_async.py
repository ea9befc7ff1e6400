"""Fully asynchronous training (``async_training.*``) in the driver, with the stand-in worker groups of the
one-step-off tests: staleness 0 and trigger 1 is the synchronous loop; the freshness rule bounds the chunks
ahead and the sample age whatever the speeds; weights go to the engines every ``trigger`` steps; a checkpoint's
chunks are each trained exactly once after a resume; and the configuration around the mode."""

from __future__ import annotations

import math
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from grpo_dist.batch import Batch
from grpo_dist.config import facts
from grpo_dist.config.driver_plan import total_steps
from grpo_dist.config.fully_async import fully_async_note, fully_async_on, fully_async_settings
from grpo_dist.config.spec import resolve
from grpo_dist.trainer import checkpoint
from grpo_dist.trainer.driver import GRPOTrainer
from grpo_dist.trainer.fully_async import QUEUE_FILE, Admission, load_chunks, save_chunks
from grpo_dist.trainer.one_step_off import RolloutAhead
from tests.configs import refused
from tests.unit.test_driver_step import ActorGroup, Rewards, config, scored_rollout
from tests.unit.test_one_step_off import OFF, Prompts, SyncRecorder


def run_steps(trainer: GRPOTrainer, n: int) -> list[dict]:
    """``n`` steps as the loop runs them in this mode (the schedule draws the prompts)."""
    out = []
    for _ in range(n):
        out.append(trainer.train_step(None))
        trainer.global_step += 1
    return out


def fully_async(staleness: float, trigger: int, partial: bool | None = False) -> tuple[str, ...]:
    """The mode's keys; without partial rollouts (verl's default is on) unless asked: a sync then waits for the chunks
    being generated, and the schedule is the same whatever the timing. ``partial=None``: the key not given."""
    keys = (*OFF, f"async_training.staleness_threshold={staleness}", f"async_training.trigger_parameter_sync_step={trigger}")
    return keys if partial is None else (*keys, f"async_training.partial_rollout={str(partial).lower()}")


# ---- verl's v1 spelling: trainer.v1.trainer_mode=separate_async -----------------------------------------------
V1 = ("trainer.v1.trainer_mode=separate_async", "trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.nnodes=1",
      "actor_rollout_ref.rollout.n_gpus_per_node=1", "trainer.v1.separate_async.parameter_sync_step=1",
      "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2")


def v1(warmup: int, *more: str) -> tuple[str, ...]:
    return (*V1, f"trainer.v1.separate_async.num_warmup_batches={warmup}", *more)


class Engines:
    """The rollout engines as the driver sees them: chunks started (step, the engines' version, the prompts), waited
    for, weight syncs (the version sent); ``gen_s`` / the trainer's ``train_s`` slow either side down. At every start
    it records how many chunks are then ahead of the trainer."""

    def __init__(self, trainer: GRPOTrainer, batch_of, gen_s: float = 0.0) -> None:
        self.events: list[tuple] = []
        self.ahead_at_start: list[int] = []
        self.trainer, self.batch_of, self.gen_s = trainer, batch_of, gen_s

    def start(self, items, step, epoch):
        t = self.trainer
        self.events.append(("start", step, t.engines.version))
        self.ahead_at_start.append(len(t.engines.queue) + 1)  # this one, and those started and not yet taken by a step
        self.prompts = getattr(self, "prompts", []) + [[row["index"] for row in items]]

        def finish():
            time.sleep(self.gen_s)
            self.events.append(("wait", step))
            return self.batch_of(step), 0.5
        return RolloutAhead(step=step, epoch=epoch, version=t.engines.version, finish=finish)

    def sync(self):
        self.events.append(("sync", self.trainer.policy_version))
        return {"update_weights/load": 0.01}

    def call(self, method, *args, **kwargs):
        """Partial rollouts' calls on the rollout ranks (one rank): a pause interrupts 3 responses."""
        self.events.append((method, *args))
        return [3] if method == "pause_generation" else [None]


class SlowActor(ActorGroup):
    def __init__(self, train_s: float) -> None:
        super().__init__()
        self.train_s = train_s

    def call(self, method, *args, **kwargs):
        time.sleep(self.train_s)
        return super().call(method, *args, **kwargs)


def make(tmp_path, *overrides, steps: int = 6, gen_s: float = 0.0, train_s: float = 0.0):
    cfg = config(*overrides, f"trainer.total_training_steps={steps}")
    trainer = GRPOTrainer(resolve(cfg), model_path="unused", tokenizer=None, tokenizer_path="unused",
                          train_data=Prompts(), val_data=None, device="cpu", out_dir=str(tmp_path))
    trainer.actor, trainer.ref, trainer.critic, trainer.rewards = SlowActor(train_s), None, None, Rewards()
    fake = scored_rollout(cfg)

    def batch_of(step):  # the stand-in's batch, its prompts named after the chunk's step
        batch = fake([{}, {}], 0, None)[0]
        batch.non_tensors["uid"] = [f"s{step}p{i // 2}" for i in range(4)]
        return batch
    engines = Engines(trainer, batch_of, gen_s)
    trainer.engines.start, trainer.engines.sync = engines.start, SyncRecorder(engines)
    trainer.rollout = trainer.engines.rollout = engines
    return trainer, engines


def trained_chunks(trainer: GRPOTrainer) -> list[int]:
    """Record, for each step, which chunk's batch the reward stage scored (its step, from the uids)."""
    seen: list[int] = []
    score = trainer.rewards.score

    def recording(batch, timer=None):
        seen.append(int(batch.non_tensors["uid"][0][1:].split("p")[0]))
        return score(batch, timer)
    trainer.rewards.score = recording
    return seen


def test_staleness_0_and_trigger_1_is_the_synchronous_loop(tmp_path):
    trainer, eng = make(tmp_path, *fully_async(0, 1), steps=3)
    metrics = run_steps(trainer, 3)
    # generate, train, sync, generate, ...: each chunk sampled by the policy that trains on it
    assert eng.events == [("start", 1, 0), ("wait", 1), ("sync", 1), ("start", 2, 1), ("wait", 2), ("sync", 2),
                          ("start", 3, 2), ("wait", 3)]
    assert [m["training/sample_age"] for m in metrics] == [0.0, 0.0, 0.0]
    assert trainer.policy_version == 3 and not trainer.engines.queue
    # the prompts of each step are the ones the synchronous loop draws for it
    sync_trainer, _ = make(tmp_path / "sync", steps=3)
    assert eng.prompts == [[row["index"] for row in sync_trainer.next_items()] for _ in range(3)]
    # the engines' sampling log-probs are the old log-probs (verl's use_rollout_log_probs): no recompute
    assert trainer.actor.calls == ["update_policy"] * 3
    torch.testing.assert_close(trainer.actor.update_rows["old_log_probs"][0],
                               trainer.actor.update_rows["response_mask"][0] * math.log(0.5))


@pytest.mark.parametrize("staleness,trigger", [(0.0, 1), (1.0, 1), (0.5, 2), (0.1, 4), (2.0, 2), (0.0, 3)])
@pytest.mark.parametrize("slow", ["rollout", "trainer"])
def test_the_chunks_ahead_and_the_sample_age_never_pass_the_bound(tmp_path, staleness, trigger, slow):
    bound = math.floor((1 + staleness) * trigger)
    speeds = {"gen_s": 0.01} if slow == "rollout" else {"train_s": 0.005}
    trainer, eng = make(tmp_path, *fully_async(staleness, trigger), steps=10, **speeds)
    metrics = run_steps(trainer, 10)
    assert max(eng.ahead_at_start) <= bound
    ages = [m["training/sample_age"] for m in metrics]
    assert max(ages) == bound - 1  # reached: the engines run as far ahead as the rule lets them
    assert all(m["fully_async/queue_size"] < bound for m in metrics)
    # every chunk trained once, in order, by the step of the same number
    assert [e[1] for e in eng.events if e[0] == "start"] == list(range(1, 11))


@pytest.mark.parametrize("trigger", [1, 2, 3])
def test_weights_go_to_the_engines_every_trigger_steps(tmp_path, trigger):
    trainer, eng = make(tmp_path, *fully_async(0.5, trigger), steps=7)
    run_steps(trainer, 7)
    # after steps trigger, 2 x trigger, ... (never after the last step); the version sent is the steps done
    assert [e[1] for e in eng.events if e[0] == "sync"] == [k for k in range(trigger, 7, trigger)]
    # every sync comes after the engines finished all they had started
    for i, e in enumerate(eng.events):
        if e[0] == "sync":
            started = {x[1] for x in eng.events[:i] if x[0] == "start"}
            waited = {x[1] for x in eng.events[:i] if x[0] == "wait"}
            assert started == waited, (e, started, waited)


def test_a_resume_trains_the_saved_chunks_first_each_exactly_once(tmp_path):
    overrides = fully_async(1.0, 2)  # bound 4: up to 4 chunks ahead
    whole, _ = make(tmp_path / "whole", *overrides, steps=8)
    whole_order = trained_chunks(whole)
    ages = [m["training/sample_age"] for m in run_steps(whole, 8)]

    first, eng1 = make(tmp_path / "a", *overrides, steps=8)
    order = trained_chunks(first)
    ages1 = [m["training/sample_age"] for m in run_steps(first, 3)]
    assert len(first.engines.queue) >= 2  # chunks 4.. generated ahead, not yet trained
    first.workers = SimpleNamespace(save=lambda tmp, export_hf: None, load=lambda path: None)
    saved = first.save()
    point = checkpoint.ResumePoint(path=Path(saved), state=checkpoint.read_state(saved))

    second, eng2 = make(tmp_path / "b", *overrides, steps=8)
    order2 = trained_chunks(second)
    second.workers = first.workers
    second.resume(point)
    assert [c.step for c in second.engines.queue] == [c.step for c in first.engines.queue]
    assert all(c.done for c in second.engines.queue)
    ages2 = [m["training/sample_age"] for m in run_steps(second, 5)]
    # nothing regenerated: the resumed run starts only chunks the first never started
    started1 = [e[1] for e in eng1.events if e[0] == "start"]
    started2 = [e[1] for e in eng2.events if e[0] == "start"]
    assert sorted(started1 + started2) == list(range(1, 9))
    # each chunk trained once, in order, at the uninterrupted run's ages
    assert order + order2 == whole_order == list(range(1, 9))
    assert ages1 + ages2 == ages


def test_chunks_round_trip_through_a_checkpoint_and_an_old_single_batch_is_read(tmp_path):
    batch = Batch.from_dict({"x": torch.arange(4.0).view(4, 1)}, {"uid": ["a", "a", "b", "b"]}, {})
    chunks = [RolloutAhead(step=s, epoch=0, version=v, finish=lambda: (batch, 1.0)) for s, v in ((4, 2), (5, 2))]
    save_chunks(chunks, tmp_path)
    loaded = load_chunks(tmp_path)
    assert [(c.step, c.version, c.done) for c in loaded] == [(4, 2, True), (5, 2, True)]
    assert torch.equal(loaded[1].result()[0]["x"], batch["x"]) and (tmp_path / QUEUE_FILE).is_file()
    old = tmp_path / "old"
    old.mkdir()
    chunks[0].save(old)  # a one-step-off checkpoint's single batch
    assert [(c.step, c.version) for c in load_chunks(old)] == [(4, 2)]
    assert load_chunks(tmp_path / "none") == []


def test_the_admission_rule():
    a = Admission(bound=4)
    a.synced(carried=1)
    starts = 0
    while a.may_start():
        a.started()
        starts += 1
    assert starts == 3
    a.synced(carried=5)  # never negative
    assert not a.may_start()


def test_the_mode_its_sizes_and_its_steps():
    cfg = config(*fully_async(0.1, 4), "async_training.require_batches=3", "data.train_batch_size=0",
                 "rollout.total_rollout_steps=60", "rollout.test_freq=2")
    assert fully_async_on(cfg) and not fully_async_on(config(*OFF))
    # a step trains one chunk of require_batches x ppo_mini_batch_size prompts; train_batch_size is not used
    assert cfg.data.train_batch_size == 6 and facts.step_shape(cfg).num_mini_batches == 3
    assert total_steps(cfg, 0) == 10
    plan = resolve(cfg).driver_plan("cpu", 16)
    fa = plan.fully_async
    assert (fa.trigger, fa.chunk_prompts, fa.max_ahead) == (4, 6, 4) and not plan.one_step_off
    assert plan.test_freq == 8 and plan.total_steps == 10  # every 2 syncs of 4 steps
    assert plan.old_from_rollout and plan.rollout_log_probs and not plan.old_logp_forward
    # compute_prox_log_prob: the actor recomputes the old log-probs
    prox = resolve(config(*fully_async(0.1, 4), "async_training.compute_prox_log_prob=true")).driver_plan("cpu", 16)
    assert not prox.old_from_rollout and prox.old_logp_forward
    # one key of verl's config is enough, even at its default; no-op keys too
    assert fully_async_on(config(*OFF, "async_training.partial_rollout=true"))
    assert fully_async_on(config(*OFF, "async_training.checkpoint_engine.enable=true"))


def test_the_start_up_plan_says_what_the_mode_does():
    from grpo_dist.config.plan import build_plan

    lines = "\n".join(build_plan(config(*fully_async(0.5, 2, partial=None)), count_rows=False).lines())
    assert "fully asynchronous" in lines and "up to 3 chunk(s) ahead" in lines
    assert "partial rollouts: a sync interrupts the responses being generated" in lines  # verl's default: on


@pytest.mark.parametrize("overrides,on,said", [
    ((), True, "partial rollouts: a sync interrupts the responses being generated and the new weights finish them"),
    (("async_training.partial_rollout=false",), False, "; a sync waits for the chunks being generated"),
    (("actor_rollout_ref.rollout.mode=async",), True, "partial rollouts: a sync interrupts"),  # agent loops too
    (("actor_rollout_ref.rollout.name=hf",), False, "partial_rollout has no effect with rollout.name=hf"),
    (("actor_rollout_ref.rollout.tensor_model_parallel_size=2", "rollout.n_gpus_per_node=2"), True,
     "partial rollouts: a sync interrupts"),  # the engine's processes agree on every iteration
    (("actor_rollout_ref.rollout.tensor_model_parallel_size=2", "rollout.n_gpus_per_node=2",
      "actor_rollout_ref.rollout.mode=async"), True, "partial rollouts: a sync interrupts"),  # loops in lock step too
])
def test_partial_rollouts_are_on_where_the_engine_can_interrupt_requests(overrides, on, said):
    fa = fully_async_settings(config(*fully_async(0.5, 2, partial=None), *overrides))
    assert fa.partial_rollout is on
    assert said in fully_async_note(fa)


@pytest.mark.parametrize("overrides,needles", [
    (("async_training.staleness_threshold=0.5",), ["actor_rollout_ref.hybrid_engine", "async_training"]),
    ((*OFF, "async_training.staleness_threshold=-1"), ["async_training.staleness_threshold", ">= 0"]),
    ((*OFF, "async_training.trigger_parameter_sync_step=0"), ["async_training.trigger_parameter_sync_step"]),
    ((*OFF, "async_training.require_batches=0"), ["async_training.require_batches"]),
    ((*OFF, "async_training.compute_advantage_in_rollout=true"), ["async_training.compute_advantage_in_rollout",
                                                                  "driver"]),
    ((*OFF, "async_training.require_batches=2", "rollout.total_rollout_steps=3"),
     ["rollout.total_rollout_steps", "= 32 prompts"]),
    ((*OFF, "rollout.total_rollout_steps=64"), ["rollout.total_rollout_steps", "async_training"]),
    (("rollout.test_freq=2",), ["rollout.test_freq", "async_training"]),
    ((*OFF, "async_training.require_batches=1", "filter.filter_function_name=filter_dapo"),
     ["filter.filter_function_name", "dummy filter"]),
    ((*OFF, "async_training.trigger_parameter_sync_step=2", "algorithm.filter_groups.enable=true",
      "algorithm.filter_groups.metric=acc"), ["algorithm.filter_groups.enable"]),
    # verl's v1 spelling
    ((*V1, "data.train_batch_size=4"), ["data.train_batch_size", "parameter_sync_step", "1 x 2 = 2"]),
    (v1(9), ["num_warmup_batches", "max_off_policy_threshold=8"]),
    (v1(1, "async_training.staleness_threshold=1"), ["trainer.v1.trainer_mode", "async_training", "one of the two"]),
    (v1(1, "actor_rollout_ref.hybrid_engine=false"), ["actor_rollout_ref.hybrid_engine", "actor_rollout_ref.rollout.nnodes"]),
    (v1(1, "rollout.total_rollout_steps=8"), ["rollout.total_rollout_steps", "trainer.total_training_steps"]),
    (("actor_rollout_ref.rollout.nnodes=1",), ["actor_rollout_ref.rollout.nnodes", "separate_async"]),
    (v1(1, "actor_rollout_ref.rollout.nnodes=0"), ["actor_rollout_ref.rollout.nnodes"]),
    (v1(1, "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc"),
     ["algorithm.filter_groups.enable", "trainer.v1.trainer_mode=sync"]),
    (v1(1, "trainer.v1.trainer_mode=fast"), ["trainer.v1.trainer_mode", "'fast'", "separate_async"]),
    (v1(1, "trainer.v1.sampler.max_off_policy_strategy=keep"), ["max_off_policy_strategy", "drop or wait"]),
])
def test_what_the_mode_cannot_take_is_refused_with_one_message(overrides, needles):
    msg = refused(*overrides)
    assert "\n" not in msg
    for needle in needles:
        assert needle in msg, (needle, msg)


@pytest.mark.parametrize("warmup", [0, 1, 2])
def test_v1_separate_async_runs_the_fully_async_schedule_it_names(tmp_path, warmup):
    """verl's v1 separate_async (batch = parameter_sync_step mini-batches, a sync after every step, num_warmup_batches
    batches generated beyond the one trained, partial rollouts always on) is the fully_async_policy schedule with
    require_batches = parameter_sync_step, trigger 1 and staleness num_warmup_batches: the same plan, and the same
    starts, waits, pauses and syncs step by step."""
    from dataclasses import replace

    same = (*fully_async(warmup, 1, partial=True), "async_training.require_batches=1",
            "async_training.use_rollout_log_probs=false")  # v1: the actor recomputes them unless bypass_mode
    spelled_v1, spelled_async = config(*v1(warmup)), config(*same)
    plan_v1, plan_async = (resolve(c).driver_plan("cpu", 16) for c in (spelled_v1, spelled_async))
    assert plan_v1.fully_async.spelling == "trainer.v1.separate_async" and plan_v1.fully_async.age_limit == 8
    assert replace(plan_v1, fully_async=replace(plan_v1.fully_async, spelling="async_training", age_limit=None)) == plan_async
    assert plan_v1.fully_async.max_ahead == warmup + 1 and plan_v1.fully_async.partial_rollout
    trainers = [make(tmp_path / name, *keys, steps=5) for name, keys in
                (("v1", v1(warmup)), ("async", same))]
    metrics = [run_steps(t, 5) for t, _ in trainers]
    ages = [[m["training/sample_age"] for m in ms] for ms in metrics]
    assert trainers[0][1].events == trainers[1][1].events and ages[0] == ages[1]
    assert max(ages[0]) == warmup
    # verl's v1 off-policy metrics: every token of a chunk sampled by its version (these stand-ins are not partial)
    for m in metrics[0]:
        assert m["training/off_policy/trajectory_staleness/max"] == m["training/sample_age"]
        assert m["training/off_policy/trajectory_spans/max"] == 1.0


def test_v1_separate_async_places_the_rollout_on_its_standalone_devices():
    from grpo_dist.config.plan import build_plan
    from grpo_dist.config.roles import ROLLOUT_POOL, pool, rollout_pool_ranks
    from grpo_dist.config.validate import separate_rollout

    cfg = config(*v1(1), "actor_rollout_ref.rollout.n_gpus_per_node=2", "trainer.device=cuda")
    assert separate_rollout(cfg) and rollout_pool_ranks(cfg) == 2
    assert pool(cfg, ROLLOUT_POOL).keys == "actor_rollout_ref.rollout" and cfg.actor_rollout_ref.hybrid_engine
    lines = "\n".join(build_plan(cfg, count_rows=False).lines())
    assert "separate_async (verl's v1 trainer mode)" in lines and "actor_rollout_ref.rollout.nnodes 1" in lines
    assert "as with verl's v1 client" in lines  # partial rollouts: no key turns them off in v1
    # verl's legacy loop (use_v1=false) does not read trainer.v1.*
    assert not fully_async_on(config("trainer.use_v1=false", "trainer.v1.trainer_mode=separate_async"))
    # bypass mode: the engines' log-probs are the old ones, as in verl's v1 trainer
    assert fully_async_settings(config(*v1(1), "algorithm.rollout_correction.bypass_mode=true")).old_from_rollout


def test_v1_separate_async_refuses_a_chunk_older_than_its_threshold(tmp_path):
    """``max_off_policy_threshold`` is checked against every trained batch (a resumed queue written with other
    settings could hold older ones); nothing is dropped silently."""
    from dataclasses import replace

    trainer, _ = make(tmp_path, *v1(2), steps=5)
    trainer.plan = trainer.engines.plan = replace(trainer.plan, fully_async=replace(trainer.plan.fully_async, age_limit=1))
    with pytest.raises(RuntimeError, match=r"max_off_policy_threshold=1"):
        run_steps(trainer, 5)


@pytest.mark.parametrize("overrides,warned", [
    (OFF, True),  # one-step-off, the actor's old log-probs: samples one update old, nothing corrects
    ((*OFF, "algorithm.rollout_correction.bypass_mode=true"), False),  # the ratio against the sampling policy
    ((*OFF, "algorithm.rollout_correction.rollout_is=token"), False),  # importance weights correct it
    ((), False),  # colocated: on-policy
    (fully_async(0.5, 2), False),  # use_rollout_log_probs (verl's default)
    ((*fully_async(0.5, 2), "async_training.use_rollout_log_probs=false"), True),
    ((*fully_async(0, 1), "async_training.use_rollout_log_probs=false"), False),  # at most 0 updates old
    (v1(1), True),  # verl's v1 script: bypass_mode=False, no rollout_is
    (v1(0), False),
])
def test_stale_samples_with_an_uncorrected_ratio_are_warned_about_at_start_up(overrides, warned):
    from grpo_dist.config.driver_plan import stale_ratio_warning

    warning = resolve(config(*overrides)).driver_plan("cpu", 16).startup_warning
    assert (warning is not None and "bypass_mode=true" in warning) is warned
    assert (stale_ratio_warning(config(*overrides)) is not None) is warned
