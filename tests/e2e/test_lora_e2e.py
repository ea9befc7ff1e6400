"""LoRA through `python -m grpo_dist.main` (real Ray, vLLM on CPU, FSDP2 on 2 gloo ranks): the actor trains
adapters, the reference is its base model (adapters off, same process), and the adapters alone, synced into
vLLM's LoRA (verl's default, ``lora.merge=false``), sample what the actor computes."""

from __future__ import annotations

import math

import pytest

from tests.e2e.conftest import RESUME_ARGS, epoch_data
from tests.e2e.helpers import read_metrics, run_main
from tests.verl_scripts import SCRIPTS, script_args

pytestmark = pytest.mark.slow


def test_verls_lora_script_trains_and_vllm_samples_through_the_synced_adapter(reverse_data, tmp_path):
    """verl's LoRA GRPO script (run_qwen2_5-3b_gsm8k_grpo_lora.sh: rank 64, alpha 32, a tensor-parallel engine
    over both ranks) at CPU sizes, with a learning rate that moves the tiny model in two steps."""
    from grpo_dist.tasks.reverse import VOCAB
    from grpo_dist.utils.tiny_model import build_tiny_model

    out = tmp_path / "run"
    data = epoch_data(reverse_data, tmp_path)
    # two attention heads: one per rank of the script's tensor-parallel engine
    model = build_tiny_model(tmp_path / "model", vocab=VOCAB, hidden_size=128, num_layers=2, num_heads=2,
                             num_kv_heads=2, head_dim=64, intermediate_size=128, max_position_embeddings=256, seed=0)
    paths = dict(model=model, train=data["train"], test=data["test"], out=out)
    args = script_args(SCRIPTS["early_grpo_lora"], cpu=True, **paths) + RESUME_ARGS[:1] + [
        "actor_rollout_ref.actor.optim.lr=1e-2", "actor_rollout_ref.rollout.calculate_log_probs=true",
        "trainer.test_freq=-1", "trainer.save_freq=-1",
    ]
    proc = run_main(args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    m = read_metrics(out)
    assert [s for s in sorted(m) if s > 0] == [1, 2]
    for step in (1, 2):
        r = m[step]
        for k in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm"):
            assert math.isfinite(r[k]), (step, k, r[k])
        # after every sync of the adapter into both engine shards, vLLM's probabilities are the actor's
        assert 0 <= r["training/rollout_probs_diff_max"] < 1e-3, (step, r["training/rollout_probs_diff_max"])
    # the adapters moved the policy away from the reference (the base model with the adapters off)
    assert m[2]["actor/kl_loss"] > 0
    assert "lora" in proc.stdout.lower()
    assert "weight sync object_store (LoRA adapters only)" in proc.stdout  # not the merged weights
    # the adapters alone crossed (rank 64 on this tiny model is nearly as large as its linear layers; the
    # benchmark measures a real model): fewer bytes than the model's weights
    assert 0 < m[2]["perf/weight_sync_bytes"] < (model / "model.safetensors").stat().st_size
    # the final export is the peft adapter folder (the merged model only with hf_model in save_contents), and
    # the checkpoint holds the adapters alone (lora.json says which)
    export = out / "global_step_2" / "huggingface"
    assert (export / "lora_adapter" / "adapter_model.safetensors").is_file()
    assert not (export / "model.safetensors").exists()
    assert (out / "global_step_2" / "actor" / "lora.json").is_file()
