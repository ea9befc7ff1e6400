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


# ---- balancing tokens over ranks inside each mini-batch (trainer.balance_batch) ----
from grpo_dist.training.micro_batches import balanced_shard_order, seqlen_balance_metrics, shard_token_loads  # noqa: E402


def test_balanced_order_by_hand():
    # one mini-batch, 2 ranks x 2 rows: contiguous chunks give [10+9, 1+2] = [19, 3]
    lengths = [10, 9, 1, 2]
    order = balanced_shard_order(lengths, num_mini_batches=1, world_size=2)
    # dealt longest first: 10 -> r0, 9 -> r1, 2 -> r1 (9 < 10), 1 -> r0
    assert order == [0, 2, 1, 3]
    assert shard_token_loads(lengths, order, num_mini_batches=1, world_size=2) == [11, 11]
    m = seqlen_balance_metrics(lengths, order, num_mini_batches=1, world_size=2)
    assert m == {
        "global_seqlen/min": 3.0, "global_seqlen/max": 19.0, "global_seqlen/minmax_diff": 16.0,
        "global_seqlen/balanced_min": 11.0, "global_seqlen/balanced_max": 11.0, "global_seqlen/mean": 11.0,
    }


def test_rows_never_leave_their_mini_batch():
    lengths = [100, 100, 100, 100, 1, 1, 1, 1]  # mini-batch 0 is all long, mini-batch 1 all short
    order = balanced_shard_order(lengths, num_mini_batches=2, world_size=2)
    assert sorted(order[:4]) == [0, 1, 2, 3] and sorted(order[4:]) == [4, 5, 6, 7]


@pytest.mark.parametrize("seed", range(30))
def test_balanced_order_is_a_permutation_within_mini_batches_and_evens_the_load(seed):
    import random

    rng = random.Random(seed)
    M, W, per = rng.randint(1, 3), rng.randint(1, 4), rng.randint(1, 5)
    n = M * W * per
    lengths = [rng.randint(1, 200) for _ in range(n)]
    order = balanced_shard_order(lengths, num_mini_batches=M, world_size=W)
    assert sorted(order) == list(range(n))
    mini = n // M
    for k in range(M):
        assert {i // mini for i in order[k * mini : (k + 1) * mini]} == {k}
    loads = shard_token_loads(lengths, order, num_mini_batches=M, world_size=W)
    plain = shard_token_loads(lengths, list(range(n)), num_mini_batches=M, world_size=W)
    for k in range(M):
        got, before = loads[k * W : (k + 1) * W], plain[k * W : (k + 1) * W]
        longest = max(lengths[k * mini : (k + 1) * mini])
        assert max(got) - min(got) <= longest, "dealing longest first leaves at most one row's difference"
        assert max(got) <= max(before)
    assert balanced_shard_order(lengths, num_mini_batches=M, world_size=W) == order, "deterministic"


def test_balanced_order_refuses_uneven_cuts():
    with pytest.raises(ValueError, match="cannot be cut"):
        balanced_shard_order([1, 2, 3], num_mini_batches=1, world_size=2)
