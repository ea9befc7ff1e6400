"""The activation-memory estimate against what autograd really keeps, and the auto choices of gradient
checkpointing and micro-batches made from it."""

from __future__ import annotations

import pytest
import torch

from grpo_dist.training.memory import (
    ModelShape,
    act_bytes_per_token,
    available_bytes,
    choose_update_plan,
    layer_bytes_per_token,
    model_state_bytes,
)

V = 1000


def qwen2(dtype, checkpointing: bool):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_dist.training.attention import VARLEN_SDPA

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=V, hidden_size=256, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=64, intermediate_size=704, attn_implementation=VARLEN_SDPA)
    model = Qwen2ForCausalLM(config).to(dtype).train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model, config


def saved_bytes(model, fused: bool) -> tuple[int, int]:
    """Bytes autograd keeps (parameters excluded, each storage once) for one policy forward of 4 rows of
    32 prompt + 64 response tokens; and the response-token count."""
    from grpo_dist.training.policy import forward_logprobs

    B, P, R = 4, 32, 64
    ids = torch.randint(0, V, (B, P + R), generator=torch.Generator().manual_seed(1))
    am = torch.ones(B, P + R, dtype=torch.long)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward_logprobs(model, ids, am, am.cumsum(-1) - 1, response_length=R, temperature=1.0, compute_entropy=True,
                         fused=fused, remove_padding=True)
    return sum(seen.values()), B * R


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_estimate_matches_what_autograd_keeps(dtype, checkpointing):
    model, config = qwen2(dtype, checkpointing)
    b = 4 if dtype == torch.float32 else 2
    shape = ModelShape.from_config(config)
    measured, _ = saved_bytes(model, fused=True)
    est = 4 * 96 * act_bytes_per_token(shape, b, checkpointing=checkpointing, fused_head=True)
    assert 0.9 < est / measured < 1.1, (est, measured)


def test_estimate_with_logits_counts_them_and_their_gradient():
    """The logits path keeps the [M, V] logits; their gradient [M, V] joins them in the backward."""
    model, config = qwen2(torch.float32, False)
    measured, responses = saved_bytes(model, fused=False)
    with_grad = measured + 4 * V * responses
    est = 4 * 96 * act_bytes_per_token(ModelShape.from_config(config), 4, checkpointing=False, response_fraction=64 / 96)
    assert 0.9 < est / with_grad < 1.1, (est, with_grad)


def test_shape_and_state_by_hand():
    """Qwen2.5-0.5B's config: 24 layers of 896, 14 heads / 2 KV heads of 64, MLP 4864, vocabulary
    151,936, tied: 494 M parameters (the published count is 494 M)."""
    from types import SimpleNamespace

    cfg = SimpleNamespace(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                          head_dim=64, intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True)
    shape = ModelShape.from_config(cfg)
    assert 490e6 < shape.params < 500e6  # the real model also has q/k/v biases (~0.1 M)
    # one layer per token in bf16: 2*6*896 + 2*896 + 2*18*64 + 2*2*14*64 + 56 + 2*896 + 8*4864
    assert layer_bytes_per_token(shape, 2) == 2 * 6 * 896 + 2 * 896 + 2 * 18 * 64 + 4 * 14 * 64 + 56 + 2 * 896 + 8 * 4864
    assert model_state_bytes(shape, 2, 4) == pytest.approx(16 * shape.params / 4 + 2 * (shape.root_params + 2 * shape.layer_params))
    with pytest.raises(ValueError, match="hidden_size"):
        ModelShape.from_config(SimpleNamespace(num_hidden_layers=2))


SHAPE = ModelShape(hidden=64, layers=2, heads=2, kv_heads=1, head_dim=32, intermediate=128, vocab=100, tied=False)


def plan(budget_tokens: float, **kw):
    """A plan whose budget holds ``budget_tokens`` tokens of non-checkpointed activations."""
    per = act_bytes_per_token(SHAPE, 4, checkpointing=False, response_fraction=0.5)
    args = dict(dtype_bytes=4, budget_bytes=budget_tokens * per, mini_batch_rows=16, max_seq_len=100,
                response_fraction=0.5, gradient_checkpointing="auto", micro_batch_size="auto", use_dynamic_bsz=False,
                max_token_len=16384)
    args.update(kw)
    return choose_update_plan(SHAPE, **args)


def test_auto_whole_mini_batch_when_it_fits():
    p = plan(1600)  # 16 rows x 100 tokens
    assert (p.gradient_checkpointing, p.micro_batch_size, p.use_dynamic_bsz) == (False, None, False)
    assert "whole mini-batch" in p.reason


def test_auto_cuts_by_tokens_before_checkpointing():
    p = plan(1000)  # 10 longest rows fit: cut by a token budget, no recomputation
    assert not p.gradient_checkpointing and p.use_dynamic_bsz and 900 <= p.max_token_len <= 1000
    p = plan(50)  # not even one 100-token row fits without checkpointing: on, and a budget that fits with it
    assert p.gradient_checkpointing and p.use_dynamic_bsz and p.max_token_len >= 100
    assert "not even one longest sequence" in p.reason


def test_explicit_settings_are_kept():
    p = plan(50, gradient_checkpointing=False)
    assert not p.gradient_checkpointing and p.max_token_len >= 100
    p = plan(10**6, gradient_checkpointing=True, micro_batch_size=4)
    assert p.gradient_checkpointing and p.micro_batch_size == 4 and not p.use_dynamic_bsz
    p = plan(10**6, micro_batch_size=None, gradient_checkpointing=True)
    assert p.gradient_checkpointing and p.micro_batch_size is None and not p.use_dynamic_bsz


def test_auto_checkpointing_with_an_explicit_cut():
    assert not plan(400, micro_batch_size=4).gradient_checkpointing  # 4 x 100 tokens fit
    p = plan(399, micro_batch_size=4)
    assert p.gradient_checkpointing and p.micro_batch_size == 4 and "4 rows x 100 tokens" in p.reason
    assert not plan(2000, use_dynamic_bsz=True, max_token_len=2000).gradient_checkpointing
    p = plan(1999, use_dynamic_bsz=True, max_token_len=2000)
    assert p.gradient_checkpointing and p.use_dynamic_bsz and p.max_token_len == 2000


def test_available_bytes_on_this_machine():
    one, how = available_bytes("cpu", 1)
    two, _ = available_bytes("cpu", 2)
    assert one > 0 and "available" in how
    assert two == pytest.approx(one / 2, rel=0.2)


# ---- the configuration: verl's explicit values kept, auto where unset --------------------------------
def load(*overrides: str):
    from grpo_dist.config.loader import compose, to_typed
    from grpo_dist.config.validate import validate_config

    cfg = to_typed(compose(list(overrides)), list(overrides))
    validate_config(cfg, check_paths=False)
    return cfg


def test_defaults_are_auto_and_explicit_values_keep_their_meaning():
    from grpo_dist.config import role_settings

    s = role_settings.actor_settings(load(), "cpu", 10)
    assert s.enable_gradient_checkpointing == "auto" and s.ppo_micro_batch_size_per_gpu == "auto"
    assert s.use_remove_padding and s.max_seq_len == 64 + 24 and s.max_response_len == 24
    s = role_settings.actor_settings(load("actor_rollout_ref.model.enable_gradient_checkpointing=true",
                                  "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"), "cpu", 10)
    assert s.enable_gradient_checkpointing is True and s.ppo_micro_batch_size_per_gpu == 4
    s = role_settings.actor_settings(load("actor_rollout_ref.actor.use_dynamic_bsz=true"), "cpu", 10)
    assert s.ppo_micro_batch_size_per_gpu is None and s.use_dynamic_bsz
    c = role_settings.critic_settings(load("algorithm.adv_estimator=gae"), "cpu", 10)
    assert c.enable_gradient_checkpointing == "auto" and c.ppo_micro_batch_size_per_gpu == "auto" and c.use_remove_padding
    c = role_settings.critic_settings(load("algorithm.adv_estimator=gae", "critic.model.use_remove_padding=false",
                                   "critic.model.enable_gradient_checkpointing=false"), "cpu", 10)
    assert c.enable_gradient_checkpointing is False and not c.use_remove_padding
    r = role_settings.reference_kwargs(load("actor_rollout_ref.model.use_fused_kernels=true",
                                    "actor_rollout_ref.model.logprob_chunk_size=64"), "cpu")
    assert r["use_fused_kernels"] and r["logprob_chunk_size"] == 64


def test_ulysses_is_not_assumed_to_divide_the_memory_of_a_sequence():
    """verl users set ulysses_sequence_parallel_size for memory per rank: here a sequence is not split,
    so the notice says so, the auto memory choices are sized for the whole prompt + response on every
    rank, and their start-up line says the setting divided nothing."""
    from grpo_dist.config.states import noop_notes
    from grpo_dist.config import preflight, role_settings

    sp = ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=4", "critic.ulysses_sequence_parallel_size=2",
          "algorithm.adv_estimator=gae")
    cfg = load(*sp)
    notes = [n for n in noop_notes(cfg) if "ulysses" in n]
    assert len(notes) == 2
    for n in notes:
        assert "a sequence is NOT split across ranks here" in n
        assert "activation memory of the full prompt + response, which this setting would have divided by sp" in n
    plain = load("algorithm.adv_estimator=gae")
    assert role_settings.actor_settings(cfg, "cpu", 10) == role_settings.actor_settings(plain, "cpu", 10)
    assert role_settings.actor_settings(cfg, "cpu", 10).max_seq_len == 64 + 24  # whole sequences, not (64 + 24) / 4
    assert role_settings.critic_settings(cfg, "cpu", 10) == role_settings.critic_settings(plain, "cpu", 10)
    assert preflight.whole_sequence_note(cfg, "actor") == (
        " (sized for whole sequences of up to 88 tokens on every rank: actor_rollout_ref.actor.ulysses_sequence_parallel_size"
        " = 4 does not split them here, so a rank needs the memory verl would spread over 4)")
    assert "critic.ulysses_sequence_parallel_size = 2" in preflight.whole_sequence_note(cfg, "critic")
    assert preflight.whole_sequence_note(cfg, "reference") == preflight.whole_sequence_note(plain, "actor") == ""
    fsdp = load("actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size=2")
    assert "actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size = 2" in preflight.whole_sequence_note(fsdp, "reference")


@pytest.mark.parametrize("override,key", [
    ("actor_rollout_ref.model.enable_gradient_checkpointing=sometimes", "actor_rollout_ref.model.enable_gradient_checkpointing"),
    ("critic.model.enable_gradient_checkpointing=2", "critic.model.enable_gradient_checkpointing"),
    ("actor_rollout_ref.rollout.kv_cache_gib=big", "actor_rollout_ref.rollout.kv_cache_gib"),
    ("actor_rollout_ref.rollout.kv_cache_gib=-1", "actor_rollout_ref.rollout.kv_cache_gib"),
    ("actor_rollout_ref.model.logprob_chunk_size=0", "actor_rollout_ref.model.logprob_chunk_size"),
])
def test_bad_memory_settings_are_refused_by_name(override, key):
    from grpo_dist.config.schema import ConfigError

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load(override)


def test_auto_settings_need_the_sequence_length():
    from grpo_dist.training.settings import ActorSettings, CriticSettings

    with pytest.raises(ValueError, match="max_seq_len"):
        ActorSettings(enable_gradient_checkpointing="auto")
    with pytest.raises(ValueError, match="enable_gradient_checkpointing"):
        CriticSettings(enable_gradient_checkpointing="yes")
    ActorSettings(ppo_micro_batch_size_per_gpu="auto", max_seq_len=100)


def test_kv_cache_auto_by_hand():
    """2 layers x 2 KV heads x 64 x 4 bytes x 2 (K and V) = 2 KiB per token; 64 sequences of 256 tokens
    need 32 MiB (x1.25 = 40 MiB): the floor, 0.25 GiB. 1024 x 2048 tokens need 5 GiB: the 25 % of 16 GiB
    / 2 engines (2 GiB) limits it; on a big node they get 5 GiB, and the 8 GiB cap limits 4096 of them."""
    from grpo_dist.training.memory import GIB, auto_kv_cache_gib, kv_bytes_per_token

    shape = ModelShape(hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64, intermediate=512, vocab=1000, tied=False)
    assert kv_bytes_per_token(shape, 4) == 2048
    gib, why = auto_kv_cache_gib(shape, 4, sequences=64, seq_len=256, available=16 * GIB, engines_on_node=2)
    assert gib == 0.25 and "64 sequences x 256 tokens need 0.04 GiB" in why
    gib, _ = auto_kv_cache_gib(shape, 4, sequences=1024, seq_len=2048, available=16 * GIB, engines_on_node=2)
    assert gib == 2.0
    gib, _ = auto_kv_cache_gib(shape, 4, sequences=1024, seq_len=2048, available=1024 * GIB, engines_on_node=1)
    assert gib == 5.0  # what the step needs
    gib, _ = auto_kv_cache_gib(shape, 4, sequences=4096, seq_len=2048, available=1024 * GIB, engines_on_node=1)
    assert gib == 8.0
    gib, _ = auto_kv_cache_gib(shape, 4, sequences=300, seq_len=1000, available=64 * GIB, engines_on_node=1)
    assert gib == 0.75  # 0.715 GiB rounded up to 1/8


def test_kv_cache_of_the_default_run(tmp_path):
    """The no-argument run's CPU engine: sized from the embedded model and one rank's share of a step."""
    from grpo_dist import tasks
    from grpo_dist.config import engine
    from grpo_dist.training.memory import GIB

    cfg = load()
    model = tasks.resolve(cfg.actor_rollout_ref.model.path)
    gib, why = engine.kv_cache_gib(cfg, model, available=20 * GIB)
    assert gib == 0.25 and "256 sequences x 88 tokens" in why  # 32 prompts x 8 responses, 64 + 24 tokens
    assert engine.kv_cache_gib(load("actor_rollout_ref.rollout.kv_cache_gib=1.5"), model) == (1.5, "set")
    assert engine.engine_kwargs(cfg, model, "cpu", 0.5)["kv_cache_gib"] == 0.5


@pytest.mark.parametrize("drop", [None, "head_dim", "tie_word_embeddings", "num_key_value_heads"])
def test_the_model_shape_read_from_config_json_is_transformers_config(tiny_model_dir, tmp_path, drop):
    """The rollout's KV cache is sized before the workers start from ``config.json`` read as JSON (no
    transformers import on start-up's critical path); the shape is the one transformers' config gives,
    also where the file leaves a field to the config class's default (then read through transformers)."""
    import json
    import shutil

    from transformers import AutoConfig

    from grpo_dist.config import engine
    from grpo_dist.training.memory import ModelShape

    model = tmp_path / "m"
    shutil.copytree(tiny_model_dir, model)
    raw = json.loads((model / "config.json").read_text())
    raw.update(num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True)
    if drop:
        del raw[drop]
    (model / "config.json").write_text(json.dumps(raw))
    expected = ModelShape.from_config(AutoConfig.from_pretrained(model))
    assert engine.model_shape(str(model), False) == expected
    if drop == "head_dim":  # Qwen2's default: hidden // heads
        assert expected.head_dim == raw["hidden_size"] // 4


def test_lora_state_is_the_frozen_base_and_the_trained_adapters():
    """Under LoRA only the adapters have gradients and AdamW state: ``4 P / W + 16 A / W`` sharded, and
    the 'auto' plan has that much more memory for activations (and says so)."""
    from dataclasses import dataclass, field
    from types import SimpleNamespace

    from grpo_dist.training.memory import GIB, lora_parameter_count, resolve_auto_settings
    from grpo_dist.training.settings import LoraSettings

    cfg = SimpleNamespace(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                          head_dim=64, intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True)
    shape = ModelShape.from_config(cfg)
    adapters = lora_parameter_count(shape, 16, "all-linear")
    # rank 16 on the 7 linear layers of each of the 24 layers: 16 * (in + out) each, the output layer excluded
    assert adapters == 24 * 16 * (2 * 896 + (896 + 128) + (896 + 128) + 2 * 896 + 2 * (896 + 4864) + (4864 + 896))
    gathered = 2 * (shape.root_params + 2 * shape.layer_params)
    assert model_state_bytes(shape, 2, 4, adapter_params=adapters) == pytest.approx(
        (4 * shape.params + 16 * adapters) / 4 + gathered)

    @dataclass
    class Settings:
        lora: LoraSettings = field(default_factory=LoraSettings)
        enable_gradient_checkpointing: object = "auto"
        ppo_micro_batch_size_per_gpu: object = "auto"
        ppo_mini_batch_size_per_gpu: int = 8
        max_seq_len: int = 1024
        max_response_len: int = 512
        use_dynamic_bsz: bool = False
        ppo_max_token_len_per_gpu: int = 16384

    def note(settings):
        _, line = resolve_auto_settings(settings, cfg, device=torch.device("cpu"), world_size=1,
                                        compute_dtype=torch.bfloat16)
        return line

    full, lora = note(Settings()), note(Settings(lora=LoraSettings(rank=16)))
    assert f"less {model_state_bytes(shape, 2, 1) / GIB:.2f} GiB of model state]" in full
    assert (f"less {model_state_bytes(shape, 2, 1, adapter_params=adapters) / GIB:.2f} GiB of model state: frozen "
            f"base, {adapters:,} adapter parameters trained]") in lora
