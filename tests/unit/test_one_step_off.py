"""One-step-off-policy (``actor_rollout_ref.hybrid_engine=false``) in the driver, with stand-in worker groups: the
next batch starts before the current one trains, with the policy one update behind; the engines get the
policy only while idle; validation and checkpoints wait for the batch being generated and lose nothing; and
the configuration around it (the rollout's own pool, what the overlapped step cannot do)."""

from __future__ import annotations

from collections import deque

import pytest
import torch

from grpo_dist.config import facts
from grpo_dist.config.spec import resolve
from grpo_dist.trainer.driver import GRPOTrainer
from grpo_dist.trainer.one_step_off import AHEAD_FILE, RolloutAhead, load_ahead
from tests.configs import refused
from tests.unit.test_driver_step import ActorGroup, Rewards, TrainData, config, scored_rollout

OFF = ("actor_rollout_ref.hybrid_engine=false", "trainer.n_gpus_per_node=1", "rollout.n_gpus_per_node=1")


class Prompts(TrainData):
    """16 training rows, each its index."""

    def __getitem__(self, i: int) -> dict:
        return {"index": i}


class Recorder:
    """The driver's calls to the engines, in order: batches started (step, the engines' version), waited for,
    weight syncs (the policy version sent)."""

    def __init__(self, trainer: GRPOTrainer, batch_of) -> None:
        self.events: list[tuple] = []
        self.trainer, self.batch_of = trainer, batch_of

    def start(self, items, step, epoch):
        t = self.trainer
        self.events.append(("start", step, t.engines.version))

        def finish():
            self.events.append(("wait", step))
            return self.batch_of(step), 0.5
        return RolloutAhead(step=step, epoch=epoch, version=t.engines.version, finish=finish)

    def sync(self):
        self.events.append(("sync", self.trainer.policy_version))
        return {"update_weights/load": 0.01}


def make(tmp_path, *overrides, steps: int = 3):
    cfg = config(*OFF, f"trainer.total_training_steps={steps}", *overrides)
    trainer = GRPOTrainer(resolve(cfg), model_path="unused", tokenizer=None, tokenizer_path="unused",
                          train_data=Prompts(), val_data=None, device="cpu", out_dir=str(tmp_path))
    trainer.actor, trainer.ref, trainer.critic, trainer.rewards = ActorGroup(), None, None, Rewards()
    fake = scored_rollout(cfg)
    rec = Recorder(trainer, lambda step: fake([{}, {}], 0, None)[0])
    trainer.engines.start, trainer.engines.sync = rec.start, SyncRecorder(rec)
    return trainer, rec


def run_steps(trainer: GRPOTrainer, n: int) -> list[dict]:
    out = []
    for _ in range(n):
        items = trainer.next_items() if trainer.engines.ahead is None else None
        out.append(trainer.train_step(items))
        trainer.global_step += 1
    return out


class SyncRecorder:
    def __init__(self, rec: Recorder) -> None:
        self.rec, self.last_bytes, self.adapter_only = rec, 123, False

    def __call__(self):
        return self.rec.sync()


def test_the_next_batch_starts_before_the_update_with_the_policy_one_update_behind(tmp_path):
    trainer, rec = make(tmp_path)
    metrics = run_steps(trainer, 3)
    # step 1 generates its own batch first; from then on every batch was started during the previous step,
    # right after the engines finished the last one and were sent the current policy
    assert rec.events == [("start", 1, 0), ("wait", 1), ("start", 2, 0),  # step 1 trains -> policy 1
                          ("wait", 2), ("sync", 1), ("start", 3, 1),      # step 2 trains on samples of policy 0
                          ("wait", 3)]                                    # the last step starts nothing
    assert [m["training/sample_age"] for m in metrics] == [0.0, 1.0, 1.0]
    assert trainer.policy_version == 3 and trainer.engines.version == 1 and trainer.engines.ahead is None
    # the samples are not the current policy's: the old log-probs are computed (no on-policy shortcut)
    assert trainer.actor.calls == ["compute_log_prob", "update_policy"] * 3
    assert "old_log_probs" in trainer.actor.update_rows
    assert metrics[1]["perf/weight_sync_bytes"] == 123 and "perf/weight_sync_bytes" not in metrics[0]
    assert "timing_s/wait_prev_gen" in metrics[0] and "timing_s/gen" not in metrics[0]


def test_the_sampler_draws_prompts_in_the_synchronous_order(tmp_path):
    """The batches are drawn from the sampler in the order the colocated loop draws them (one ahead)."""
    trainer, rec = make(tmp_path)
    drawn = []
    original = trainer.next_items
    trainer.next_items = lambda: drawn.append(trainer.sampler.state_dict()) or original()
    run_steps(trainer, 3)
    sync_trainer, _ = make(tmp_path / "sync")
    expected = []
    for _ in range(3):
        expected.append(sync_trainer.sampler.state_dict())
        next(sync_trainer.sampler)
    assert drawn == expected


def test_validation_and_checkpoints_wait_for_the_batch_being_generated(tmp_path):
    trainer, rec = make(tmp_path, steps=4)
    run_steps(trainer, 2)
    assert trainer.engines.ahead is not None and not trainer.engines.ahead.done  # step 3's batch, being generated
    trainer.val_data = [{}]
    trainer.workers = type("W", (), {"calls_labelled": lambda self, label: __import__("contextlib").nullcontext()})()
    import grpo_dist.trainer.driver as driver

    seen = []
    real = driver.validation.validate
    driver.validation.validate = lambda *a, **k: seen.append(list(rec.events)) or {}
    try:
        trainer.validate()
    finally:
        driver.validation.validate = real
    # validation ran after the engines finished step 3's batch and got the current policy (2)
    assert seen[0][-2:] == [("wait", 3), ("sync", 2)]
    events = len(rec.events)
    run_steps(trainer, 1)  # step 3: the engines hold the current policy already: no second sync
    assert rec.events[events:] == [("start", 4, 2)]

    # a checkpoint saves the batch being generated; a resume trains on it next
    trainer.engines.ahead.save(tmp_path)
    loaded = load_ahead(tmp_path)
    assert (loaded.step, loaded.version, loaded.done) == (4, 2, True)
    a, b = trainer.engines.ahead.result()[0], loaded.result()[0]
    assert sorted(a.tensors.keys()) == sorted(b.tensors.keys()) and len(a) == len(b) == 4
    assert all(torch.equal(a[k], b[k]) for k in a.tensors.keys())
    assert list(a["uid"]) == list(b["uid"])
    assert load_ahead(tmp_path / "nothing") is None and (tmp_path / AHEAD_FILE).is_file()


def test_a_saved_batch_is_trained_on_after_a_resume(tmp_path):
    trainer, rec = make(tmp_path, steps=4)
    run_steps(trainer, 2)
    trainer.engines.ahead.save(tmp_path)
    resumed, rec2 = make(tmp_path / "resumed", steps=4)
    resumed.global_step, resumed.policy_version, resumed.engines.version = 2, 2, 2
    resumed.engines.queue = deque([load_ahead(tmp_path)])
    (m,) = run_steps(resumed, 1)
    # nothing regenerated for step 3: its saved batch (of policy 1) is trained on, then step 4's is started
    assert rec2.events == [("start", 4, 2)]
    assert m["training/sample_age"] == 1.0


def test_the_plan_and_the_facts_of_a_one_step_off_run():
    cfg = config(*OFF)
    plan = resolve(cfg).driver_plan("cpu", 16)
    assert plan.one_step_off and not plan.free_cache_engine and not plan.on_policy
    assert not facts.on_policy(cfg) and facts.on_policy(config())  # the same update colocated is on-policy
    from grpo_dist.config.roles import ROLLOUT_POOL, pool, rollout_pool_ranks

    assert rollout_pool_ranks(cfg) == 1 and rollout_pool_ranks(config()) == 0
    assert pool(cfg, ROLLOUT_POOL).world_size == 1


@pytest.mark.parametrize("overrides,needles", [
    (("algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc"),
     ["algorithm.filter_groups.enable", "dynamic sampling", "hybrid_engine=true"]),
    (("algorithm.adv_estimator=remax",), ["algorithm.adv_estimator", "greedy baseline", "hybrid_engine=true"]),
    (("rollout.n_gpus_per_node=0",), ["rollout.n_gpus_per_node", "> 0"]),
    (("rollout.n_gpus_per_node=3", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"),
     ["tensor_model_parallel_size", "rollout.n_gpus_per_node (3)"]),
])
def test_what_one_step_off_cannot_do_is_refused_with_one_message(overrides, needles):
    msg = refused(*OFF, *overrides)
    assert "\n" not in msg
    for needle in needles:
        assert needle in msg, (needle, msg)
