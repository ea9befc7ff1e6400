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
