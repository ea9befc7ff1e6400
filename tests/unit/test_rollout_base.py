"""The rollout contract: SamplingSettings validation, pad_responses, the engine registry."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from grpo_dist.rollout import RolloutOutput, SamplingSettings, make_engine, pad_responses


def _output() -> RolloutOutput:
    # 2 prompts x n=2, prompt-major; row 1 and 2 stopped on EOS (id 1), rows 0 and 3 hit max_tokens.
    return RolloutOutput(
        response_ids=[[5, 6, 7], [8, 1], [1], [9, 9, 9]],
        logprobs=[[-0.1, -0.2, -0.3], [-1.0, -2.0], [-0.5], [-0.7, -0.8, -0.9]],
        finished_by_eos=[False, True, True, False],
    )


def test_pad_responses_right_pads_ids_mask_and_logprobs():
    responses_BR, mask_BR, logp_BR = pad_responses(_output(), pad_id=0, max_len=4)

    assert responses_BR.dtype == torch.long and responses_BR.shape == (4, 4)
    assert mask_BR.dtype == torch.float32 and logp_BR.dtype == torch.float32
    torch.testing.assert_close(
        responses_BR, torch.tensor([[5, 6, 7, 0], [8, 1, 0, 0], [1, 0, 0, 0], [9, 9, 9, 0]])
    )
    # The mask covers every generated token, the EOS token included.
    torch.testing.assert_close(
        mask_BR,
        torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]], dtype=torch.float32),
    )
    torch.testing.assert_close(
        logp_BR,
        torch.tensor(
            [
                [-0.1, -0.2, -0.3, 0.0],
                [-1.0, -2.0, 0.0, 0.0],
                [-0.5, 0.0, 0.0, 0.0],
                [-0.7, -0.8, -0.9, 0.0],
            ]
        ),
    )


def test_pad_responses_without_logprobs_pads_the_same_and_returns_none():
    out = _output()
    bare = RolloutOutput(response_ids=out.response_ids, logprobs=None, finished_by_eos=out.finished_by_eos)
    responses_BR, mask_BR, logp_BR = pad_responses(bare, pad_id=0, max_len=4)
    want_ids, want_mask, _ = pad_responses(out, pad_id=0, max_len=4)
    assert logp_BR is None
    assert torch.equal(responses_BR, want_ids) and torch.equal(mask_BR, want_mask)


def test_pad_responses_uses_the_given_pad_id_and_exact_width():
    responses_BR, mask_BR, _ = pad_responses(_output(), pad_id=42, max_len=3)
    assert responses_BR.shape == (4, 3)
    assert responses_BR[2].tolist() == [1, 42, 42]
    assert mask_BR.sum().item() == 3 + 2 + 1 + 3


def test_pad_responses_rejects_a_response_longer_than_max_len():
    with pytest.raises(ValueError, match="max_len"):
        pad_responses(_output(), pad_id=0, max_len=2)


def test_rollout_output_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="logprobs"):
        RolloutOutput(response_ids=[[1, 2]], logprobs=[[-0.1]], finished_by_eos=[True])
    with pytest.raises(ValueError, match="disagree"):
        RolloutOutput(response_ids=[[1]], logprobs=[[-0.1]], finished_by_eos=[True, False])
    with pytest.raises(ValueError, match="disagree"):
        RolloutOutput(response_ids=[[1]], logprobs=None, finished_by_eos=[True, False])


def test_sampling_settings_accepts_valid_values():
    s = SamplingSettings(n=8, temperature=0.7, top_p=0.9, top_k=50, max_tokens=128, seed=1)
    assert (s.n, s.temperature, s.top_p, s.top_k, s.max_tokens, s.do_sample, s.seed) == (
        8, 0.7, 0.9, 50, 128, True, 1,
    )
    g = SamplingSettings.greedy(max_tokens=16)
    assert (g.n, g.do_sample, g.max_tokens) == (1, False, 16)
    with pytest.raises(Exception):  # frozen
        g.n = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n=0, temperature=1.0, max_tokens=4), "n must be"),
        (dict(n=1, temperature=1.0, max_tokens=0), "max_tokens"),
        (dict(n=1, temperature=0.0, max_tokens=4), "temperature"),
        (dict(n=1, temperature=-1.0, max_tokens=4), "temperature"),
        (dict(n=1, temperature=float("nan"), max_tokens=4), "temperature"),
        (dict(n=1, temperature=1.0, top_p=0.0, max_tokens=4), "top_p"),
        (dict(n=1, temperature=1.0, top_p=1.5, max_tokens=4), "top_p"),
        (dict(n=1, temperature=1.0, top_k=0, max_tokens=4), "top_k"),
        (dict(n=1, temperature=1.0, top_k=-2, max_tokens=4), "top_k"),
        (dict(n=4, temperature=0.0, max_tokens=4, do_sample=False), "greedy"),
    ],
)
def test_sampling_settings_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingSettings(**kwargs)


def test_greedy_settings_allow_zero_temperature():
    s = SamplingSettings(n=1, temperature=0.0, max_tokens=4, do_sample=False)
    assert not s.do_sample


def test_make_engine_rejects_unknown_names_and_lists_valid_ones():
    with pytest.raises(ValueError, match=r"unknown rollout engine 'sglang'.*hf, vllm"):
        make_engine("sglang", model_path="unused")


def test_importing_rollout_does_not_import_vllm():
    code = "import sys, grpo_dist.rollout; assert 'vllm' not in sys.modules, 'vllm imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
