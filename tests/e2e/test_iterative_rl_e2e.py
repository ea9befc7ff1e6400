"""Iterative RL end to end on CPU (real Ray, vLLM, FSDP2), on the embedded task: the policy is rewarded
only by a learned reward model (a starting one, trained briefly on the base policy's samples), which
is retrained every 2 steps on the policy's new samples with replay, and the reference is reset to the
policy after each retraining.

Two runs share the assertions: 8 steps at once (checkpoints at steps 5 and 8), and a second run that
resumes from step 5 (in the middle of an iteration: its samples so far are in the checkpoint) and
goes through two reward-model updates (steps 6 and 8, the second drawing replay from a buffer that was
restored and then grown after the resume) to step 8. The second run puts the reward model on a pool
of its own (``reward_model.enable_resource_pool``, 2 ranks: its own processes and process group);
the first has it in the training ranks' processes, so the comparison of the two also checks that
where the reward model runs changes none of its scores and updates.
"""

from __future__ import annotations

import math
import time

import pytest
import torch
from safetensors.torch import load_file

from tests.e2e.helpers import read_metrics, run_main

pytestmark = pytest.mark.slow
VAL = "val-core/grpo_dist/reverse/acc/mean@1"
STEPS, EVERY = 8, 2
RESUME_AT = 5  # mid-iteration: the checkpoint holds the step's pending samples
RESETS = (2, 4, 6, 8)
OWN_POOL = ["reward_model.enable_resource_pool=true", "reward_model.nnodes=1", "reward_model.n_gpus_per_node=2"]


@pytest.fixture(scope="session")
def starting_reward_model(embedded_model):
    """The embedded task's base policy and its starting reward model (built once per machine, cached)."""
    from grpo_dist.tasks import reverse

    return embedded_model, reverse.ensure_reward_model(embedded_model.parent)


def iterative_args(policy, rm, data, out) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={policy}",
        f"data.train_files={data['train']}",
        f"data.val_files={data['test']}",
        "data.train_batch_size=32",
        "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        # a smaller step than the default job's: a policy chasing an imperfect reward model drifts fast
        "actor_rollout_ref.actor.optim.lr=2e-4",
        # the KL to the reference in the reward (measured before the update): exactly what a reset zeroes
        "actor_rollout_ref.actor.use_kl_loss=false",
        "algorithm.use_kl_in_reward=true",
        "algorithm.kl_ctrl.kl_coef=0.01",
        "reward_model.enable=true",
        f"reward_model.model.path={rm}",
        "reward_model.iterative.enable=true",
        f"reward_model.iterative.steps_per_iteration={EVERY}",
        "reward_model.iterative.lr=1e-4",
        "reward_model.iterative.epochs=4",
        "reward_model.iterative.heldout_fraction=0.25",
        "trainer.n_gpus_per_node=2",
        "trainer.device=cpu",
        f"trainer.total_training_steps={STEPS}",
        f"trainer.save_freq={RESUME_AT}",
        f"trainer.test_freq={STEPS}",
        "trainer.logger=[console,file]",
        "trainer.progress_bar=false",
        f"trainer.default_local_dir={out}",
    ]


@pytest.fixture(scope="module")
def runs(starting_reward_model, reverse_data, tmp_path_factory):
    policy, rm = starting_reward_model
    base = tmp_path_factory.mktemp("iterative_rl")
    full, part = base / "full", base / "resumed"
    t0 = time.perf_counter()
    p_full = run_main(iterative_args(policy, rm, reverse_data, full))
    t1 = time.perf_counter()
    assert p_full.returncode == 0, p_full.stdout[-2000:] + p_full.stderr[-4000:]
    p_part = run_main(iterative_args(policy, rm, reverse_data, part) + OWN_POOL
                      + ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={full / f'global_step_{RESUME_AT}'}"])
    t2 = time.perf_counter()
    assert p_part.returncode == 0, p_part.stdout[-2000:] + p_part.stderr[-4000:]
    print(f"iterative RL e2e: full run {t1 - t0:.0f} s, resumed run {t2 - t1:.0f} s")
    return {"full": full, "part": part, "full_proc": p_full, "part_proc": p_part,
            "m": read_metrics(full), "resumed": read_metrics(part)}


def test_the_policy_learns_from_the_reward_model_alone(runs):
    """Validation scores with the rule verifier; the policy was rewarded by the reward model only."""
    m = runs["m"]
    before, after = m[0][VAL], m[STEPS][VAL]
    assert after > before + 0.05, (before, after)
    for step in range(1, STEPS + 1):
        r = m[step]
        # the reward is the reward model's score (on the last token), not the verifier's
        assert r["critic/score/mean"] == pytest.approx(r["reward_model/score/mean"], abs=1e-5)
        assert r["critic/score/mean"] != pytest.approx(r["reward_model/rule_score/mean"], abs=1e-3)
        assert 0.0 <= r["reward_model/rule_score/mean"] <= 1.0


def test_each_update_keeps_or_raises_the_reward_models_accuracy(runs):
    m = runs["m"]
    updates = [s for s in m if "reward_model/accuracy" in m[s]]
    assert updates == list(RESETS)
    for s in updates:
        r = m[s]
        assert r["reward_model/accuracy"] >= r["reward_model/accuracy_before"], (s, r["reward_model/accuracy_before"],
                                                                                 r["reward_model/accuracy"])
        assert r["reward_model/heldout_samples"] > 0 and math.isfinite(r["reward_model/train_loss"])
    # the replay share: none in the first iteration, then 10 % of the mix
    first, later = m[RESETS[0]], m[RESETS[1]]
    assert first["reward_model/replay_samples"] == 0
    fresh, replayed = later["reward_model/fresh_samples"], later["reward_model/replay_samples"]
    assert replayed == round(0.1 * fresh / 0.9) and later["reward_model/replay_size"] == 2 * 32 * 8 * EVERY


def test_the_kl_to_the_reference_is_zero_right_after_a_reset(runs):
    m = runs["m"]
    kl = {s: m[s]["actor/reward_kl_penalty"] for s in range(1, STEPS + 1)}
    assert [m[s]["actor/ref_reset"] for s in range(1, STEPS + 1)] == [0, 2, 2, 4, 4, 6, 6, 8]
    for s in (1, 3, 5, 7):  # the first step after a reset (step 1: the initial reference is the policy)
        assert abs(kl[s]) < 1e-6, (s, kl)
    for s in (2, 4, 6, 8):  # one update later the policy has moved away from it
        assert kl[s] > 1e-4, (s, kl)


def test_resume_across_reward_model_updates_is_exact(runs):
    a, b = runs["m"], runs["resumed"]
    assert "resumed from" in runs["part_proc"].stdout and f"global_step_{RESUME_AT}" in runs["part_proc"].stdout
    assert sorted(b) == list(range(RESUME_AT + 1, STEPS + 1))
    assert [s for s in b if "reward_model/accuracy" in b[s]] == [6, 8]  # two updates after the resume
    keys = ["critic/score/mean", "reward_model/score/mean", "actor/pg_loss", "actor/reward_kl_penalty",
            "response_length/mean", "critic/advantages/mean", "actor/ref_reset"]
    for step in range(RESUME_AT + 1, STEPS + 1):
        for k in keys + [k for k in a[step] if k.startswith("reward_model/")]:
            assert math.isclose(a[step][k], b[step][k], rel_tol=1e-4, abs_tol=1e-6), (step, k, a[step][k], b[step][k])
    assert a[STEPS][VAL] == b[STEPS][VAL]
    wa = load_file(str(runs["full"] / f"global_step_{STEPS}" / "huggingface" / "model.safetensors"))
    wb = load_file(str(runs["part"] / f"global_step_{STEPS}" / "huggingface" / "model.safetensors"))
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-5, atol=1e-6)


def test_a_reward_model_on_its_own_pool_scores_and_trains_as_the_colocated_one(runs):
    """The resumed run's reward model ran in processes of its own (2 ranks, the training ranks' model
    processes without it) and loaded the checkpoint the colocated one wrote; from the same inputs its
    scores, its verifier agreement before and after each update and its losses are the colocated run's."""
    from grpo_dist.utils import startup

    full, part = startup.read(runs["full"])[0], startup.read(runs["part"])[0]
    assert sorted(p for p in full["processes"] if p.startswith("models")) == ["models rank 0", "models rank 1"]
    assert sorted(p for p in part["processes"] if p.startswith("models")) == [
        "models (reward_model pool) rank 0", "models (reward_model pool) rank 1", "models rank 0", "models rank 1"]
    a, b = runs["m"], runs["resumed"]
    first = RESUME_AT + 1  # the same weights restored, so the same responses: the same scores, to the bit
    assert {k: b[first][k] for k in a[first] if k.startswith("reward_model/")} == {
        k: v for k, v in a[first].items() if k.startswith("reward_model/")}
    for step in range(first + 1, STEPS + 1):  # (every reward_model/ metric: the resume test just above)
        assert math.isclose(a[step]["reward_model/score/mean"], b[step]["reward_model/score/mean"], rel_tol=1e-4)
    assert [s for s in b if "reward_model/train_loss" in b[s]] == [6, 8]  # it was trained on its own pool


def test_the_checkpoint_holds_the_reward_model_the_replay_buffer_and_the_reset_reference(runs):
    ckpt = runs["full"] / f"global_step_{RESUME_AT}"
    for part in ("reward_model", "reference", "iterative_rl/replay.safetensors", "iterative_rl/pending.safetensors",
                 "iterative_rl/state.json"):
        assert (ckpt / part).exists(), part
    assert not list(ckpt.rglob("*.pkl"))
