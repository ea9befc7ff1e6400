"""What the reward model is given and where its scores go: the combination with rule scores, the
step-end tokens of a process reward model, and the re-encoding for a reward model with its own
tokenizer and chat template."""

from __future__ import annotations

import pytest
import torch

from grpo_dist.rewards.combine import RewardCombine, weighted_sum
from grpo_dist.rewards.tokens import SeparatorTokens, token_step_ends


# ------------------------------------------------------------------------------------------- combine
RM_B = torch.tensor([0.5, -1.0, 2.0])
RULE_B = torch.tensor([1.0, 0.0, 1.0])


def combined(rule: RewardCombine, rm_X, rule_X):
    """The reward of verl's keys: the weighted sum with ``reward_model.combine``'s weights."""
    rm_w, rule_w = rule.weights
    return weighted_sum([(rm_w, rm_X), (rule_w, rule_X)])


def test_verl_mode_takes_the_reward_model_unless_a_custom_function_is_set():
    verl = RewardCombine("verl")
    assert verl.weights == (1.0, 0.0)
    assert torch.equal(combined(verl, RM_B, RULE_B), RM_B)  # a rule score computed anyway is not used
    custom = RewardCombine("verl", custom_function=True)
    assert custom.weights == (0.0, 1.0)
    assert torch.equal(combined(custom, RM_B, RULE_B), RULE_B)


def test_weighted_mode_adds_the_two():
    w = RewardCombine("weighted", rm_weight=0.5, rule_weight=2.0)
    torch.testing.assert_close(combined(w, RM_B, RULE_B), torch.tensor([2.25, -0.5, 3.0]))
    rm_only = RewardCombine("weighted", rm_weight=1.0, rule_weight=0.0)
    assert torch.equal(combined(rm_only, RM_B, RULE_B), RM_B)
    rule_only = RewardCombine("weighted", rm_weight=0.0, rule_weight=1.0)
    assert torch.equal(combined(rule_only, RM_B, RULE_B), RULE_B)


def test_combination_works_on_token_level_scores():
    rm_BR = torch.tensor([[0.0, 0.0, 0.5], [0.0, -1.0, 0.0]])
    rule_BR = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    got = combined(RewardCombine("weighted", rm_weight=1.0, rule_weight=3.0), rm_BR, rule_BR)
    torch.testing.assert_close(got, torch.tensor([[0.0, 0.0, 3.5], [0.0, -1.0, 0.0]]))
    with pytest.raises(ValueError, match="cannot be combined"):
        combined(RewardCombine("weighted"), rm_BR, rule_BR[:, :2])
    with pytest.raises(ValueError, match="unknown"):
        RewardCombine("max")


# ------------------------------------------------------------------------------------------- step ends
class CharTokenizer:
    """Token id i decodes to ALPHABET[i]."""

    ALPHABET = ["<pad>", "a", "b", "\n", "c\n", ".", "<eos>"]

    def __init__(self):
        self.calls = 0

    def batch_decode(self, ids, skip_special_tokens=False):
        self.calls += 1
        return ["".join(self.ALPHABET[t] for t in row) for row in ids]


def test_step_ends_are_separator_tokens_and_the_last_token():
    tok = CharTokenizer()
    sep = SeparatorTokens(tok, "\n")
    # "a\nb" + pad: a step ends at "\n" (col 1) and at the last token (col 2)
    # "ac\n.<eos>": "c\n" (col 1) holds the separator; the last token is <eos> (col 3)
    # "ab" with no separator: one step, at the last token
    # an empty response: no step
    responses = torch.tensor([[1, 3, 2, 0], [1, 4, 5, 6], [1, 2, 0, 0], [0, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.float32)
    ends, has_sep = token_step_ends(responses, mask, sep)
    assert ends.tolist() == [[0, 1, 1, 0], [0, 1, 0, 1], [0, 1, 0, 0], [0, 0, 0, 0]]
    assert has_sep.tolist() == [True, True, False, False]
    calls = tok.calls
    token_step_ends(responses, mask, sep)
    assert tok.calls == calls  # every id was decoded once, then remembered


def test_step_ends_loop_reference():
    g = torch.Generator().manual_seed(0)
    responses = torch.randint(0, 7, (6, 9), generator=g)
    lengths = [9, 0, 3, 5, 1, 7]
    mask = torch.tensor([[1.0] * n + [0.0] * (9 - n) for n in lengths])
    ends, _ = token_step_ends(responses, mask, SeparatorTokens(CharTokenizer(), "\n"))
    for b, n in enumerate(lengths):
        for t in range(9):
            want = t < n and ("\n" in CharTokenizer.ALPHABET[int(responses[b, t])] or t == n - 1)
            assert ends[b, t].item() == float(want), (b, t)


def test_a_process_reward_placed_at_step_ends_feeds_grpo_process():
    """The stage's placement (scores at step ends) is what grpo_process reads: the advantage of a token
    is the sum of the normalised step rewards from its step on."""
    from grpo_dist.core.advantages import AdvantageInputs, AdvantageParams, compute_grpo_process_advantage

    responses = torch.tensor([[1, 3, 2, 0], [1, 2, 3, 5]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.float32)
    ends, _ = token_step_ends(responses, mask, SeparatorTokens(CharTokenizer(), "\n"))
    token_scores = torch.tensor([[9.0, 1.0, 2.0, 9.0], [9.0, 9.0, 3.0, 4.0]])
    rewards = token_scores * ends
    inputs = AdvantageInputs(token_level_rewards_BT=rewards, response_mask_BT=mask, index_B=["u", "u"],
                             step_end_mask_BT=ends)
    adv, _ = compute_grpo_process_advantage(inputs, AdvantageParams())
    r = torch.tensor([1.0, 2.0, 3.0, 4.0])  # the four step rewards of the group
    z = (r - r.mean()) / r.std()
    want = torch.tensor([[z[0] + z[1], z[0] + z[1], z[1], 0.0], [z[2] + z[3]] * 3 + [z[3]]])
    torch.testing.assert_close(adv, want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------- re-encoding
@pytest.fixture(scope="module")
def tokenizers():
    from grpo_dist.tasks.reverse import VOCAB
    from grpo_dist.utils.tiny_model import _build_tokenizer, default_vocab

    policy = _build_tokenizer(list(VOCAB))
    rm = _build_tokenizer(default_vocab())
    rm.chat_template = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    return policy, rm


def policy_rows(policy, prompts, responses, P=40, R=8):
    from grpo_dist.data.dataset import tokenize_prompt

    B = len(prompts)
    ids = torch.full((B, P + R), policy.pad_token_id)
    mask = torch.zeros((B, P + R), dtype=torch.long)
    for b, (p, r) in enumerate(zip(prompts, responses)):
        p_ids = list(tokenize_prompt(policy, [{"role": "user", "content": p}]))
        r_ids = policy.encode(r, add_special_tokens=False) + [policy.convert_tokens_to_ids("<|im_end|>")]
        ids[b, P - len(p_ids): P] = torch.tensor(p_ids)
        mask[b, P - len(p_ids): P] = 1
        ids[b, P: P + len(r_ids)] = torch.tensor(r_ids)
        mask[b, P: P + len(r_ids)] = 1
    return ids, mask


def test_reencoding_renders_the_chat_with_the_reward_models_template(tokenizers):
    from grpo_dist.training.reward_model import reencode_for_reward_model

    policy, rm = tokenizers
    ids, mask = policy_rows(policy, ["reverse 123", "reverse 45"], ["321", "4"])
    raw = [[{"role": "user", "content": "reverse 123"}], "reverse 45"]  # chat messages, or a plain prompt
    out = reencode_for_reward_model(ids, mask, response_length=8, raw_prompts=raw, input_tokenizer=policy,
                                    rm_tokenizer=rm, max_length=None)
    texts = [rm.decode(row[m.bool()].tolist()) for row, m in zip(out["input_ids"], out["attention_mask"])]
    assert texts == ["[user]reverse 123[assistant]321", "[user]reverse 45[assistant]4"]
    first = out["attention_mask"][1].tolist()
    assert first == sorted(first, reverse=True)  # right-padded
    assert out["position_ids"][0].tolist()[: int(out["attention_mask"][0].sum())] == list(range(int(out["attention_mask"][0].sum())))


def test_reencoding_keeps_the_end_of_long_inputs_and_works_without_a_chat_template(tokenizers):
    from grpo_dist.training.reward_model import reencode_for_reward_model

    policy, rm = tokenizers
    ids, mask = policy_rows(policy, ["reverse 123"], ["321"])
    out = reencode_for_reward_model(ids, mask, response_length=8, raw_prompts=[[{"role": "user", "content": "reverse 123"}]],
                                    input_tokenizer=policy, rm_tokenizer=rm, max_length=6)
    assert rm.decode(out["input_ids"][0].tolist()) == "nt]321"
    rm.chat_template = None
    try:
        out = reencode_for_reward_model(ids, mask, response_length=8, raw_prompts=[[{"role": "user", "content": "x"}]],
                                        input_tokenizer=policy, rm_tokenizer=rm, max_length=None)
    finally:
        rm.chat_template = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    # without a template: the decoded prompt (the policy's rendering, special tokens dropped) + the response
    assert rm.decode(out["input_ids"][0].tolist()) == "user\nreverse 123\nassistant\n321"
