"""BatchRewarder: decode responses (special tokens skipped), score them, place the scores on tokens."""

import pytest
import torch

from grpo_dist.rewards.manager import RewardScorer
from grpo_dist.rewards.rewarder import BatchRewarder
from grpo_dist.rewards.tokens import place_scores_on_last_token, step_char_ends

EOS, IM_END, PAD = 1, 3, 0


@pytest.fixture(scope="module")
def tokenizer():
    """A byte-level BPE tokenizer (Qwen2's class, as the tiny test model has) with a few merges, so
    that some tokens hold several characters ("abc", "xy") or several steps' ends ("\\n\\n")."""
    from transformers import Qwen2Tokenizer

    from grpo_dist.utils.tiny_model import EOS_TOKEN, IM_END_TOKEN, IM_START_TOKEN, PAD_TOKEN, SPECIAL_TOKENS, _bytes_to_unicode

    symbol = _bytes_to_unicode()
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in "abcdxyz12\n ":
        vocab[symbol[ord(ch)]] = len(vocab)
    merges = [("a", "b"), ("ab", "c"), ("Ċ", "Ċ"), ("x", "y")]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges, pad_token=PAD_TOKEN, eos_token=EOS_TOKEN, unk_token=None,
                         extra_special_tokens=[IM_START_TOKEN, IM_END_TOKEN], clean_up_tokenization_spaces=False)
    assert [tok.convert_ids_to_tokens(i) for i in (PAD, EOS, IM_END)] == [PAD_TOKEN, EOS_TOKEN, IM_END_TOKEN]
    return tok


def one_per_line(data_source, solution_str, ground_truth, extra_info=None):
    """1.0 when the decoded text is the ground truth; step k (line k) gets reward k + 1."""
    steps = solution_str.splitlines(keepends=True)
    return {"score": float(solution_str == ground_truth), "step_rewards": [float(k + 1) for k in range(len(steps))]}


def outcome_only(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str == ground_truth)


def batch(tokenizer):
    """Four responses, R = 7: with EOS at the end, with a special token inside, unfinished, empty."""
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    rows = [enc("abc\nab\n") + [EOS], enc("a")[:1] + [IM_END] + enc("\n\nb"), enc("xyz\n12"), []]
    assert [len(r) for r in rows] == [5, 4, 5, 0]  # "abc" and "xy" are one token each, "\n\n" is one token
    R = 7
    responses = torch.full((len(rows), R), PAD, dtype=torch.long)
    mask = torch.zeros((len(rows), R), dtype=torch.float32)
    for b, ids in enumerate(rows):
        responses[b, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        mask[b, :len(ids)] = 1.0
    texts = ["abc\nab\n", "a\n\nb", "xyz\n12", ""]
    return responses, mask, texts


def compute(tokenizer, fn, *, token_level, step_rewards, truths=None):
    responses, mask, texts = batch(tokenizer)
    rewarder = BatchRewarder(tokenizer, RewardScorer(fn, num_workers=0, timeout_s=None, on_error="raise"))
    n = len(texts)
    return rewarder.compute(responses, mask, ["d"] * n, truths or texts, [{}] * n,
                            token_level=token_level, step_rewards=step_rewards)


def test_outcome_score_on_the_last_response_token(tokenizer):
    responses, mask, _ = batch(tokenizer)
    out = compute(tokenizer, outcome_only, token_level=True, step_rewards=False,
                  truths=["abc\nab\n", "a\n\nb", "wrong", ""])
    # the scored texts have no special tokens: EOS and <|im_end|> were skipped
    assert out.scores_B.dtype == torch.float32 and out.scores_B.tolist() == [1.0, 1.0, 0.0, 1.0]
    assert out.token_level_scores_BR.dtype == torch.float32
    assert out.token_level_scores_BR.tolist() == [
        [0, 0, 0, 0, 1.0, 0, 0],  # on the EOS token, the last one of the response
        [0, 0, 0, 1.0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 0],  # empty response: no token to hold it
    ]
    assert torch.equal(out.token_level_scores_BR, place_scores_on_last_token(out.scores_B, mask))
    assert out.step_end_mask_BR is None
    assert out.stats == {"reward/num_errors": 0.0, "reward/num_timeouts": 0.0}


def test_scores_only(tokenizer):
    out = compute(tokenizer, outcome_only, token_level=False, step_rewards=False)
    assert out.scores_B.tolist() == [1.0] * 4
    assert out.token_level_scores_BR is None and out.step_end_mask_BR is None


def test_step_rewards_on_the_tokens_that_end_each_step(tokenizer):
    out = compute(tokenizer, one_per_line, token_level=True, step_rewards=True)
    assert out.token_level_scores_BR.tolist() == [
        [0, 1.0, 0, 2.0, 0, 0, 0],  # "abc" "\n" | "ab" "\n" | EOS
        [0, 0, 3.0, 3.0, 0, 0, 0],  # "a" <|im_end|> "\n\n" "b": steps "a\n" and "\n" both end in "\n\n"
        [0, 0, 1.0, 0, 2.0, 0, 0],  # "xy" "z" "\n" | "1" "2"
        [0, 0, 0, 0, 0, 0, 0],
    ]
    assert out.step_end_mask_BR.tolist() == [
        [0, 1, 0, 1, 0, 0, 0],
        [0, 0, 1, 1, 0, 0, 0],
        [0, 0, 1, 0, 1, 0, 0],
        [0, 0, 0, 0, 0, 0, 0],
    ]
    assert out.scores_B.tolist() == [1.0] * 4


def test_step_placement_equals_placement_from_prefix_decoding(tokenizer):
    """Each step's reward on the first token whose prefix of the response decodes to a text that holds
    the whole step (special tokens skipped, as the scored text was decoded)."""
    responses, mask, texts = batch(tokenizer)
    out = compute(tokenizer, one_per_line, token_level=True, step_rewards=True)
    for b, text in enumerate(texts):
        cols = torch.nonzero(mask[b], as_tuple=True)[0].tolist()
        ids = responses[b, cols].tolist()
        prefixes = tokenizer.batch_decode([ids[:n] for n in range(1, len(ids) + 1)], skip_special_tokens=True)
        want = torch.zeros(mask.shape[1])
        for k, end in enumerate(step_char_ends(text)):
            want[cols[next(i for i, p in enumerate(prefixes) if p.startswith(text[:end]))]] += k + 1
        assert torch.equal(out.token_level_scores_BR[b], want)
        assert torch.equal(out.step_end_mask_BR[b], (want != 0).float())


class CountingTokenizer:
    """Counts the token sequences decoded through it."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.decoded = 0

    def batch_decode(self, sequences, **kwargs):
        self.decoded += len(sequences)
        return self.tokenizer.batch_decode(sequences, **kwargs)

    def decode(self, ids, **kwargs):
        self.decoded += 1
        return self.tokenizer.decode(ids, **kwargs)


def test_step_ends_cost_a_few_prefix_decodes_not_one_per_token(tokenizer):
    """A response of over 300 tokens in 4 lines of unequal lengths: its step ends are found with a few
    prefix decodes per step."""
    counting = CountingTokenizer(tokenizer)
    text = "".join(("xy1 2ab" * 12 + "\n") if k % 2 else ("z 12" * 30 + "\n") for k in range(4)).rstrip("\n")
    ids = tokenizer.encode(text, add_special_tokens=False)
    responses, mask = torch.tensor([ids]), torch.ones(1, len(ids))
    rewarder = BatchRewarder(counting, RewardScorer(one_per_line, num_workers=0, timeout_s=None, on_error="raise"))
    out = rewarder.compute(responses, mask, ["d"], [text], [{}], token_level=True, step_rewards=True)
    prefixes = tokenizer.batch_decode([ids[:n] for n in range(1, len(ids) + 1)], skip_special_tokens=True)
    want = [next(i for i, p in enumerate(prefixes) if p.startswith(text[:end])) for end in step_char_ends(text)]
    assert torch.nonzero(out.step_end_mask_BR[0], as_tuple=True)[0].tolist() == want
    # the text, then a few prefixes per step (26 decodes here), not one per token (363)
    assert len(ids) > 300 and counting.decoded <= 2 + 8 * len(want)


def test_missing_step_rewards_and_bad_arguments(tokenizer):
    with pytest.raises(ValueError, match="response 0: the reward function returned no step rewards"):
        compute(tokenizer, outcome_only, token_level=True, step_rewards=True)
    with pytest.raises(ValueError, match="needs token_level=True"):
        compute(tokenizer, one_per_line, token_level=False, step_rewards=True)
    responses, mask, _ = batch(tokenizer)
    rewarder = BatchRewarder(tokenizer, RewardScorer(outcome_only, num_workers=0, timeout_s=None, on_error="raise"))
    with pytest.raises(ValueError, match=r"same shape \[B, R\]"):
        rewarder.compute(responses, mask[:, :3], ["d"] * 4, [""] * 4, [{}] * 4, token_level=True, step_rewards=False)
