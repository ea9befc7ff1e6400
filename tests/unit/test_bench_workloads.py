"""The benchmark's workloads and the grpo_dist command line it builds: valid configuration, one rank,
one update per step, KL loss on, and the same sizes that TRL and the bare programs are given."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench"
sys.path.insert(0, str(BENCH))

import bench_common as common  # noqa: E402
import run_bench  # noqa: E402


@pytest.mark.parametrize("quick", [True, False])
def test_workloads_shape(quick):
    ws = common.workloads(quick)
    assert [w["name"] for w in ws] == (["tiny"] if quick else ["tiny", "large"])
    every = common.workloads(quick, names=list(common.CPU_WORKLOADS))
    assert [w["name"] for w in every] == ["tiny", "large", "gen_heavy", "real_vocab"]
    for w in every:
        assert w["steps"] > w["warmup_steps"] >= 1
        assert (w["batch_size"] * w["n"]) % w["micro_batch"] == 0  # TRL's gradient accumulation is whole
        assert w["gradient_checkpointing"] is False  # equal settings in every program
    large, gen, real = every[1], every[2], every[3]
    assert large["response_length"] >= 128 and large["top_k"] > 0
    # generation-heavy: 64 responses of up to 128 tokens whose lengths vary (EOS bias), full sampling
    assert gen["batch_size"] * gen["n"] == 64 and gen["response_length"] == 128 and gen["mean_response"] > 1
    assert gen["top_k"] == -1 and gen["bare_variants"] == ["naive", "packed", "packed_fused"]
    assert set(real["grpo_variants"]) == {"plain", "chunked", "fused"} and real["mean_response"] > 1


@pytest.mark.parametrize("names", [["gen"], ["tiny", "large", "nope"], []])
def test_unknown_workload_names_are_refused(names):
    with pytest.raises(ValueError, match="unknown workload"):
        common.workloads(False, names=names)
    with pytest.raises(ValueError, match="valid: gpu"):
        common.workloads(False, device="cuda", names=["gen_heavy"])


def test_the_command_line_refuses_an_unknown_workload(capsys):
    with pytest.raises(SystemExit) as e:
        run_bench.main(["--workloads", "tiny,gen"])
    assert e.value.code == 2
    assert "unknown workload(s) ['gen']" in capsys.readouterr().err


@pytest.mark.parametrize("name,variant", [("tiny", None), ("large", None), ("gen_heavy", None),
                                          ("real_vocab", "plain"), ("real_vocab", "fused")])
def test_grpo_command_line_is_a_valid_config(name, variant, tmp_path):
    from grpo_dist.config.loader import compose, to_typed
    from grpo_dist.config.validate import validate_config

    w = next(w for w in common.workloads(False, names=list(common.CPU_WORKLOADS)) if w["name"] == name)
    w = dict(w, model_dir=str(tmp_path / "model"), train_file=str(tmp_path / "train.parquet"))
    overrides = run_bench.grpo_overrides(w, tmp_path / "out", variant)
    cfg = to_typed(compose(overrides), overrides)
    validate_config(cfg, check_paths=False)
    assert cfg.trainer.n_gpus_per_node == 1 and cfg.trainer.nnodes == 1 and cfg.trainer.device == "cpu"
    a = cfg.actor_rollout_ref.actor
    assert a.ppo_mini_batch_size == cfg.data.train_batch_size == w["batch_size"] and a.ppo_epochs == 1
    assert a.use_kl_loss and a.kl_loss_coef == w["kl_coef"]
    assert a.ppo_micro_batch_size_per_gpu == w["micro_batch"]
    assert cfg.actor_rollout_ref.model.enable_gradient_checkpointing is False  # not auto: equal settings
    r = cfg.actor_rollout_ref.rollout
    assert (r.n, r.top_k, cfg.data.max_response_length) == (w["n"], w["top_k"], w["response_length"])
    assert cfg.trainer.val_before_train is False and cfg.trainer.test_freq == -1
    m = cfg.actor_rollout_ref.model
    assert m.use_fused_kernels == (variant == "fused")
    assert (m.logprob_chunk_size or 0) >= (10**9 if variant == "plain" else 0)


def test_bench_model_varies_lengths_and_samples_only_tokenizer_ids(tmp_path):
    """The EOS bias gives every position the same EOS probability, 1 / mean_response; the rows past the
    tokenizer's ids of a 151,936-token output layer are never sampled."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shape = dict(hidden_size=64, num_layers=2, num_heads=1, num_kv_heads=1, head_dim=64, intermediate_size=128,
                 max_position_embeddings=256)
    d = common.build_bench_model(tmp_path / "m", shape, vocab_size=common.REAL_VOCAB_SIZE, mean_response=64)
    assert common.build_bench_model(tmp_path / "m", shape, vocab_size=common.REAL_VOCAB_SIZE, mean_response=64) == d
    model = AutoModelForCausalLM.from_pretrained(d)
    n = len(AutoTokenizer.from_pretrained(d))
    assert model.config.vocab_size == common.REAL_VOCAB_SIZE and n < 200
    ids = torch.randint(4, n, (4, 96), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        p = torch.softmax(model(input_ids=ids).logits.float(), -1)
    p_eos = p[..., list(common.EOS_TOKEN_IDS)].sum(-1)
    assert torch.allclose(p_eos, torch.full_like(p_eos, 1 / 64), rtol=0.05)
    assert p[..., n:].sum(-1).max() < 1e-12


def test_bare_loop_lengths_follow_the_eos_bias():
    w = next(w for w in common.workloads(False, names=["gen_heavy"]))
    a = common.response_lengths(w, 0, 2000)
    assert a == common.response_lengths(w, 0, 2000) and a != common.response_lengths(w, 1, 2000)
    assert max(a) == 128 and min(a) >= 1
    # geometric with p = 1/64 capped at 128: mean = 64 (1 - (63/64)^128) = 55.7
    assert 52 < sum(a) / len(a) < 59
    tiny = common.workloads(False)[0]
    assert common.response_lengths(dict(tiny, response_tokens=7), 0, 3) == [7, 7, 7]
    # grpo_dist's sampled lengths (the bare vLLM run's, with its seeds) win, row for row, capped
    sampled = dict(w, step_response_lengths=[[3, 200, 5], [1, 2, 3]])
    assert common.response_lengths(sampled, 0, 3) == [3, 128, 5]
    assert common.response_lengths(sampled, 1, 3) == [1, 2, 3]
    # a step or row count they do not cover falls back to the distribution
    assert common.response_lengths(sampled, 2, 3) == common.response_lengths(w, 2, 3)
    assert common.response_lengths(sampled, 0, 4) == common.response_lengths(w, 0, 4)


@pytest.mark.parametrize("precision,dtype", [("auto", "float32"), ("fp32", "float32"), ("bf16", "bfloat16")])
def test_precision_reaches_every_dtype_key(precision, dtype, tmp_path):
    """--precision bf16 makes grpo_dist compute and roll out in bf16 (TRL gets bf16=True, the bare
    programs bf16 too); auto is float32 on the CPU, as grpo_dist's own default there."""
    from grpo_dist.config.loader import compose, to_typed
    from grpo_dist.config.facts import compute_dtype

    for w in common.workloads(False, "cpu", "vllm", precision):
        assert w["precision"] == ("bf16" if dtype == "bfloat16" else "fp32")
        w = dict(w, model_dir=str(tmp_path / "model"), train_file=str(tmp_path / "train.parquet"))
        overrides = run_bench.grpo_overrides(w, tmp_path / "out")
        cfg = to_typed(compose(overrides), overrides)
        assert compute_dtype(cfg.actor_rollout_ref.actor.fsdp_config.dtype, "cpu") == dtype
        assert compute_dtype(cfg.actor_rollout_ref.rollout.dtype, "cpu") == dtype
    with pytest.raises(ValueError, match="precision"):
        common.workloads(False, "cpu", "vllm", "fp8")


def test_large_model_never_samples_eos(tmp_path):
    """The EOS rows of the output layer are zero, so EOS logits are 0 and fall outside the top 20."""
    import torch
    from transformers import AutoModelForCausalLM

    d = common.build_large_model(tmp_path / "m")
    assert common.build_large_model(tmp_path / "m") == d  # cached: the marker matches
    model = AutoModelForCausalLM.from_pretrained(d)
    w = model.lm_head.weight
    for eos in common.EOS_TOKEN_IDS:
        assert torch.count_nonzero(w[eos]) == 0
    ids = torch.randint(4, w.shape[0], (4, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    top20 = logits.topk(20, dim=-1).indices
    for eos in common.EOS_TOKEN_IDS:
        assert not (top20 == eos).any()
    assert 20e6 < common.count_params(str(d)) < 30e6


@pytest.mark.parametrize("merge", [False, True])
def test_lora_reaches_grpo_dists_command_line(merge, tmp_path):
    """--lora-rank R (--lora-merge): grpo_dist trains rank-R adapters with alpha 2R on every linear layer of the
    blocks, as TRL's peft_config and the bare loop do, and syncs the adapters alone or the merged weights."""
    from grpo_dist.config.loader import compose, to_typed
    from grpo_dist.config.validate import lora_settings, validate_config

    w = next(w for w in common.workloads(False, names=["large"]))
    w = dict(w, model_dir=str(tmp_path / "model"), train_file=str(tmp_path / "train.parquet"), lora_rank=16,
             lora_merge=merge)
    overrides = run_bench.grpo_overrides(w, tmp_path / "out")
    cfg = to_typed(compose(overrides), overrides)
    validate_config(cfg, check_paths=False)
    lora = lora_settings(cfg)
    assert (lora.rank, lora.alpha, lora.merge) == (16, 32.0, merge)
    assert lora.target_modules == "all-linear"
