"""The role table drives placement: each row's pool and device share, the reward model's own pool
(``reward_model.enable_resource_pool``), and ``--check``'s placement lines, all from the same rows."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from grpo_dist.config import roles as table
from grpo_dist.config.plan import build_plan
from grpo_dist.config.schema import ConfigError
from grpo_dist.config.spec import resolve
from tests.configs import cfg_of

RM = ("reward_model.enable=true", "reward_model.model.path=/rm")
OWN = (*RM, "reward_model.enable_resource_pool=true", "reward_model.nnodes=1", "reward_model.n_gpus_per_node=3")
CURRENT = ("reward.reward_model.enable=true", "reward.reward_model.model_path=/rm",
           "reward.reward_model.enable_resource_pool=true", "reward.reward_model.nnodes=2",
           "reward.reward_model.n_gpus_per_node=1")
TWO = ("trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.use_kl_loss=true")


def row(name: str, share: float | None = None, process: str | None = None):
    return SimpleNamespace(name=name, per_rank=True, process=process, device_share=share)


def workers(cfg):
    from grpo_dist.trainer.roles import Workers

    return Workers(SimpleNamespace(spec=resolve(cfg), device="cpu"))  # placement only: nothing starts before create()


# ------------------------------------------------------------------------------------------- one table
def test_the_driver_and_check_read_the_same_rows():
    from grpo_dist.trainer.roles import ROLES

    assert [r.spec for r in ROLES] == list(table.ROLE_SPECS)
    assert [r.name for r in ROLES] == ["actor", "reference", "critic", "reward_model", "rollout", "reward"]
    assert all(r.description for r in table.ROLE_SPECS)


# ------------------------------------------------------------------------------------------- shares
def test_default_shares_are_equal_parts_per_process_as_before():
    """No row names a share: each process of a rank takes 1 / processes (the model process and the
    rollout engine half each, whatever the models in the model process)."""
    for overrides in ((), ("algorithm.adv_estimator=gae",), RM, (*RM, "algorithm.adv_estimator=gae")):
        cfg = cfg_of(*TWO, *overrides)
        ((pool, rows),) = table.placement(cfg, table.active_specs(cfg))
        processes = table.rank_processes(rows)
        assert [p for p, _ in processes] == [table.MODELS, None]
        assert table.device_shares(processes) == [0.5, 0.5]
        assert pool.name == table.GLOBAL and pool.world_size == 2


def test_named_shares_and_the_rest_split_equally():
    procs = table.rank_processes([row("actor", 0.25, "m"), row("reference", 0.15, "m"), row("rollout"), row("x")])
    assert [p for p, _ in procs] == ["m", None, None]
    assert table.device_shares(procs) == pytest.approx([0.4, 0.3, 0.3])
    assert table.device_shares(table.rank_processes([row("a", 0.7), row("b", 0.3)])) == pytest.approx([0.7, 0.3])
    assert table.device_shares(table.rank_processes([row("a")])) == [1.0]
    with pytest.raises(ValueError, match="leaving nothing"):
        table.device_shares(table.rank_processes([row("a", 1.0), row("b")]))
    with pytest.raises(ValueError, match="take 1.2"):
        table.device_shares(table.rank_processes([row("a", 0.6), row("b", 0.6)]))


# ------------------------------------------------------------------------------------------- pools
def test_a_reward_model_on_its_own_pool_leaves_the_training_ranks():
    cfg = cfg_of(*TWO, *OWN)
    placed = table.placement(cfg, table.active_specs(cfg))
    assert [(p.name, p.world_size, p.keys, [r.name for r in rows]) for p, rows in placed] == [
        ("global", 2, "trainer", ["actor", "reference", "rollout"]),
        ("reward_model", 3, "reward_model", ["reward_model"])]
    assert table.device_shares(table.rank_processes(placed[1][1])) == [1.0]  # the whole device
    assert table.bundles(cfg) == 5
    colocated = cfg_of(*TWO, *RM, "reward_model.nnodes=1", "reward_model.n_gpus_per_node=3")  # the switch off
    assert [p.name for p, _ in table.placement(colocated, table.active_specs(colocated))] == ["global"]
    assert table.bundles(colocated) == 2


def test_the_current_spelling_gives_the_same_pool_and_names_its_keys():
    cfg = cfg_of(*TWO, *CURRENT)
    pool = table.pool(cfg, "reward_model")
    assert (pool.nnodes, pool.per_node, pool.keys) == (2, 1, "reward.reward_model")


def test_the_workers_place_each_pool_with_its_own_world_size():
    from grpo_dist.trainer.roles import RoleContext

    cfg = cfg_of(*TWO, *OWN)
    w = workers(cfg)
    assert {name: (p.nnodes, p.devices_per_node, p.keys) for name, p in w.plans.items()} == {
        "global": (1, 2, "trainer"), "reward_model": (1, 3, "reward_model")}
    w.ctx = RoleContext(resolve(cfg), "cpu", "/m", "/t", 10, 2, 1)
    rows = {r.name: r for r in w.roles}
    assert rows["reward_model"].init_kwargs(w._context("reward_model"), 2)["world_size"] == 3
    assert rows["actor"].init_kwargs(w._context("global"), 1)["world_size"] == 2
    assert rows["reward_model"].pool_of(w.ctx.spec) == "reward_model" and rows["actor"].pool_of(w.ctx.spec) == "global"
    assert list(workers(cfg_of(*TWO, *RM)).plans) == ["global"]


def test_the_reward_models_sizes_follow_its_ranks():
    from grpo_dist.config.reward_sources import model_sources
    from grpo_dist.config.driver_plan import driver_plan
    from grpo_dist.config.launch import launch_plan

    it = ("reward_model.iterative.enable=true", "reward_model.iterative.mini_batch_size=12")
    own = cfg_of(*TWO, *OWN, *it, "reward_model.micro_batch_size=12")
    shared = cfg_of(*TWO, *RM, *it, "reward_model.micro_batch_size=12")
    assert (model_sources(own)[0].world_size, model_sources(shared)[0].world_size) == (3, 2)
    assert (model_sources(own)[0].micro_batch_size_per_gpu, model_sources(shared)[0].micro_batch_size_per_gpu) == (4, 6)
    assert driver_plan(resolve(own), "cpu", 4096).iterative.world_size == 3
    assert driver_plan(resolve(shared), "cpu", 4096).iterative.world_size == 2
    assert launch_plan(own).ray_init["min_cpus"] == 5 and launch_plan(shared).ray_init["min_cpus"] == 2


@pytest.mark.parametrize("overrides, key, size_key", [
    ((*RM, "reward_model.enable_resource_pool=true"), "reward_model.enable_resource_pool", "reward_model.nnodes"),
    ((*RM, "reward_model.enable_resource_pool=true", "reward_model.nnodes=1", "reward_model.n_gpus_per_node=0"),
     "reward_model.enable_resource_pool", "reward_model.n_gpus_per_node"),
    (("reward.reward_model.enable=true", "reward.reward_model.model_path=/rm", "reward.reward_model.enable_resource_pool=true"),
     "reward.reward_model.enable_resource_pool", "reward.reward_model.nnodes"),
])
def test_a_pool_without_devices_is_refused_naming_the_keys(overrides, key, size_key):
    """verl's defaults leave reward_model.nnodes at 0: a pool of its own must be given a size."""
    with pytest.raises(ConfigError) as e:
        cfg_of(*overrides)
    msg = str(e.value)
    assert msg.startswith(key + " =") and f"{size_key} >= 1" in msg, msg


# ------------------------------------------------------------------------------------------- --check
def check_lines(*overrides: str) -> list[str]:
    return build_plan(cfg_of(*TWO, *overrides), count_rows=False).lines()


def test_check_lists_the_reward_model_with_the_colocated_roles():
    text = "\n".join(check_lines(*RM))
    assert ("placement   node 0: ranks 0-1: actor, reference, reward_model, rollout (colocated, shares of the rank's "
            "device: actor+reference+reward_model 1/2, rollout 1/2)") in text
    assert "            reward_model: the learned reward model under FSDP2" in text
    assert "reward: 1 scoring worker (2 scoring process(es))" in text
    assert "pool  " not in text
    plain = check_lines()  # no reward model: not listed
    assert any(line.startswith("placement   node 0: ranks 0-1: actor, reference, rollout (") for line in plain)
    assert not any(line.startswith("            reward_model:") for line in plain)


def test_check_shows_the_reward_models_own_pool():
    lines = check_lines(*OWN)
    text = "\n".join(lines)
    assert ("placement   node 0: ranks 0-1: actor, reference, rollout (colocated, shares of the rank's device: "
            "actor+reference 1/2, rollout 1/2)") in lines
    assert ("pool        reward_model: reward_model.nnodes 1 x reward_model.n_gpus_per_node 3 = 3 rank(s) of its own "
            "(its own process group)") in lines
    assert "placement   reward_model pool node 0: ranks 0-2: reward_model" in lines
    assert "reward_model: the learned reward model under FSDP2" in text
    current = check_lines(*CURRENT)
    assert "placement   reward_model pool node 1: rank 1: reward_model" in current
    assert any(line.startswith("pool        reward_model: reward.reward_model.nnodes 2 x") for line in current)


def test_check_says_a_pool_without_a_reward_model_has_no_effect():
    text = "\n".join(check_lines("reward_model.enable_resource_pool=true", "reward_model.nnodes=1"))
    assert "reward_model.enable_resource_pool=True: the run has no reward model" in text
    assert "pool  " not in text
