"""Rollout output -> the step's batch (grpo_dist.rollout.assemble): the layout every later stage reads."""

from __future__ import annotations

import pytest
import torch

from grpo_dist.data.dataset import collate_prompts
from grpo_dist.rollout.assemble import merge_outputs, prompt_batch, responses_to_batch, shard_prompts
from grpo_dist.rollout.base import RolloutOutput, SamplingSettings, rollout_step_seed


def items(prompts: list[list[int]]) -> list[dict]:
    return [{"prompt_ids": p, "data_source": f"src{i}", "ground_truth": str(i), "extra_info": {"i": i}}
            for i, p in enumerate(prompts)]


def test_shares_cover_prompts_in_order_and_seed_by_global_position():
    s = SamplingSettings(n=3, temperature=1.0, max_tokens=4, seed=100)
    prompts = [[1], [2], [3], [4], [5]]
    shares = shard_prompts(prompts, 2, s)
    assert [p for share, _ in shares for p in share] == prompts
    starts = [0, len(shares[0][0])]
    assert [st.seed for _, st in shares] == [100 + b * 3 for b in starts]
    # more ranks than prompts: some ranks get none; no seed stays None
    shares = shard_prompts(prompts[:1], 3, SamplingSettings(n=1, temperature=1.0, max_tokens=4))
    assert sorted(len(p) for p, _ in shares) == [0, 0, 1] and all(st.seed is None for _, st in shares)
    with pytest.raises(ValueError, match="num_ranks"):
        shard_prompts(prompts, 0, s)


def test_every_response_of_every_step_gets_its_own_seed():
    # (rollout_seed * 100003 + step) * (responses + 1); response r of the step samples with seed + r
    assert rollout_step_seed(0, 0, 64) == 0 and rollout_step_seed(0, 3, 64) == 3 * 65
    assert rollout_step_seed(2, 1, 8) == (2 * 100_003 + 1) * 9
    for seed in (0, 1):
        used = [rollout_step_seed(seed, step, 12) + r for step in range(50) for r in range(12)]
        assert len(set(used)) == len(used)


def test_batch_layout_groups_pads_and_continues_positions():
    col = collate_prompts(items([[5, 6], [7]]), pad_id=0, max_prompt_length=3)
    prompts = prompt_batch(col, "s0")
    assert list(prompts["uid"]) == ["s0-0", "s0-1"]
    s = SamplingSettings(n=2, temperature=1.0, max_tokens=3, logprobs=True)
    outs = [RolloutOutput([[9], [9, 8]], [[-0.1], [-0.2, -0.3]], [True, True]),
            RolloutOutput([[8, 8, 8], [1]], [[-1.0, -1.0, -1.0], [-0.5]], [False, True])]
    batch = responses_to_batch(prompts, merge_outputs(outs, s), n=2, pad_id=0, response_length=3)
    assert len(batch) == 4
    assert list(batch["uid"]) == ["s0-0", "s0-0", "s0-1", "s0-1"]
    assert list(batch["data_source"]) == ["src0", "src0", "src1", "src1"]
    assert batch["responses"].tolist() == [[9, 0, 0], [9, 8, 0], [8, 8, 8], [1, 0, 0]]
    assert batch["response_mask"].tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1], [1, 0, 0]]
    assert torch.equal(batch["input_ids"][:, :3], batch["prompts"])
    assert batch["input_ids"][1].tolist() == [0, 5, 6, 9, 8, 0]
    assert batch["attention_mask"][1].tolist() == [0, 1, 1, 1, 1, 0]
    # positions count real tokens from 0 and continue into the response
    assert batch["position_ids"][2].tolist()[2:] == [0, 1, 2, 3]
    assert batch["position_ids"][1].tolist()[1:5] == [0, 1, 2, 3]
    assert batch["rollout_log_probs"][1].tolist() == pytest.approx([-0.2, -0.3, 0.0])


def test_without_logprobs_no_rollout_log_probs_and_count_mismatch_refused():
    col = collate_prompts(items([[5]]), pad_id=0, max_prompt_length=2)
    prompts = prompt_batch(col, "v")
    s = SamplingSettings(n=1, temperature=1.0, max_tokens=2, logprobs=False)
    out = merge_outputs([RolloutOutput([[3]], None, [True])], s)
    batch = responses_to_batch(prompts, out, n=1, pad_id=0, response_length=2)
    assert "rollout_log_probs" not in batch
    with pytest.raises(ValueError, match="responses for 1 prompts"):
        responses_to_batch(prompts, out, n=2, pad_id=0, response_length=2)


def _trajectories(**over):
    """Two prompts x n=1: a two-turn trajectory (model 2 tokens, tool 2 tokens, model 1) and a plain one."""
    fields = dict(response_ids=[[9, 8, 50, 51, 7], [6]], logprobs=[[-0.1, -0.2, 0.0, 0.0, -0.3], [-0.4]],
                  finished_by_eos=[True, True], response_masks=[[1, 1, 0, 0, 1], [1]],
                  prompt_ids=[[5, 6, 40], [7]], num_turns=[4, 2],
                  metrics=[{"tool_calls": 1.0}, {"tool_calls": 0.0}], extra_fields=[{"tool_rewards": [0.5]}, {}])
    fields.update(over)
    return RolloutOutput(**fields)


def test_a_trajectory_attends_to_tool_tokens_but_trains_only_on_model_tokens():
    col = collate_prompts(items([[5, 6], [7]]), pad_id=0, max_prompt_length=4)
    batch = responses_to_batch(prompt_batch(col, "s0"), _trajectories(), n=1, pad_id=0, response_length=6)
    assert batch["response_mask"].tolist() == [[1, 1, 0, 0, 1, 0], [1, 0, 0, 0, 0, 0]]
    assert batch["attention_mask"][0].tolist() == [0, 1, 1, 1, 1, 1, 1, 1, 1, 0]  # tool tokens are context
    # the agent loop's own prompt (tool schemas rendered) replaces the dataset's, positions follow it
    assert batch["prompts"][0].tolist() == [0, 5, 6, 40] and batch["prompt_ids"][0] == [5, 6, 40]
    assert batch["position_ids"][0].tolist()[1:9] == list(range(8))
    assert batch["rollout_log_probs"][0].tolist() == pytest.approx([-0.1, -0.2, 0.0, 0.0, -0.3, 0.0])
    # verl's reward functions read num_turns and the loops' extra fields in extra_info
    assert batch["extra_info"][0] == {"i": 0, "num_turns": 4, "rollout_reward_scores": {"tool_rewards": [0.5]}}
    assert batch["extra_info"][1] == {"i": 1, "num_turns": 2}
    assert list(batch["num_turns"]) == [4, 2]
    from grpo_dist.rollout.assemble import response_tokens

    assert response_tokens(batch).sum(-1).tolist() == [5, 1]


def test_merging_ranks_keeps_trajectory_fields_and_a_prompt_too_long_is_named():
    s = SamplingSettings(n=1, temperature=1.0, max_tokens=6)
    one = _trajectories()
    merged = merge_outputs([one, RolloutOutput.empty(s), one], s)
    assert merged.response_masks == one.response_masks * 2 and merged.num_turns == [4, 2, 4, 2]
    col = collate_prompts(items([[5, 6], [7]]), pad_id=0, max_prompt_length=2)
    with pytest.raises(ValueError, match="max_prompt_length=2"):
        responses_to_batch(prompt_batch(col, "s0"), one, n=1, pad_id=0, response_length=6)
    with pytest.raises(ValueError, match="mask entries"):
        _trajectories(response_masks=[[1, 1], [1]])
    with pytest.raises(ValueError, match="num_turns has 1 entries"):
        _trajectories(num_turns=[4])
