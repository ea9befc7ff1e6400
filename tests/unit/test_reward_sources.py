"""Reward sources as a named list (``reward.sources``): what verl's keys mean as sources, a list with two
reward models and the rule score (their role rows, pools, settings, ``--check``), every refusal, and the
reward stage summing them with their weights under one rule."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from grpo_dist.config import roles as table
from grpo_dist.config.plan import build_plan
from grpo_dist.config.reward_sources import RewardSource, reward_sources
from grpo_dist.config.spec import resolve
from grpo_dist.rewards.combine import RewardCombine, weighted_sum
from tests.configs import cfg_of as load, refused

TWO = ("trainer.n_gpus_per_node=2",)
SOURCES = (
    "+reward.sources.verifier.kind=rule", "+reward.sources.verifier.weight=0.5",
    "+reward.sources.helpful.kind=outcome_model", "+reward.sources.helpful.path=/rm_a",
    "+reward.sources.judge.kind=outcome_model", "+reward.sources.judge.path=/rm_b",
    "+reward.sources.judge.weight=0.25", "+reward.sources.judge.enable_resource_pool=true",
    "+reward.sources.judge.nnodes=1", "+reward.sources.judge.n_gpus_per_node=3",
)




def weights(cfg) -> dict[str, float]:
    return {s.name: s.weight for s in reward_sources(cfg)}


# ------------------------------------------------------------------------------- verl's keys as sources
def test_without_the_list_verls_keys_make_the_rule_and_one_reward_model():
    assert weights(load()) == {"rule": 1.0}
    rm = ("reward_model.enable=true", "reward_model.model.path=/rm")
    assert weights(load(*rm)) == {"rule": 0.0, "reward_model": 1.0}  # verl: the reward model is the reward
    assert weights(load(*rm, "custom_reward_function.path=/f.py")) == {"rule": 1.0, "reward_model": 0.0}
    assert weights(load(*rm, "reward_model.combine=weighted", "reward_model.rm_weight=0.5",
                        "reward_model.rule_weight=2")) == {"rule": 2.0, "reward_model": 0.5}
    (model,) = [s for s in reward_sources(load(*rm, *TWO)) if s.is_model]
    assert (model.role, model.path, model.path_key, model.world_size, model.own_pool) == (
        "reward_model", "/rm", "reward_model.model.path", 2, False)
    assert model.metric_prefix == "reward_model"


# ------------------------------------------------------------------------------- the named list
def test_two_reward_models_and_the_rule_score_are_three_sources_with_their_weights():
    cfg = load(*TWO, *SOURCES)
    by_name = {s.name: s for s in reward_sources(cfg)}
    assert weights(cfg) == {"verifier": 0.5, "helpful": 1.0, "judge": 0.25}
    a, b = by_name["helpful"], by_name["judge"]
    assert (a.role, a.own_pool, a.world_size, a.metric_prefix) == ("reward_model.helpful", False, 2, "reward_model/helpful")
    assert (b.role, b.own_pool, b.world_size, b.metric_prefix) == ("reward_model.judge", True, 3, "reward_model/judge")
    assert by_name["verifier"].role is None and not any(s.trained for s in by_name.values())


def test_each_reward_model_is_a_role_row_and_the_one_on_its_own_pool_gets_a_pool():
    cfg = load(*TWO, *SOURCES)
    rows = {r.name: r for r in table.active_specs(cfg)}
    assert [n for n in rows if n.startswith("reward_model")] == ["reward_model.helpful", "reward_model.judge"]
    assert rows["reward_model.helpful"].kind == "reward_model" and rows["reward_model.helpful"].process == table.MODELS
    assert rows["reward_model.helpful"].pool_of(cfg) == "global" and rows["reward_model.judge"].pool_of(cfg) == "reward_model.judge"
    placed = table.placement(cfg, table.active_specs(cfg))
    assert [(p.name, p.world_size, p.keys) for p, _ in placed] == [
        ("global", 2, "trainer"), ("reward_model.judge", 3, "reward.sources.judge")]
    assert table.bundles(cfg) == 5
    spec = resolve(cfg)
    assert spec.needs_reward_model and spec.checkpointed.isdisjoint({"reward_model.helpful", "reward_model.judge"})


def test_each_reward_model_gets_its_own_ranks_and_micro_batch_in_its_settings():
    from grpo_dist.trainer.roles import RoleContext, Workers

    cfg = load(*TWO, *SOURCES, "+reward.sources.judge.micro_batch_size_per_gpu=5", "reward_model.micro_batch_size_per_gpu=7")
    spec = resolve(cfg)
    w = Workers(SimpleNamespace(spec=spec, device="cpu"))  # placement only: nothing starts before create()
    assert {name: p.world_size for name, p in w.plans.items()} == {"global": 2, "reward_model.judge": 3}
    w.ctx = RoleContext(spec, "cpu", "/m", "/t", 10, 2, 1)
    rows = {r.name: r for r in w.roles}
    assert rows["reward_model.judge"].init_kwargs(w._context("reward_model.judge"), 0)["world_size"] == 3
    settings = {name: spec.reward_model_settings("cpu", name, "/rm", "/t") for name in ("reward_model.helpful",
                                                                                     "reward_model.judge")}
    assert settings["reward_model.helpful"].micro_batch_size_per_gpu == 7
    assert settings["reward_model.judge"].micro_batch_size_per_gpu == 5
    assert spec.reward_model_path("reward_model.judge") == "/rm_b"


def test_check_lists_the_sources_and_places_the_pool():
    text = "\n".join(build_plan(load(*TWO, *SOURCES), count_rows=False).lines())
    assert "reward      the weighted sum of 3 sources" in text
    assert "0.5 x verifier: rule score" in text and "1 x helpful: outcome reward model /rm_a (2 rank(s)" in text
    assert "0.25 x judge: outcome reward model /rm_b (3 rank(s), own pool 1x3)" in text
    assert "placement   reward_model.judge pool node 0: ranks 0-2: reward_model.judge" in text


def test_iterative_rl_trains_the_source_it_names():
    it = ("reward_model.iterative.enable=true",)
    cfg = load(*TWO, *SOURCES, *it, "reward_model.iterative.source=judge")
    trained = [s.name for s in reward_sources(cfg) if s.trained]
    assert trained == ["judge"] and resolve(cfg).checkpointed >= {"reward_model.judge"}
    assert resolve(cfg).driver_plan("cpu", 64).iterative.role == "reward_model.judge"
    assert "several reward models; name the one" in refused(*TWO, *SOURCES, *it)
    assert "expected the name of one of the run's model sources: helpful, judge" in refused(
        *TWO, *SOURCES, *it, "reward_model.iterative.source=verifier")
    assert "iterative.enable is false" in refused(*TWO, *SOURCES, "reward_model.iterative.source=judge")


@pytest.mark.parametrize("extra, key, words", [
    (("+reward.sources.x.kind=model",), "reward.sources.x.kind", "rule, outcome_model, process_model"),
    (("+reward.sources.x.kind=outcome_model",), "reward.sources.x.path", "needs its reward model's folder"),
    (("+reward.sources.x.kind=rule", "+reward.sources.x.path=/p"), "reward.sources.x.path", "keys are kind, weight"),
    (("+reward.sources.x.kind=rule", "+reward.sources.y.kind=rule"), "reward.sources.y.kind", "one rule source"),
    (("+reward.sources.x.kind=rule", "+reward.sources.x.weight=0"), "reward.sources", "every source has weight 0"),
    (("+reward.sources.x.kind=outcome_model", "+reward.sources.x.path=/p", "+reward.sources.x.enable_resource_pool=true"),
     "reward.sources.x.enable_resource_pool", "needs reward.sources.x.nnodes >= 1"),
    (("+reward.sources.x.kind=outcome_model", "+reward.sources.x.path=/p", "+reward.sources.x.nnodes=2"),
     "reward.sources.x.enable_resource_pool", "only with enable_resource_pool=true"),
    (("+reward.sources.x.kind=rule", "+reward.sources.x.weight=much"), "reward.sources.x.weight", "finite number"),
    (("+reward.sources.x.kind=rule", "reward_model.enable=true"), "reward_model.enable", "declare that reward model"),
    (("+reward.sources.x.kind=rule", "reward_model.combine=weighted"), "reward_model.combine", "declare that reward model"),
    (("+reward.sources.x.kind=outcome_model", "+reward.sources.x.path=/p", "+reward.sources.x.step_separator=END"),
     "reward.sources.x.step_separator", "keys are"),
    (("+reward.sources.x.kind=process_model", "+reward.sources.x.path=/p"), "reward.sources.x.kind",
     "adv_estimator=grpo_process"),
])
def test_a_bad_entry_is_refused_with_one_message_naming_its_key(extra, key, words):
    msg = refused(*extra)
    assert msg.startswith(key + " = ") and words in msg, msg


def test_a_process_model_source_gives_step_rewards():
    cfg = load("algorithm.adv_estimator=grpo_process", "+reward.sources.steps.kind=process_model",
               "+reward.sources.steps.path=/prm", "+reward.sources.steps.step_separator=END")
    (s,) = reward_sources(cfg)
    assert s.is_process and s.step_separator == "END"
    assert "needs a reward per step" in refused("algorithm.adv_estimator=grpo_process",
                                                "+reward.sources.a.kind=outcome_model", "+reward.sources.a.path=/p")


# ------------------------------------------------------------------------------- the one rule of the sum
def test_verls_combination_is_the_weighted_sum_with_its_weights():
    rm, rule = torch.tensor([0.5, -1.0, 2.0]), torch.tensor([1.0, 0.0, 1.0])
    for combine, want in ((RewardCombine("verl"), rm), (RewardCombine("verl", custom_function=True), rule),
                          (RewardCombine("weighted", rm_weight=0.5, rule_weight=2.0), torch.tensor([2.25, -0.5, 3.0]))):
        rm_w, rule_w = combine.weights
        torch.testing.assert_close(weighted_sum([(rm_w, rm), (rule_w, rule)]), want)
    assert torch.equal(weighted_sum([(0.0, rm)]), torch.zeros(3))
    with pytest.raises(ValueError, match="cannot be combined"):
        weighted_sum([(1.0, rm), (1.0, torch.zeros(2))])


def test_the_stage_sums_two_reward_models_and_the_rule_with_their_weights_and_metrics():
    from tests.unit.test_reward_stage import RMGroup, RuleGroup, Tok, batch
    from grpo_dist.trainer.reward_stage import ModelScorer, RewardStage
    from grpo_dist.trainer.metrics import Timer

    class Doubled(RMGroup):  # a second reward model: twice the first one's scores
        def call(self, method, per_rank):
            out = super().call(method, per_rank)
            for o in out:
                o.value["last_B"], o.value["token_scores_BR"] = 2 * o.value["last_B"], 2 * o.value["token_scores_BR"]
            return out

    def source(name, weight, world):
        return RewardSource(name, "outcome_model", weight, f"reward.sources.{name}", role=f"reward_model.{name}",
                            world_size=world)

    models = [ModelScorer(source("a", 1.0, 2), RMGroup(world=2), "/rm_a", tokenizer=Tok()),
              ModelScorer(source("b", 0.25, 1), Doubled(world=1), "/rm_b", tokenizer=Tok())]
    stage = RewardStage(RuleGroup(), needs_step_rewards=False, overlong=None, rule_weight=0.5, models=models)
    b, timer = batch(), Timer()
    scores, stats = stage.score(b, timer=timer)
    rm, rule = torch.tensor([2.0, 11.0, 23.0]), torch.tensor([1.0, 0.0, 1.0])  # model a; the rule (stand-ins)
    torch.testing.assert_close(scores, rm + 0.25 * 2 * rm + 0.5 * rule)
    assert b["token_level_scores"][1].tolist() == [0, 11 * 1.5, 0, 0]
    assert stats["reward_model/a/score/mean"] == pytest.approx(12.0) and stats["reward_model/b/score/max"] == 46.0
    assert stats["reward_model/rule_score/mean"] == pytest.approx(2 / 3)
    assert {"reward_model/a", "reward_model/a/worker", "reward_model/b", "reward_model/b/worker"} <= set(timer.seconds)
