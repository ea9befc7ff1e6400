"""Policy filtration for PPO (PF-PPO; Zhang et al., 2024, "Policy Filtration in RLHF to Fine-Tune LLM for Code
Generation"), as verl applies it (``algorithm.use_pf_ppo``, with GAE advantages): the step's batch is resampled
with replacement, each response drawn with a probability set by its reward, so that the responses whose rewards
are most reliable (a reward model's highest and lowest) weigh most in the update.

With s_i the reward of response i (the sum of its token-level scores) over the B responses of the step:

- ``pow``:        w_i = |s_i|^p                                   (p = ``pf_ppo.weight_pow``)
- ``max_min``:    w_i = 1 if s_i = max_j s_j or s_i = min_j s_j, else 0
- ``max_random``: w_i = 0.4 if s_i = max_j s_j, else 0.1

then w_i <- max(w_i + 1e-8, 1e-8) (every response keeps a tiny chance), and B indices are drawn with replacement,
P(i) = w_i / sum_j w_j. The batch's rows (advantages, returns, values, log-probs, ...) are taken at those indices.
"""

import torch

from grpo_dist.core.names import PF_PPO_METHODS

__all__ = ["PF_PPO_METHODS", "pf_ppo_weights", "pf_ppo_indices"]

#: Added to every weight (and its floor) so that no response's probability is exactly 0.
WEIGHT_FLOOR = 1e-8


def pf_ppo_weights(scores_B: torch.Tensor, method: str, weight_pow: float) -> torch.Tensor:
    """Sampling weights [B] (float32, > 0) of B responses with rewards ``scores_B`` [B] (module docstring)."""
    if scores_B.dim() != 1:
        raise ValueError(f"scores_B must be 1-D [B], got shape {tuple(scores_B.shape)}")
    s = scores_B.detach().float()
    if method == "pow":
        w = s.abs().pow(weight_pow)
    elif method == "max_min":
        w = ((s == s.max()) | (s == s.min())).float()
    elif method == "max_random":
        w = torch.where(s == s.max(), torch.tensor(0.4), torch.tensor(0.1))
    else:
        raise ValueError(f"unknown PF-PPO reweight method {method!r}; valid: {', '.join(PF_PPO_METHODS)}")
    return torch.clamp(w + WEIGHT_FLOOR, min=WEIGHT_FLOOR)


def pf_ppo_indices(weights_B: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """B row indices [B] (int64) drawn with replacement, P(i) = w_i / sum_j w_j."""
    return torch.multinomial(weights_B, weights_B.shape[0], replacement=True, generator=generator)
