"""Agent-loop rollouts (``rollout.mode=async``) on the real stack: Ray, vLLM, FSDP2 on gloo."""

from __future__ import annotations

import pytest

from tests.e2e.helpers import base_args, read_metrics, run_main

pytestmark = pytest.mark.slow

SAME = ("critic/score/mean", "response_length/mean", "response_length/max", "actor/pg_loss", "actor/entropy")


def test_single_turn_grpo_through_agent_loops_equals_the_sync_path(tiny_model_dir, reverse_data, tmp_path):
    """Two rollout replicas: every response of a step is one request of its replica's asynchronous server,
    seeded as the sync call seeds it, so the step's samples, rewards and update are the sync run's."""
    runs = {}
    for mode in ("sync", "async"):
        out = tmp_path / mode
        proc = run_main(base_args(tiny_model_dir, reverse_data, out, steps=2)
                        + [f"actor_rollout_ref.rollout.mode={mode}", "trainer.test_freq=-1", "trainer.save_freq=-1"])
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        runs[mode] = read_metrics(out)
    for step in (1, 2):  # step 2 samples from the weights step 1 trained: the sync reached both engines alike
        for key in SAME:
            assert runs["async"][step][key] == pytest.approx(runs["sync"][step][key], rel=1e-5, abs=1e-6), (step, key)
    assert "num_turns/mean" not in runs["sync"][1]
    assert runs["async"][1]["num_turns/mean"] == 2 and runs["async"][1]["agent/model_token_ratio"] == 1


def test_the_calculator_recipe_calls_its_tool_and_trains_on_model_tokens_only(tmp_path):
    """The embedded agent recipe (recipes/agent_calculator_cpu), shortened, on a briefly warmed base model (80
    supervised steps: it writes a well-formed tool call in about a quarter of its samples), on two ranks whose
    vLLM engine is tensor-parallel over both (its processes run the same agent loops in lock step): trajectories
    call the add tool, the tool's tokens are context but not trained on, and the report draws turns and tool
    calls per step."""
    from grpo_dist.tasks.calculator import build_model

    model = build_model(tmp_path / "model", warmup_steps=80, batch_size=16)
    out = tmp_path / "run"
    proc = run_main(["--config-name", "recipes/agent_calculator_cpu", f"actor_rollout_ref.model.path={model}",
                     "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                     "actor_rollout_ref.rollout.n=4", "trainer.total_training_steps=3", "trainer.test_freq=3",
                     "data.val_max_samples=16", "trainer.save_freq=-1", "trainer.progress_bar=false",
                     "trainer.logger=[console,file]", f"trainer.default_local_dir={out}",
                     "actor_rollout_ref.rollout.calculate_log_probs=true", "trainer.n_gpus_per_node=2",
                     "actor_rollout_ref.rollout.tensor_model_parallel_size=2"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    m = read_metrics(out)
    steps = [m[s] for s in (1, 2, 3)]
    # some trajectories called the tool: a tool turn between the call and the answer (4 turns, not 2)
    assert max(r["agent/tool_calls/mean"] for r in steps) > 0
    assert max(r["num_turns/max"] for r in steps) >= 4
    called = [r for r in steps if r["agent/tool_calls/mean"] > 0]
    assert all(r["agent/model_token_ratio"] < 1 for r in called)  # tool tokens are in the responses, mask 0
    for r in steps:  # the engine's log-probs of the model's tokens are the actor's (tool tokens masked out)
        assert 0 <= r["training/rollout_probs_diff_max"] < 1e-3, r["training/rollout_probs_diff_max"]
    assert "val-core/grpo_dist/calculator/acc/mean@1" in m[3]
    assert 2 <= m[3]["val-aux/num_turns/min"] <= m[3]["val-aux/num_turns/mean"] <= m[3]["val-aux/num_turns/max"]
    assert (out / "report" / "agents.png").exists()
