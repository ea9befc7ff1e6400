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
    for w in ws:
        assert w["steps"] > w["warmup_steps"] >= 1
        assert (w["batch_size"] * w["n"]) % w["micro_batch"] == 0  # TRL's gradient accumulation is whole
    if not quick:
        large = ws[1]
        assert large["response_length"] >= 128 and large["top_k"] > 0


@pytest.mark.parametrize("name", ["tiny", "large"])
def test_grpo_command_line_is_a_valid_config(name, tmp_path):
    from grpo_dist.config.loader import compose, to_typed
    from grpo_dist.config.validate import validate_config

    w = next(w for w in common.workloads(False) if w["name"] == name)
    w = dict(w, model_dir=str(tmp_path / "model"), train_file=str(tmp_path / "train.parquet"))
    overrides = run_bench.grpo_overrides(w, tmp_path / "out")
    cfg = to_typed(compose(overrides), overrides)
    validate_config(cfg, check_paths=False)
    assert cfg.trainer.n_gpus_per_node == 1 and cfg.trainer.nnodes == 1 and cfg.trainer.device == "cpu"
    a = cfg.actor_rollout_ref.actor
    assert a.ppo_mini_batch_size == cfg.data.train_batch_size == w["batch_size"] and a.ppo_epochs == 1
    assert a.use_kl_loss and a.kl_loss_coef == w["kl_coef"]
    assert a.ppo_micro_batch_size_per_gpu == w["micro_batch"]
    r = cfg.actor_rollout_ref.rollout
    assert (r.n, r.top_k, cfg.data.max_response_length) == (w["n"], w["top_k"], w["response_length"])
    assert cfg.trainer.val_before_train is False and cfg.trainer.test_freq == -1


@pytest.mark.parametrize("precision,dtype", [("auto", "float32"), ("fp32", "float32"), ("bf16", "bfloat16")])
def test_precision_reaches_every_dtype_key(precision, dtype, tmp_path):
    """--precision bf16 makes grpo_dist compute and roll out in bf16 (TRL gets bf16=True, the bare
    programs bf16 too); auto is float32 on the CPU, as grpo_dist's own default there."""
    from grpo_dist.config.loader import compose, to_typed
    from grpo_dist.trainer.build import compute_dtype

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
