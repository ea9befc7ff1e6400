"""Advantage estimators: pure functions from rewards to per-token advantages.

Every estimator is registered under a name (``algorithm.adv_estimator`` in the configuration) and
looked up with :func:`get_adv_estimator`: the built-in ``compute_<name>_advantage`` functions here by
their rows in :mod:`grpo_dist.core.advantage_registry` (which the configuration reads without torch),
a user's with :func:`register_adv_estimator`. All estimators share one
signature, ``fn(inputs: AdvantageInputs, params: AdvantageParams) -> (advantages_BT, returns_BT)``,
and are called through their registry entry, which first checks that the inputs the estimator needs
are there::

    spec = get_adv_estimator("grpo")
    inputs = AdvantageInputs(token_level_rewards_BT=..., response_mask_BT=..., index_B=uids)
    advantages_BT, returns_BT = spec(inputs, AdvantageParams(norm_adv_by_std=True))

Shapes: ``B`` is the number of responses (prompts x rollout.n), ``T`` the padded response length.
:class:`AdvantageInputs` holds the tensors (checked against each other once, when it is built) and
:class:`AdvantageParams` the numbers. ``response_mask_BT`` (float or bool) is 1 on response tokens
that count. ``index_B`` is a sequence (list, numpy array or tensor) of hashable group ids, e.g.
prompt uid strings: responses with equal ids form one group of size G. Estimators read what they
need and ignore the rest; the capability flags of :class:`AdvEstimatorSpec` say which optional
inputs must be given (``index_B``, ``values_BT``, ``step_end_mask_BT``, ``reward_baselines_B``).

The names and semantics follow verl's ``verl/trainer/ppo/core_algos.py``. Differences (all
documented at the function): advantages are always zero outside the mask, the masked whitening used
by ``gae`` and ``reinforce_plus_plus`` does not raise on masks with 0 or 1 token, and group statistics
are computed in float64 so that a group of equal rewards gives exactly zero advantages.
"""

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from grpo_dist.core.advantage_registry import (
    _REGISTRY,
    AdvantageParams,
    AdvEstimatorSpec,
    get_adv_estimator,
    list_adv_estimators,
    register_adv_estimator,
)
from grpo_dist.core.registry import bind_builtins

__all__ = [
    "AdvantageInputs",
    "AdvantageParams",
    "AdvEstimatorFn",
    "AdvEstimatorSpec",
    "register_adv_estimator",
    "get_adv_estimator",
    "list_adv_estimators",
    "scores_from_token_rewards",
    "masked_whiten",
    "compute_grpo_advantage",
    "compute_rloo_advantage",
    "compute_reinforce_plus_plus_advantage",
    "compute_gae_advantage",
    "compute_grpo_process_advantage",
    "compute_remax_advantage",
    "compute_reinforce_plus_plus_baseline_advantage",
    "compute_grpo_passk_advantage",
    "compute_opo_advantage",
    "compute_gpg_advantage",
]


def _check_2d_rewards(token_level_rewards_BT: torch.Tensor) -> None:
    if token_level_rewards_BT.dim() != 2:
        raise ValueError(
            f"token_level_rewards_BT must be 2-D [B, T], got shape {tuple(token_level_rewards_BT.shape)}"
        )


@dataclass(frozen=True, eq=False)
class AdvantageInputs:
    """The tensors an advantage estimator reads; shapes are checked once, when the object is built.

    Attributes:
        token_level_rewards_BT: [B, T] rewards per response token (an outcome score on the last
            response token; per-step rewards at step ends for process supervision).
        response_mask_BT: [B, T] float or bool, 1 on the response tokens that count.
        index_B: [B] hashable group ids (list, numpy array or tensor), e.g. prompt uids; responses
            with equal ids form one group. Needed by group-based estimators.
        values_BT: [B, T] critic values; needed by estimators flagged ``needs_values`` (``gae``).
        step_end_mask_BT: [B, T], 1 on the last token of each reasoning step; needed by estimators
            flagged ``needs_step_rewards`` (``grpo_process``).
        reward_baselines_B: [B] the reward of one greedy response to each row's prompt; needed by
            estimators flagged ``needs_baseline_rollout`` (``remax``).

    ``ValueError`` when the rewards are not 2-D or another given input does not fit their shape.
    """

    token_level_rewards_BT: torch.Tensor
    response_mask_BT: torch.Tensor
    index_B: Sequence[Any] | None = None
    values_BT: torch.Tensor | None = None
    step_end_mask_BT: torch.Tensor | None = None
    reward_baselines_B: torch.Tensor | None = None

    def __post_init__(self) -> None:
        _check_2d_rewards(self.token_level_rewards_BT)
        shape_BT = tuple(self.token_level_rewards_BT.shape)
        for field in ("response_mask_BT", "values_BT", "step_end_mask_BT"):
            x = getattr(self, field)
            if x is not None and tuple(x.shape) != shape_BT:
                raise ValueError(f"{field} shape {tuple(x.shape)} must equal token_level_rewards_BT shape {shape_BT}")
        B = shape_BT[0]
        if self.index_B is not None and len(self.index_B) != B:
            raise ValueError(f"index_B has {len(self.index_B)} entries but the batch has B={B} responses")
        if self.reward_baselines_B is not None and tuple(self.reward_baselines_B.shape) != (B,):
            raise ValueError(f"reward_baselines_B must have shape ({B},), got {tuple(self.reward_baselines_B.shape)}")

    @property
    def mask_BT(self) -> torch.Tensor:
        """``response_mask_BT`` in the rewards' dtype."""
        return self.response_mask_BT.to(self.token_level_rewards_BT.dtype)

    @property
    def scores_B(self) -> torch.Tensor:
        """Outcome score per response in float64: :func:`scores_from_token_rewards` [B]."""
        return scores_from_token_rewards(self.token_level_rewards_BT).double()

    def group_ids(self) -> tuple[torch.Tensor, int]:
        """``index_B`` as dense ints 0..G-1 in order of first appearance: ``(gid_B, G)``, ``gid_B`` a
        long tensor [B] on the rewards' device. ``ValueError`` for ids that are not hashable."""
        assert self.index_B is not None, "a group-based estimator is called through its spec, which checks index_B"
        ids = self.index_B.tolist() if hasattr(self.index_B, "tolist") else list(self.index_B)
        dense: dict[Any, int] = {}
        try:
            gid = [dense.setdefault(x, len(dense)) for x in ids]
        except TypeError as e:
            raise ValueError(f"index_B entries must be hashable group ids (str or int): {e}") from None
        return torch.tensor(gid, dtype=torch.long, device=self.token_level_rewards_BT.device), len(dense)


AdvEstimatorFn = Callable[[AdvantageInputs, AdvantageParams], tuple[torch.Tensor, torch.Tensor]]

# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------


def scores_from_token_rewards(token_level_rewards_BT: torch.Tensor) -> torch.Tensor:
    """Outcome score per response: ``r_B[i] = sum_t token_level_rewards_BT[i, t]``.

    Shapes: ``token_level_rewards_BT`` [B, T] -> ``r_B`` [B]. Like verl, the sum runs over all T
    positions (rewards are expected to be zero outside the response).
    """
    _check_2d_rewards(token_level_rewards_BT)
    return token_level_rewards_BT.sum(dim=-1)


def masked_whiten(values_BT: torch.Tensor, mask_BT: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Whiten ``values_BT`` with the mean and unbiased variance of its masked entries.

    ``mean = sum(v*m)/(sum(m)+1e-8)``, ``var = sum((v-mean)^2*m)/(sum(m)+1e-8) * n/(n-1)`` with
    ``n = sum(m)``, result ``(v - mean) * rsqrt(var + eps)``. Shapes: [B, T] -> [B, T].

    Unlike verl (which raises when ``n`` is 0 or 1), the Bessel factor is 1 when ``n <= 1``: then every
    masked entry equals the mean and its whitened value is 0 either way. Entries outside the mask are
    transformed too (not zeroed); callers multiply by the mask.
    """
    m = mask_BT.to(values_BT.dtype)
    n = m.sum()
    v = torch.where(m != 0, values_BT, torch.zeros_like(values_BT))
    mean = (v * m).sum() / (n + 1e-8)
    centered = values_BT - mean
    c = torch.where(m != 0, centered, torch.zeros_like(centered))
    var = (c.square() * m).sum() / (n + 1e-8)
    bessel = torch.where(n > 1, n / (n - 1).clamp_min(1e-8), torch.ones_like(n))
    var = var * bessel
    return centered * torch.rsqrt(var + eps)


def _apply_mask(x_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """``x * mask``, with exact zeros (never NaN) where the mask is 0."""
    return torch.where(mask_BT != 0, x_BT * mask_BT, torch.zeros_like(x_BT))


def _outcome_advantage(adv_B: torch.Tensor, inputs: AdvantageInputs) -> torch.Tensor:
    """``adv_B[i] * mask[i, t]`` in the rewards' dtype (exact zeros outside the mask)."""
    return _apply_mask(adv_B.to(inputs.token_level_rewards_BT.dtype).unsqueeze(-1), inputs.mask_BT)


def _group_mean_std(
    x_N: torch.Tensor, gid_N: torch.Tensor, num_groups: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-group count, mean and unbiased std of the float64 values ``x_N`` grouped by ``gid_N``.

    Groups with one element get mean 0 and std 1 (verl's convention); empty groups get mean 0, std 1.
    Returns ``(count_G, mean_G, std_G)``, all float64 [G].
    """
    assert x_N.dtype == torch.float64 and x_N.shape == gid_N.shape
    zeros_G = torch.zeros(num_groups, dtype=torch.float64, device=x_N.device)
    count_G = zeros_G.index_add(0, gid_N, torch.ones_like(x_N))
    sum_G = zeros_G.index_add(0, gid_N, x_N)
    mean_G = sum_G / count_G.clamp_min(1.0)
    sq_G = zeros_G.index_add(0, gid_N, (x_N - mean_G[gid_N]).square())
    std_G = torch.sqrt(sq_G / (count_G - 1.0).clamp_min(1.0))
    many_G = count_G > 1
    mean_G = torch.where(many_G, mean_G, torch.zeros_like(mean_G))
    std_G = torch.where(many_G, std_G, torch.ones_like(std_G))
    return count_G, mean_G, std_G


# --------------------------------------------------------------------------------------------------
# estimators: fn(inputs: AdvantageInputs, params: AdvantageParams) -> (advantages_BT, returns_BT)
# --------------------------------------------------------------------------------------------------


@torch.no_grad()
def compute_grpo_advantage(inputs: AdvantageInputs, params: AdvantageParams) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage (DeepSeekMath), verl's ``grpo``.

    ``r_i = sum_t token_level_rewards[i, t]``; within the group ``g`` of response ``i``::

        A_i = (r_i - mean_g(r)) / (std_g(r) + epsilon)     norm_adv_by_std=True  (GRPO)
        A_i =  r_i - mean_g(r)                             norm_adv_by_std=False (Dr. GRPO)

    ``std`` is unbiased (``torch.std``); a group of one has mean 0 and std 1 (verl's convention), so
    its advantage is ``r_i / (1 + epsilon)``. Every token gets its sequence's value:
    ``advantages[i, t] = A_i * mask[i, t]``; ``returns = advantages``.

    Shapes: token_level_rewards_BT, response_mask_BT [B, T]; index_B [B] -> two [B, T] tensors in
    the dtype of the rewards. Group statistics are computed in float64, so a group of equal rewards
    gets exactly 0. Reads ``token_level_rewards_BT``, ``response_mask_BT``, ``index_B``;
    ``params.norm_adv_by_std``, ``params.epsilon``.
    """
    scores_B = inputs.scores_B
    gid_B, num_groups = inputs.group_ids()
    _, mean_G, std_G = _group_mean_std(scores_B, gid_B, num_groups)
    adv_B = scores_B - mean_G[gid_B]
    if params.norm_adv_by_std:
        adv_B = adv_B / (std_G[gid_B] + params.epsilon)
    advantages_BT = _outcome_advantage(adv_B, inputs)
    return advantages_BT, advantages_BT


@torch.no_grad()
def compute_rloo_advantage(inputs: AdvantageInputs, params: AdvantageParams) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (REINFORCE leave-one-out) outcome advantage, verl's ``rloo``.

    With ``r_i = sum_t token_level_rewards[i, t]`` and a group of size ``G > 1``::

        A_i = r_i - (sum_{j != i} r_j) / (G - 1) = r_i * G/(G-1) - mean_g(r) * G/(G-1)

    A group of one keeps ``A_i = r_i`` (verl's convention). ``advantages[i, t] = A_i * mask[i, t]``;
    ``returns = advantages``. Shapes: [B, T], [B, T], index_B [B] -> two [B, T]. Reads
    ``token_level_rewards_BT``, ``response_mask_BT``, ``index_B``; no params.
    """
    scores_B = inputs.scores_B
    gid_B, num_groups = inputs.group_ids()
    count_G, mean_G, _ = _group_mean_std(scores_B, gid_B, num_groups)
    g_B = count_G[gid_B]
    scale_B = g_B / (g_B - 1.0).clamp_min(1.0)
    adv_B = torch.where(g_B > 1, scores_B * scale_B - mean_G[gid_B] * scale_B, scores_B)
    advantages_BT = _outcome_advantage(adv_B, inputs)
    return advantages_BT, advantages_BT


@torch.no_grad()
def compute_reinforce_plus_plus_advantage(inputs: AdvantageInputs,
                                          params: AdvantageParams) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ advantage (verl's ``reinforce_plus_plus``): whitened discounted returns-to-go.

    Iterating ``t = T-1 .. 0`` with ``running = 0``::

        running      = r[:, t] + gamma * running
        returns[:, t] = running
        running      = running * mask[:, t]        # the return does not flow across masked positions

    then ``advantages = masked_whiten(returns, mask) * mask`` (batch-wide mean and unbiased variance
    over mask tokens, ``(x - mean) * rsqrt(var + 1e-8)``).

    Shapes: token_level_rewards_BT, response_mask_BT [B, T] -> (advantages_BT, returns_BT) [B, T].
    Reads ``token_level_rewards_BT``, ``response_mask_BT``; ``params.gamma``.
    """
    rewards_BT, mask_BT = inputs.token_level_rewards_BT, inputs.mask_BT
    returns_BT = torch.zeros_like(rewards_BT)
    running_B = torch.zeros_like(rewards_BT[:, 0])
    for t in reversed(range(rewards_BT.shape[1])):
        running_B = rewards_BT[:, t] + params.gamma * running_B
        returns_BT[:, t] = running_B
        running_B = running_B * mask_BT[:, t]
    advantages_BT = _apply_mask(masked_whiten(returns_BT, mask_BT), mask_BT)
    return advantages_BT, returns_BT


@torch.no_grad()
def compute_gae_advantage(inputs: AdvantageInputs, params: AdvantageParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (PPO with a critic), verl's ``gae``.

    Iterating ``t = T-1 .. 0`` with ``nextvalues = lastgaelam = 0`` and ``m = mask[:, t]``::

        delta      = r[:, t] + gamma * nextvalues - V[:, t]
        gae_t      = delta + gamma * lam * lastgaelam
        nextvalues = m * V[:, t] + (1 - m) * nextvalues   # masked positions are skipped:
        lastgaelam = m * gae_t   + (1 - m) * lastgaelam   # they neither add a TD error nor a value
        adv[:, t]  = lastgaelam

    ``returns = adv + V`` (before whitening); ``advantages = masked_whiten(adv, mask) * mask``.

    Shapes: token_level_rewards_BT, values_BT, response_mask_BT [B, T] -> (advantages_BT, returns_BT)
    [B, T]. Interpretation of verl: verl leaves whitened values at masked positions, here advantages
    are zeroed outside the mask (no masked loss changes). Reads ``token_level_rewards_BT``,
    ``response_mask_BT``, ``values_BT``; ``params.gamma``, ``params.lam``.
    """
    assert inputs.values_BT is not None, "called through its spec, which checks values_BT"
    rewards_BT, mask_BT = inputs.token_level_rewards_BT, inputs.mask_BT
    gamma, lam = params.gamma, params.lam
    values_BT = inputs.values_BT.to(rewards_BT.dtype)
    nextvalues_B = torch.zeros_like(rewards_BT[:, 0])
    lastgaelam_B = torch.zeros_like(nextvalues_B)
    adv_BT = torch.zeros_like(rewards_BT)
    for t in reversed(range(rewards_BT.shape[1])):
        m_B = mask_BT[:, t]
        delta_B = rewards_BT[:, t] + gamma * nextvalues_B - values_BT[:, t]
        gae_B = delta_B + gamma * lam * lastgaelam_B
        nextvalues_B = m_B * values_BT[:, t] + (1 - m_B) * nextvalues_B
        lastgaelam_B = m_B * gae_B + (1 - m_B) * lastgaelam_B
        adv_BT[:, t] = lastgaelam_B
    returns_BT = adv_BT + values_BT
    advantages_BT = _apply_mask(masked_whiten(adv_BT, mask_BT), mask_BT)
    return advantages_BT, returns_BT


@torch.no_grad()
def compute_grpo_process_advantage(inputs: AdvantageInputs,
                                   params: AdvantageParams) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO with process supervision (DeepSeekMath, section 4.1.3).

    ``step_end_mask_BT[i, t] = 1`` marks the token that ends a reasoning step of response ``i``, and
    ``token_level_rewards_BT[i, t]`` holds that step's reward ``r_i^{index(j)}``. All step rewards
    ``R`` of a group (every step of all G responses) are normalised together::

        r~_i^{index(j)} = (r_i^{index(j)} - mean(R)) / (std(R) + epsilon)   norm_adv_by_std=True
        r~_i^{index(j)} =  r_i^{index(j)} - mean(R)                         norm_adv_by_std=False

    (``std`` unbiased; a group with a single step reward has mean 0, std 1, like ``grpo``), and each
    token gets the sum of the normalised rewards of the steps ending at or after it::

        A_{i,t} = sum_{j: index(j) >= t} r~_i^{index(j)}     (a reverse cumulative sum over t)

    times ``mask[i, t]``; ``returns = advantages``. Tokens after the last step end get 0.

    Shapes: token_level_rewards_BT, response_mask_BT, step_end_mask_BT [B, T]; index_B [B] -> two
    [B, T]. Reads ``token_level_rewards_BT``, ``response_mask_BT``, ``step_end_mask_BT``, ``index_B``;
    ``params.norm_adv_by_std``, ``params.epsilon``. ``ValueError`` if ``step_end_mask_BT`` marks a
    position outside the response mask, or a reward is non-zero away from a step end (e.g. a KL
    penalty folded into the rewards with ``use_kl_in_reward``: this estimator reads rewards only at
    step ends).
    """
    assert inputs.step_end_mask_BT is not None, "called through its spec, which checks step_end_mask_BT"
    rewards_BT = inputs.token_level_rewards_BT
    is_end_BT = inputs.step_end_mask_BT != 0
    in_resp_BT = inputs.response_mask_BT != 0
    if bool((is_end_BT & ~in_resp_BT).any()):
        raise ValueError("step_end_mask_BT marks step ends at positions where response_mask_BT is 0")
    if bool(((rewards_BT != 0) & ~is_end_BT).any()):
        raise ValueError(
            "token_level_rewards_BT has non-zero rewards at positions that are not step ends; "
            "'grpo_process' reads rewards only where step_end_mask_BT is 1 "
            "(do not combine it with algorithm.use_kl_in_reward)"
        )
    gid_B, num_groups = inputs.group_ids()
    rewards_N = rewards_BT.double()[is_end_BT]
    gid_N = gid_B.unsqueeze(-1).expand_as(is_end_BT)[is_end_BT]
    _, mean_G, std_G = _group_mean_std(rewards_N, gid_N, num_groups)
    norm_N = rewards_N - mean_G[gid_N]
    if norm_N.numel() > 0 and params.norm_adv_by_std:
        norm_N = norm_N / (std_G[gid_N] + params.epsilon)
    step_BT = torch.zeros_like(rewards_BT, dtype=torch.float64)
    step_BT[is_end_BT] = norm_N
    adv_BT = step_BT.flip(-1).cumsum(-1).flip(-1)
    advantages_BT = _apply_mask(adv_BT.to(rewards_BT.dtype), inputs.mask_BT)
    return advantages_BT, advantages_BT


@torch.no_grad()
def compute_remax_advantage(inputs: AdvantageInputs, params: AdvantageParams) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023, arXiv:2310.10505), verl's ``remax``: REINFORCE with the reward of the
    greedy response to the same prompt as the baseline::

        returns[i, t]    = sum_{t' >= t} r[i, t'] * mask[i, t']         (rewards-to-go, no discount)
        advantages[i, t] = (returns[i, t] - b_i) * mask[i, t]

    ``b_i = reward_baselines_B[i]``: the score of one greedy response to response i's prompt (the
    trainer samples it each step). Shapes: token_level_rewards_BT, response_mask_BT [B, T];
    reward_baselines_B [B] -> two [B, T]. Reads ``token_level_rewards_BT``, ``response_mask_BT``,
    ``reward_baselines_B``; no params. (verl leaves ``-b_i * 0`` outside the mask, i.e. the same zeros.)
    """
    assert inputs.reward_baselines_B is not None, "called through its spec, which checks reward_baselines_B"
    rewards_BT, mask_BT = inputs.token_level_rewards_BT, inputs.mask_BT
    returns_BT = _apply_mask(rewards_BT, mask_BT).flip(-1).cumsum(-1).flip(-1)
    baseline_BT = inputs.reward_baselines_B.to(rewards_BT.dtype).unsqueeze(-1)
    advantages_BT = _apply_mask(returns_BT - baseline_BT, mask_BT)
    return advantages_BT, returns_BT


@torch.no_grad()
def compute_reinforce_plus_plus_baseline_advantage(inputs: AdvantageInputs,
                                                   params: AdvantageParams) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group baseline (Hu 2025, arXiv:2501.03262), verl's
    ``reinforce_plus_plus_baseline``: subtract the group's mean reward, then whiten over the batch::

        a[i, t]    = (r_i - mean_g(r)) * mask[i, t]          (a group of one: mean 0)
        advantages = masked_whiten(a, mask) * mask            (batch mean and unbiased std over tokens)

    ``returns = advantages``. Shapes: [B, T], [B, T], index_B [B] -> two [B, T]. Reads
    ``token_level_rewards_BT``, ``response_mask_BT``, ``index_B``; no params.
    """
    scores_B = inputs.scores_B
    gid_B, num_groups = inputs.group_ids()
    _, mean_G, _ = _group_mean_std(scores_B, gid_B, num_groups)
    a_BT = _outcome_advantage(scores_B - mean_G[gid_B], inputs)
    mask_BT = inputs.mask_BT
    advantages_BT = _apply_mask(masked_whiten(a_BT, mask_BT), mask_BT)
    return advantages_BT, advantages_BT


@torch.no_grad()
def compute_grpo_passk_advantage(inputs: AdvantageInputs, params: AdvantageParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k training (Chen et al. 2025, arXiv:2503.19595), verl's ``grpo_passk``: only the best
    response of each group learns, by its margin over the runner-up::

        A_best = (r_max - r_second) / (std_g(r) + epsilon)     norm_adv_by_std=True
        A_best =  r_max - r_second                              norm_adv_by_std=False
        A_j    = 0 for every other response j of the group

    ``best`` is the first response (in row order) with the group's largest reward; ``r_second`` is
    the second largest reward counting ties (so a tie at the top gives 0); ``std`` is unbiased.
    ``advantages[i, t] = A_i * mask[i, t]``; ``returns = advantages``. ``ValueError`` for a group of
    fewer than 2 responses. Shapes: [B, T], [B, T], index_B [B] -> two [B, T]. Reads
    ``token_level_rewards_BT``, ``response_mask_BT``, ``index_B``; ``params.norm_adv_by_std``,
    ``params.epsilon``.
    """
    scores_B = inputs.scores_B
    gid_B, num_groups = inputs.group_ids()
    count_G, _, std_G = _group_mean_std(scores_B, gid_B, num_groups)
    if bool((count_G < 2).any()):
        raise ValueError("the 'grpo_passk' advantage estimator needs groups of at least 2 responses "
                         f"(actor_rollout_ref.rollout.n >= 2); smallest group: {int(count_G.min())}")
    adv_B = torch.zeros_like(scores_B)
    for g in range(num_groups):
        rows = torch.nonzero(gid_B == g, as_tuple=True)[0]
        vals = scores_B[rows]
        best = int(torch.argmax(vals))  # the first maximum
        second = torch.topk(vals, 2).values[1]
        margin = vals[best] - second
        if margin != 0:  # a tie at the top (or a constant group, std 0) leaves the whole group at 0
            adv_B[rows[best]] = margin / (std_G[g] + params.epsilon) if params.norm_adv_by_std else margin
    advantages_BT = _outcome_advantage(adv_B, inputs)
    return advantages_BT, advantages_BT


@torch.no_grad()
def compute_opo_advantage(inputs: AdvantageInputs, params: AdvantageParams) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO, On-Policy RL with the Optimal reward baseline (Hao et al. 2025, arXiv:2505.23585), verl's
    ``opo``: the group baseline is the length-weighted mean reward::

        L_j = sum_t mask[j, t];   b_g = sum_{j in g} L_j r_j / sum_{j in g} L_j
        A_i = r_i - b_g                                        (a group of one, or of empty
                                                                responses only: b = 0)

    ``advantages[i, t] = A_i * mask[i, t]``; ``returns = advantages``. Shapes: [B, T], [B, T],
    index_B [B] -> two [B, T]. Reads ``token_level_rewards_BT``, ``response_mask_BT``, ``index_B``;
    no params. Deviation from verl: a group whose responses are all empty gets b = 0 (verl divides 0
    by 0).
    """
    scores_B = inputs.scores_B
    len_B = inputs.response_mask_BT.double().sum(-1)
    gid_B, num_groups = inputs.group_ids()
    zeros_G = torch.zeros(num_groups, dtype=torch.float64, device=scores_B.device)
    count_G = zeros_G.index_add(0, gid_B, torch.ones_like(scores_B))
    wsum_G = zeros_G.index_add(0, gid_B, len_B * scores_B)
    lsum_G = zeros_G.index_add(0, gid_B, len_B)
    base_G = torch.where((count_G > 1) & (lsum_G > 0), wsum_G / lsum_G.clamp_min(1e-12), zeros_G)
    advantages_BT = _outcome_advantage(scores_B - base_G[gid_B], inputs)
    return advantages_BT, advantages_BT


@torch.no_grad()
def compute_gpg_advantage(inputs: AdvantageInputs, params: AdvantageParams) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG, Group Policy Gradient (Chu et al. 2025, arXiv:2504.02546), verl's ``gpg``: the group mean
    as baseline, no std, rescaled by the share of responses with a non-zero reward in the batch::

        alpha = B / max(#{i : r_i != 0}, 1)
        A_i   = alpha * (r_i - mean_g(r)) / f_norm,   f_norm = 1   (a group of one: mean 0)

    ``advantages[i, t] = A_i * mask[i, t]``; ``returns = advantages``. Use with the ``gpg`` policy
    loss. Shapes: [B, T], [B, T], index_B [B] -> two [B, T]. Reads ``token_level_rewards_BT``,
    ``response_mask_BT``, ``index_B``; no params.
    """
    scores_B = inputs.scores_B
    alpha = scores_B.shape[0] / max(int((scores_B != 0).sum()), 1)
    gid_B, num_groups = inputs.group_ids()
    _, mean_G, _ = _group_mean_std(scores_B, gid_B, num_groups)
    advantages_BT = _outcome_advantage(alpha * (scores_B - mean_G[gid_B]), inputs)
    return advantages_BT, advantages_BT


bind_builtins(_REGISTRY, __name__)  # the registry's built-in rows name the compute_<name>_advantage functions above
