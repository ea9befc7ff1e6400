"""One driver step (GRPOTrainer.train_step) with stand-in worker groups: which forwards run and what
reaches the metrics and the actor for on-policy, off-policy, rollout-correction and bypass steps.

The stand-ins replace the generation-and-scoring stage and the actor and rollout groups only; the
step's recipe (old log-probs, mismatch metrics, rollout correction, advantages, the update's keys)
runs as it does in a real run.
"""

from __future__ import annotations

import math

import pytest
import torch

from grpo_dist.batch import Batch
from grpo_dist.config import facts, sampling
from grpo_dist.config.spec import resolve
from grpo_dist.trainer.driver import GRPOTrainer
from grpo_dist.workers.common import Timed

P, R = 2, 3
ROLLOUT_P, ACTOR_P = 0.5, 0.4  # the engine's and the trainer's probability of every sampled token


def config(*overrides: str):
    from grpo_dist.config.loader import compose, to_typed
    from grpo_dist.config.validate import validate_config

    base = ["data.train_batch_size=2", "actor_rollout_ref.rollout.n=2", "data.max_response_length=3",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.actor.use_kl_loss=false",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2"]
    cfg = to_typed(compose(base + list(overrides)), base + list(overrides))
    validate_config(cfg, check_paths=False)
    return cfg


class TrainData:
    """The training set as the trainer's constructor sees it: a size and a pad id."""

    pad_id = 0

    def __len__(self) -> int:
        return 16


class ActorGroup:
    """Answers compute_log_prob with log(ACTOR_P) on every position and records update_policy's rows."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.update_rows: dict[str, torch.Tensor] = {}

    def call(self, method, *args, per_rank):
        self.calls.append(method)
        if method == "compute_log_prob":
            return [Timed((torch.full((len(rows["responses"]), R), math.log(ACTOR_P)), None), 0.01)
                    for rows, *_ in per_rank]
        assert method == "update_policy", method
        (rows,) = per_rank[0]
        self.update_rows = rows
        return [Timed({"actor/pg_loss": 0.0}, 0.02)]


class RolloutGroup:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def call(self, method, *args, **kwargs):
        self.calls.append(method)
        return []


def scored_rollout(cfg):
    """Generation batch k, scored: 2 prompts x 2 responses; the engine's log-probs only when the
    step's sampling settings ask for them (as the real engine does)."""

    def fake(items, k, timer):
        mask = torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]])
        scores = torch.tensor([1.0, 0.0, 0.0, 1.0])
        tls = torch.zeros(4, R)
        for i in range(4):
            tls[i, int(mask[i].sum()) - 1] = scores[i]
        tensors = {
            "prompts": torch.ones(4, P, dtype=torch.long), "responses": torch.ones(4, R, dtype=torch.long),
            "input_ids": torch.ones(4, P + R, dtype=torch.long),
            "attention_mask": torch.cat([torch.ones(4, P), mask], -1).long(),
            "position_ids": torch.arange(P + R).expand(4, P + R).contiguous(),
            "response_mask": mask, "scores": scores, "token_level_scores": tls,
        }
        if sampling.train_sampling(cfg).logprobs:
            tensors["rollout_log_probs"] = torch.full((4, R), math.log(ROLLOUT_P)) * mask
        return Batch.from_dict(tensors, {"uid": ["p0", "p0", "p1", "p1"]}), {}

    return fake


class NoSync:
    """The weight sync, sending nothing."""

    last_bytes, adapter_only = 0, False

    def __call__(self) -> dict:
        return {}


def step(tmp_path, *overrides):
    cfg = config(*overrides)
    trainer = GRPOTrainer(resolve(cfg), model_path="unused", tokenizer=None, tokenizer_path="unused", train_data=TrainData(),
                          val_data=None, device="cpu", out_dir=str(tmp_path))
    trainer.actor, trainer.rollout, trainer.ref, trainer.critic = ActorGroup(), RolloutGroup(), None, None
    trainer.scored_rollout = scored_rollout(cfg)
    trainer.engines.sync = NoSync()
    metrics = trainer.train_step([{}, {}])
    return trainer, metrics


DIFF = ("training/rollout_probs_diff_max", "training/rollout_probs_diff_mean", "training/rollout_probs_diff_std")


def test_on_policy_step_with_rollout_log_probs_compares_them_with_the_trainers(tmp_path):
    cfg = config("actor_rollout_ref.rollout.calculate_log_probs=true")
    assert facts.on_policy(cfg) and facts.old_log_prob_forward(cfg)
    trainer, m = step(tmp_path, "actor_rollout_ref.rollout.calculate_log_probs=true")
    assert trainer.actor.calls == ["compute_log_prob", "update_policy"]
    # |0.5 - 0.4| on every response token
    assert [m[k] for k in DIFF] == pytest.approx([0.1, 0.1, 0.0], abs=1e-6)
    assert m["timing_s/old_log_prob"] >= 0 and "timing_s/old_log_prob/worker" in m
    assert m["rollout_corr/kl"] == pytest.approx(math.log(ROLLOUT_P / ACTOR_P), rel=1e-5)
    # still an on-policy update: the actor is not sent old log-probs, and no weights
    assert "old_log_probs" not in trainer.actor.update_rows and "rollout_is_weights" not in trainer.actor.update_rows


def test_on_policy_step_without_rollout_log_probs_skips_the_forward(tmp_path):
    assert not facts.old_log_prob_forward(config())
    trainer, m = step(tmp_path)
    assert trainer.actor.calls == ["update_policy"]
    assert not any(k in m for k in DIFF) and "timing_s/old_log_prob" not in m
    assert not any(k.startswith("rollout_corr/") for k in m)


def test_off_policy_step_runs_the_forward_and_sends_old_log_probs(tmp_path):
    over = ["actor_rollout_ref.actor.ppo_epochs=2"]  # a second pass over the batch: off-policy
    assert not facts.on_policy(config(*over)) and facts.old_log_prob_forward(config(*over))
    assert not facts.on_policy(config("data.train_batch_size=4"))  # so are 2 mini-batches
    trainer, m = step(tmp_path, *over)
    assert trainer.actor.calls == ["compute_log_prob", "update_policy"]
    torch.testing.assert_close(trainer.actor.update_rows["old_log_probs"], torch.full((4, R), math.log(ACTOR_P)))
    assert not any(k in m for k in DIFF)  # no rollout log-probs to compare with


def test_truncated_importance_sampling_turns_the_rollout_log_probs_on_and_weights_the_update(tmp_path):
    over = ["algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=2.0"]
    assert facts.rollout_log_probs(config(*over)) and facts.old_log_prob_forward(config(*over))
    trainer, m = step(tmp_path, *over)
    assert trainer.actor.calls == ["compute_log_prob", "update_policy"]
    assert [m[k] for k in DIFF] == pytest.approx([0.1, 0.1, 0.0], abs=1e-6)
    # w = min(pi_old / pi_rollout, 2) = 0.8 on response tokens, 0 elsewhere
    rows = trainer.actor.update_rows
    torch.testing.assert_close(rows["rollout_is_weights"], 0.8 * rows["response_mask"])
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx(0.8)


def test_bypass_mode_uses_the_rollout_log_probs_as_the_old_ones(tmp_path):
    over = ["algorithm.rollout_correction.bypass_mode=true"]
    assert not facts.on_policy(config(*over)) and not facts.old_log_prob_forward(config(*over))
    trainer, m = step(tmp_path, *over)
    assert trainer.actor.calls == ["update_policy"]
    rows = trainer.actor.update_rows
    torch.testing.assert_close(rows["old_log_probs"], math.log(ROLLOUT_P) * rows["response_mask"])
    assert not any(k in m for k in DIFF)


class Rewards:
    """Scores a batch as the reward stage does (``token_level_scores`` on the last response token): 1.0 for the
    sampled responses of the stand-in above; for the greedy baseline batch, ``GREEDY[prompt]``."""

    GREEDY = (0.25, 0.75)

    def score(self, batch, timer=None):
        mask = batch["response_mask"]
        scores = (torch.tensor(self.GREEDY) if len(batch) == 2 else torch.tensor([1.0, 0.0, 0.0, 1.0]))
        tls = torch.zeros_like(mask)
        tls[torch.arange(len(batch)), mask.sum(-1).long() - 1] = scores
        batch["token_level_scores"] = tls
        return scores, {}


def test_remax_takes_one_greedy_response_per_prompt_as_the_baseline_of_its_responses(tmp_path):
    cfg = config("algorithm.adv_estimator=remax")
    trainer = GRPOTrainer(resolve(cfg), model_path="unused", tokenizer=None, tokenizer_path="unused", train_data=TrainData(),
                          val_data=None, device="cpu", out_dir=str(tmp_path))
    trainer.actor, trainer.rollout, trainer.ref, trainer.critic = ActorGroup(), RolloutGroup(), None, None
    trainer.rewards, trainer.engines.sync = Rewards(), NoSync()
    sampled = scored_rollout(cfg)
    asked = []

    def generate(items, tag, sampling):
        asked.append((tag, sampling.n, sampling.do_sample))
        if sampling.n == 1:  # the greedy baseline: one response per prompt
            whole, _ = sampled(items, 0, None)
            return whole.reorder([0, 2]), 0.0
        return sampled(items, 0, None)[0], 0.0

    trainer.generate = generate
    m = trainer.train_step([{}, {}])
    assert asked == [("s0", 2, True), ("s0b", 1, False)]
    rows = trainer.actor.update_rows
    mask = rows["response_mask"]
    # returns-to-go of the sampled responses (score on the last token) minus their prompt's greedy score
    baseline = torch.tensor([0.25, 0.25, 0.75, 0.75]).unsqueeze(-1)
    returns = torch.tensor([1.0, 0.0, 0.0, 1.0]).unsqueeze(-1) * mask
    torch.testing.assert_close(rows["advantages"], (returns - baseline) * mask)
    assert m["timing_s/gen_max"] >= 0


class CriticGroup:
    """Values 0 everywhere; records the rows of its update."""

    def __init__(self) -> None:
        self.update_rows: dict[str, torch.Tensor] = {}

    def call(self, method, *args, per_rank):
        if method == "compute_values":
            return [Timed(torch.zeros(len(rows["responses"]), R), 0.01) for rows, *_ in per_rank]
        assert method == "update_critic", method
        (rows,) = per_rank[0]
        self.update_rows = rows
        return [Timed({"critic/vf_loss": 0.0}, 0.02)]


def gae_step(tmp_path, *overrides):
    cfg = config("algorithm.adv_estimator=gae", *overrides)
    trainer = GRPOTrainer(resolve(cfg), model_path="unused", tokenizer=None, tokenizer_path="unused", train_data=TrainData(),
                          val_data=None, device="cpu", out_dir=str(tmp_path))
    trainer.actor, trainer.rollout, trainer.ref, trainer.critic = ActorGroup(), RolloutGroup(), None, CriticGroup()
    trainer.scored_rollout, trainer.engines.sync = scored_rollout(cfg), NoSync()
    return trainer, trainer.train_step([{}, {}])


def test_pf_ppo_resamples_the_step_after_its_advantages_for_both_updates(tmp_path):
    """The stand-in rewards are 1, 0, 0, 1: with verl's pow weighting (|s|^2, + 1e-8) the resampled step holds
    copies of the reward-1 rows only (a zero-reward row's chance is 1e-8 per draw), each with the advantages and
    returns GAE gave it in the whole step (values 0, gamma = lam = 1: returns 1 on its tokens; advantages
    whitened over all four rows, so positive); the critic and the actor both train on them, and the step's
    metrics describe them."""
    plain, m_plain = gae_step(tmp_path / "plain")
    pf, m_pf = gae_step(tmp_path / "pf", "algorithm.use_pf_ppo=true")
    assert m_plain["critic/score/mean"] == 0.5 and m_pf["critic/score/mean"] == 1.0

    def rows(group, key):
        return {(tuple(m.tolist()), tuple(v.tolist())) for m, v in zip(group["response_mask"], group[key])}

    actor, critic = rows(pf.actor.update_rows, "advantages"), rows(pf.critic.update_rows, "returns")
    assert actor <= rows(plain.actor.update_rows, "advantages") and critic <= rows(plain.critic.update_rows, "returns")
    assert all(a > 0 for mask, adv in actor for m, a in zip(mask, adv) if m)
    assert all(r == 1.0 for mask, ret in critic for m, r in zip(mask, ret) if m)
    # the draws are the step's own: the same run resamples the same rows
    again, _ = gae_step(tmp_path / "again", "algorithm.use_pf_ppo=true")
    assert torch.equal(again.actor.update_rows["advantages"], pf.actor.update_rows["advantages"])


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_responses_cut_at_the_limit_are_not_warned_about_when_ignore_eos_asked_for_it(tmp_path, ignore_eos):
    cfg = config(f"actor_rollout_ref.rollout.ignore_eos={str(ignore_eos).lower()}")
    trainer = GRPOTrainer(resolve(cfg), model_path="unused", tokenizer=None, tokenizer_path="unused", train_data=TrainData(),
                          val_data=None, device="cpu", out_dir=str(tmp_path))
    trainer.actor, trainer.rollout, trainer.ref, trainer.critic = ActorGroup(), RolloutGroup(), None, None
    trainer.scored_rollout, trainer.engines.sync = scored_rollout(cfg), NoSync()
    seen: list[str] = []
    trainer.clip_warning.emit, trainer.clip_warning.threshold = seen.append, 0.0  # (2 of the 4 stand-ins are cut)
    trainer.train_step([{}, {}])
    assert len(seen) == (0 if ignore_eos else 1)
