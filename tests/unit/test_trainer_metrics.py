"""Per-step metrics the user reads: verl's response-length clip ratio and the warning when most
responses are cut at the response limit."""

from __future__ import annotations

import pytest
import torch

from grpo_dist.batch import Batch
from grpo_dist.trainer.metrics import CLIP_RATIO_WARN_THRESHOLD, ResponseClipWarning, data_metrics


def _batch(response_lengths: list[int], width: int) -> Batch:
    rows = len(response_lengths)
    mask = torch.zeros(rows, width)
    for i, n in enumerate(response_lengths):
        mask[i, :n] = 1
    prompts = torch.ones(rows, 3, dtype=torch.long)
    zeros = torch.zeros(rows, width)
    return Batch.from_dict({
        "prompts": prompts, "responses": torch.ones(rows, width, dtype=torch.long), "response_mask": mask,
        "attention_mask": torch.cat([torch.ones(rows, 3), mask], dim=1).long(),
        "token_level_scores": zeros, "token_level_rewards": zeros, "advantages": zeros, "returns": zeros,
    })


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
