"""Agent-loop outputs -> the rollout output the trainer reads (grpo_dist.agents.collect), and the step's
agent metrics (verl's num_turns/*)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from grpo_dist.agents.collect import agent_row, to_rollout_output
from grpo_dist.data.dataset import collate_prompts
from grpo_dist.rollout.assemble import prompt_batch, responses_to_batch
from grpo_dist.trainer.metrics import agent_metrics


def out(ids, mask, lps=None, turns=2, metrics=None, eos=True, prompt=(1, 2)):
    return SimpleNamespace(prompt_ids=list(prompt), response_ids=ids, response_mask=mask, response_logprobs=lps,
                           num_turns=turns, metrics=metrics or {}, extra_fields={}, finished_by_eos=eos)


def test_outputs_convert_with_masks_and_the_trainers_checks():
    outs = [out([3, 4, 9, 5], [1, 1, 0, 1], [-1.0, -2.0, 0.0, -0.5], turns=4, metrics={"tool_calls": 1}),
            out([6], [1], [-0.1], eos=False)]
    ro = to_rollout_output(outs, logprobs=True, response_length=4)
    assert ro.response_masks == [[1, 1, 0, 1], [1]] and ro.num_turns == [4, 2]
    assert ro.finished_by_eos == [True, False] and ro.metrics[0] == {"tool_calls": 1.0}
    assert to_rollout_output(outs, logprobs=False, response_length=4).logprobs is None
    with pytest.raises(ValueError, match="trajectory 0 has 4 response tokens, more than rollout.response_length=3"):
        to_rollout_output(outs, logprobs=True, response_length=3)
    with pytest.raises(ValueError, match="trajectory 1 has no response_logprobs"):
        to_rollout_output([outs[0], out([6], [1])], logprobs=True, response_length=4)
    with pytest.raises(ValueError, match="response_mask must hold 0"):
        to_rollout_output([out([6], [2], [-0.1])], logprobs=True, response_length=4)


def test_a_row_for_an_agent_loop_carries_verls_fields_and_tools_kwargs():
    item = {"prompt_ids": [1], "raw_prompt": [{"role": "user", "content": "q"}], "agent_name": "tool_agent",
            "extra_info": {"tools_kwargs": {"calc": {"create_kwargs": {"x": 1}}}}, "data_source": "d",
            "ground_truth": "4", "index": 3, "ability": "math", "reward_source": "d"}
    row = agent_row(item)
    assert row["tools_kwargs"] == {"calc": {"create_kwargs": {"x": 1}}} and row["agent_name"] == "tool_agent"
    assert "ability" not in row and row["index"] == 3


def test_step_metrics_of_trajectories():
    outs = [out([3, 4, 9, 5], [1, 1, 0, 1], [-1.0] * 4, turns=4, metrics={"tool_calls": 2, "tool_errors": 1}),
            out([6], [1], [-0.1], turns=2, metrics={"tool_calls": 0})]
    col = collate_prompts([{"prompt_ids": [1, 2], "data_source": "d", "ground_truth": "1", "extra_info": {}}] * 2,
                          pad_id=0, max_prompt_length=2)
    batch = responses_to_batch(prompt_batch(col, "s"), to_rollout_output(outs, logprobs=True, response_length=4),
                               n=1, pad_id=0, response_length=4)
    m = agent_metrics(batch)
    assert (m["num_turns/min"], m["num_turns/max"], m["num_turns/mean"]) == (2, 4, 3)
    assert m["agent/tool_calls/mean"] == 1.0 and m["agent/tool_errors/mean"] == 0.5
    assert m["agent/model_token_ratio"] == pytest.approx(4 / 5)
