"""The reward stage with stand-in groups: what the reward is in each combination mode (the rule score
is not in it when the reward model is the reward), where a process reward model's scores go, the
verifier's labels for iterative RL, and the one message for a reward model that gives NaN."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_dist.batch import Batch
from grpo_dist.config.reward_sources import RewardSource
from grpo_dist.rewards.combine import RewardCombine
from grpo_dist.rewards.rewarder import RewardResult
from grpo_dist.trainer.reward_stage import ModelScorer, RewardStage
from grpo_dist.trainer.summary import TrainingError
from grpo_dist.workers.common import Timed

P, R = 2, 4
SEP = 9  # the separator token's id


class Tok:
    def batch_decode(self, ids, skip_special_tokens=False):
        return ["\n" if row == [SEP] else "x" for row in ids]


class RuleGroup:
    """Scores 1 for responses whose first token is 1, else 0; step rewards when asked (1 per step)."""

    def __init__(self):
        self.calls = []

    def call(self, method, responses, mask, sources, truths, extras, token_level, step_rewards, optional=False):
        self.calls.append((token_level, step_rewards, optional))
        scores = (responses[:, 0] == 1).float()
        last = mask.sum(-1).long() - 1
        tl = torch.zeros_like(mask)
        tl[torch.arange(len(mask)), last] = scores
        return [RewardResult(scores_B=scores, token_level_scores_BR=tl, step_end_mask_BR=None,
                             stats={"reward/num_errors": 0.0})]


class RMGroup:
    """Score of response token t = 10 * row + t (row counted over the whole batch via input_ids[:, 0])."""

    def __init__(self, world=2, nan=False):
        self.world, self.nan = world, nan

    def __len__(self):
        return self.world

    def call(self, method, per_rank):
        out = []
        for data, raw in per_rank:
            rows = data["input_ids"][:, 0].float()
            token = rows.unsqueeze(1) * 10 + torch.arange(R).float()
            token = token * (data["attention_mask"][:, -R:] != 0)
            last_idx = data["attention_mask"][:, -R:].sum(-1).long() - 1
            last = token[torch.arange(len(rows)), last_idx]
            if self.nan:
                last = last.clone()
                last[0] = float("nan")
            out.append(Timed({"last_B": last, "token_scores_BR": token}, 0.0))
        return out


def batch(rows=3) -> Batch:
    responses = torch.tensor([[1, SEP, 5, 0], [2, 5, 0, 0], [1, 5, 5, 5]])[:rows]
    mask = (torch.arange(R) < torch.tensor([3, 2, 4])[:rows].unsqueeze(1)).float()
    ids = torch.cat([torch.arange(rows).unsqueeze(1).expand(rows, P), responses], dim=1)
    att = torch.cat([torch.ones(rows, P, dtype=torch.long), mask.long()], dim=1)
    return Batch.from_dict({"input_ids": ids, "attention_mask": att, "position_ids": att.cumsum(-1) - 1,
                            "responses": responses, "response_mask": mask},
                           {"data_source": ["d"] * rows, "ground_truth": ["g"] * rows, "extra_info": [{}] * rows})


def model(rm=None, *, weight=1.0, process_separator=None, trained=False, name="reward_model"):
    """A reward model of the run: its source (verl's one, or a named one) at work with the stand-in group."""
    rm = rm or RMGroup()
    source = RewardSource(name, "process_model" if process_separator else "outcome_model", weight,
                          "reward_model" if name == "reward_model" else f"reward.sources.{name}",
                          role="reward_model" if name == "reward_model" else f"reward_model.{name}",
                          step_separator=process_separator, world_size=rm.world, trained=trained)
    return ModelScorer(source, rm, "/models/rm", tokenizer=Tok())


def stage(rm=None, combine=RewardCombine("verl"), *, iterative=False, process_separator=None, steps=False,
          label_threshold=0.5, rule=None):
    """The stage of a run with verl's one reward model, weighted by ``reward_model.combine``."""
    rm_weight, rule_weight = combine.weights
    return RewardStage(rule or RuleGroup(), needs_step_rewards=steps, overlong=None, rule_weight=rule_weight,
                       models=[model(rm, weight=rm_weight, process_separator=process_separator, trained=iterative)],
                       label_threshold=label_threshold)


def test_verl_mode_the_reward_is_the_reward_models_and_the_rule_is_not_called():
    s = stage(combine=RewardCombine("verl"))
    b = batch()
    scores, stats = s.score(b)
    assert scores.tolist() == [2.0, 11.0, 23.0]  # the score at each row's last response token
    assert b["token_level_scores"].tolist() == [[0, 0, 2, 0], [0, 11, 0, 0], [0, 0, 0, 23]]
    assert s.rule.calls == [] and "reward_model/rule_score/mean" not in stats
    assert stats["reward_model/score/mean"] == pytest.approx(12.0) and stats["reward_model/score/max"] == 23.0


def test_iterative_rl_computes_the_verifier_labels_without_putting_them_in_the_reward():
    s = stage(combine=RewardCombine("verl"), iterative=True)
    b = batch()
    scores, stats = s.score(b)
    assert scores.tolist() == [2.0, 11.0, 23.0]
    assert stats["reward_model/rule_score/mean"] == pytest.approx(2 / 3)
    t = b["rm_targets"]
    assert torch.isnan(t).sum() == 9 and (t[0, 2], t[1, 1], t[2, 3]) == (1.0, 0.0, 1.0)


class GradedRule(RuleGroup):
    """Rule scores 1.0 (correct), 0.1 (format only) and 0.5 for the three rows; with step rewards, a
    step-end reward of 0.1 at t=0 and the row's score at its last token."""

    def call(self, method, responses, mask, sources, truths, extras, token_level, step_rewards, optional=False):
        scores = torch.tensor([1.0, 0.1, 0.5])[: len(mask)]
        last = mask.sum(-1).long() - 1
        tl = torch.zeros_like(mask)
        tl[torch.arange(len(mask)), last] = scores
        ends = None
        if step_rewards:
            tl[:, 0] = 0.1
            ends = torch.zeros_like(mask)
            ends[:, 0] = 1
            ends[torch.arange(len(mask)), last] = 1
        return [RewardResult(scores_B=scores, token_level_scores_BR=tl, step_end_mask_BR=ends, stats={})]


@pytest.mark.parametrize("threshold, want", [(0.5, [1.0, 0.0, 1.0]), (1.0, [1.0, 0.0, 0.0]), (None, [1.0, 0.1, 0.5])])
def test_iterative_rl_labels_are_the_rule_score_against_the_threshold(threshold, want):
    """reward_model.iterative.label_threshold: a format-only 0.1 is labelled 0, not a soft 0.1 (null
    keeps the clamped score as a soft label)."""
    s = stage(rule=GradedRule(), iterative=True, label_threshold=threshold)
    b = batch()
    s.score(b)
    t = b["rm_targets"]
    assert [t[0, 2].item(), t[1, 1].item(), t[2, 3].item()] == pytest.approx(want)
    assert int(torch.isfinite(t).sum()) == 3
    # a process reward model: every step-end reward is labelled by the same rule
    s = stage(rule=GradedRule(), steps=True, iterative=True, label_threshold=threshold, process_separator="\n")
    b = batch()
    s.score(b)
    t = b["rm_targets"]
    assert t[:, 0].tolist() == pytest.approx([0.1 if threshold is None else 0.0] * 3)
    assert [t[0, 2].item(), t[1, 1].item(), t[2, 3].item()] == pytest.approx(want)


def test_a_custom_function_is_the_reward_in_verl_mode_and_weighted_mode_adds():
    b = batch()
    scores, _ = stage(combine=RewardCombine("verl", custom_function=True)).score(b)
    assert scores.tolist() == [1.0, 0.0, 1.0]
    b = batch()
    scores, _ = stage(combine=RewardCombine("weighted", rm_weight=0.5, rule_weight=10.0)).score(b)
    assert scores.tolist() == [11.0, 5.5, 21.5]
    assert b["token_level_scores"][2].tolist() == [0, 0, 0, 21.5]


def test_a_process_reward_model_is_read_at_the_step_ends():
    s = stage(combine=RewardCombine("verl"), process_separator="\n", steps=True)
    b = batch()
    scores, stats = s.score(b)
    # row 0: the separator at t=1 and the last token t=2; rows 1 and 2: no separator, one step at the end
    assert b["step_end_mask"].tolist() == [[0, 1, 1, 0], [0, 1, 0, 0], [0, 0, 0, 1]]
    assert b["token_level_scores"].tolist() == [[0, 1, 2, 0], [0, 11, 0, 0], [0, 0, 0, 23]]
    assert scores.tolist() == [3.0, 11.0, 23.0]
    assert stats["reward_model/score/min"] == 1.0 and stats["reward_model/score/max"] == 23.0
    assert s.models[0].warned_no_separator


def test_validation_scores_with_the_rules_only():
    s = stage(combine=RewardCombine("verl"))
    scores, _ = s.score(batch(), token_level=False)
    assert scores.tolist() == [1.0, 0.0, 1.0] and s.rule.calls == [(False, False, False)]


def test_a_reward_model_that_gives_nan_stops_the_run_naming_it():
    with pytest.raises(TrainingError) as e:
        stage(rm=RMGroup(nan=True)).score(batch())
    assert "/models/rm" in str(e.value) and "NaN" in str(e.value)


def test_rows_are_padded_to_equal_shares():
    rm = RMGroup(world=2)
    seen = []
    orig = rm.call
    rm.call = lambda method, per_rank: seen.append([d["input_ids"].shape[0] for d, _ in per_rank]) or orig(method, per_rank)
    scores, _ = stage(rm=rm).score(batch(3))
    assert seen == [[2, 2]] and len(scores) == 3 and not math.isnan(scores[-1])


def test_the_missing_separator_warning_is_said_once(capsys):
    s = stage(combine=RewardCombine("verl"), process_separator="\n", steps=True)
    s.score(batch())
    s.score(batch())
    out = capsys.readouterr().out
    assert out.count("hold no step separator") == 1 and "2 of 3 responses" in out


class FailingRuleGroup(RuleGroup):
    """Every score failed and was scored 0 (reward_model.on_error=zero), as the reward worker reports it."""

    def call(self, method, responses, *args):
        n = len(responses)
        return [RewardResult(scores_B=torch.zeros(n), token_level_scores_BR=None, step_end_mask_BR=None,
                             stats={"reward/num_errors": float(n - 1), "reward/num_timeouts": 1.0},
                             first_error="reward function f from /r.py failed on sample 0 of the batch: raised "
                                         "KeyError: 'x' at /r.py:3 (in f)")]


def test_failed_scores_are_counted_over_the_run_and_reach_the_summary(capsys):
    """With on_error=zero a run whose every score failed ends with a summary line and a warning that say
    so, and the first failure with its file and line."""
    from grpo_dist.trainer.run import _print_summary
    from grpo_dist.trainer.summary import RunSummary

    s = RewardStage(FailingRuleGroup(), needs_step_rewards=False, overlong=None)
    s.score(batch(), token_level=False)
    s.score(batch(2), token_level=False)
    assert (s.counts.scored, s.counts.failed) == (5, 5)
    summary = RunSummary(steps=2, out_dir="/out", rewards=s.counts)
    _print_summary(summary, 10.0)
    out, err = capsys.readouterr()
    assert "reward errors    5 of 5 scores failed (every score) and were scored 0 (reward_model.on_error=zero" in out
    assert err.startswith("grpo_dist: warning: every reward score of this run failed and was scored 0")
    assert "the first: reward function f from /r.py failed" in err and "/r.py:3 (in f)" in err

    # a few failures: the summary counts them, no warning
    summary.rewards.scored = 100
    _print_summary(summary, 10.0)
    out, err = capsys.readouterr()
    assert "5 of 100 scores failed (5%)" in out and err == ""
    _print_summary(RunSummary(steps=2, out_dir="/out"), 10.0)
    assert "reward errors" not in capsys.readouterr().out
