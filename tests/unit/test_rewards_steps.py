"""Process supervision: step rewards land on the tokens that end each step (line)."""

import pytest
import torch

from grpo_dist.rewards.tokens import place_step_rewards, step_char_ends


def test_step_char_ends():
    assert step_char_ends("a\nbc\nd") == [2, 5, 6]
    assert step_char_ends("a\n") == [2]
    assert step_char_ends("") == []
    assert step_char_ends("abc") == [3]


#: A toy vocabulary: token id -> its text; a response decodes to its pieces joined.
PIECES = ["ab", "\n", "c", "d\n", "x", "y\nz"]


def decode(seqs):
    return ["".join(PIECES[t] for t in ids) for ids in seqs]


def test_step_rewards_on_step_end_tokens():
    # response 0: tokens "ab","\n","c","d\n" -> steps "ab\n" (ends in token 1) and "cd\n" (token 3)
    # response 1: tokens "x","y\nz" -> steps "xy\n" and "z" both end in token 1 (rewards add up)
    ids = [[0, 1, 2, 3], [4, 5]]
    texts = decode(ids)
    assert texts == ["ab\ncd\n", "xy\nz"]
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], dtype=torch.float32)
    rewards, ends = place_step_rewards([[0.5, -1.0], [2.0, 3.0]], texts, ids, mask, decode)
    assert rewards.tolist() == [[0, 0.5, 0, -1.0, 0], [0, 5.0, 0, 0, 0]]
    assert ends.tolist() == [[0, 1, 0, 1, 0], [0, 1, 0, 0, 0]]


def test_wrong_number_of_step_rewards_names_the_response():
    mask = torch.ones(2, 3)
    with pytest.raises(ValueError, match="response 1: .* 1 step rewards for a response with 2 steps"):
        place_step_rewards([[1.0], [1.0]], ["abc", "a\nb"], [[0, 2, 2], [0, 1, 2]], mask, decode)
    with pytest.raises(ValueError, match="response 0: .* no step rewards"):
        place_step_rewards([None, [1.0]], ["abc", "abc"], [[0, 2, 2], [0, 2, 2]], mask, decode)
