"""verl's rollout keys around the engine: ``rollout.mode=async`` (agent loops; their keys in detail:
tests/unit/test_agent_config.py), the vLLM pass-through keys
(``enable_chunked_prefill``, ``engine_kwargs.vllm``), and ``trainer.val_only``'s rules."""

from __future__ import annotations

import re
import sys
import types

import pytest

from grpo_dist.config.schema import ConfigError
from grpo_dist.config import engine, sampling
from grpo_dist.config.spec import resolve
from grpo_dist.trainer import roles
from tests.configs import cfg_of

R = "actor_rollout_ref.rollout."


# ------------------------------------------------------------------------------ mode=async
def worker_inputs(cfg) -> dict:
    """Everything the rollout workers are given for a step: their constructor arguments (every rank)
    and the sampling settings of training, validation and a baseline rollout."""
    ctx = roles.RoleContext(resolve(cfg), "cpu", "/m", "/m", 10, 2, 1)
    return dict(ranks=[roles._rollout_kwargs(ctx, r) for r in range(2)],
                train=sampling.train_sampling(cfg, seed=123), val=sampling.val_sampling(cfg),
                baseline=sampling.baseline_sampling(cfg), engine=engine.engine_kwargs(cfg, "/m", "cuda"))


@pytest.mark.parametrize("extra", [[], [R + "name=hf"], [R + "calculate_log_probs=true", R + "n=4"]])
def test_async_mode_samples_with_the_settings_of_sync(extra):
    """An agent loop calls the same engine with the same sampling settings and engine arguments as sync
    generation; only who calls it (and how many turns) differs."""
    sync = cfg_of(R + "mode=sync", "trainer.n_gpus_per_node=2", *extra)
    asyn = cfg_of(R + "mode=async", "trainer.n_gpus_per_node=2", *extra)
    inputs = [worker_inputs(c) for c in (sync, asyn)]
    for part in ("train", "val", "baseline", "engine"):
        assert inputs[1][part] == inputs[0][part], part


def test_async_mode_validates_with_verls_agent_defaults():
    cfg = cfg_of(R + "mode=async", R + "agent.num_workers=4", R + "multi_turn.format=hermes")
    assert cfg.actor_rollout_ref.rollout.mode == "async"
    with pytest.raises(ConfigError, match="expected one of sync, async"):
        cfg_of(R + "mode=server")


@pytest.mark.parametrize("override,needle", [
    (R + "multi_turn.enable=true", "set actor_rollout_ref.rollout.mode=async"),
    (R + "agent.default_agent_loop=react_agent", "single_turn_agent, tool_agent"),
    (R + "agent.custom_async_server.path=/x.py", "a custom async rollout server is not built"),
    (R + "agent.num_workers=0", ">= 1"),
    ("+" + R + "engine_kwargs.sglang.mem_fraction_static=0.5", "SGLang as a rollout engine is not built here"),
    ("+" + R + "engine_kwargs.vllm.tensor_parallel_size=2", "tensor_model_parallel_size"),
])
def test_keys_without_an_implementation_are_refused_with_the_reason(override, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        cfg_of(override)


@pytest.mark.parametrize("override", [R + "agent.num_workers=2", R + "trace.backend=weave"])
def test_agent_knobs_without_an_effect_are_accepted_with_a_note(override):
    from grpo_dist.config.states import noop_notes

    notes = " ".join(noop_notes(cfg_of(R + "mode=async", override)))
    assert override.split("=")[0] in notes


def test_a_step_budget_below_max_num_seqs_is_refused_before_vllm_refuses_it_in_a_worker():
    """vLLM refuses max_num_batched_tokens < max_num_seqs when the engine starts, inside a worker; the engine
    raises the budget to max_model_len itself, so only a budget below both is refused."""
    with pytest.raises(ConfigError, match=r"max_num_batched_tokens = 72 is not valid.*max_num_seqs=1024"):
        cfg_of(R + "max_num_batched_tokens=72", "data.max_prompt_length=64", "data.max_response_length=8")
    cfg_of(R + "max_num_batched_tokens=72", R + "max_num_seqs=64", "data.max_prompt_length=64",
           "data.max_response_length=8")
    cfg_of(R + "max_num_batched_tokens=72", "data.max_prompt_length=1024", "data.max_response_length=8")


@pytest.mark.parametrize("override,needle", [
    (R + "max_model_len=16", "at least rollout.prompt_length + rollout.response_length"),
    (R + "gpu_memory_utilization=1.5", "in (0, 1]"),
    (R + "gpu_memory_utilization=0", "in (0, 1]"),
])
def test_engine_sizes_vllm_would_refuse_in_a_worker_are_refused_here(override, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        cfg_of(override)


def test_vllm_kwargs_need_the_vllm_engine():
    with pytest.raises(ConfigError, match="rollout.name=hf"):
        cfg_of(R + "name=hf", "+" + R + "engine_kwargs.vllm.swap_space=4")


def test_ignore_eos_reaches_every_generation_and_needs_vllm():
    """verl's vLLM server applies rollout.ignore_eos to every request: training, validation, the baseline
    rollout, and an agent loop's requests (through its sampling_params)."""
    from grpo_dist.agents.runner import sampling_params_of
    from grpo_dist.rollout.async_server import sampling_from_params

    off = worker_inputs(cfg_of())
    assert not any(off[k].ignore_eos for k in ("train", "val", "baseline"))
    on = worker_inputs(cfg_of(R + "ignore_eos=true"))
    assert all(on[k].ignore_eos for k in ("train", "val", "baseline"))
    assert sampling_from_params(sampling_params_of(on["train"], seed=1), max_tokens=8).ignore_eos
    assert not sampling_from_params(sampling_params_of(off["train"], seed=1), max_tokens=8).ignore_eos
    assert sampling_from_params({"temperature": 0.0, "ignore_eos": True}, max_tokens=8).ignore_eos  # greedy too
    with pytest.raises(ConfigError, match="ignore_eos = True is not valid: the hf engine stops at the end-of-sequence"):
        cfg_of(R + "name=hf", R + "ignore_eos=true")


# ------------------------------------------------------------------------------ pass-through to vLLM
@pytest.fixture
def fake_vllm(monkeypatch):
    """A stand-in ``vllm`` module whose LLM records its arguments (the mapping is what is tested)."""
    seen: dict = {}

    class LLM:
        def __init__(self, **kwargs):
            seen.update(kwargs)

    mod = types.ModuleType("vllm")
    mod.LLM = LLM
    monkeypatch.setitem(sys.modules, "vllm", mod)
    return seen


def engine_args(cfg, fake_vllm, *, gpu: bool, monkeypatch) -> dict:
    import torch

    from grpo_dist.rollout.vllm_engine import VLLMEngine

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    kwargs = engine.engine_kwargs(cfg, "/m", "cuda" if gpu else "cpu")
    VLLMEngine(**kwargs)
    return dict(fake_vllm)


def test_vllm_pass_through_keys_reach_the_engine(fake_vllm, monkeypatch):
    cfg = cfg_of("+" + R + "engine_kwargs.vllm.swap_space=4", "+" + R + "engine_kwargs.vllm.enable_prefix_caching=false",
                 "+" + R + "engine_kwargs.vllm.disable_log_stats=null", R + "enable_chunked_prefill=true",
                 R + "max_num_seqs=77", R + "max_num_batched_tokens=4096", R + "enforce_eager=false")
    got = engine_args(cfg, fake_vllm, gpu=True, monkeypatch=monkeypatch)
    assert got["swap_space"] == 4 and got["enable_prefix_caching"] is False
    assert "disable_log_stats" not in got  # null values are dropped, as verl does
    assert got["enable_chunked_prefill"] is True and got["max_num_seqs"] == 77
    assert got["max_num_batched_tokens"] == 4096 and got["enforce_eager"] is False
    fake_vllm.clear()
    got = engine_args(cfg_of(R + "enable_chunked_prefill=false"), fake_vllm, gpu=True, monkeypatch=monkeypatch)
    assert got["enable_chunked_prefill"] is False


def test_chunked_prefill_stays_off_on_cpu(fake_vllm, monkeypatch):
    got = engine_args(cfg_of(R + "enable_chunked_prefill=true"), fake_vllm, gpu=False, monkeypatch=monkeypatch)
    assert got["enable_chunked_prefill"] is False  # CPU generators cannot rewind a seeded request


def test_engine_refuses_extra_arguments_it_sets_itself(fake_vllm):
    from grpo_dist.rollout.vllm_engine import VLLMEngine

    with pytest.raises(ValueError, match="max_model_len"):
        VLLMEngine("/m", extra_kwargs={"max_model_len": 5})


# ------------------------------------------------------------------------------ val_only
def test_val_only_rules():
    assert cfg_of("trainer.val_only=true").trainer.val_only is True
    with pytest.raises(ConfigError, match="val_before_train=false it ignores val_only"):
        cfg_of("trainer.val_only=true", "trainer.val_before_train=false")
    with pytest.raises(ConfigError, match="nothing to validate"):
        cfg_of("trainer.val_only=true", "data.val_files=null")
    with pytest.raises(ConfigError, match="trainer.log_val_generations"):
        cfg_of("trainer.log_val_generations=-1")


# ------------------------------------------------------------------------------ checkpoint_engine.backend
@pytest.mark.parametrize("backend, needle", [("hccl", "Ascend NPUs' HCCL"), ("nixl", "NIXL"),
                                             ("mooncake", "Mooncake"), ("delta_sharded", "SGLang"), ("gloo", "valid: naive")])
def test_weight_sync_backends_other_than_naive_and_nccl_are_refused_naming_the_valid_ones(backend, needle):
    from tests.configs import refused

    msg = refused(f"{R}checkpoint_engine.backend={backend}")
    assert f"{R}checkpoint_engine.backend" in msg and needle in msg and "naive" in msg and "nccl" in msg


@pytest.mark.parametrize("backend", ["naive", "nccl"])
def test_the_weight_sync_backend_reaches_the_drivers_plan(backend):
    cfg = cfg_of(f"{R}checkpoint_engine.backend={backend}", "actor_rollout_ref.nccl_timeout=77")
    plan = resolve(cfg).driver_plan("cpu", 100)
    assert (plan.sync_backend, plan.sync_timeout_s) == (backend, 77.0)
