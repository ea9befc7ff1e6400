"""The critic's configuration: when it is on, what it inherits from the actor, verl's two layouts of its
FSDP keys, every refusal, the settings the workers get, the warm-up rule, and verl's PPO scripts."""

from __future__ import annotations

import pytest

from grpo_dist.config.loader import compose, to_typed
from grpo_dist.config.schema import ConfigError
from grpo_dist.config.spec import resolve
from grpo_dist.config.validate import critic_enabled, validate_config
from grpo_dist.config import role_settings
from grpo_dist.trainer import schedule
from tests.verl_ppo_scripts import SCRIPTS, script_args

GAE = "algorithm.adv_estimator=gae"


def load(*overrides: str):
    cfg = to_typed(compose(list(overrides)), list(overrides))
    validate_config(cfg, check_paths=False)
    return cfg


# ---------------------------------------------------------------------------------------------- on/off
def test_the_critic_is_on_exactly_when_the_estimator_needs_values():
    assert not critic_enabled(load())  # grpo
    assert critic_enabled(load(GAE))
    assert critic_enabled(load("critic.enable=true"))  # trained beside grpo, as verl allows
    assert not critic_enabled(load("algorithm.adv_estimator=rloo", "critic.enable=false"))
    with pytest.raises(ConfigError) as e:
        load(GAE, "critic.enable=false")
    assert "critic.enable" in str(e.value) and "gae" in str(e.value)


def test_the_critic_role_row_follows_the_same_rule():
    from grpo_dist.trainer.roles import active_roles

    assert "critic" not in [r.name for r in active_roles(resolve(load()))]
    roles = active_roles(resolve(load(GAE)))
    assert "critic" in [r.name for r in roles]
    critic = next(r for r in roles if r.name == "critic")
    assert critic.per_rank and critic.checkpoint and critic.model is not None


# ------------------------------------------------------------------------------------------ inheritance
def test_unset_keys_follow_the_actor_as_in_verl():
    cfg = load(GAE, "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_epochs=2",
               "actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.shuffle=true",
               "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean", "actor_rollout_ref.model.trust_remote_code=true")
    c = cfg.critic
    assert (c.ppo_mini_batch_size, c.ppo_epochs, c.use_dynamic_bsz, c.shuffle) == (8, 2, True, True)
    assert c.loss_agg_mode == "seq-mean-token-mean" and c.model.trust_remote_code is True
    assert c.model.path == cfg.actor_rollout_ref.model.path == c.model.tokenizer_path
    # the critic's own micro-batch and token budget are not the actor's; forwards follow the critic's
    assert c.ppo_micro_batch_size_per_gpu is None and c.ppo_max_token_len_per_gpu == 32768
    cfg = load(GAE, "critic.ppo_micro_batch_size_per_gpu=4", "critic.ppo_max_token_len_per_gpu=1000")
    assert cfg.critic.forward_micro_batch_size_per_gpu == 4 and cfg.critic.forward_max_token_len_per_gpu == 1000


def test_set_keys_win_over_the_actors():
    cfg = load(GAE, "critic.ppo_mini_batch_size=8", "critic.ppo_epochs=3", "critic.use_dynamic_bsz=true",
               "critic.loss_agg_mode=seq-mean-token-sum", "critic.forward_micro_batch_size_per_gpu=16")
    c = cfg.critic
    assert (c.ppo_mini_batch_size, c.ppo_epochs, c.use_dynamic_bsz, c.loss_agg_mode) == (8, 3, True, "seq-mean-token-sum")
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 16 and cfg.actor_rollout_ref.actor.ppo_epochs == 1
    assert c.forward_micro_batch_size_per_gpu == 16


def test_verls_defaults():
    c = load(GAE).critic
    assert c.optim.lr == 1e-5 and c.optim.weight_decay == 0.01 and c.optim.lr_warmup_steps == -1
    assert c.cliprange_value == 0.5 and c.grad_clip == 1.0 and c.optim.clip_grad == 1.0
    assert list(c.checkpoint.save_contents) == ["model", "optimizer", "extra"]
    assert list(c.checkpoint.load_contents) == list(c.checkpoint.save_contents)


# ------------------------------------------------------------------------------- two layouts, two names
@pytest.mark.parametrize("prefix", ["critic.fsdp", "critic.model.fsdp_config"])
def test_either_fsdp_layout_reaches_the_workers(prefix):
    cfg = load(GAE, f"{prefix}.param_offload=true", f"{prefix}.model_dtype=bfloat16", f"{prefix}.reshard_after_forward=false")
    s = role_settings.critic_settings(cfg, "cpu", 10)
    assert s.param_offload is True and s.model_dtype == "bfloat16" and s.reshard_after_forward is False
    assert s.optimizer_offload is False


def test_the_two_layouts_combine_and_contradictions_are_refused():
    cfg = load(GAE, "critic.fsdp.param_offload=true", "critic.model.fsdp_config.optimizer_offload=true")
    s = role_settings.critic_settings(cfg, "cpu", 10)
    assert s.param_offload and s.optimizer_offload
    with pytest.raises(ConfigError) as e:
        load(GAE, "critic.fsdp.model_dtype=bfloat16", "critic.model.fsdp_config.model_dtype=float16")
    assert "critic.fsdp.model_dtype" in str(e.value) and "critic.model.fsdp_config.model_dtype" in str(e.value)


@pytest.mark.parametrize("key", ["critic.grad_clip", "critic.optim.clip_grad"])
def test_either_grad_clip_key(key):
    assert role_settings.critic_settings(load(GAE, f"{key}=0.3"), "cpu", 10).grad_clip == 0.3


def test_contradicting_grad_clip_keys_are_refused():
    with pytest.raises(ConfigError, match="critic.grad_clip.*critic.optim.clip_grad"):
        load(GAE, "critic.grad_clip=0.3", "critic.optim.clip_grad=2.0")


# --------------------------------------------------------------------------------------------- refusals
FAILURES = [
    (["critic.ppo_mini_batch_size=5"], ["critic.ppo_mini_batch_size", "5", "divisible", "32"]),
    (["critic.ppo_mini_batch_size=2", "actor_rollout_ref.rollout.n=3", "trainer.n_gpus_per_node=4"],
     ["critic.ppo_mini_batch_size", "6 responses", "4 data-parallel ranks"]),
    (["critic.ppo_micro_batch_size_per_gpu=5", "trainer.n_gpus_per_node=2"],
     ["critic.ppo_micro_batch_size_per_gpu", "5", "128 responses"]),
    (["critic.ppo_epochs=0"], ["critic.ppo_epochs", "> 0"]),
    (["critic.optim.lr=0"], ["critic.optim.lr", "> 0"]),
    (["critic.cliprange_value=-0.5"], ["critic.cliprange_value", ">= 0"]),
    (["critic.loss_agg_mode=mean"], ["critic.loss_agg_mode", "'mean'", "token-mean"]),
    (["critic.strategy=megatron"], ["critic.strategy", "fsdp2"]),
    (["critic.optim.lr_scheduler_type=linear"], ["critic.optim.lr_scheduler_type", "cosine"]),
    (["critic.optim.betas=[0.9]"], ["critic.optim.betas"]),
    (["critic.fsdp.dtype=fp8"], ["critic.fsdp.dtype", "'fp8'", "bfloat16"]),
    (["critic.model.fsdp_config.model_dtype=fp8"], ["critic.model.fsdp_config.model_dtype", "'fp8'", "float32"]),
    (["critic.checkpoint.save_contents=[model]"], ["critic.checkpoint.save_contents", "optimizer", "exact"]),
    (["critic.checkpoint.load_contents=[model,optimizer]"], ["critic.checkpoint.load_contents", "extra"]),
    (["critic.checkpoint.save_contents=[model,optimizer,extra,weights]"], ["save_contents", "'weights'", "hf_model"]),
    (["trainer.critic_warmup=-1"], ["trainer.critic_warmup", ">= 0"]),
    (["critic.optim.clip_grad=0"], ["critic.optim.clip_grad", "> 0"]),
    (["critic.ppo_mini_batch_sise=4"], ["unknown config key", "critic.ppo_mini_batch_size"]),
]


@pytest.mark.parametrize("overrides,needles", FAILURES, ids=[" ".join(o) for o, _ in FAILURES])
def test_critic_validation_failure_message(overrides, needles):
    with pytest.raises(ConfigError) as ei:
        load(GAE, *overrides)
    for n in needles:
        assert n in str(ei.value), f"{n!r} not in message: {ei.value}"


def test_critic_model_path_must_exist(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    data = tmp_path / "d.parquet"
    data.write_bytes(b"PAR1")
    base = [GAE, f"actor_rollout_ref.model.path={model}", f"data.train_files={data}", f"data.val_files={data}"]
    cfg = to_typed(compose(base + ["critic.model.path=/nonexistent/critic"]))
    with pytest.raises(ConfigError, match="critic.model.path.*no such directory"):
        validate_config(cfg)
    validate_config(to_typed(compose(base)))  # the default: the actor's model, which exists


# --------------------------------------------------------------------------------------- what workers get
def test_critic_settings_map_the_keys():
    cfg = load(GAE, "trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.n=4", "critic.ppo_mini_batch_size=8",
               "critic.ppo_micro_batch_size_per_gpu=2", "critic.cliprange_value=0.2", "critic.optim.lr=3e-4",
               "critic.optim.lr_warmup_steps_ratio=0.1", "critic.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
               "+critic.model.override_config.attn_implementation=eager", "+critic.model.override_config.rope_theta=5000.0",
               "critic.model.enable_gradient_checkpointing=false", "trainer.seed=5")
    s = role_settings.critic_settings(cfg, "cpu", 20)
    assert s.ppo_mini_batch_size_per_gpu == 8 * 4 // 2 and s.ppo_micro_batch_size_per_gpu == 2
    assert s.forward_micro_batch_size_per_gpu == 2 and s.use_dynamic_bsz is False
    assert (s.cliprange_value, s.lr, s.lr_warmup_steps_ratio, s.total_training_steps) == (0.2, 3e-4, 0.1, 20)
    assert s.attn_implementation == "eager" and s.override_config == {"rope_theta": 5000.0}
    assert s.export_hf is True and s.enable_gradient_checkpointing is False and s.seed == 5
    assert s.norm_constant == float(cfg.data.max_response_length)
    assert s.param_dtype == "float32" and role_settings.critic_settings(cfg, "cuda", 20).param_dtype == "bfloat16"
    dyn = role_settings.critic_settings(load(GAE, "critic.use_dynamic_bsz=true", "critic.ppo_micro_batch_size_per_gpu=2",
                                     "critic.forward_max_token_len_per_gpu=77"), "cpu", 20)
    assert dyn.use_dynamic_bsz and dyn.ppo_micro_batch_size_per_gpu is None and dyn.forward_micro_batch_size_per_gpu is None
    assert dyn.forward_max_token_len_per_gpu == 77


def test_critic_model_path_resolution(tmp_path):
    cfg = load(GAE)
    assert role_settings.critic_model_path(cfg, "/resolved/actor") == "/resolved/actor"  # the actor's, already resolved
    other = tmp_path / "value_model"
    other.mkdir()
    cfg = load(GAE, f"critic.model.path={other}")
    assert role_settings.critic_model_path(cfg, "/resolved/actor") == str(other)


# ------------------------------------------------------------------------------------------- warm-up
@pytest.mark.parametrize("critic_warmup", [0, 1, 2, 3, 5])
def test_warmup_matches_verls_rule(critic_warmup):
    """verl updates the actor when ``critic_warmup <= global_steps`` with global_steps = 1 during the
    first step; the driver's global_step counts finished steps (0 during the first step)."""
    for finished in range(8):
        verl_global_steps = finished + 1
        assert schedule.actor_update_due(finished, critic_warmup) == (critic_warmup <= verl_global_steps)


def test_warmup_in_words():
    # 0 and 1: the actor trains from the first step; 3: steps 1 and 2 train only the critic
    assert schedule.actor_update_due(0, 0) and schedule.actor_update_due(0, 1)
    assert [schedule.actor_update_due(done, 3) for done in range(4)] == [False, False, True, True]


# ----------------------------------------------------------------------------------- verl's scripts
PATHS = dict(model="/m", train="/d/train.parquet", train2="/d/math_train.parquet", test="/d/test.parquet",
             test2="/d/math_test.parquet")


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_verl_ppo_script_validates_at_its_own_sizes(name):
    """The script as verl ships it (8 GPUs, its batch sizes, its rollout tensor parallelism), paths aside,
    composes and validates."""
    cfg = load(*script_args(SCRIPTS[name], cpu=False, **PATHS))
    assert cfg.algorithm.adv_estimator == "gae" and critic_enabled(cfg)
    assert cfg.critic.model.path == "/m" and cfg.trainer.critic_warmup == 0
    s = role_settings.critic_settings(cfg, "cuda", 100)
    assert s.lr == 1e-5 and s.param_offload is False and s.optimizer_offload is False
    # verl's rule: the critic's mini-batch is the actor's (256 prompts x n responses over 8 ranks)
    assert s.ppo_mini_batch_size_per_gpu == 256 * cfg.actor_rollout_ref.rollout.n // 8


def test_verl_scripts_use_both_layouts():
    assert any(o.startswith("critic.model.fsdp_config.") for o in SCRIPTS["early_2026"]["overrides"])
    assert any(o.startswith("critic.fsdp.") for o in SCRIPTS["current"]["overrides"])


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_verl_ppo_script_validates_at_cpu_sizes(name):
    cfg = load(*script_args(SCRIPTS[name], cpu=True, **PATHS))
    assert cfg.data.train_batch_size == 4 and cfg.trainer.total_training_steps == 2
    assert cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node == 2
