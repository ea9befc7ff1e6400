"""verl's gsm8k tool-agent script (tests/verl_multiturn: run_qwen2.5-3b_gsm8k_tool_agent_mlflow.sh with its
``--config-path``/``--config-name`` YAML and tool config) trained for two steps on the CPU through
``python -m grpo_dist.main`` (real Ray, vLLM, FSDP2): the module name, the paths and the engine name changed,
the sizes scaled down; the script's tensor parallelism of 2 kept (one vLLM engine over both ranks, its two
processes running the same agent loops in lock step).

The rows are written in the format of verl's ``examples/data_preprocess/gsm8k_tool_agent_loop.py``
(``agent_name: tool_agent``, a system and a user message, ``extra_info.tools_kwargs`` with the ground truth
for ``calc_gsm8k_reward``), with short prompts for the tiny model's 256 positions. The tiny random model
will rarely write a tool call; what is under test is that every trajectory runs through the tool agent
with verl's tool config loaded, and that the step trains on it."""

from __future__ import annotations

import time

import pytest

from tests.e2e.helpers import read_metrics, run_main
from tests.verl_multiturn import TOOL_AGENT_MLFLOW, script_argv

pytestmark = pytest.mark.slow

QUESTIONS = [("tom has 3 apples and buys 4 more how many now", "7"), ("a box holds 6 eggs how many in 2 boxes", "12"),
             ("sam had 10 pens and gave away 4 how many left", "6"), ("9 birds and 5 fly off how many stay", "4"),
             ("2 cats each eat 3 fish how many fish", "6"), ("15 cookies shared by 3 kids how many each", "5"),
             ("a bus has 8 seats in 4 rows how many seats", "32"), ("ann reads 5 pages a day for 3 days", "15")]
SYSTEM = "you are a math expert use the calc gsm8k reward tool"


def gsm8k_tool_agent_rows(split: str) -> list[dict]:
    """Rows as verl's gsm8k_tool_agent_loop.py writes them (shorter texts)."""
    return [{
        "data_source": "openai/gsm8k",
        "agent_name": "tool_agent",
        "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {
            "split": split, "index": i, "answer": f"#### {answer}", "question": question, "need_tools_kwargs": True,
            "tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": answer}}},
            "interaction_kwargs": {"query": question, "ground_truth": answer},
        },
    } for i, (question, answer) in enumerate(QUESTIONS)]


def test_the_tool_agent_script_trains_two_steps_through_the_tool_agent(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from grpo_dist.utils.tiny_model import build_tiny_model

    # two attention heads (one per rank of the tensor-parallel engine), printable ASCII (a tool call can be written)
    model = build_tiny_model(tmp_path / "model", hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=2,
                             head_dim=64, intermediate_size=128, max_position_embeddings=256, seed=0)

    files = {}
    for split in ("train", "test"):
        files[split] = tmp_path / f"{split}.parquet"
        pq.write_table(pa.Table.from_pylist(gsm8k_tool_agent_rows(split)), files[split])
    out = tmp_path / "run"
    args = script_argv(TOOL_AGENT_MLFLOW, cpu=True, model=str(model), train=str(files["train"]),
                       test=str(files["test"]), out=str(out)) + ["actor_rollout_ref.rollout.calculate_log_probs=true"]
    t0 = time.time()
    proc = run_main(args)
    took = time.time() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    m = read_metrics(out)
    assert [s for s in sorted(m) if s > 0] == [1, 2]
    for step in (1, 2):
        # verl's count: the prompt, then every assistant and tool turn; at least one assistant turn each
        assert m[step]["num_turns/min"] >= 2 and m[step]["num_turns/mean"] >= 2, m[step]
        # the tool agent's own metrics: the rows' agent_name picked it, with verl's tool config loaded
        for key in ("agent/tool_calls/mean", "agent/model_token_ratio", "actor/pg_loss", "actor/kl_loss",
                    "critic/score/mean", "timing_s/ref"):
            assert key in m[step], (step, key)
        # both engine processes sampled the same trajectories, and their log-probs are the actor's
        assert 0 <= m[step]["training/rollout_probs_diff_max"] < 1e-3, m[step]["training/rollout_probs_diff_max"]
    assert "tensor_model_parallel_size=2" in " ".join(proc.args)
    # the trace keys are accepted and said to have no effect
    assert "actor_rollout_ref.rollout.trace.backend" in proc.stdout and "tracing of agent loops is not built" in proc.stdout
    assert took < 90, f"the run took {took:.0f} s"
