"""verl's example scripts (tests/verl_scripts.py, tests/verl_ppo_scripts.py) pass validation as verl
ships them, only the model and data paths changed, and at CPU sizes."""

from __future__ import annotations

import pytest

from grpo_dist.config.loader import compose, to_typed
from grpo_dist.config.schema import ConfigError
from grpo_dist.config.states import noop_notes
from grpo_dist.config.validate import validate_config
from tests import verl_ppo_scripts, verl_scripts

PATHS = dict(model="builtin:tiny-reverse", train="builtin:reverse/train", train2="builtin:reverse/train",
             test="builtin:reverse/test", test2="builtin:reverse/test", out="/tmp/grpo_dist_verl_script")


def load(overrides, check_paths=True):
    cfg = to_typed(compose(list(overrides)), list(overrides))
    validate_config(cfg, check_paths=check_paths)
    return cfg


@pytest.mark.parametrize("name", sorted(verl_scripts.SCRIPTS))
def test_the_script_validates_unchanged(name):
    script = verl_scripts.SCRIPTS[name]
    refused = script.get("refused")
    cfg = load(verl_scripts.script_args(script, cpu=False, **PATHS) + ([refused[1]] if refused else []))
    steps = [o for o in script["overrides"] if o.startswith("trainer.total_training_steps=")]
    assert cfg.trainer.total_training_steps == (int(steps[-1].split("=")[1]) if steps else None)  # else from epochs
    gpus = [o for o in script["overrides"] if o.startswith("trainer.n_gpus_per_node=")]
    assert cfg.trainer.n_gpus_per_node == int(gpus[-1].split("=")[1])
    tp = [o for o in script["overrides"] if o.startswith(verl_scripts.TP + "=")]
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == (int(tp[-1].split("=")[1]) if tp else 1)


@pytest.mark.parametrize("name", sorted(n for n, s in verl_scripts.SCRIPTS.items() if "refused" in s))
def test_a_refused_script_is_refused_on_its_one_key(name):
    """A script verl runs but this trainer does not is refused with one message naming the key; with that
    one override changed (``refused``) it validates (the test above)."""
    key = verl_scripts.SCRIPTS[name]["refused"][0]
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load(verl_scripts.script_args(verl_scripts.SCRIPTS[name], cpu=False, **PATHS))


def test_the_sapo_script_reaches_the_actor_with_its_gate_temperatures():
    """verl's SAPO script: loss_mode=sapo, its temperatures written under policy_loss with "+" (another
    spelling of the actor's keys here); a temperature that contradicts the actor's key is one message."""
    from grpo_dist.config.role_settings import actor_settings

    args = verl_scripts.script_args(verl_scripts.CURRENT_SAPO, cpu=True, **PATHS)
    s = actor_settings(load(args), "cpu", total_training_steps=2)
    assert (s.loss_mode, s.loss_agg_mode, s.policy_loss.tau_pos, s.policy_loss.tau_neg) == ("sapo", "token-mean", 1.0, 1.05)
    s = actor_settings(load([a.replace("tau_neg=1.05", "tau_neg=1.4") for a in args]), "cpu", total_training_steps=2)
    assert s.policy_loss.tau_neg == 1.4
    with pytest.raises(ConfigError, match=r"tau_neg = 1\.4 is not valid: it contradicts"):
        load([a.replace("tau_neg=1.05", "tau_neg=1.4") for a in args] + ["actor_rollout_ref.actor.tau_neg=1.2"])


def test_the_current_lora_script_trains_all_linear_layers_at_its_rank():
    """verl's current tuning script: rank 32, alpha 32, all-linear adapters; its vLLM limits and offload
    keys are kept as given; what has no effect here is named."""
    from grpo_dist.config.validate import lora_settings

    from grpo_dist.config.driver_plan import single_response_warning

    script = verl_scripts.CURRENT_TUNING_LORA
    cfg = load(verl_scripts.script_args(script, cpu=False, **PATHS))
    # one response per prompt, as verl runs it: the raw score is the advantage, and the run says so
    assert cfg.actor_rollout_ref.rollout.n == 1 and "raw score" in single_response_warning(cfg)
    lora = lora_settings(cfg)
    assert (lora.rank, lora.alpha, lora.target_modules) == (32, 32.0, "all-linear")
    rollout = cfg.actor_rollout_ref.rollout
    assert (rollout.max_num_seqs, rollout.max_model_len, rollout.max_num_batched_tokens) == (512, 1536, 1536)
    assert rollout.enable_chunked_prefill is False and cfg.actor_rollout_ref.actor.fsdp_config.optimizer_offload
    notes = " ".join(noop_notes(cfg))
    assert "layered_summon" in notes and "load_format" in notes


@pytest.mark.parametrize("name", sorted(verl_ppo_scripts.SCRIPTS))
def test_the_ppo_script_validates_with_nothing_left_out(name):
    script = verl_ppo_scripts.SCRIPTS[name]
    assert script["left_out"] == []
    cfg = load(verl_ppo_scripts.script_args(script, cpu=False, **PATHS))
    assert cfg.trainer.total_training_steps is None and cfg.algorithm.adv_estimator == "gae"


@pytest.mark.parametrize("name", sorted(verl_scripts.SCRIPTS))
def test_the_script_validates_at_cpu_sizes(name):
    cfg = load(verl_scripts.script_args(verl_scripts.SCRIPTS[name], cpu=True, **PATHS))
    assert cfg.data.train_batch_size == 4 and cfg.trainer.total_training_steps == 2
    assert cfg.ray_kwargs.ray_init.runtime_env.py_executable is None


def test_what_the_scripts_set_has_an_effect_or_is_said_to_have_none():
    """The GSPO script's knobs that do nothing here are named at start-up; the current scripts' uv
    launcher reaches Ray."""
    from grpo_dist.config.launch import launch_plan

    gspo = load(verl_scripts.script_args(verl_scripts.EARLY_GSPO, cpu=False, **PATHS))
    notes = " ".join(noop_notes(gspo))
    assert "entropy_checkpointing" in notes and "ulysses" not in notes  # ulysses=1 is verl's default: no note
    grpo = load(verl_scripts.script_args(verl_scripts.CURRENT_GRPO, cpu=False, **PATHS))
    assert launch_plan(grpo).ray_init["runtime_env"]["py_executable"].startswith("uv ")
    assert grpo.actor_rollout_ref.ref.log_prob_use_dynamic_bsz and grpo.trainer.balance_batch


def test_the_fully_async_script_runs_its_schedule():
    """verl's fully asynchronous DAPO script, only the module name and paths changed: a step trains a chunk of
    require_batches 4 x 32 prompts (its data.train_batch_size=0 is not used), 51200 prompts make 400 steps, the
    weights are synced every 4 steps and at most floor(1.1 x 4) = 4 chunks are generated ahead."""
    from grpo_dist.config.fully_async import fully_async_settings
    from grpo_dist.config.spec import resolve

    cfg = load(verl_scripts.script_args(verl_scripts.FULLY_ASYNC_DAPO, cpu=False, **PATHS))
    fa = fully_async_settings(cfg)
    assert (fa.chunk_prompts, fa.trigger, fa.max_ahead, fa.old_from_rollout) == (128, 4, 4, True)
    assert fa.partial_rollout and fa.partial_off is None  # through its agent loops (rollout.mode=async)
    plan = resolve(cfg).driver_plan("cuda", 17000)
    assert plan.total_steps == 400 and plan.test_freq == 40 and not plan.one_step_off
    assert cfg.data.train_batch_size == 128


def test_the_v1_separate_async_script_runs_its_schedule():
    """verl's v1 separate_async script, only the module name and paths changed: 4 standalone rollout GPUs (two
    tensor-parallel engines) beside 4 training ones; a step trains its batch of parameter_sync_step 4 x 1 prompts
    and syncs, with one batch generated beyond it (num_warmup_batches 1), partial rollouts, and the actor's old
    log-probs (bypass_mode=False); the weights go by broadcast (its nccl checkpoint engine) and the transfer queue
    is named as having no effect."""
    from grpo_dist.config.fully_async import fully_async_settings
    from grpo_dist.config.roles import ROLLOUT_POOL, pool
    from grpo_dist.config.spec import resolve

    cfg = load(verl_scripts.script_args(verl_scripts.V1_SEPARATE_ASYNC, cpu=False, **PATHS))
    fa = fully_async_settings(cfg)
    assert (fa.chunk_prompts, fa.trigger, fa.max_ahead, fa.old_from_rollout, fa.age_limit) == (4, 1, 2, False, 8)
    assert fa.partial_rollout and fa.spelling == "trainer.v1.separate_async"
    rollout = pool(cfg, ROLLOUT_POOL)
    assert (rollout.nnodes, rollout.per_node, rollout.keys) == (1, 4, "actor_rollout_ref.rollout")
    plan = resolve(cfg).driver_plan("cuda", 7000)
    assert plan.total_steps == 2 and not plan.one_step_off and plan.old_logp_forward
    assert cfg.data.train_batch_size == 4 and plan.shape.num_mini_batches == 4
    notes = " ".join(noop_notes(cfg))
    assert "transfer_queue.enable" in notes and "checkpoint_engine.backend" not in notes
    assert plan.sync_backend == "nccl"


def test_the_torch_profile_script_profiles_rank_0_of_the_actor_whole_and_of_the_rollout_per_call():
    from grpo_dist.config.profiling import profile_plan

    plan = profile_plan(load(verl_scripts.script_args(verl_scripts.SCRIPTS["torch_profile"], cpu=False, **PATHS)))
    assert plan.steps == (1, 2) and not plan.continuous and sorted(plan.roles) == ["actor", "rollout"]
    actor, rollout = plan.roles["actor"], plan.roles["rollout"]
    assert actor.ranks == rollout.ranks == (0,) and actor.contents == rollout.contents == ("cpu", "cuda")
    assert not actor.discrete and rollout.discrete
    assert actor.save_path == rollout.save_path == PATHS["out"] + "/profile_data"
    assert "(actor: one trace per step; rollout: one trace per call per process)" in plan.line()
