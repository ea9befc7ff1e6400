"""Process supervision: step rewards land on the tokens that end each step (line)."""

import pytest
import torch

from grpo_dist.rewards.tokens import place_step_rewards, step_char_ends


def test_step_char_ends():
    assert step_char_ends("a\nbc\nd") == [2, 5, 6]
    assert step_char_ends("a\n") == [2]
    assert step_char_ends("") == []
    assert step_char_ends("abc") == [3]


def test_step_rewards_on_step_end_tokens():
    # response 0: tokens "ab","\n","c","d\n" -> steps "ab\n" (ends in token 1) and "cd\n" (token 3)
    # response 1: tokens "x","y\nz" -> steps "xy\n" and "z" both end in token 1 (rewards add up)
    texts = ["ab\ncd\n", "xy\nz"]
    lengths = [[2, 1, 1, 2], [1, 3]]
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], dtype=torch.float32)
    rewards, ends = place_step_rewards([[0.5, -1.0], [2.0, 3.0]], texts, lengths, mask)
    assert rewards.tolist() == [[0, 0.5, 0, -1.0, 0], [0, 5.0, 0, 0, 0]]
    assert ends.tolist() == [[0, 1, 0, 1, 0], [0, 1, 0, 0, 0]]


def test_wrong_number_of_step_rewards_names_the_response():
    mask = torch.ones(2, 3)
    with pytest.raises(ValueError, match="response 1: .* 1 step rewards for a response with 2 steps"):
        place_step_rewards([[1.0], [1.0]], ["abc", "a\nb"], [[1, 1, 1], [1, 1, 1]], mask)
    with pytest.raises(ValueError, match="response 0: .* no step rewards"):
        place_step_rewards([None, [1.0]], ["abc", "abc"], [[1, 1, 1], [1, 1, 1]], mask)
