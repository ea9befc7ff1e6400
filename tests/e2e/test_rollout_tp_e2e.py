"""Tensor-parallel rollout through the command line: ``actor_rollout_ref.rollout.tensor_model_parallel_size=2``
on 2 CPU ranks, so both rollout ranks hold one vLLM engine (vLLM's external launcher over gloo; the GPU
runs the same code over NCCL). One short run, read by several tests."""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.helpers import base_args, read_metrics, run_main

pytestmark = pytest.mark.slow

VAL = "val-core/grpo_dist/reverse/acc/mean@1"


@pytest.fixture(scope="module")
def tp_run(reverse_data, tmp_path_factory):
    from grpo_dist.tasks.reverse import VOCAB
    from grpo_dist.utils.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("tp_run")
    # two attention heads: one per rank of the engine
    model = build_tiny_model(root / "model", vocab=VOCAB, hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=2,
                             head_dim=64, intermediate_size=128, max_position_embeddings=256, seed=0)
    out = root / "run"
    t0 = time.time()
    proc = run_main(base_args(model, reverse_data, out, steps=2) + [
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.rollout.calculate_log_probs=true",
        "trainer.test_freq=2", "trainer.log_val_generations=2"])
    return out, proc, time.time() - t0


def test_tensor_parallel_rollout_trains(tp_run):
    out, proc, seconds = tp_run
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    m = read_metrics(out)
    assert sorted(m) == [0, 1, 2] and VAL in m[0] and VAL in m[2]
    for step in (1, 2):
        # the engine's log-probs of its samples equal the actor's: at step 2 after a weight sync into both
        # shards (full tensors to each rank), so the sharded engine holds exactly the trainer's policy
        assert 0 <= m[step]["training/rollout_probs_diff_max"] < 1e-3, (step, m[step])
        assert m[step]["response_length/mean"] > 0
    assert json.loads((out / "placement.json").read_text())["rollout_rank_nodes"]
    print(f"tensor-parallel run: {seconds:.0f} s")


def test_validation_samples_come_from_the_sharded_engine(tp_run):
    out, proc, _ = tp_run
    assert proc.returncode == 0
    rows = [json.loads(line) for line in (out / "val_generations.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in rows}) == [0, 2] and all(len(r["input"]) > 0 for r in rows)
