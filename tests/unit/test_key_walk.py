"""No honoured key goes unread: every key whose state is "honoured" is read while a run's plans and
every role's worker settings are built, over a matrix of configurations; a planted unread key fails.

Keys with no effect or refused are enforced by their state (tests/unit/test_key_states.py); what is
checked here is that "honoured" is never a claim without code behind it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest

from grpo_dist.config.fields import F, NoOp, Refused, S
from grpo_dist.config.keywalk import recording, unread_honoured_keys
from grpo_dist.config.loader import compose, to_typed
from grpo_dist.config.schema import GRPOConfig
from grpo_dist.config.validate import validate_config

MATRIX = {
    "grpo": [],
    "ppo_critic": ["algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive",
                   "actor_rollout_ref.actor.use_kl_loss=false", "trainer.critic_warmup=2", "algorithm.use_pf_ppo=true",
                   "actor_rollout_ref.actor.shuffle=true", "critic.ppo_micro_batch_size=2",
                   "critic.checkpoint.save_contents=[model,optimizer,extra,hf_model]"],
    "dynamic_bsz": ["actor_rollout_ref.actor.use_dynamic_bsz=true", "algorithm.adv_estimator=gae",
                    "actor_rollout_ref.rollout.calculate_log_probs=true", "actor_rollout_ref.actor.ppo_micro_batch_size=4"],
    "dapo": ["algorithm.filter_groups.enable=true", "data.gen_batch_size=48",
             "reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=4",
             "custom_reward_function.path=" + __file__, "actor_rollout_ref.rollout.name=hf",
             "actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]",
             "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=float32"],
    "bypass": ["algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.rollout_is=token",
               "actor_rollout_ref.rollout.log_prob_micro_batch_size=8", "actor_rollout_ref.ref.log_prob_micro_batch_size=8",
               "reward_model.reward_kwargs.overlong_buffer_cfg.enable=true", "reward_model.reward_kwargs.overlong_buffer_cfg.len=4"],
    "rm_outcome": ["reward_model.enable=true", "reward_model.model.path=/rm", "reward_model.model.input_tokenizer=null",
                   "reward_model.combine=weighted", "reward_model.micro_batch_size=8",
                   "reward_model.model.override_config.attn_implementation=eager"],
    "rm_process_iterative": ["reward.reward_model.enable=true", "reward.reward_model.model_path=/rm",
                             "reward_model.model.input_tokenizer=null", "reward_model.process.enable=true",
                             "algorithm.adv_estimator=grpo_process", "reward_model.iterative.enable=true",
                             "reward_model.use_dynamic_bsz=true"],
    "lora": ["actor_rollout_ref.model.lora.rank=8", "actor_rollout_ref.model.lora.dropout=0.05",
             "actor_rollout_ref.actor.use_kl_loss=true"],
    "agents": ["actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.multi_turn.enable=true",
               "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3"],
    "one_step_off": ["actor_rollout_ref.hybrid_engine=false", "trainer.n_gpus_per_node=1", "rollout.n_gpus_per_node=1",
                     "rollout.nnodes=1"],
    "fully_async": ["actor_rollout_ref.hybrid_engine=false", "trainer.n_gpus_per_node=1", "rollout.n_gpus_per_node=1",
                    "async_training.staleness_threshold=0.5", "async_training.trigger_parameter_sync_step=2",
                    "async_training.require_batches=2", "rollout.total_rollout_steps=256", "rollout.test_freq=2"],
    "v1_separate_async": ["trainer.v1.trainer_mode=separate_async", "trainer.n_gpus_per_node=1",
                          "actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=1",
                          "trainer.v1.separate_async.parameter_sync_step=2", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
                          "data.train_batch_size=32", "trainer.v1.separate_async.num_warmup_batches=2"],
    "profiler": ["global_profiler.tool=torch", "global_profiler.steps=[1,3]", "algorithm.adv_estimator=gae",
                 "reward_model.enable=true", "reward_model.model.path=/rm", "reward_model.model.input_tokenizer=null"]
                + [f"{role}.profiler.enable=true" for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref",
                                                               "actor_rollout_ref.rollout", "critic", "reward_model")],
    "epochs": ["trainer.total_epochs=2", "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
               "actor_rollout_ref.rollout.val_kwargs.temperature=0.7", "actor_rollout_ref.rollout.val_kwargs.n=2",
               "reward.reward_kwargs.overlong_buffer_cfg.enable=true", "reward.reward_kwargs.overlong_buffer_cfg.len=4"],
}


def load(overrides):
    cfg = to_typed(compose(list(overrides)), list(overrides))
    validate_config(cfg, check_paths=False)
    return cfg


def build_everything(cfg, device: str) -> None:
    """Everything a run builds from its configuration: the run specification (with the launch plan: files,
    tokenizer, dataset, Ray, and the agent loops' settings), the driver's plan, the CPU checks, and every active role's constructor and
    model arguments."""
    from grpo_dist.config.spec import resolve
    from grpo_dist.trainer import roles

    spec = resolve(cfg)
    spec.agent_settings  # what the rollout replicas' agent loops get (None in sync mode)
    driver = spec.driver_plan(device, train_size=4096)
    spec.check_cpu_ranks(2)
    ctx = roles.RoleContext(spec, device, "/model", "/tokenizer", driver.total_steps, driver.shape.world_size, 1)
    roles.Workers(ctx)  # placement and call deadlines (nothing starts until .start())
    for role in roles.active_roles(spec):
        role.init_kwargs(ctx, 0)
        if role.model is not None:
            role.model(ctx)


def builds():
    for name, overrides in MATRIX.items():
        cfg = load(overrides)  # composed once; each device's build gets its own copy
        for device in ("cpu", "cuda"):
            yield copy.deepcopy(cfg), lambda cfg, device=device: build_everything(cfg, device)


def test_every_honoured_key_is_read_when_a_run_is_built():
    unread = unread_honoured_keys(GRPOConfig, builds())
    assert not unread, ("honoured keys that no plan or worker setting reads (use them, or give them the state "
                        f"they have: no effect or refused): {unread}")


def test_validation_checks_do_not_count_as_reads():
    """The state checks read every key; they must not make an unused key look used."""
    cfg = load([])
    with recording(cfg) as seen:
        validate_config(cfg, check_paths=False)
    assert "distillation.enabled" not in seen and "actor_rollout_ref.model.lora_rank" not in seen


# ---- the walk itself, on a synthetic schema --------------------------------------------------------
@dataclass
class _Inner:
    used: int = F(1, "read by the builder")
    planted: int = F(2, "honoured, but nothing reads it")
    derived: int = F("${inner.used}", "takes its default from inner.used")
    quiet: int = F(3, "no effect", NoOp("nothing to do"))


@dataclass
class _Synthetic:
    inner: _Inner = S(_Inner, "a section")
    switch: bool = F(False, "a refused feature", Refused("not built"))
    top: str = F("x", "read by the builder")


def test_a_planted_unread_honoured_key_is_found():
    cfg = _Synthetic()
    cfg.inner.derived = 1

    def build(c):
        return c.top, c.inner.derived  # inner.used counts through derived's ${inner.used}

    assert unread_honoured_keys(_Synthetic, [(cfg, build)]) == ["inner.planted"]
    assert unread_honoured_keys(_Synthetic, [(cfg, lambda c: (c.top, c.inner.derived, c.inner.planted))]) == []


def test_recording_sees_reads_through_objects_handed_around():
    cfg = _Synthetic()

    def build(c):
        section = c.inner
        return getattr(section, "used")

    with recording(cfg) as seen:
        build(cfg)
    assert seen == {"inner", "inner.used"}
    assert type(cfg.inner).__getattribute__ is object.__getattribute__  # the hook is gone afterwards


@pytest.mark.parametrize("name", sorted(MATRIX))
def test_the_matrix_configurations_validate(name):
    load(MATRIX[name])
