"""verl's keys in their three states: honoured, accepted with no effect, refused; unknown keys added
with + / ++; verl's spellings and derived defaults; the keys that used to be read nowhere."""

from __future__ import annotations

import pytest

from grpo_dist.config.fields import Honoured, NoOp, Refused
from grpo_dist.config.schema import GRPOConfig
from grpo_dist.config.spec import resolve
from grpo_dist.config.states import leaf_states, noop_notes, setting
from grpo_dist.config import role_settings
from grpo_dist.config.driver_plan import driver_plan
from grpo_dist.config.launch import launch_plan
from tests.configs import cfg_of as load, refused




# ---- every key has a state, and the generated reference lists it ---------------------------------------
def test_every_key_has_exactly_one_state_and_the_reference_lists_it():
    from grpo_dist.config.docgen import render_doc

    doc = render_doc()
    kinds = {}
    for key, _f, state in leaf_states(GRPOConfig):
        assert isinstance(state, (Honoured, NoOp, Refused)), key
        kinds[state.kind] = kinds.get(state.kind, 0) + 1
        line = next(ln for ln in doc.splitlines() if ln.startswith(f"| `{key}` |"))
        assert ("honoured" in line) == (state.kind == "honoured") and ("no effect" in line) == (state.kind == "no-op"), key
    assert kinds["honoured"] > 150 and kinds["no-op"] > 300 and kinds["refused"] > 40, kinds


def _state_of_verl_key(key: str, table: dict) -> str | None:
    """The state a verl key name gets here: its own leaf's, or that of the mapping it is an entry of, or (a
    section verl fills by interpolation, e.g. rollout.mtp) the states of the leaves under it; None: no state."""
    parts = key.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in table:
            return table[".".join(parts[:i])].kind
    under = {state.kind for k, state in table.items() if k.startswith(key + ".")}
    return "/".join(sorted(under)) or None


@pytest.mark.parametrize("layout", ["FSDP", "MEGATRON_ONLY"])
def test_every_key_of_verls_generated_trainer_configs_has_a_state(layout):
    from tests import verl_keys

    table = {key: state for key, _f, state in leaf_states(GRPOConfig)}
    names = getattr(verl_keys, layout)
    assert len(names) > 100
    missing = [key for key in names if _state_of_verl_key(key, table) is None]
    assert missing == [], f"verl keys with no state here (refused only as unknown keys): {missing}"


@pytest.mark.parametrize("key,kind", [
    ("reward_model.launch_reward_fn_async", "no-op"), ("reward_model.sandbox_fusion.url", "refused"),
    ("reward_model.sandbox_fusion.max_concurrent", "no-op"), ("reward_model.sandbox_fusion.memory_limit_mb", "no-op"),
    ("reward_model.reward_loop_source", "no-op"), ("reward_model.reward_loop_module_path", "refused"),
    ("reward_model.reward_loop_class_name", "refused"), ("reward_model.profiler.enable", "honoured"),
    ("reward_model.profiler.tool", "honoured"), ("reward_model.profiler.finish_hook_cmd", "refused"), ("reward_model.ulysses_sequence_parallel_size", "no-op"),
    ("reward_model.model.external_lib", "honoured"), ("reward_model.model.use_shm", "no-op"),
    ("reward_model.model.use_fused_kernels", "no-op"),
    ("global_profiler.global_tool_config.nsys.controller_nsight_options.trace", "no-op"),
    ("global_profiler.global_tool_config.nsys.worker_nsight_options.capture-range", "no-op"),
    ("actor_rollout_ref.actor.megatron.tensor_model_parallel_size", "no-op"), ("critic.optim.lr_decay_style", "no-op"),
])
def test_verls_reward_model_and_profiler_keys_have_the_state_of_their_neighbours(key, kind):
    table = {k: state for k, _f, state in leaf_states(GRPOConfig)}
    assert _state_of_verl_key(key, table) == kind


@pytest.mark.parametrize("override,needles", [
    ("reward_model.reward_loop_source=importlib", ["reward_loop_source", "'importlib'", "custom_reward_function.path"]),
    ("reward_model.reward_loop_module_path=/x.py", ["reward_loop_module_path", "custom_reward_function.path"]),
    ("reward_model.sandbox_fusion.url=http://x", ["reward_model.sandbox_fusion.url", "custom_reward_function"]),
    ("reward_model.profiler.finish_hook_cmd=ls", ["reward_model.profiler.finish_hook_cmd", "save_path"]),
    ("critic.nccl_timeout=60", ["critic.nccl_timeout", "actor_rollout_ref.nccl_timeout"]),
])
def test_verls_reward_model_keys_refuse_with_what_to_use_instead(override, needles):
    msg = refused(override)
    assert msg.startswith(override.split("=")[0])
    for needle in needles:
        assert needle in msg, (needle, msg)


def test_verls_reward_model_and_megatron_knobs_are_accepted_and_noted():
    cfg = load("reward_model.launch_reward_fn_async=true", "reward_model.sandbox_fusion.max_concurrent=8",
               "reward_model.ulysses_sequence_parallel_size=2", "reward_model.model.use_shm=true",
               "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2", "critic.optim.lr_decay_style=cosine",
               "actor_rollout_ref.nccl_timeout=900")
    notes = noop_notes(cfg)
    assert len(notes) == 6, notes
    assert any(n.startswith("reward_model.launch_reward_fn_async") and "scores" in n for n in notes)
    assert any(n.startswith("actor_rollout_ref.actor.megatron") and "Megatron" in n for n in notes)
    assert cfg.critic.nccl_timeout == 900 and cfg.reward_model.nccl_timeout == 900  # verl's copies follow the one timeout


def test_states_that_accept_only_the_default_have_plain_defaults():
    """A refused key is accepted at its default: that default must be a value, not an interpolation."""
    for key, f, state in leaf_states(GRPOConfig):
        if isinstance(state, Refused) and state.accept is None:
            assert not (isinstance(f.default, str) and f.default.startswith("${")), key


# ---- refused features ------------------------------------------------------------------------------------
@pytest.mark.parametrize("override,needles", [
    # LoRA of the policy and of the value model is built (tests/unit/test_lora_config.py,
    # tests/unit/test_critic_lora_config.py); other adapter types are not
    ("critic.model.lora.type=loha", ["lora.type", "'loha'", "LoRA"]),
    ("trainer.v1.trainer_mode=colocate_async", ["trainer_mode", "'colocate_async'", "separate_async"]),
    ("actor_rollout_ref.rollout.name=sglang", ["rollout.name", "'sglang'", "vllm"]),
    ("global_profiler.tool=nsys", ["global_profiler.tool", "'nsys'", "tool=torch"]),
    ("actor_rollout_ref.actor.profiler.tool=npu", ["actor.profiler.tool", "'npu'", "torch"]),
    ("algorithm.use_pf_ppo=true", ["use_pf_ppo", "PF-PPO"]),
    ("sandbox_fusion.url=http://x", ["sandbox_fusion.url", "custom_reward_function"]),
    ("reward.sandbox_fusion.url=http://x", ["reward.sandbox_fusion.url"]),
    ("distillation.enabled=true", ["distillation.enabled", "distillation"]),
    ("trainer.v1.separate_async.hybrid_rollout.enable_switch=true", ["enable_switch", "True", "rollout's own devices"]),
    ("trainer.v1.sampler.custom_sampler.path=/x.py", ["custom_sampler.path", "custom v1 sampler"]),
    ("skip.rollout.enable=true", ["skip.rollout.enable"]),
    ("actor_rollout_ref.model.mtp.enable=true", ["mtp.enable"]),
    ("actor_rollout_ref.actor.fsdp_config.qat.enable=true", ["qat.enable"]),
    ("actor_rollout_ref.actor.fsdp_config.turbo_config.distributed.fsdp_plan.fsdp_implementation=turbo",
     ["fsdp_implementation", "'turbo'", "native"]),
    ("actor_rollout_ref.actor.fsdp_config.full_determinism=true", ["full_determinism"]),
    ("data.custom_cls.path=/x.py", ["data.custom_cls.path", "row format"]),
    ("actor_rollout_ref.rollout.nnodes=2", ["rollout.nnodes", "standalone rollout", "hybrid_engine=false"]),
    ("actor_rollout_ref.actor.checkpoint.strict=false", ["checkpoint.strict", "False"]),
    ("actor_rollout_ref.rollout.logprobs_mode=raw_logprobs", ["logprobs_mode", "'raw_logprobs'", "processed_logprobs"]),
    ("actor_rollout_ref.actor.rollout_n=3", ["actor.rollout_n", "3", "actor_rollout_ref.rollout.n"]),
])
def test_a_refused_value_names_the_key_the_value_and_what_to_use(override, needles):
    msg = refused(override)
    assert msg.startswith(override.split("=")[0])
    for needle in needles:
        assert needle in msg, (needle, msg)


def test_the_off_values_of_refused_features_are_accepted():
    load("actor_rollout_ref.model.lora_rank=0", "actor_rollout_ref.hybrid_engine=true", "global_profiler.tool=null",
         "actor_rollout_ref.actor.profiler.enable=false", "algorithm.use_pf_ppo=false", "trainer.v1.trainer_mode=sync",
         "actor_rollout_ref.actor.rollout_n=8", "trainer.max_critic_ckpt_to_keep=null")


# ---- no effect here -------------------------------------------------------------------------------------
def test_knobs_with_no_effect_are_accepted_at_any_value_and_noted_once():
    cfg = load("actor_rollout_ref.actor.use_torch_compile=false", "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
               "actor_rollout_ref.actor.fsdp_config.forward_prefetch=true", "actor_rollout_ref.actor.use_fused_kernels=true",
               "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true",
               "actor_rollout_ref.actor.profiler.tool_config.torch.schedule.active=2",
               "critic.model.lora.dtype=bfloat16", "trainer.use_legacy_worker_impl=disable")
    notes = noop_notes(cfg)
    assert len(notes) == 8, notes
    ulysses = next(n for n in notes if "ulysses" in n)
    assert "no effect here" in ulysses and "data-parallel" in ulysses
    assert launch_plan(cfg).noop_notes == tuple(notes)
    assert noop_notes(load()) == []


def test_ulysses_does_not_change_the_data_parallel_size():
    """verl's data-parallel size is ranks / sp; here every rank is data-parallel (same global mini-batch)."""
    base = role_settings.actor_settings(load("trainer.n_gpus_per_node=2", "trainer.device=cpu"), "cpu", 10)
    sp = role_settings.actor_settings(load("trainer.n_gpus_per_node=2", "trainer.device=cpu",
                                   "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"), "cpu", 10)
    assert base == sp and base.ppo_mini_batch_size_per_gpu == 16 * 8 // 2


# ---- unknown keys added with + / ++ ----------------------------------------------------------------------
@pytest.mark.parametrize("override", ["+trainer.newkey=3", "++actor_rollout_ref.rollout.no_such_knob=True",
                                      "+actor_rollout_ref.actor.optim.clip_gard=1.0"])
def test_an_added_key_the_schema_lacks_is_refused(override):
    msg = refused(override)
    assert "unknown config key" in msg and override.lstrip("+").split("=")[0] in msg


def test_added_keys_the_schema_has_or_entries_of_mappings_are_fine():
    cfg = load("+actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=bf16",
               "++trainer.total_epochs=3", "+critic.model.override_config.attn_implementation=eager",
               "+ray_kwargs.ray_init.runtime_env.env_vars.MY_FLAG=1")
    assert role_settings.actor_settings(cfg, "cpu", 10).reduce_dtype == "bfloat16"
    assert launch_plan(cfg).ray_init["runtime_env"]["env_vars"] == {"MY_FLAG": "1"}


# ---- verl's own values and spellings ---------------------------------------------------------------------
def test_verls_default_values_are_accepted():
    cfg = load("actor_rollout_ref.actor.fsdp_config.model_dtype=fp32", "actor_rollout_ref.actor.fsdp_config.dtype=bf16",
               "data.seed=null", "actor_rollout_ref.ref.fsdp_config.model_dtype=fp32", "actor_rollout_ref.actor.strategy=fsdp",
               "actor_rollout_ref.rollout.load_format=dummy", "data.return_raw_chat=true")
    s = role_settings.actor_settings(cfg, "cpu", 10)
    assert (s.model_dtype, s.param_dtype) == ("float32", "bfloat16")


@pytest.mark.parametrize("new,old,value,attr", [
    ("actor_rollout_ref.actor.optim.clip_grad", "actor_rollout_ref.actor.grad_clip", 0.3, "grad_clip"),
    ("actor_rollout_ref.actor.optim.warmup_style", "actor_rollout_ref.actor.optim.lr_scheduler_type", "cosine",
     "lr_scheduler_type"),
])
def test_two_spellings_of_one_setting(new, old, value, attr):
    assert getattr(role_settings.actor_settings(load(f"{new}={value}"), "cpu", 10), attr) == value
    assert getattr(role_settings.actor_settings(load(f"{old}={value}"), "cpu", 10), attr) == value
    other = 0.7 if isinstance(value, float) else "constant"
    if other != "constant":  # constant is the default: not a contradiction
        msg = refused(f"{new}={value}", f"{old}={other}")
        assert new in msg and old in msg and "spelling" in msg


def test_the_current_reward_layout_maps_onto_the_existing_keys(tmp_path):
    f = tmp_path / "r.py"
    f.write_text("def my_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    cfg = load(f"reward.custom_reward_function.path={f}", "reward.custom_reward_function.name=my_score", "reward.num_workers=3",
               "reward.reward_manager.name=prime")
    from grpo_dist.trainer.roles import ROLES, RoleContext

    kwargs = next(r for r in ROLES if r.name == "reward").init_kwargs(RoleContext(resolve(cfg), "cpu", "/m", "/t", 10, 1, 1), 0)
    assert (kwargs["custom_path"], kwargs["custom_name"], kwargs["num_workers"]) == (str(f), "my_score", 3)
    assert launch_plan(cfg).custom_reward == (str(f), "my_score")
    msg = refused(f"reward.custom_reward_function.path={f}", "custom_reward_function.path=/other.py")
    assert "reward.custom_reward_function.path" in msg or "custom_reward_function.path" in msg


def test_global_micro_batch_sizes_are_divided_by_the_ranks():
    cfg = load("trainer.n_gpus_per_node=2", "trainer.device=cpu", "actor_rollout_ref.actor.ppo_micro_batch_size=8",
               "actor_rollout_ref.rollout.log_prob_micro_batch_size=16", "actor_rollout_ref.ref.log_prob_micro_batch_size=4")
    assert role_settings.actor_settings(cfg, "cpu", 10).ppo_micro_batch_size_per_gpu == 4
    p = driver_plan(resolve(cfg), "cpu", 4096)
    assert p.old_logp_batching == (8, None) and p.ref_logp_batching == (2, None)
    msg = refused("actor_rollout_ref.actor.ppo_micro_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4")
    assert "ppo_micro_batch_size" in msg and "set only one" in msg


# ---- derived defaults follow verl ------------------------------------------------------------------------
def test_log_prob_batching_of_reference_and_rollout_follows_the_actor():
    cfg = load("actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=3000")
    for section in (cfg.actor_rollout_ref.ref, cfg.actor_rollout_ref.rollout):
        assert section.log_prob_use_dynamic_bsz is True and section.log_prob_max_token_len_per_gpu == 3000
    assert driver_plan(resolve(cfg), "cpu", 4096).ref_logp_batching == (None, 3000)
    cfg = load("actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=false")
    assert driver_plan(resolve(cfg), "cpu", 4096).ref_logp_batching == (None, None)


def test_steps_come_from_the_epochs_unless_set():
    """verl: total_training_steps null, the steps are total_epochs x steps per epoch. The no-argument
    job keeps its own length (the embedded task's 60 steps)."""
    from grpo_dist.tasks.reverse import DEFAULT_JOB_STEPS

    assert load().trainer.total_training_steps == DEFAULT_JOB_STEPS == 60
    assert driver_plan(resolve(load()), "cpu", 4096).total_steps == 60
    two = load("trainer.total_epochs=2")
    assert two.trainer.total_training_steps is None
    assert driver_plan(resolve(two), "cpu", 4096).total_steps == 2 * (4096 // 32)
    own_data = load("data.train_files=/data/train.parquet")
    assert driver_plan(resolve(own_data), "cpu", 1000).total_steps == 30 * (1000 // 32)
    assert driver_plan(resolve(load("trainer.total_epochs=2", "trainer.total_training_steps=7")), "cpu", 4096).total_steps == 7


# ---- keys that used to be read nowhere --------------------------------------------------------------------
def test_reward_fn_key_selects_the_column_handed_to_the_reward_function():
    from grpo_dist.data.dataset import PromptDataset
    from grpo_dist.data.readers import DataError
    from grpo_dist.rollout.assemble import prompt_batch
    from grpo_dist.data.dataset import collate_prompts

    class Tok:
        chat_template = None
        eos_token_id = pad_token_id = 0

        def encode(self, text, add_special_tokens=True):
            return [1] * len(text)

    rows = [{"prompt": "abc", "data_source": "metrics/name", "scorer": "openai/gsm8k",
             "reward_model": {"ground_truth": "1"}}]
    ds = PromptDataset(rows, Tok(), max_prompt_length=8, filter_overlong_prompts=False, truncation="error",
                       reward_fn_key="scorer")
    batch = prompt_batch(collate_prompts([ds[0]], 0, 8), "u")
    assert list(batch["reward_source"]) == ["openai/gsm8k"] and list(batch["data_source"]) == ["metrics/name"]
    with pytest.raises(DataError, match="reward_fn_key"):
        PromptDataset(rows, Tok(), max_prompt_length=8, filter_overlong_prompts=False, truncation="error",
                      reward_fn_key="missing")
    assert launch_plan(load("data.reward_fn_key=scorer")).dataset["reward_fn_key"] == "scorer"


def test_actor_checkpoint_contents():
    s = role_settings.actor_settings(load("actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]"), "cpu", 10)
    assert s.save_contents == s.load_contents == ("model",)  # load follows save; hf_model is an export
    cfg = load("actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra]",
               "actor_rollout_ref.actor.checkpoint.load_contents=[model]")
    assert role_settings.actor_settings(cfg, "cpu", 10).load_contents == ("model",)
    old = load("actor_rollout_ref.actor.checkpoint.contents=[model,optimizer,extra,hf_model]")  # the former spelling
    assert driver_plan(resolve(old), "cpu", 4096).export_hf_every_checkpoint
    assert role_settings.actor_settings(old, "cpu", 10).save_contents == ("model", "optimizer", "extra")
    assert "lacks model" in refused("actor_rollout_ref.actor.checkpoint.save_contents=[optimizer,extra]")
    assert "lacks model" in refused("actor_rollout_ref.actor.checkpoint.load_contents=[optimizer]")
    assert "'weights'" in refused("actor_rollout_ref.actor.checkpoint.save_contents=[model,weights]")


def test_shuffle_is_global_seeded_and_the_same_for_any_rank_count():
    from grpo_dist.training.micro_batches import epoch_orders, update_layout

    orders = epoch_orders(16, epochs=2, seed=42)
    assert orders == epoch_orders(16, epochs=2, seed=42) and orders != epoch_orders(16, epochs=2, seed=7)
    assert all(sorted(o) == list(range(16)) for o in orders) and orders[0] != orders[1]
    lengths = [3, 9, 4, 7, 1, 8, 2, 6, 5, 5, 3, 9, 4, 7, 1, 8]
    for balance in (False, True):
        one, _ = update_layout(lengths, num_mini_batches=2, world_size=1, balance=balance, orders=orders)
        four, _ = update_layout(lengths, num_mini_batches=2, world_size=4, balance=balance, orders=orders)
        # (epoch, mini-batch) k holds the same rows on 1 rank as over 4 ranks, and they come from the permutation
        for e in range(2):
            for k in range(2):
                whole = set(one[0][e * 16 + k * 8:e * 16 + (k + 1) * 8])
                shards = set().union(*(set(r[e * 4 + k * 2:e * 4 + (k + 1) * 2]) for r in four))
                assert whole == shards == set(orders[e][k * 8:(k + 1) * 8])
    p = driver_plan(resolve(load("actor_rollout_ref.actor.shuffle=true", "actor_rollout_ref.actor.ppo_epochs=2",
                                 "actor_rollout_ref.actor.data_loader_seed=5")), "cpu", 4096)
    assert p.actor_shuffle == (2, 5) and p.critic_shuffle == (2, 42)
    assert role_settings.actor_settings(load("actor_rollout_ref.actor.shuffle=true"), "cpu", 10).epochs_in_rows


def test_nccl_timeout_reaches_every_fsdp_role():
    from grpo_dist.trainer.roles import RoleContext, active_roles

    cfg = load("algorithm.adv_estimator=gae", "actor_rollout_ref.nccl_timeout=1200")
    ctx = RoleContext(resolve(cfg), "cpu", "/m", "/t", 10, 1, 1)
    got = {r.name: r.model(ctx)["timeout_s"] for r in active_roles(ctx.spec) if r.model is not None}
    assert got == {"actor": 1200.0, "reference": 1200.0, "critic": 1200.0}


def test_launch_plan_reads_tokenizer_template_samples_and_ray():
    cfg = load("actor_rollout_ref.model.tokenizer_path=/tok", "actor_rollout_ref.model.custom_chat_template='{{x}}'",
               "+data.apply_chat_template_kwargs.enable_thinking=false", "data.train_max_samples=100",
               "ray_kwargs.ray_init.runtime_env.py_executable=uv run", "ray_kwargs.timeline_json_file=/tmp/t.json",
               "data.trust_remote_code=true")
    lp = launch_plan(cfg)
    assert (lp.tokenizer, lp.chat_template, lp.train_max_samples, lp.timeline_file) == ("/tok", "{{x}}", 100, "/tmp/t.json")
    assert lp.dataset["chat_template_kwargs"] == {"enable_thinking": False} and lp.tokenizer_trust_remote_code
    assert lp.ray_init["runtime_env"]["py_executable"] == "uv run"
    assert launch_plan(load("data.tokenizer=/a", "actor_rollout_ref.model.tokenizer_path=/b")).tokenizer == "/a"


def test_max_samples_take_a_seeded_choice_or_the_first_rows():
    from grpo_dist.data.dataset import select_rows
    from grpo_dist.data.rows import Rows

    rows = Rows([{"i": i} for i in range(10)], [("f", i) for i in range(10)])
    first = select_rows(rows, 3, seed=1, randomly=False)
    assert [r["i"] for r in first] == [0, 1, 2] and first.origins == [("f", 0), ("f", 1), ("f", 2)]
    a, b = select_rows(rows, 4, seed=1, randomly=True), select_rows(rows, 4, seed=1, randomly=True)
    assert [r["i"] for r in a] == [r["i"] for r in b] and len({r["i"] for r in a}) == 4
    assert select_rows(rows, -1, seed=1, randomly=True) is rows


def test_a_fresh_data_seed_is_kept_for_resume():
    from grpo_dist.data.sampler import EpochSampler

    a = EpochSampler(10, 2, seed=None, shuffle=True)
    first = [next(a) for _ in range(3)]
    state = a.state_dict()
    b = EpochSampler(10, 2, seed=None, shuffle=True)
    b.load_state_dict(state)
    assert b.seed == a.seed and next(b) == next(a)
    assert first  # drawn with the fresh seed
    with pytest.raises(ValueError, match="seed"):
        EpochSampler(10, 2, seed=3, shuffle=True).load_state_dict(state)


def test_chat_template_kwargs_reach_the_template():
    from grpo_dist.data.dataset import tokenize_prompt

    class Tok:
        chat_template = "x"

        def apply_chat_template(self, messages, add_generation_prompt, tokenize, **kw):
            return "thinking" if kw.get("enable_thinking", True) else "plain"

        def encode(self, text, add_special_tokens):
            return [len(text)]

    msgs = [{"role": "user", "content": "hi"}]
    assert tokenize_prompt(Tok(), msgs) == [8] and tokenize_prompt(Tok(), msgs, {"enable_thinking": False}) == [5]


def test_setting_reads_the_spelling_that_was_changed():
    cfg = load("reward.num_workers=4")
    assert setting(cfg, "reward_model.num_workers") == 4 and setting(load(), "reward_model.num_workers") == 2
