"""DAPO's dynamic sampling: the group filter (by hand and against a plain loop) and the refill loop
(DynamicSampling.collect) driven with stand-ins for "the next prompts" and "generate and score"."""

from __future__ import annotations

import random

import pytest
import torch

from grpo_dist.batch import Batch
from grpo_dist.core.group_filter import groups_with_spread
from grpo_dist.trainer.dynamic_sampling import (
    DynamicSampling,
    DynamicSamplingError,
    SingleBatch,
    merge_stats,
    metric_values,
)

N = 3  # responses per prompt


# --------------------------------------------------------------------------------------------------
# the group filter
# --------------------------------------------------------------------------------------------------


def test_group_filter_by_hand():
    # group a: [1, 1] no spread -> dropped; group b: [0, 1] -> kept; group c: a single row -> kept (verl)
    keep, groups, kept = groups_with_spread(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5]), ["a", "a", "b", "b", "c"])
    assert keep.tolist() == [False, False, True, True, True] and (groups, kept) == (3, 2)
    # rows of a group need not be adjacent
    keep, groups, kept = groups_with_spread(torch.tensor([0.0, 2.0, 0.0, 2.0]), ["a", "b", "a", "b"])
    assert keep.tolist() == [False, False, False, False] and (groups, kept) == (2, 0)


def test_group_filter_matches_a_plain_loop():
    rng = random.Random(0)
    index = [f"g{rng.randrange(25)}" for _ in range(60)]
    values = [float(rng.random() < 0.15) if rng.random() < 0.9 else rng.random() for _ in index]
    keep, groups, kept = groups_with_spread(torch.tensor(values), index)
    members: dict[str, list[float]] = {}
    for g, v in zip(index, values):
        members.setdefault(g, []).append(v)

    def spread(vals):  # population standard deviation > 0 (DAPO), or a lone response (verl keeps it)
        mean = sum(vals) / len(vals)
        return len(vals) == 1 or sum((v - mean) ** 2 for v in vals) / len(vals) > 0

    assert keep.tolist() == [spread(members[g]) for g in index]
    assert (groups, kept) == (len(members), sum(spread(v) for v in members.values()))
    assert 0 < kept < groups


# --------------------------------------------------------------------------------------------------
# the refill loop
# --------------------------------------------------------------------------------------------------


def prompt(name: str, rewards: list[float], shaped: list[float] | None = None) -> dict:
    return {"name": name, "rewards": rewards, "shaped": shaped if shaped is not None else rewards}


def flat(n_with: int, n_without: int, tag: str) -> list[dict]:
    """``n_with`` prompts whose responses differ, then ``n_without`` whose responses all score 1."""
    return ([prompt(f"{tag}{i}", [1.0, 0.0, 0.0]) for i in range(n_with)]
            + [prompt(f"{tag}{n_with + i}", [1.0, 1.0, 1.0]) for i in range(n_without)])


class Generator:
    """Stands in for the driver: generation batch k of the step for the given prompts, N rows per
    prompt grouped by uid, with the keys the filter reads; its reward statistics count the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, list[str]]] = []

    def __call__(self, items: list[dict], k: int):
        self.calls.append((k, [it["name"] for it in items]))
        rows = [(it, j) for it in items for j in range(N)]
        scores = torch.tensor([it["rewards"][j] for it, j in rows])
        shaped = torch.tensor([it["shaped"][j] for it, j in rows])
        token_level = torch.zeros(len(rows), 2)
        token_level[:, 1] = shaped
        batch = Batch.from_dict({"scores": scores, "token_level_scores": token_level},
                                {"uid": [f"g{k}-{it['name']}" for it, _ in rows], "name": [it["name"] for it, _ in rows]})
        return batch, {"reward/num_responses": float(len(rows)), "reward/mean": float(scores.mean())}


class Prompts:
    """The data: each call to next_items() gives the next generation batch's prompts."""

    def __init__(self, *batches: list[dict]) -> None:
        self.batches = list(batches)
        self.calls = 0

    def __call__(self) -> list[dict]:
        self.calls += 1
        return self.batches.pop(0)


def groups_in(batch: Batch) -> list[str]:
    names = list(batch["name"])
    return [names[i] for i in range(0, len(names), N)]


def test_refill_until_enough_groups_with_spread():
    # want 4 groups; batch 0 has 2 with spread (a0, a1) and 2 without; batch 1 has 3 with spread.
    # Two generation batches, 8 groups generated, 5 kept, 3 dropped; the step trains on the first
    # 4 kept groups in generation order: a0, a1, b0, b1 (b2 is left over)
    gen, more = Generator(), Prompts(flat(3, 1, "b"))
    ds = DynamicSampling(train_batch_size=4, metric="acc", max_num_gen_batches=0)
    out, m = ds.collect(flat(2, 2, "a"), more, gen)
    assert [k for k, _ in gen.calls] == [0, 1] and more.calls == 1
    assert groups_in(out) == ["a0", "a1", "b0", "b1"]
    assert len(out) == 4 * N and out["scores"].tolist() == [1.0, 0.0, 0.0] * 4
    assert m == pytest.approx({
        "train/num_gen_batches": 2.0,
        "training/filter_groups/num_groups": 8.0,
        "training/filter_groups/num_kept_groups": 5.0,
        "training/filter_groups/num_dropped_groups": 3.0,
        "training/filter_groups/kept_fraction": 5 / 8,
        "training/filter_groups/num_train_groups": 4.0,
        "training/filter_groups/exhausted": 0.0,
        "reward/num_responses": 24.0,  # counts add up over the generation batches
        "reward/mean": ((2 * 1 / 3 + 2) / 4 + (3 * 1 / 3 + 1) / 4) / 2,  # other stats are averaged
    })


def test_one_generation_batch_is_enough_when_every_group_has_spread():
    gen = Generator()
    out, m = DynamicSampling(train_batch_size=2, metric="acc").collect(flat(2, 0, "a"), Prompts(), gen)
    assert len(gen.calls) == 1 and groups_in(out) == ["a0", "a1"]
    assert m["train/num_gen_batches"] == 1.0 and m["training/filter_groups/num_dropped_groups"] == 0.0


def test_no_limit_keeps_generating():
    gen, more = Generator(), Prompts(flat(0, 2, "b"), flat(0, 2, "c"), flat(1, 1, "d"))
    out, m = DynamicSampling(train_batch_size=2, metric="acc", max_num_gen_batches=0).collect(flat(1, 1, "a"), more, gen)
    assert groups_in(out) == ["a0", "d0"] and m["train/num_gen_batches"] == 4.0


def test_limit_reached_is_an_error_by_default():
    gen, more = Generator(), Prompts(flat(1, 3, "b"))
    ds = DynamicSampling(train_batch_size=4, metric="acc", max_num_gen_batches=2)
    with pytest.raises(DynamicSamplingError) as info:
        ds.collect(flat(1, 3, "a"), more, gen)
    msg = str(info.value)
    assert "kept 2 of the 4" in msg and "2 generation batches" in msg
    assert "algorithm.filter_groups.max_num_gen_batches" in msg and "on_exhausted=train" in msg
    assert len(gen.calls) == 2  # it stopped at the limit


def test_limit_reached_trains_on_whole_mini_batches_of_the_kept_groups():
    # on_exhausted=train, mini-batches of 2 prompts: 3 kept groups -> the first 2 train
    gen, more = Generator(), Prompts(flat(1, 3, "b"))
    ds = DynamicSampling(train_batch_size=4, metric="acc", max_num_gen_batches=2, on_exhausted="train",
                         mini_batch_prompts=2)
    out, m = ds.collect(flat(2, 2, "a"), more, gen)
    assert groups_in(out) == ["a0", "a1"]
    assert m["training/filter_groups/exhausted"] == 1.0 and m["training/filter_groups/num_train_groups"] == 2.0
    assert m["training/filter_groups/num_kept_groups"] == 3.0
    # fewer kept groups than one mini-batch: topped up with dropped groups to one mini-batch
    gen, more = Generator(), Prompts(flat(0, 4, "b"))
    out, m = ds.collect(flat(1, 3, "a"), more, gen)
    assert groups_in(out) == ["a0", "a1"]  # a0 kept, a1 (dropped, first in generation order) tops up
    assert m["training/filter_groups/num_train_groups"] == 2.0
    # none kept at all: one mini-batch of dropped groups
    gen, more = Generator(), Prompts(flat(0, 4, "b"))
    out, _ = ds.collect(flat(0, 4, "a"), more, gen)
    assert groups_in(out) == ["a0", "a1"]


def test_too_few_prompts_for_one_mini_batch_is_a_clear_error():
    # 1 prompt per generation batch, a limit of 1 batch, mini-batches of 2 prompts: nothing can fill one
    ds = DynamicSampling(train_batch_size=2, metric="acc", max_num_gen_batches=1, on_exhausted="train",
                         mini_batch_prompts=2)
    with pytest.raises(DynamicSamplingError, match="ppo_mini_batch_size"):
        ds.collect(flat(0, 1, "a"), Prompts(), Generator())


@pytest.mark.parametrize("metric,kept", [("acc", ["a0"]), ("score", ["a0"]), ("seq_reward", ["a0", "a1"]),
                                         ("seq_final_reward", ["a0", "a1"])])
def test_filter_metric_chooses_what_must_differ(metric, kept):
    # a1's scores are all 1 but its shaped (token-level) rewards differ, as overlong shaping can make them
    items = [prompt("a0", [1.0, 0.0, 0.0]), prompt("a1", [1.0, 1.0, 1.0], shaped=[1.0, 0.8, 1.0])]
    gen = Generator()
    out, m = DynamicSampling(train_batch_size=1, metric=metric).collect(items, Prompts(), gen)
    assert m["training/filter_groups/num_kept_groups"] == len(kept)


def test_metric_values_read_the_documented_keys():
    b = Batch.from_dict({"scores": torch.tensor([1.0, 0.0]),
                         "token_level_scores": torch.tensor([[0.0, 1.0], [0.5, 0.0]]),
                         "token_level_rewards": torch.tensor([[0.0, 2.0], [0.0, 3.0]])})
    assert metric_values(b, "acc").tolist() == [1.0, 0.0] == metric_values(b, "score").tolist()
    assert metric_values(b, "seq_reward").tolist() == [1.0, 0.5]
    assert metric_values(b, "seq_final_reward").tolist() == [2.0, 3.0]
    with pytest.raises(ValueError, match="algorithm.filter_groups.metric"):
        metric_values(b, "accuracy")


def test_single_batch_is_one_generation_batch():
    gen = Generator()
    out, m = SingleBatch().collect(flat(1, 1, "a"), Prompts(), gen)
    assert len(gen.calls) == 1 and groups_in(out) == ["a0", "a1"]  # nothing dropped
    assert m == pytest.approx({"reward/num_responses": 6.0, "reward/mean": 4 / 6})


def test_merge_stats_adds_counts_and_averages_the_rest():
    got = merge_stats([{"reward/num_x": 2.0, "reward/mean": 1.0}, {"reward/num_x": 3.0, "reward/mean": 0.0, "y": 4.0}])
    assert got == {"reward/num_x": 5.0, "reward/mean": 0.5, "y": 4.0}


def test_settings_are_checked():
    with pytest.raises(ValueError, match="filter metric"):
        DynamicSampling(train_batch_size=4, metric="nope")
    with pytest.raises(ValueError, match="on_exhausted"):
        DynamicSampling(train_batch_size=4, metric="acc", on_exhausted="skip")
    with pytest.raises(ValueError, match="multiple of mini_batch_prompts"):
        DynamicSampling(train_batch_size=4, metric="acc", mini_batch_prompts=3)
