"""Diagnostics of a step that are not part of the loss: how far the rollout engine's sampling
distribution is from the trainer's on the same tokens."""

import torch


def rollout_probs_diff(rollout_logp_BR: torch.Tensor, actor_logp_BR: torch.Tensor,
                       mask_BR: torch.Tensor) -> dict[str, float]:
    """How far the rollout engine's token probabilities are from the actor's on the same tokens.

    ``d = |exp(rollout_logp) - exp(actor_logp)|`` over the response tokens (``mask_BR`` = 1), all
    ``[B, R]``; returns ``training/rollout_probs_diff_{max,mean,std}`` (verl's names). Nonzero
    values come from the engines' numerics (kernels, dtype) or from sampling settings that change
    the distribution (temperature, top-k/top-p: the rollout log-probs are the processed ones).
    """
    m = mask_BR.bool()
    if not m.any():
        return {}
    d = (rollout_logp_BR.float().exp() - actor_logp_BR.float().exp()).abs()[m]
    return {
        "training/rollout_probs_diff_max": d.max().item(),
        "training/rollout_probs_diff_mean": d.mean().item(),
        "training/rollout_probs_diff_std": d.std(unbiased=False).item(),
    }
