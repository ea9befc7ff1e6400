"""The iterative-RL protocol with stand-in groups: every N steps the reward model trains on the
iteration's samples plus a replay share of older ones (the configured fraction, without the held-out
rows), accuracy is measured before and after on the held-out rows, the buffer is capped, the reference
is reset; its state survives a save and load exactly."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_dist.batch import Batch
from grpo_dist.trainer.iterative import IterativeRL, IterativeSettings
from grpo_dist.trainer.metrics import Timer
from grpo_dist.workers.common import Timed

P, R = 3, 4


class FakeRewardModel:
    """A reward-model group of ``world`` ranks. It scores -1 everywhere until it has been updated; then
    +1 on the rows whose first response token is 1 (the correct ones), -1 elsewhere. It records the
    rows every update got."""

    def __init__(self, world: int = 2):
        self.world, self.trained, self.updates, self.scored = world, False, [], []

    def __len__(self):
        return self.world

    def call(self, method, *args, per_rank=None):
        assert per_rank is not None and len(per_rank) == self.world
        if method == "compute_rm_score":
            out = []
            for data, raw in per_rank:
                assert raw is None
                self.scored.append(data["input_ids"].shape[0])
                n = data["input_ids"].shape[0]
                good = (data["responses"][:, 0] == 1).float() * 2 - 1 if self.trained else -torch.ones(n)
                token = good.unsqueeze(1).expand(n, R) * (data["attention_mask"][:, -R:] != 0)
                out.append(Timed({"last_B": good, "token_scores_BR": token}, 0.0))
            return out
        assert method == "update_reward_model"
        self.updates.append([d for (d,) in per_rank])
        self.trained = True
        return [Timed({"reward_model/train_loss": 0.5, "perf/max_memory_gb/reward_model": 1.0}, 0.0)] * self.world


def step_batch(step: int, rows: int = 10) -> Batch:
    """A step's scored rows: row ids in the prompt (step * 100 + row), correct when even."""
    ids = torch.zeros(rows, P + R, dtype=torch.long)
    ids[:, 0] = torch.arange(rows) + step * 100
    correct = torch.arange(rows) % 2 == 0
    ids[:, P] = torch.where(correct, 1, 2)
    mask = torch.ones(rows, P + R, dtype=torch.long)
    targets = torch.full((rows, R), math.nan)
    targets[:, -1] = correct.float()
    return Batch.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1),
                            "responses": ids[:, P:].clone(), "response_mask": torch.ones(rows, R), "rm_targets": targets})


def make(rm, resets, **kw):
    settings = IterativeSettings(**{**dict(steps_per_iteration=2, replay_fraction=0.25, heldout_fraction=0.1,
                                           buffer_size=30, mini_batch_size=8, world_size=rm.world, seed=3), **kw})
    return IterativeRL(rm, settings, lambda: resets.append(1) or {"update_weights/gather": 0.1})


def run_steps(proto, first: int, last: int) -> dict[int, dict]:
    out = {}
    for step in range(first, last + 1):
        out[step] = proto.after_step(step_batch(step), step, Timer())
    return out


def update_rows(call) -> torch.Tensor:
    """Row ids of an update call's labelled rows (all ranks)."""
    rows = torch.cat([d["input_ids"] for d in call])
    labelled = torch.isfinite(torch.cat([d["rm_targets"] for d in call])).any(dim=1)
    return rows[labelled, 0]


def test_every_n_steps_the_reward_model_trains_with_the_replay_share():
    rm, resets = FakeRewardModel(), []
    proto = make(rm, resets)
    m = run_steps(proto, 1, 6)
    assert [s for s in m if "reward_model/accuracy" in m[s]] == [2, 4, 6]
    assert len(rm.updates) == 3 and len(resets) == 3
    # iteration 1: 20 fresh rows, 2 held out, 18 trained, an empty buffer: no replay
    first = update_rows(rm.updates[0])
    assert len(first) == 18 and all(100 <= i < 300 for i in first.tolist())
    assert m[2]["reward_model/replay_samples"] == 0 and m[2]["reward_model/replay_size"] == 20
    # iteration 2: 18 fresh rows and round(0.25 * 18 / 0.75) = 6 from the buffer (steps 1-2): 6 / 24 = 25 %
    second = update_rows(rm.updates[1]).tolist()
    old = [i for i in second if i < 300]
    assert len(second) == 24 and len(old) == 6 and m[4]["reward_model/replay_samples"] == 6
    assert len(set(second)) == 24  # drawn without replacement
    # the held-out rows are never trained on in their own iteration
    held = set(range(300, 500)) - set(second) - {i for i in range(300, 500) if i % 100 >= 10}
    assert len(held) == 2 and m[4]["reward_model/heldout_samples"] == 2
    # iteration 3: the buffer is capped at 30 (the newest rows: steps 3-4 and 10 of steps 1-2's)
    assert m[6]["reward_model/replay_size"] == 30 and m[4]["reward_model/replay_size"] == 30
    third_old = [i for i in update_rows(rm.updates[2]).tolist() if i < 500]
    assert len(third_old) == 6 and all(i >= 200 for i in third_old)  # step 1's rows, the oldest 10 of 40, are gone
    # every update call gives each rank the same number of rows, whole mini-batches of 8 over 2 ranks
    for call in rm.updates:
        sizes = {d["input_ids"].shape[0] for d in call}
        assert len(sizes) == 1 and (2 * sizes.pop()) % 8 == 0


def test_accuracy_before_and_after_and_the_reset_step():
    rm, resets = FakeRewardModel(), []
    m = run_steps(make(rm, resets), 1, 4)
    # the untrained stand-in says "incorrect" everywhere: it agrees on the odd (incorrect) held-out rows only
    before, after = m[2]["reward_model/accuracy_before"], m[2]["reward_model/accuracy"]
    assert after == 1.0 and 0.0 <= before < 1.0
    assert m[4]["reward_model/accuracy_before"] == 1.0
    assert [m[s]["actor/ref_reset"] for s in (1, 2, 3, 4)] == [0.0, 2.0, 2.0, 4.0]
    assert "timing_s/ref_reset/gather" in m[2]


def test_no_reset_without_a_reference():
    rm = FakeRewardModel(world=1)
    proto = IterativeRL(rm, IterativeSettings(steps_per_iteration=1, world_size=1), None)
    m = proto.after_step(step_batch(1), 1, Timer())
    assert "actor/ref_reset" not in m and "reward_model/accuracy" in m


@pytest.mark.parametrize("stop", [1, 2, 3])
def test_save_and_load_continue_exactly(tmp_path, stop):
    """Stopped after step ``stop`` (mid-iteration, at its end, or after), saved, loaded into a new
    object: the next steps give the same metrics and the same update calls as the run that went on."""
    rm_a, rm_b, resets = FakeRewardModel(), FakeRewardModel(), []
    a = make(rm_a, resets)
    full = run_steps(a, 1, 6)
    b = make(FakeRewardModel(), resets)
    run_steps(b, 1, stop)
    b.save(tmp_path)
    c = make(rm_b, resets)
    rm_b.trained = stop >= 2  # the reward model's own state comes back from its role's checkpoint
    c.load(tmp_path)
    resumed = run_steps(c, stop + 1, 6)
    for step in range(stop + 1, 7):
        assert resumed[step] == full[step], step
    done = len(rm_a.updates) - len(rm_b.updates)
    for call_a, call_b in zip(rm_a.updates[done:], rm_b.updates):
        for da, db in zip(call_a, call_b):
            torch.testing.assert_close(da["input_ids"], db["input_ids"])
            torch.testing.assert_close(da["rm_targets"], db["rm_targets"], equal_nan=True)
    assert (tmp_path / "iterative_rl" / "state.json").exists()
    assert not list(tmp_path.rglob("*.pt")) and not list(tmp_path.rglob("*.pkl"))


# ------------------------------------------------------------------------------------------- the buffer
def test_replay_buffer_keeps_the_newest_and_draws_without_replacement():
    from grpo_dist.rewards.replay import ReplayBuffer

    buf = ReplayBuffer(5)
    buf.add({"x": torch.arange(3).unsqueeze(1)})
    buf.add({"x": torch.arange(3, 7).unsqueeze(1)})
    assert len(buf) == 5 and buf.rows["x"][:, 0].tolist() == [2, 3, 4, 5, 6]
    draw = buf.sample(4, torch.Generator().manual_seed(0))["x"][:, 0].tolist()
    assert len(set(draw)) == 4 and set(draw) <= {2, 3, 4, 5, 6}
    with pytest.raises(ValueError, match="cannot draw 6"):
        buf.sample(6, torch.Generator())
    with pytest.raises(ValueError, match="different widths"):
        buf.add({"x": torch.zeros(1, 2, dtype=torch.long)})
    other = ReplayBuffer(5)
    other.load_state_tensors(buf.state_tensors())
    assert torch.equal(other.rows["x"], buf.rows["x"])
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(2).load_state_tensors(buf.state_tensors())
