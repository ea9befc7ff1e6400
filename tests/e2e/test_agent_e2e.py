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
