"""DAPO's overlong reward shaping: the penalty (by hand and against a plain loop), its placement on
the rewards and its metrics, and the three configuration spellings that turn it on."""

from __future__ import annotations

import pytest
import torch

from grpo_dist.rewards.shaping import OverlongBuffer, apply_overlong_penalty, overlong_penalty


def test_overlong_penalty_by_hand():
    # max_resp_len 8, buffer 4, factor 1: expected = 8 - 4 = 4 tokens, then -1/4 per extra token
    #   L = 4 -> 0; 6 -> -0.5; 7 -> -0.75; 8 -> -1 (the factor); 10 -> -1.5 (past the limit, as verl)
    got = overlong_penalty(torch.tensor([0, 4, 6, 7, 8, 10]), max_resp_len=8, buffer_len=4, penalty_factor=1.0)
    assert got.tolist() == pytest.approx([0.0, 0.0, -0.5, -0.75, -1.0, -1.5])
    assert got.dtype == torch.float32


@pytest.mark.parametrize("max_len,buf,factor", [(8, 4, 1.0), (24, 6, 0.5), (10, 10, 2.0), (5, 1, 0.0)])
def test_overlong_penalty_matches_a_plain_loop(max_len, buf, factor):
    lengths = list(range(0, max_len + 3))
    got = overlong_penalty(torch.tensor(lengths), max_resp_len=max_len, buffer_len=buf, penalty_factor=factor)
    for L, g in zip(lengths, got.tolist()):
        expected_len = max_len - buf
        want = 0.0 if L <= expected_len else -(L - expected_len) / buf * factor
        assert g == pytest.approx(want, abs=1e-6), L


def test_apply_overlong_penalty_on_the_last_token_with_metrics():
    # max 6, buffer 3, factor 0.6: expected 3 tokens; lengths 2, 4, 6 -> penalties 0, -0.2, -0.6
    #   added to each response's last token: 1 -> 1, 0.8, 0.4; metrics: mean -0.8/3, min -0.6,
    #   fraction penalised 2/3
    mask = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.float32)
    scores = torch.zeros(3, 6)
    scores[0, 1] = scores[1, 3] = scores[2, 5] = 1.0
    buf = OverlongBuffer(max_resp_len=6, buffer_len=3, penalty_factor=0.6, log=True)
    shaped, m = apply_overlong_penalty(scores, mask, buf)
    want = scores.clone()
    want[1, 3], want[2, 5] = 0.8, 0.4
    torch.testing.assert_close(shaped, want)
    assert m == pytest.approx({"reward/overlong_reward/mean": -0.8 / 3, "reward/overlong_reward/min": -0.6,
                               "reward/overlong/mean": 2 / 3})
    _, m = apply_overlong_penalty(scores, mask, OverlongBuffer(max_resp_len=6, buffer_len=3, penalty_factor=0.6))
    assert m == {}  # log off


def test_overlong_buffer_checks_its_numbers():
    with pytest.raises(ValueError, match="buffer length"):
        OverlongBuffer(max_resp_len=4, buffer_len=5, penalty_factor=1.0)
    with pytest.raises(ValueError, match="penalty factor"):
        OverlongBuffer(max_resp_len=4, buffer_len=2, penalty_factor=-1.0)


# --------------------------------------------------------------------------------------------------
# configuration: DAPO's recipe spelling and verl's two reward_kwargs spellings
# --------------------------------------------------------------------------------------------------


def config(*overrides: str):
    from grpo_dist.config.loader import compose, to_typed
    from grpo_dist.config.validate import validate_config

    cfg = to_typed(compose(list(overrides)), list(overrides))
    validate_config(cfg, check_paths=False)
    return cfg


SPELLINGS = {
    "reward_model.overlong_buffer": [],  # max_resp_len is data.max_response_length
    "reward_model.reward_kwargs.overlong_buffer_cfg": ["reward_model.reward_kwargs.max_resp_len=20"],
    "reward.reward_kwargs.overlong_buffer_cfg": ["reward.reward_kwargs.max_resp_len=20"],
}


@pytest.mark.parametrize("prefix", list(SPELLINGS))
def test_each_spelling_turns_the_shaping_on(prefix):
    from grpo_dist.config.validate import overlong_buffer

    assert overlong_buffer(config()) is None
    cfg = config("data.max_response_length=20", f"{prefix}.enable=true", f"{prefix}.len=4",
                 f"{prefix}.penalty_factor=0.5", f"{prefix}.log=true", *SPELLINGS[prefix])
    assert overlong_buffer(cfg) == OverlongBuffer(max_resp_len=20, buffer_len=4, penalty_factor=0.5, log=True)


def test_spellings_that_disagree_or_bad_numbers_are_refused():
    from grpo_dist.config.loader import ConfigError
    from grpo_dist.config.validate import overlong_buffer

    a, b = "reward_model.overlong_buffer", "reward.reward_kwargs.overlong_buffer_cfg"
    same = [f"{p}.{k}" for p in (a, b) for k in ("enable=true", "len=4", "penalty_factor=1.0")]
    assert overlong_buffer(config(*same)).buffer_len == 4  # the same settings twice: fine
    with pytest.raises(ConfigError, match="two spellings"):
        config(*same, f"{b}.len=8")
    with pytest.raises(ConfigError, match=r"reward_model\.overlong_buffer\.len"):
        config(f"{a}.enable=true", f"{a}.len=100", "data.max_response_length=24")
    with pytest.raises(ConfigError, match=r"penalty_factor"):
        config(f"{b}.enable=true", f"{b}.len=4", f"{b}.penalty_factor=-1")
