"""Micro-batch planning: by count, by token budget, order restore, rank layout (no processes)."""

from __future__ import annotations

import random

import pytest
import torch

from grpo_dist.training.micro_batches import (
    make_micro_batches,
    plan_micro_batches,
    rank_shard_indices,
    restore_order,
    split_by_count,
    split_by_token_budget,
    split_to_count,
    take_rows,
)


def mask_with_lengths(lengths: list[int], width: int = 16) -> torch.Tensor:
    m = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        m[i, width - n :] = 1  # left padding: only the count matters
    return m


def assert_partition(mbs: list[list[int]], n: int) -> None:
    flat = [i for m in mbs for i in m]
    assert sorted(flat) == list(range(n)), "every row exactly once"
    assert all(m for m in mbs), "no empty micro-batch"


def test_split_by_count():
    assert split_by_count(7, 3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert split_by_count(4, 4) == [[0, 1, 2, 3]]
    assert split_by_count(4, 10) == [[0, 1, 2, 3]]
    assert split_by_count(0, 2) == []
    with pytest.raises(ValueError):
        split_by_count(4, 0)


@pytest.mark.parametrize("seed", range(20))
def test_token_budget_is_respected_and_every_row_is_used_once(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(1, 40) for _ in range(rng.randint(1, 30))]
    budget = rng.randint(20, 80)
    mbs = split_by_token_budget(lengths, budget)
    assert_partition(mbs, len(lengths))
    for m in mbs:
        total = sum(lengths[i] for i in m)
        assert total <= budget or len(m) == 1, (m, total, budget)
    # tight packing (the first-fit property): no two micro-batches could be merged within the budget
    loads = [sum(lengths[i] for i in m) for m in mbs]
    assert all(loads[i] + loads[j] > budget for i in range(len(loads)) for j in range(i + 1, len(loads)))
    assert mbs == split_by_token_budget(lengths, budget), "deterministic"
    assert all(m == sorted(m) for m in mbs)


def test_token_budget_packs_tightly():
    # 4 rows of 10 and 4 of 5 fit exactly in 3 micro-batches of 20 (10+10, 10+10, 5*4)
    assert len(split_by_token_budget([10, 5, 10, 5, 10, 5, 10, 5], 20)) == 3
    # first-fit decreasing fills gaps with later short rows
    assert split_by_token_budget([8, 2, 7, 3], 10) == [[0, 1], [2, 3]]


def test_row_longer_than_budget_goes_alone():
    mbs = split_by_token_budget([50, 3, 4, 60], 10)
    assert [0] in mbs and [3] in mbs and [1, 2] in mbs
    assert len(mbs) == 3


def test_make_micro_batches_uses_attention_mask_lengths():
    m = mask_with_lengths([10, 6, 4, 2])
    assert make_micro_batches(m, max_token_len=12) == [[0, 3], [1, 2]]
    assert make_micro_batches(m, micro_batch_size=3) == [[0, 1, 2], [3]]
    with pytest.raises(ValueError):
        make_micro_batches(m)
    with pytest.raises(ValueError):
        make_micro_batches(m, micro_batch_size=2, max_token_len=10)


def test_plan_without_process_group_and_whole_batch_default():
    m = mask_with_lengths([3, 3, 3])
    assert plan_micro_batches(m) == [[0, 1, 2]]
    assert plan_micro_batches(m, micro_batch_size=2) == [[0, 1], [2]]


def test_restore_order_inverts_any_packing():
    lengths = [7, 1, 9, 3, 3, 8, 2]
    values = torch.arange(len(lengths) * 3, dtype=torch.float32).reshape(len(lengths), 3)
    for mbs in (split_by_token_budget(lengths, 10), split_by_count(len(lengths), 3), [[6, 0], [3, 1, 5], [2, 4]]):
        pieces = [take_rows({"v": values}, m)["v"] * 1.0 for m in mbs]
        assert torch.equal(restore_order(pieces, mbs), values)
    with pytest.raises(ValueError):
        restore_order([values[:1]], [[1]])  # not a permutation of 0..N-1


def test_split_to_count_keeps_budget_and_rows():
    lengths = [6, 6, 2, 2, 2, 2]
    mbs = split_by_token_budget(lengths, 12)
    assert len(mbs) == 2
    more = split_to_count(mbs, 5)
    assert len(more) == 5
    assert_partition(more, len(lengths))
    assert all(sum(lengths[i] for i in m) <= 12 for m in more)
    with pytest.raises(ValueError):
        split_to_count(mbs, 7)  # only 6 rows
    with pytest.raises(ValueError):
        split_to_count(mbs, 1)  # never merges


def test_rank_shard_layout():
    # 12 rows, 3 mini-batches of 4, 2 ranks: rank r takes half of every mini-batch, in order
    assert rank_shard_indices(12, num_mini_batches=3, rank=0, world_size=2) == [0, 1, 4, 5, 8, 9]
    assert rank_shard_indices(12, num_mini_batches=3, rank=1, world_size=2) == [2, 3, 6, 7, 10, 11]
    union = sorted(
        i for r in range(3) for i in rank_shard_indices(12, num_mini_batches=2, rank=r, world_size=3)[2:4]
    )
    assert union == [6, 7, 8, 9, 10, 11], "chunk 1 over all ranks is global mini-batch 1"
    with pytest.raises(ValueError):
        rank_shard_indices(10, num_mini_batches=3, rank=0, world_size=2)
