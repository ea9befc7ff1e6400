"""Per-step metrics the user reads: verl's response-length clip ratio and the warning when most
responses are cut at the response limit; the share of groups with no learning signal and the warning when
steps in a row teach nothing."""

from __future__ import annotations

import pytest
import torch

from grpo_dist.batch import Batch
from grpo_dist.trainer.metrics import (CLIP_RATIO_WARN_THRESHOLD, NO_SIGNAL_STEPS, NoSignalWarning, ResponseClipWarning,
                                       data_metrics)


def _batch(response_lengths: list[int], width: int, advantages: torch.Tensor | None = None) -> Batch:
    rows = len(response_lengths)
    mask = torch.zeros(rows, width)
    for i, n in enumerate(response_lengths):
        mask[i, :n] = 1
    prompts = torch.ones(rows, 3, dtype=torch.long)
    zeros = torch.zeros(rows, width)
    return Batch.from_dict({
        "prompts": prompts, "responses": torch.ones(rows, width, dtype=torch.long), "response_mask": mask,
        "attention_mask": torch.cat([torch.ones(rows, 3), mask], dim=1).long(),
        "token_level_scores": zeros, "token_level_rewards": zeros, "advantages": advantages if advantages is not None
        else zeros, "returns": zeros,
    }, {"uid": [f"p{i // 2}" for i in range(rows)]})


def test_clip_ratio_is_the_fraction_of_responses_at_the_limit():
    # verl: mean(response_length == max_response_length); the EOS token counts in the length
    m = data_metrics(_batch([8, 8, 3, 8], width=8), max_response_length=8)
    assert m["response_length/clip_ratio"] == pytest.approx(0.75)
    assert m["response_length/mean"] == pytest.approx(6.75)


def test_warns_once_when_most_responses_are_cut_and_names_the_key():
    seen: list[str] = []
    w = ResponseClipWarning(max_response_length=16, emit=seen.append)
    assert w.observe(0.5, step=1) is None  # half is not "most": the threshold is strict
    msg = w.observe(0.875, step=2)
    assert msg is not None and seen == [msg]
    assert "data.max_response_length = 16" in msg and "88%" in msg and "step 2" in msg
    assert w.observe(1.0, step=3) is None and w.observe(0.9, step=4) is None  # once per run
    assert seen == [msg]


def test_no_warning_while_responses_end_on_their_own():
    seen: list[str] = []
    w = ResponseClipWarning(max_response_length=16, emit=seen.append)
    for step, ratio in enumerate([0.0, 0.2, CLIP_RATIO_WARN_THRESHOLD, 0.1], start=1):
        assert w.observe(ratio, step=step) is None
    assert seen == []


def test_the_threshold_is_a_setting():
    seen: list[str] = []
    w = ResponseClipWarning(max_response_length=4, threshold=0.1, emit=seen.append)
    assert w.observe(0.2, step=1) is not None and len(seen) == 1
    with pytest.raises(ValueError, match="threshold = 1.5"):
        ResponseClipWarning(max_response_length=4, threshold=1.5)


def test_default_emit_prints_to_stdout(capsys):
    ResponseClipWarning(max_response_length=8).observe(1.0, step=1)
    assert "grpo_dist: warning: 100% of the responses of step 1" in capsys.readouterr().out


def test_the_zero_advantage_group_ratio_is_a_step_metric():
    adv = torch.zeros(4, 8)
    adv[3, 0] = 0.7  # the second group (rows 2, 3) carries a signal, the first does not
    m = data_metrics(_batch([8, 8, 3, 8], width=8, advantages=adv), max_response_length=8)
    assert m["training/zero_advantage_group_ratio"] == pytest.approx(0.5)


def _step(ratio: float, score: float = 0.0, entropy: float = 0.004) -> dict[str, float]:
    return {"training/zero_advantage_group_ratio": ratio, "critic/score/mean": score, "actor/entropy": entropy}


def test_warns_once_per_stretch_of_steps_that_teach_nothing():
    seen: list[str] = []
    w = NoSignalWarning(emit=seen.append)
    assert NO_SIGNAL_STEPS == 10
    assert w.observe(_step(1.0, entropy=0.28), 1) is None
    for step in range(2, 10):  # nine steps: not yet
        assert w.observe(_step(1.0), step) is None
    msg = w.observe(_step(0.97), 10)
    assert seen == [msg]
    assert "steps 1-10" in msg and "critic/score/mean 0" in msg and "actor/entropy 0.004 (0.28 at step 1)" in msg
    assert "actor_rollout_ref.actor.optim.lr" in msg and "training/zero_advantage_group_ratio" in msg
    for step in range(11, 30):  # the same stretch goes on: said once
        w.observe(_step(1.0), step)
    assert len(seen) == 1
    w.observe(_step(0.5), 30)  # a step that teaches ends the stretch; the next full stretch is said again
    for step in range(31, 41):
        w.observe(_step(1.0, score=1.0), step)
    assert len(seen) == 2 and "steps 31-40" in seen[1] and "critic/score/mean 1" in seen[1]


def test_no_warning_while_some_groups_differ():
    seen: list[str] = []
    w = NoSignalWarning(emit=seen.append)
    for step in range(1, 100):  # a group in ten carries a signal every step (ratio 0.9 < 0.95)
        w.observe(_step(0.9), step)
    for step in range(100, 200):  # a healthy run's steps, and steps without the metric
        w.observe(_step(0.4 + 0.5 * (step % 2)) if step % 3 else {}, step)
    assert seen == []
    with pytest.raises(ValueError, match="steps >= 1"):
        NoSignalWarning(steps=0)
