"""Generation dumps (``trainer.rollout_data_dir``, ``trainer.validation_data_dir``): verl's fields, one object per
response in the batch's order, the reward function's extra values carried from the reward worker to the file, a
file written whole, a failed write said once without stopping the run, and the configuration's checks.
(The real run's dumps: tests/e2e/test_train_e2e.py.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from grpo_dist.batch import Batch
from grpo_dist.rewards.manager import RewardScorer
from grpo_dist.rewards.rewarder import BatchRewarder
from grpo_dist.trainer.dumps import GenerationDump, batch_rows, generation_rows
from grpo_dist.trainer.reward_stage import RewardStage
from grpo_dist.trainer.validation import validate
from tests.configs import cfg_of, refused

PAD = 0


class Tok:
    """Token t is the letter chr(ord('a') + t - 1); 0 is the padding (a special token)."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(ord("a") + t - 1) for t in ids if t or not skip_special_tokens)

    def batch_decode(self, rows, skip_special_tokens=False):
        return [self.decode(r, skip_special_tokens) for r in rows]


def scored_batch(prompts: list[list[int]], responses: list[list[int]], truths: list) -> Batch:
    """Left-padded prompts and right-padded responses, as the rollout assembles them (rows of one prompt: one uid)."""
    P, R = max(map(len, prompts)), max(map(len, responses))
    p = torch.tensor([[PAD] * (P - len(x)) + x for x in prompts])
    r = torch.tensor([x + [PAD] * (R - len(x)) for x in responses])
    att = torch.cat([(p != PAD), torch.tensor([[1] * len(x) + [0] * (R - len(x)) for x in responses])], dim=1).long()
    return Batch.from_dict({"prompts": p, "responses": r, "input_ids": torch.cat([p, r], 1), "attention_mask": att,
                            "position_ids": att.cumsum(-1) - 1, "response_mask": att[:, P:].float()},
                           {"data_source": ["d"] * len(prompts), "ground_truth": truths, "extra_info": [{}] * len(prompts),
                            "uid": [f"{p}" for p in prompts]})


def hits(data_source, solution_str, ground_truth, extra_info=None):
    """verl's dict result: a score and extra values; ``note`` only for perfect answers."""
    n = sum(a == b for a, b in zip(solution_str, ground_truth))
    out = {"score": n / len(ground_truth), "hits": n}
    if n == len(ground_truth):
        out["note"] = "exact"
    return out


class RuleWorkers:
    """The reward worker group, in process: a real ``BatchRewarder`` scoring with ``fn``."""

    def __init__(self, fn):
        self.rewarder = BatchRewarder(Tok(), RewardScorer(fn, num_workers=0, timeout_s=None, on_error="raise"))

    def call(self, method, *args):
        return [getattr(self.rewarder, method)(*args[:5], token_level=args[5], step_rewards=args[6],
                                               optional_steps=args[7])]


def test_rows_have_verls_fields_then_the_extra_values_which_never_replace_them():
    rows = generation_rows(inputs=["ab", "ab"], outputs=["c", "d"], gts=[np.int64(3), {"x": 1}], scores=[1, 0.5],
                           step=7, extra=[{"acc": np.float32(1.0), "score": 99, "vec": torch.tensor([1, 2])}, {}])
    assert rows == [{"input": "ab", "output": "c", "gts": 3, "score": 1.0, "step": 7, "acc": 1.0, "vec": [1, 2]},
                    {"input": "ab", "output": "d", "gts": {"x": 1}, "score": 0.5, "step": 7}]
    assert json.dumps(rows)  # plain values only
    with pytest.raises(ValueError, match="different lengths"):
        generation_rows(inputs=["a"], outputs=[], gts=[1], scores=[1.0], step=1)


def test_the_reward_functions_extra_values_reach_the_batch_rows_and_the_file(tmp_path):
    """From the reward worker (a dict result) through the reward stage into the batch, then decoded into the
    dump: the prompt and response texts without padding, every row with every extra key (null where a sample
    did not return it, as verl)."""
    b = scored_batch([[1, 2], [3]], [[1, 2, 3], [2]], ["abc", "ab"])
    stage = RewardStage(RuleWorkers(hits), needs_step_rewards=False, overlong=None)
    scores, _ = stage.score(b)
    assert scores.tolist() == [1.0, 0.0]
    assert list(b["reward_extra_info"]) == [{"hits": 3, "note": "exact"}, {"hits": 0, "note": None}]
    rows = batch_rows(b, Tok(), b["token_level_scores"].sum(-1).tolist(), step=4)
    assert [(r["input"], r["output"], r["gts"], r["score"], r["hits"], r["note"]) for r in rows] == [
        ("ab", "abc", "abc", 1.0, 3, "exact"), ("c", "b", "ab", 0.0, 0, None)]
    path = GenerationDump(str(tmp_path / "d"), "trainer.rollout_data_dir").write(4, rows)
    assert path == tmp_path / "d" / "4.jsonl"
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows


def test_a_function_returning_numbers_gives_its_score_as_acc():
    b = scored_batch([[1]], [[1]], ["a"])
    RewardStage(RuleWorkers(lambda data_source, solution_str, ground_truth, extra_info=None: 1.0),
                needs_step_rewards=False, overlong=None).score(b)
    assert list(b["reward_extra_info"]) == [{"acc": 1.0}]


def test_validation_dumps_every_response_of_every_batch_at_its_step(tmp_path):
    data = [{"p": [1], "truth": "a"}, {"p": [2], "truth": "b"}, {"p": [3], "truth": "z"}]

    def generate(items, tag):  # two responses per prompt: the prompt's own letter, then "a"
        return scored_batch([it["p"] for it in items for _ in range(2)], [x for it in items for x in (it["p"], [1])],
                            [it["truth"] for it in items for _ in range(2)])

    dump = GenerationDump(str(tmp_path / "val"), "trainer.validation_data_dir")
    scores = lambda b: torch.tensor([float(r == g) for r, g in zip(Tok().batch_decode(b["responses"].tolist(), True),
                                                                    b["ground_truth"])])  # noqa: E731
    out = validate(data, generate=generate, score=scores, batch_size=2, tokenizer=Tok(), step=5, dump=dump)
    rows = [json.loads(line) for line in (tmp_path / "val" / "5.jsonl").read_text().splitlines()]
    assert [(r["input"], r["output"], r["score"], r["step"]) for r in rows] == [
        ("a", "a", 1.0, 5), ("a", "a", 1.0, 5), ("b", "b", 1.0, 5), ("b", "a", 0.0, 5), ("c", "c", 0.0, 5),
        ("c", "a", 0.0, 5)]
    assert out["val-core/d/reward/mean@2"] == pytest.approx(sum(r["score"] for r in rows) / len(rows))


def test_a_file_is_replaced_whole_and_a_failed_write_is_said_once_without_stopping(tmp_path, capsys):
    dump = GenerationDump(str(tmp_path / "d"), "trainer.rollout_data_dir")
    dump.write(1, [{"a": 1}, {"a": 2}])
    dump.write(1, [{"a": 3}])  # a resumed run rewrites the step after its checkpoint
    assert (tmp_path / "d" / "1.jsonl").read_text() == '{"a": 3}\n'
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["1.jsonl"]  # no temporary left

    (tmp_path / "d" / "2.jsonl").mkdir()  # a folder where the file should go: the write fails
    assert dump.write(2, [{"a": 1}]) is None and dump.write(2, [{"a": 1}]) is None
    err = capsys.readouterr().err
    assert err.count("grpo_dist: warning: step 2's generations were not dumped: cannot write to "
                     f"trainer.rollout_data_dir={tmp_path / 'd'}") == 1
    assert "Training goes on" in err and "Traceback" not in err
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["1.jsonl", "2.jsonl"]


def test_the_folders_are_off_by_default_and_may_not_be_the_same():
    cfg = cfg_of()
    assert cfg.trainer.rollout_data_dir is None and cfg.trainer.validation_data_dir is None
    assert cfg_of("trainer.rollout_data_dir=/tmp/r", "trainer.validation_data_dir=/tmp/v").trainer.rollout_data_dir == "/tmp/r"
    msg = refused("trainer.rollout_data_dir=/tmp/same", "trainer.validation_data_dir=/tmp/same/")
    assert "trainer.validation_data_dir" in msg and "also trainer.rollout_data_dir" in msg and "different folders" in msg


def test_validation_of_agent_trajectories_reports_their_turns_as_verl():
    def generate(items, tag):
        b = scored_batch([it["p"] for it in items], [it["p"] for it in items], ["a"] * len(items))
        b["num_turns"] = [it["turns"] for it in items]
        return b

    data = [{"p": [1], "turns": 2}, {"p": [2], "turns": 4}, {"p": [3], "turns": 6}]
    out = validate(data, generate=generate, score=lambda b: torch.zeros(len(b)), batch_size=2, tokenizer=Tok())
    assert (out["val-aux/num_turns/min"], out["val-aux/num_turns/max"], out["val-aux/num_turns/mean"]) == (2, 6, 4)
    plain = validate(data[:1], generate=lambda items, tag: scored_batch([[1]], [[1]], ["a"]),
                     score=lambda b: torch.zeros(len(b)), batch_size=2, tokenizer=Tok())
    assert not any("num_turns" in k for k in plain)
