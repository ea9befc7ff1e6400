"""Reward shaping on the response length: DAPO's soft overlong punishment."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the configuration builds an OverlongBuffer without torch; the functions import it
    import torch

__all__ = ["OverlongBuffer", "overlong_penalty", "apply_overlong_penalty"]


@dataclass(frozen=True)
class OverlongBuffer:
    """DAPO's overlong reward shaping (``reward_model.overlong_buffer.*``, or verl's
    ``reward(_model).reward_kwargs.overlong_buffer_cfg.*`` with ``max_resp_len``).

    Attributes:
        max_resp_len: the length the penalty reaches ``penalty_factor`` at (verl: the max response
            length).
        buffer_len: the length of the buffer before ``max_resp_len`` in which the penalty grows.
        penalty_factor: the penalty at ``max_resp_len``.
        log: report the ``reward/overlong_reward/*`` and ``reward/overlong/mean`` metrics.
    """

    max_resp_len: int
    buffer_len: int
    penalty_factor: float
    log: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.buffer_len <= self.max_resp_len:
            raise ValueError(f"the overlong buffer length must be in [1, max_resp_len={self.max_resp_len}], "
                             f"got {self.buffer_len}")
        if not self.penalty_factor >= 0:
            raise ValueError(f"the overlong penalty factor must be >= 0, got {self.penalty_factor}")


def overlong_penalty(response_length_B: torch.Tensor, *, max_resp_len: int, buffer_len: int,
                     penalty_factor: float) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, eq. 13), verl's form::

        expected = max_resp_len - buffer_len
        penalty  = min(-(L - expected) / buffer_len * penalty_factor, 0)

    0 up to ``expected`` tokens, then falling linearly to ``-penalty_factor`` at ``max_resp_len``
    (and further below beyond it, as verl; the paper's -1 beyond the limit cannot happen when
    ``max_resp_len`` is the generation limit). ``L`` counts the response tokens, EOS included.
    Shapes: response_length_B [B] -> penalty_B [B] float32 (<= 0).
    """
    import torch

    if response_length_B.dim() != 1:
        raise ValueError(f"response_length_B must be 1-D [B], got shape {tuple(response_length_B.shape)}")
    exceed_B = response_length_B.to(torch.float32) - float(max_resp_len - buffer_len)
    return torch.clamp(-exceed_B / float(buffer_len) * float(penalty_factor), max=0.0)


def apply_overlong_penalty(token_level_scores_BR: torch.Tensor, response_mask_BR: torch.Tensor,
                           buffer: OverlongBuffer) -> tuple[torch.Tensor, dict[str, float]]:
    """Add each response's :func:`overlong_penalty` to its reward on its last response token.

    Returns ``(token_level_scores_BR, metrics)``: the shaped scores [B, R] and, with ``buffer.log``,
    ``reward/overlong_reward/mean``, ``reward/overlong_reward/min`` (the penalties) and
    ``reward/overlong/mean`` (the fraction of responses penalised); ``{}`` otherwise.
    """
    import torch

    from grpo_dist.rewards.tokens import place_scores_on_last_token

    length_B = response_mask_BR.to(torch.float32).sum(-1)
    penalty_B = overlong_penalty(length_B, max_resp_len=buffer.max_resp_len, buffer_len=buffer.buffer_len,
                                 penalty_factor=buffer.penalty_factor)
    shaped_BR = token_level_scores_BR + place_scores_on_last_token(penalty_B, response_mask_BR).to(token_level_scores_BR.dtype)
    metrics: dict[str, float] = {}
    if buffer.log and penalty_B.numel():
        metrics = {
            "reward/overlong_reward/mean": float(penalty_B.mean()),
            "reward/overlong_reward/min": float(penalty_B.min()),
            "reward/overlong/mean": float((penalty_B < 0).float().mean()),
        }
    return shaped_BR, metrics
