"""place_scores_on_last_token."""

import torch

from grpo_dist.rewards import place_scores_on_last_token


def test_score_on_last_response_token():
    mask_BR = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [1, 0, 1, 0]])
    scores_B = torch.tensor([0.5, -1.0, 2.0, 1.0, 3.0])
    out = place_scores_on_last_token(scores_B, mask_BR)
    expected = torch.tensor([
        [0.0, 0.0, 0.5, 0.0],
        [-1.0, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0],  # empty response: no score
        [0.0, 0.0, 0.0, 1.0],
        [0.0, 0.0, 3.0, 0.0],  # a hole in the mask: the last 1 wins
    ])
    assert torch.equal(out, expected)


def test_accepts_a_list_and_keeps_float_dtype():
    out = place_scores_on_last_token([1.0, 0.0], torch.tensor([[1, 1], [1, 0]]))
    assert out.dtype == torch.float32
    assert out.tolist() == [[0.0, 1.0], [0.0, 0.0]]
    out64 = place_scores_on_last_token(torch.tensor([2.0], dtype=torch.float64), torch.ones(1, 3))
    assert out64.dtype == torch.float64 and out64.tolist() == [[0.0, 0.0, 2.0]]
