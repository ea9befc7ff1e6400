"""Policy-loss modes: pure functions from log-probs and advantages to a scalar loss and its metrics.

Every mode is registered under a name (``actor_rollout_ref.actor.policy_loss.loss_mode``, verl's key)
and looked up with :func:`get_policy_loss`: the built-in ``<name>_policy_loss`` functions here by their
rows in :mod:`grpo_dist.core.policy_loss_registry` (which the configuration reads without torch), a
user's with :func:`register_policy_loss`. All modes share one
call, so the actor calls every mode the same way::

    spec = get_policy_loss("vanilla")
    inputs = PolicyLossInputs(logp_BT, old_logp_BT, advantages_BT, mask_BT)
    loss, metrics = spec.fn(inputs, agg=agg_spec, params=params)

The loss contract: ``fn(inputs, *, agg, params) -> (loss, metrics)``
----------------------------------------------------------------------
``inputs`` is positional, ``agg`` and ``params`` are keywords. ``inputs`` is a
:class:`PolicyLossInputs` holding ``B`` rows of ONE micro-batch on one data-parallel rank, ``T`` the
padded response length; it checked the shapes and detached what must be detached when it was built:

- ``inputs.logp_BT`` [B, T] float32: log-probs of the response tokens under the policy being
  trained (at the rollout temperature); the only input that carries gradients.
- ``inputs.old_logp_BT`` [B, T]: log-probs under the policy that sampled the responses (the policy
  before this step's first optimizer step); detached. On-policy updates pass ``logp_BT.detach()``.
- ``inputs.advantages_BT`` [B, T]: per-token advantages; detached, zero outside the response.
- ``inputs.mask_BT`` [B, T] (float or bool): 1 on the response tokens that count.
- ``inputs.rollout_is_weights_BT`` [B, T] or None: per-token rollout importance weights (detached,
  in ``logp_BT``'s dtype, 0 outside the response; :mod:`grpo_dist.core.rollout_correction`). The
  actor fills them in when the batch carries ``rollout_is_weights``
  (``algorithm.rollout_correction.rollout_is``) AND the mode was registered with
  ``register_policy_loss(name, rollout_is_weights=True)`` (:attr:`PolicyLossSpec.accepts_rollout_is_weights`;
  configuration refuses importance weights with a mode that was not). A mode that takes them
  multiplies its per-token loss by them before aggregating; for any other mode they are None.

``agg`` is an :class:`~grpo_dist.core.losses.AggSpec` whose counts are those of the WHOLE mini-batch
(all micro-batches on all ranks). Reduce the per-token loss with
:func:`~grpo_dist.core.losses.agg_loss` and this spec, so that the pieces of all micro-batches and
ranks add up to the loss of the whole mini-batch (the update then does not depend on the micro-batch
size or the number of ranks).

``params`` is a :class:`PolicyLossParams`, the numbers the losses use (clip ranges, ...); a mode
reads the fields it needs.

The call returns ``(loss, metrics)``: ``loss`` a 0-dim tensor (this micro-batch's piece of the
mini-batch loss, to be summed over micro-batches and ranks), ``metrics`` a ``dict[str, 0-dim tensor]``.

The metrics contract
--------------------
Each metric is a masked token mean over the rows of the call (``sum(x * mask) / sum(mask)``, 0 when
the mask is empty; :func:`~grpo_dist.core.losses.masked_mean`). The caller (the actor) weights each
by the call's token count, sums over micro-batches and ranks, divides by the mini-batch's token
count, averages over the step's mini-batches, and reports it as ``actor/<name>``. Whatever metrics a
loss returns are reported: a new mode's own diagnostics need no change in the caller. A mode must
return the same metric names on every call, and none of the names the actor reports itself
(:data:`RESERVED_METRIC_NAMES`).

A new loss with a parameter
---------------------------
Add the field to :class:`PolicyLossParams` (in :mod:`grpo_dist.core.policy_loss_registry`) with its metadata (``_param(default, help)``: a
default, a one-line help text, and the config key's place, ``"policy_loss"`` by default), and
register the function; nothing else. From that one declaration the parameter becomes the key
``actor_rollout_ref.actor.policy_loss.<name>`` (default and help in the schema, conf/ and
docs/configuration.md, all generated), reaches the actor's settings
(``ActorSettings.policy_loss``) and is accepted by the Python API
(``GRPO(policy_loss_params={"<name>": ...})``). Range checks go in
:meth:`PolicyLossParams.__post_init__`, which every one of those paths runs::

    @dataclass(frozen=True)
    class PolicyLossParams:
        ...
        my_beta: float = _param(0.5, "my_loss: weight of the extra term")

    @register_policy_loss("my_loss")
    def my_loss(inputs, *, agg, params):
        per_token_BT = -inputs.advantages_BT * inputs.logp_BT + params.my_beta * inputs.logp_BT ** 2
        return agg_loss(per_token_BT, inputs.mask_BT, agg), {}
"""


from dataclasses import dataclass, fields, replace
from typing import Protocol

import torch

from grpo_dist.core.losses import AggSpec, agg_loss, masked_mean, ppo_clip_policy_loss
from grpo_dist.core.policy_loss_registry import (
    _REGISTRY,
    BUILTIN_POLICY_LOSSES,
    POLICY_LOSS_KEY,
    PolicyLossParams,
    PolicyLossSpec,
    get_policy_loss,
    list_policy_losses,
    policy_loss_keys,
    register_policy_loss,
)
from grpo_dist.core.registry import bind_builtins
from grpo_dist.core.rollout_correction import (
    importance_weights,
    mismatch_metrics,
    rejection_mask,
)

__all__ = [
    "PolicyLossInputs",
    "PolicyLossParams",
    "POLICY_LOSS_KEY",
    "policy_loss_keys",
    "PolicyLossFn",
    "PolicyLossOutput",
    "PolicyLossSpec",
    "RESERVED_METRIC_NAMES",
    "register_policy_loss",
    "get_policy_loss",
    "list_policy_losses",
    "vanilla_policy_loss",
    "gspo_policy_loss",
    "gpg_policy_loss",
    "cispo_policy_loss",
    "clip_cov_policy_loss",
    "kl_cov_policy_loss",
    "geo_mean_policy_loss",
    "sapo_policy_loss",
    "dro_policy_loss",
    "dppo_tv_policy_loss",
    "dppo_kl_policy_loss",
    "bypass_mode_policy_loss",
]

RESERVED_METRIC_NAMES: frozenset[str] = frozenset(
    {"pg_loss", "entropy", "kl_loss", "kl_coef", "grad_norm", "grad_norm_nonfinite_count", "lr"}
)
"""Metric names the actor reports itself (``actor/<name>``); a policy loss may not return them."""


@dataclass(frozen=True, eq=False)
class PolicyLossInputs:
    """The tensors a policy loss is called on (module docstring): ``B`` rows of one micro-batch, ``T``
    the padded response length. Building it checks the shapes (``ValueError`` naming the input) and
    detaches ``old_logp_BT``, ``advantages_BT`` and ``rollout_is_weights_BT`` (the weights also cast
    to ``logp_BT``'s dtype), once for every mode."""

    logp_BT: torch.Tensor
    """[B, T] log-probs under the policy being trained; the only input with gradients."""
    old_logp_BT: torch.Tensor
    """[B, T] log-probs under the policy that sampled (detached here)."""
    advantages_BT: torch.Tensor
    """[B, T] per-token advantages (detached here)."""
    mask_BT: torch.Tensor
    """[B, T] 1 on the response tokens that count (float or bool)."""
    rollout_is_weights_BT: torch.Tensor | None = None
    """[B, T] rollout importance weights (detached here), only for modes registered to take them."""

    def __post_init__(self) -> None:
        logp_BT = self.logp_BT
        if logp_BT.dim() != 2:
            raise ValueError(f"logp_BT must be 2-D [B, T], got shape {tuple(logp_BT.shape)}")
        for f in fields(self)[1:]:
            t = getattr(self, f.name)
            if t is not None and t.shape != logp_BT.shape:
                raise ValueError(f"{f.name} shape {tuple(t.shape)} must equal logp_BT shape {tuple(logp_BT.shape)}")
        object.__setattr__(self, "old_logp_BT", self.old_logp_BT.detach())
        object.__setattr__(self, "advantages_BT", self.advantages_BT.detach())
        if self.rollout_is_weights_BT is not None:
            object.__setattr__(self, "rollout_is_weights_BT", self.rollout_is_weights_BT.detach().to(logp_BT.dtype))

    def unpack(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(logp_BT, old_logp_BT, advantages_BT, mask_BT, rollout_is_weights_BT)``, the fields in order."""
        return self.logp_BT, self.old_logp_BT, self.advantages_BT, self.mask_BT, self.rollout_is_weights_BT


PolicyLossOutput = tuple[torch.Tensor, dict[str, torch.Tensor]]
"""What a policy loss returns: ``(0-dim loss, {metric name: 0-dim tensor})`` (the module docstring)."""


class PolicyLossFn(Protocol):
    """The one call every policy-loss mode implements (see the module docstring)."""

    def __call__(self, inputs: PolicyLossInputs, *, agg: AggSpec, params: PolicyLossParams) -> PolicyLossOutput: ...


# --------------------------------------------------------------------------------------------------
# modes
# --------------------------------------------------------------------------------------------------


def vanilla_policy_loss(inputs: PolicyLossInputs, *, agg: AggSpec, params: PolicyLossParams) -> PolicyLossOutput:
    """verl's ``vanilla``: the PPO clipped surrogate with clip-higher and dual clip.

    Exactly :func:`~grpo_dist.core.losses.ppo_clip_policy_loss` (formula there) with the clip ranges
    of ``params`` (and the per-token rollout importance weights, when given, multiplying the
    per-token loss). Metrics: ``pg_clipfrac``, ``pg_clipfrac_lower``, ``ppo_kl``.
    Shapes: [B, T] each -> (0-dim loss, dict of 0-dim tensors).
    """
    return ppo_clip_policy_loss(
        inputs.logp_BT,
        inputs.old_logp_BT,
        inputs.advantages_BT,
        inputs.mask_BT,
        clip_ratio_low=params.clip_ratio_low,
        clip_ratio_high=params.clip_ratio_high,
        clip_ratio_c=params.clip_ratio_c,
        agg=agg,
        rollout_is_weights_BT=inputs.rollout_is_weights_BT,
    )


# --------------------------------------------------------------------------------------------------
# helpers of the modes below
# --------------------------------------------------------------------------------------------------


def _weighted(loss_BT: torch.Tensor, w_BT: torch.Tensor | None) -> torch.Tensor:
    return loss_BT if w_BT is None else loss_BT * w_BT


def _bool_mask(mask_BT: torch.Tensor) -> torch.Tensor:
    return mask_BT != 0


def _masked_covariance(advantages_BT: torch.Tensor, logp_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """``(A - mean(A)) * (logp - mean(logp))`` per token, the means over the response tokens of the
    call (detached). Shapes: [B, T] x 3 -> [B, T]."""
    lp_BT = logp_BT.detach()
    return (advantages_BT - masked_mean(advantages_BT, mask_BT)) * (lp_BT - masked_mean(lp_BT, mask_BT))


# --------------------------------------------------------------------------------------------------
# more modes (verl's names)
# --------------------------------------------------------------------------------------------------


def gspo_policy_loss(inputs: PolicyLossInputs, *, agg: AggSpec, params: PolicyLossParams) -> PolicyLossOutput:
    """GSPO, Group Sequence Policy Optimization (Zheng et al. 2025, arXiv:2507.18071): one
    importance ratio per sequence, the length-normalised sequence likelihood ratio::

        d        = logp - old_logp
        s_i      = sum_t d_it * mask_it / max(len_i, 1)             (log of the sequence ratio)
        log_r_it = min(logp_it - sg(logp_it) + sg(s_i), 10)         (value s_i; gradient of logp_it)
        r_it     = exp(log_r_it)
        pg1 = -A * r;   pg2 = -A * clamp(r, 1 - clip_ratio_low, 1 + clip_ratio_high)
        per_token = max(pg1, pg2) [* w]
        loss = agg_loss(per_token, mask, agg with mode "seq-mean-token-mean")

    Always aggregated per sequence (seq-mean-token-mean over the mini-batch's sequences), whatever
    ``agg.mode`` says, as verl does; the paper's clip ranges are tiny (3e-4 / 4e-4). No dual clip.
    Micro-batch and rank invariant (every quantity is per sequence; the normaliser is global).
    Metrics: ``pg_clipfrac`` (tokens with pg2 > pg1), ``pg_clipfrac_lower`` (always 0),
    ``ppo_kl`` (mean of -d). Shapes: [B, T] each -> (0-dim loss, dict).
    """
    logp_BT, old_logp_BT, advantages_BT, mask_BT, w_BT = inputs.unpack()
    m_BT = mask_BT.to(logp_BT.dtype)
    d_BT = logp_BT - old_logp_BT
    len_B = m_BT.sum(-1).clamp_min(1.0)
    seq_B = torch.where(m_BT != 0, d_BT, torch.zeros_like(d_BT)).mul(m_BT).sum(-1) / len_B
    log_r_BT = torch.clamp(logp_BT - logp_BT.detach() + seq_B.detach().unsqueeze(-1), max=10.0)
    r_BT = torch.exp(log_r_BT)
    pg1_BT = -advantages_BT * r_BT
    pg2_BT = -advantages_BT * torch.clamp(r_BT, 1.0 - params.clip_ratio_low, 1.0 + params.clip_ratio_high)
    per_token_BT = _weighted(torch.maximum(pg1_BT, pg2_BT), w_BT)
    loss = agg_loss(per_token_BT, mask_BT, replace(agg, mode="seq-mean-token-mean"))
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((pg2_BT > pg1_BT).to(logp_BT.dtype), mask_BT),
            "pg_clipfrac_lower": torch.zeros((), dtype=logp_BT.dtype, device=logp_BT.device),
            "ppo_kl": masked_mean(-d_BT.detach(), mask_BT),
        }
    return loss, metrics


def gpg_policy_loss(inputs: PolicyLossInputs, *, agg: AggSpec, params: PolicyLossParams) -> PolicyLossOutput:
    """GPG, Group Policy Gradient (Chu et al. 2025, arXiv:2504.02546): plain policy gradient, no
    ratio, no clipping, no old policy::

        loss = agg_loss(-A * logp [* w], mask, agg)

    Pair it with ``algorithm.adv_estimator=gpg``. Invariant under any aggregation mode.
    Metrics: none (as verl). Shapes: [B, T] each -> (0-dim loss, {}).
    """
    logp_BT, _, advantages_BT, mask_BT, w_BT = inputs.unpack()
    return agg_loss(_weighted(-advantages_BT * logp_BT, w_BT), mask_BT, agg), {}


def cispo_policy_loss(inputs: PolicyLossInputs, *, agg: AggSpec, params: PolicyLossParams) -> PolicyLossOutput:
    """CISPO, Clipped IS-weight Policy Optimization (MiniMax-M1, arXiv:2506.13585): clip the
    importance weight, not the update; every token keeps a gradient::

        d = clamp(logp - old_logp, -20, 20);   r = exp(d)
        c = sg(clamp(r, 1 - clip_ratio_low, 1 + clip_ratio_high))
        loss = agg_loss(-c * A * logp [* w], mask, agg)

    (verl's form, with both clip ranges; the paper clips mainly above.) Invariant under any
    aggregation mode. Metrics: ``pg_clipfrac`` (tokens whose weight was clipped),
    ``pg_clipfrac_lower`` (always 0), ``ppo_kl`` (mean of -d). Shapes: [B, T] each -> (loss, dict).
    """
    logp_BT, old_logp_BT, advantages_BT, mask_BT, w_BT = inputs.unpack()
    d_BT = torch.clamp(logp_BT - old_logp_BT, -20.0, 20.0)
    r_BT = torch.exp(d_BT)
    c_BT = torch.clamp(r_BT, 1.0 - params.clip_ratio_low, 1.0 + params.clip_ratio_high).detach()
    loss = agg_loss(_weighted(-c_BT * advantages_BT * logp_BT, w_BT), mask_BT, agg)
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((r_BT != c_BT).to(logp_BT.dtype), mask_BT),
            "pg_clipfrac_lower": torch.zeros((), dtype=logp_BT.dtype, device=logp_BT.device),
            "ppo_kl": masked_mean(-d_BT.detach(), mask_BT),
        }
    return loss, metrics


def clip_cov_policy_loss(inputs: PolicyLossInputs, *, agg: AggSpec, params: PolicyLossParams) -> PolicyLossOutput:
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs",
    arXiv:2505.22617): the PPO clip, plus the gradient of a few high-covariance tokens cut::

        d = clamp(logp - old_logp, -20, 20);  r = exp(d)
        pg1 = -A * r;  pg2 = -A * clamp(r, 1 - clip_ratio_low, 1 + clip_ratio_high)
        cov = (A - mean(A)) * (logp - mean(logp))             (means over the call's response tokens)
        candidates: response tokens with pg2 <= pg1 (not already clipped) and
                    clip_cov_lb < cov < clip_cov_ub
        cut: min(max(int(clip_cov_ratio * #response tokens), 1), #candidates) candidates drawn
             uniformly at random (torch.randperm on torch's global generator, over the candidates
             in row-major order)
        per_token = max(pg1, pg2) * (0 on cut tokens, else 1) [* w]
        loss = agg_loss(per_token, mask, agg)

    No dual clip (as verl). NOT micro-batch or rank invariant: the covariance means, the number cut
    and the draw are over the rows of the call. (verl does not clamp d; for |d| <= 20 the same.)
    Metrics: ``pg_clipfrac`` (tokens cut), ``ppo_kl`` (mean of -d). Shapes: [B, T] -> (loss, dict).
    """
    logp_BT, old_logp_BT, advantages_BT, mask_BT, w_BT = inputs.unpack()
    d_BT = torch.clamp(logp_BT - old_logp_BT, -20.0, 20.0)
    r_BT = torch.exp(d_BT)
    pg1_BT = -advantages_BT * r_BT
    pg2_BT = -advantages_BT * torch.clamp(r_BT, 1.0 - params.clip_ratio_low, 1.0 + params.clip_ratio_high)
    with torch.no_grad():
        resp_BT = _bool_mask(mask_BT)
        cov_BT = _masked_covariance(advantages_BT, logp_BT, mask_BT)
        cand_BT = resp_BT & ~(pg2_BT > pg1_BT) & (cov_BT > params.clip_cov_lb) & (cov_BT < params.clip_cov_ub)
        cand_N2 = torch.nonzero(cand_BT)
        keep_BT = torch.ones_like(logp_BT)
        if len(cand_N2) > 0:
            n_cut = max(int(params.clip_cov_ratio * int(resp_BT.sum())), 1)
            cut_N2 = cand_N2[torch.randperm(len(cand_N2))[: min(n_cut, len(cand_N2))].to(cand_N2.device)]
            keep_BT[cut_N2[:, 0], cut_N2[:, 1]] = 0.0
    per_token_BT = _weighted(torch.maximum(pg1_BT, pg2_BT) * keep_BT, w_BT)
    loss = agg_loss(per_token_BT, mask_BT, agg)
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((keep_BT == 0).to(logp_BT.dtype), mask_BT),
            "ppo_kl": masked_mean(-d_BT.detach(), mask_BT),
        }
    return loss, metrics


def kl_cov_policy_loss(inputs: PolicyLossInputs, *, agg: AggSpec, params: PolicyLossParams) -> PolicyLossOutput:
    """KL-Cov (Cui et al. 2025, arXiv:2505.22617): no clipping; a KL penalty on the few tokens with
    the largest covariance between advantage and log-prob::

        d = clamp(logp - old_logp, -20, 20);  r = exp(d)
        cov = (A - mean(A)) * (logp - mean(logp))             (means over the call's response tokens)
        top: the max(int(kl_cov_ratio * #response tokens), 1) response tokens with the largest cov
        per_token = -A * r + ppo_kl_coef * |d| * [token in top]   [* w]
        loss = agg_loss(per_token, mask, agg)

    NOT micro-batch or rank invariant (the covariance and the top-k are over the rows of the call).
    (verl does not clamp d; for |d| <= 20 the same.) Metrics: ``ppo_kl``, here the mean of |d| as
    in verl. Shapes: [B, T] each -> (0-dim loss, dict).
    """
    logp_BT, old_logp_BT, advantages_BT, mask_BT, w_BT = inputs.unpack()
    d_BT = torch.clamp(logp_BT - old_logp_BT, -20.0, 20.0)
    per_token_BT = -advantages_BT * torch.exp(d_BT)
    with torch.no_grad():
        resp_BT = _bool_mask(mask_BT)
        n_resp = int(resp_BT.sum())
        top_BT = torch.zeros_like(resp_BT)
        if n_resp > 0:
            cov_N = _masked_covariance(advantages_BT, logp_BT, mask_BT)[resp_BT]
            top_N = torch.topk(cov_N, max(int(n_resp * params.kl_cov_ratio), 1), largest=True).indices
            flat_N = torch.nonzero(resp_BT.reshape(-1), as_tuple=True)[0][top_N]
            top_BT.view(-1)[flat_N] = True
    per_token_BT = torch.where(top_BT, per_token_BT + params.ppo_kl_coef * d_BT.abs(), per_token_BT)
    loss = agg_loss(_weighted(per_token_BT, w_BT), mask_BT, agg)
    with torch.no_grad():
        metrics = {"ppo_kl": masked_mean(d_BT.detach().abs(), mask_BT)}
    return loss, metrics


def geo_mean_policy_loss(inputs: PolicyLossInputs, *, agg: AggSpec, params: PolicyLossParams) -> PolicyLossOutput:
    """GMPO, Geometric-Mean Policy Optimization (Zhao et al. 2025, arXiv:2507.20673): the geometric
    mean of the token ratios, clipped per token in log space::

        d  = logp - old_logp;   s = sign(A)
        dc = clamp(d, -clip_ratio_low, clip_ratio_high)
        e  = s * min(s * d, s * dc)                           (the pessimistic of clipped / unclipped)
        ratio_i = exp(sum_t e_it m_it / (len_i + 1e-8));   adv_i = sum_t A_it m_it / (len_i + 1e-8)
        [w_i = exp(sum_t log(w_it + 1e-10) m_it / (len_i + 1e-8))]       (geometric mean of the weights)
        loss = sum_{i: len_i > 0} -adv_i * ratio_i [* w_i]  /  N_seq

    ``N_seq`` is ``agg.global_seqs`` (the mini-batch's non-empty sequences), so the loss is
    micro-batch and rank invariant whatever ``agg.mode`` says. verl instead takes the plain mean over
    the rows of the micro-batch (empty rows included); the two agree for one micro-batch without
    empty rows. Meant for sequence-level advantages (GRPO's). Metrics: ``pg_clipfrac`` (tokens with
    d != dc and A > 0), ``pg_clipfrac_lower`` (d != dc and A < 0), ``ppo_kl`` (mean of -d).
    Shapes: [B, T] each -> (0-dim loss, dict).
    """
    logp_BT, old_logp_BT, advantages_BT, mask_BT, w_BT = inputs.unpack()
    m_BT = mask_BT.to(logp_BT.dtype)
    zero_BT = torch.zeros_like(logp_BT)
    d_BT = logp_BT - old_logp_BT
    s_BT = torch.sign(advantages_BT)
    dc_BT = torch.clamp(d_BT, -params.clip_ratio_low, params.clip_ratio_high)
    e_BT = s_BT * torch.minimum(s_BT * d_BT, s_BT * dc_BT)
    len_B = m_BT.sum(-1)
    ratio_B = torch.exp(torch.where(m_BT != 0, e_BT, zero_BT).mul(m_BT).sum(-1) / (len_B + 1e-8))
    adv_B = torch.where(m_BT != 0, advantages_BT, zero_BT).mul(m_BT).sum(-1) / (len_B + 1e-8)
    pg_B = -adv_B * ratio_B
    if w_BT is not None:
        log_w_BT = torch.where(m_BT != 0, torch.log(w_BT + 1e-10), zero_BT)
        pg_B = pg_B * torch.exp(log_w_BT.mul(m_BT).sum(-1) / (len_B + 1e-8))
    rows_B = len_B > 0
    seqs = agg.global_seqs if agg.global_seqs is not None else float(rows_B.sum())
    total = torch.where(rows_B, pg_B, torch.zeros_like(pg_B)).sum()
    loss = total / seqs if seqs > 0 else total * 0.0
    with torch.no_grad():
        clipped_BT = d_BT != dc_BT
        metrics = {
            "pg_clipfrac": masked_mean((clipped_BT & (advantages_BT > 0)).to(logp_BT.dtype), mask_BT),
            "pg_clipfrac_lower": masked_mean((clipped_BT & (advantages_BT < 0)).to(logp_BT.dtype), mask_BT),
            "ppo_kl": masked_mean(-d_BT.detach(), mask_BT),
        }
    return loss, metrics


def sapo_policy_loss(inputs: PolicyLossInputs, *, agg: AggSpec, params: PolicyLossParams) -> PolicyLossOutput:
    """SAPO, Soft Adaptive Policy Optimization (arXiv:2511.20347): a smooth gate on
    the token ratio instead of a hard clip::

        d = clamp(logp - old_logp, -20, 20);   r = exp(d)
        tau = tau_pos where A > 0, else tau_neg                     (per token)
        f(r) = sigmoid(tau * (r - 1)) * 4 / tau
        per_token = -f(r) * A [* w]
        loss = agg_loss(per_token, mask, agg with mode "seq-mean-token-mean")

    ``df/dlogp = 4 sigma (1 - sigma) r``: 1 at ``r = 1`` (the on-policy gradient is the plain
    policy gradient's), fading smoothly as ``r`` leaves 1, faster for the larger ``tau`` (verl's
    ``tau_neg`` 1.05 > ``tau_pos`` 1.0 damps negative updates a little more). Always aggregated per
    sequence whatever ``agg.mode`` says, as verl does. Micro-batch and rank invariant. Metrics:
    ``ppo_kl`` (mean of -d) and, for verl's dashboards, ``pg_clipfrac`` and ``pg_clipfrac_lower``
    (always 0: nothing is clipped). Shapes: [B, T] each -> (0-dim loss, dict).
    """
    logp_BT, old_logp_BT, advantages_BT, mask_BT, w_BT = inputs.unpack()
    d_BT = torch.clamp(logp_BT - old_logp_BT, -20.0, 20.0)
    tau_BT = torch.where(advantages_BT > 0, torch.full_like(logp_BT, params.tau_pos),
                         torch.full_like(logp_BT, params.tau_neg)).detach()
    gate_BT = torch.sigmoid(tau_BT * (torch.exp(d_BT) - 1.0)) * (4.0 / tau_BT)
    per_token_BT = _weighted(-gate_BT * advantages_BT, w_BT)
    loss = agg_loss(per_token_BT, mask_BT, replace(agg, mode="seq-mean-token-mean"))
    with torch.no_grad():
        zero = torch.zeros((), dtype=logp_BT.dtype, device=logp_BT.device)
        metrics = {"pg_clipfrac": zero, "pg_clipfrac_lower": zero.clone(), "ppo_kl": masked_mean(-d_BT.detach(), mask_BT)}
    return loss, metrics


def dro_policy_loss(inputs: PolicyLossInputs, *, agg: AggSpec, params: PolicyLossParams) -> PolicyLossOutput:
    """DRO, Direct Reward Optimization (verl's ``dro``): the policy gradient with a quadratic proximal
    penalty on the log-ratio instead of a clip::

        d = logp - old_logp
        per_token = -(logp * A - beta / 2 * d^2) [* w]              (beta = dro_beta > 0)
        loss = agg_loss(per_token, mask, agg)

    The penalty's gradient ``beta * d`` pulls each token back toward the policy that sampled it. Invariant
    under any aggregation mode. Metrics: ``ppo_kl`` (mean of -d). Shapes: [B, T] each -> (loss, dict).
    """
    get_policy_loss("dro").check_params(params)
    logp_BT, old_logp_BT, advantages_BT, mask_BT, w_BT = inputs.unpack()
    d_BT = logp_BT - old_logp_BT
    per_token_BT = -(logp_BT * advantages_BT - 0.5 * params.dro_beta * d_BT.square())
    loss = agg_loss(_weighted(per_token_BT, w_BT), mask_BT, agg)
    with torch.no_grad():
        metrics = {"ppo_kl": masked_mean(-d_BT.detach(), mask_BT)}
    return loss, metrics


def _dppo(inputs: PolicyLossInputs, agg: AggSpec, params: PolicyLossParams, valid_BT: torch.Tensor) -> PolicyLossOutput:
    """DPPO's loss once the trust region's token mask ``valid_BT`` (bool, detached) is known."""
    logp_BT, old_logp_BT, advantages_BT, mask_BT, w_BT = inputs.unpack()
    d_BT = torch.clamp(logp_BT - old_logp_BT, -20.0, 20.0)
    r_BT = torch.exp(d_BT.detach())
    truncated_BT = torch.clamp(r_BT, max=params.clip_ratio_c)
    keep_BT = valid_BT.to(logp_BT.dtype)
    per_token_BT = _weighted(-advantages_BT * truncated_BT * logp_BT * keep_BT, w_BT)
    loss = agg_loss(per_token_BT, mask_BT, agg)
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean(1.0 - keep_BT, mask_BT),
            "pg_clipfrac_lower": masked_mean((r_BT > params.clip_ratio_c).to(logp_BT.dtype) * keep_BT, mask_BT),
            "ppo_kl": masked_mean(-d_BT.detach(), mask_BT),
        }
    return loss, metrics


def dppo_tv_policy_loss(inputs: PolicyLossInputs, *, agg: AggSpec, params: PolicyLossParams) -> PolicyLossOutput:
    """DPPO-Binary-TV (arXiv:2602.04879): the trust region is a bound on how far each sampled token's
    probability moved (its total variation), not on the ratio; inside it, a policy gradient weighted by
    the truncated importance ratio::

        p = exp(logp), p_old = exp(old_logp)
        valid = (p - p_old <= clip_ratio_high) where A > 0, else (p - p_old >= -clip_ratio_low)   (no gradient)
        r = exp(clamp(logp - old_logp, -20, 20));   c = sg(min(r, clip_ratio_c))
        per_token = -A * c * logp * valid [* w]
        loss = agg_loss(per_token, mask, agg)

    The clip ranges are here thresholds of the probability's change, as in verl; ``clip_ratio_c``
    truncates the weight (the paper advises a large one; verl's actor default is 3). Invariant under any
    aggregation mode. Metrics: ``pg_clipfrac`` (tokens outside the region), ``pg_clipfrac_lower``
    (tokens inside it whose ratio was truncated), ``ppo_kl`` (mean of -d). Shapes: [B, T] each -> (loss, dict).
    """
    with torch.no_grad():
        moved_BT = torch.exp(inputs.logp_BT) - torch.exp(inputs.old_logp_BT)
        valid_BT = torch.where(inputs.advantages_BT > 0, moved_BT <= params.clip_ratio_high,
                               moved_BT >= -params.clip_ratio_low)
    return _dppo(inputs, agg, params, valid_BT)


def dppo_kl_policy_loss(inputs: PolicyLossInputs, *, agg: AggSpec, params: PolicyLossParams) -> PolicyLossOutput:
    """DPPO-Binary-KL (arXiv:2602.04879): as ``dppo_tv`` with the binary KL of the token's probability
    as the divergence, and a token moving back toward the old policy always inside the region::

        bkl = p_old (old_logp - logp) + (1 - p_old) log((1 - p_old + 1e-8) / (1 - p + 1e-8))
        valid = (bkl <= clip_ratio_high or p <= p_old) where A > 0, else (bkl <= clip_ratio_low or p >= p_old)
        per_token = -A * sg(min(r, clip_ratio_c)) * logp * valid [* w];   loss = agg_loss(per_token, mask, agg)

    Metrics and invariance as ``dppo_tv``. Shapes: [B, T] each -> (0-dim loss, dict).
    """
    with torch.no_grad():
        logp_BT, old_logp_BT = inputs.logp_BT, inputs.old_logp_BT
        p_BT, p_old_BT = torch.exp(logp_BT), torch.exp(old_logp_BT)
        bkl_BT = p_old_BT * (old_logp_BT - logp_BT) + (1.0 - p_old_BT) * torch.log(
            (1.0 - p_old_BT + 1e-8) / (1.0 - p_BT + 1e-8))
        valid_BT = torch.where(inputs.advantages_BT > 0, (bkl_BT <= params.clip_ratio_high) | (p_BT <= p_old_BT),
                               (bkl_BT <= params.clip_ratio_low) | (p_BT >= p_old_BT))
    return _dppo(inputs, agg, params, valid_BT)


def bypass_mode_policy_loss(inputs: PolicyLossInputs, *, agg: AggSpec, params: PolicyLossParams) -> PolicyLossOutput:
    """Rollout correction in bypass mode (verl's ``bypass_mode``; set by
    ``algorithm.rollout_correction.bypass_mode=true``, not chosen directly).

    ``old_logp_BT`` holds the ROLLOUT engine's log-probs (no old-log-prob forward ran). With
    ``r = sg(logp) - old_logp`` (the policy being trained against the rollout policy), the weights
    ``w`` and the rejected tokens come from :mod:`grpo_dist.core.rollout_correction` with
    ``params.rollout_correction``'s settings, over the rows of this call; ``mask'`` is the mask
    without the rejected tokens. Then, by ``loss_type``::

        ppo_clip:   the vanilla PPO clip of logp against old_logp (= the rollout policy) on mask';
                    no weights (the ratio already corrects for the rollout policy)
        reinforce:  agg_loss(-sg(w) * A * logp, mask', agg)       (w = 1 without rollout_is)

    The aggregation's normalisers are the mini-batch's counts before rejection (as verl). With
    ``rollout_is_batch_normalize`` the weights are normalised over the rows of the call, so that
    part is not micro-batch invariant (the rest is). Metrics: the loss's own (ppo_clip:
    ``pg_clipfrac``, ``pg_clipfrac_lower``, ``ppo_kl``; reinforce: ``ppo_kl``, the mean of
    ``old_logp - logp``) and the token means of the correction: ``rollout_corr/kl``, ``k3_kl``,
    ``chi2_token``, with weights ``rollout_corr/rollout_is_mean``, ``_ratio_fraction_high``,
    ``_ratio_fraction_low``, ``_masked_fraction``, with rejection
    ``rollout_corr/rollout_rs_masked_fraction`` (and per criterion).

    Deviations from verl: every metric is a mean over ALL response tokens of the call, rejected ones
    included (verl takes ``pg_clipfrac``, ``ppo_kl``, ... over the tokens kept): the actor weights
    a call's metrics by its response-token count, and only means over that same set of tokens add
    up to the mini-batch's value for any micro-batch size; the rejected share is reported by
    ``rollout_corr/rollout_rs_masked_fraction``. Of verl's ``rollout_corr/*`` metrics only those
    that are token means are returned (the per-sequence ones cannot be combined over micro-batches;
    the decoupled mode, :func:`~grpo_dist.core.rollout_correction.correct`, reports them all).
    """
    rc = params.rollout_correction
    if rc is None or not rc.bypass:
        raise ValueError("the 'bypass_mode' policy loss needs rollout-correction settings with bypass on "
                         "(algorithm.rollout_correction.bypass_mode=true sets it up)")
    logp_BT, rollout_logp_BT, advantages_BT, mask_BT, _ = inputs.unpack()
    log_ratio_BT = logp_BT.detach() - rollout_logp_BT
    corr: dict[str, torch.Tensor] = {}
    w_BT = None
    if rc.is_level is not None:
        w_BT, m = importance_weights(log_ratio_BT, mask_BT, level=rc.is_level, lower=rc.is_lower, upper=rc.is_upper,
                                     band=rc.is_band, batch_normalize=rc.is_batch_normalize)
        corr.update({k: m[k] for k in ("rollout_is_mean", "rollout_is_ratio_fraction_high",
                                       "rollout_is_ratio_fraction_low", "rollout_is_masked_fraction")})
    kept_BT = mask_BT
    if rc.rejection:
        kept_BT, m = rejection_mask(log_ratio_BT, mask_BT, rc.rejection)
        corr.update({k: v for k, v in m.items() if k.endswith("masked_fraction") and "seq_masked" not in k})
    mm = mismatch_metrics(logp_BT.detach(), rollout_logp_BT, mask_BT)
    for k in ("kl", "k3_kl", "chi2_token"):
        corr[k] = mm[k] if k in mm else torch.zeros((), dtype=logp_BT.dtype, device=logp_BT.device)
    clip = dict(clip_ratio_low=params.clip_ratio_low, clip_ratio_high=params.clip_ratio_high,
                clip_ratio_c=params.clip_ratio_c, agg=agg)
    if rc.loss_type == "ppo_clip":
        loss, _ = ppo_clip_policy_loss(logp_BT, rollout_logp_BT, advantages_BT, kept_BT, **clip)
        with torch.no_grad():  # the metrics over every response token of the call (see the docstring)
            _, metrics = ppo_clip_policy_loss(logp_BT.detach(), rollout_logp_BT, advantages_BT, mask_BT, **clip)
    else:
        loss = agg_loss(_weighted(-advantages_BT * logp_BT, w_BT.to(logp_BT.dtype) if w_BT is not None else None),
                        kept_BT, agg)
        metrics = {"ppo_kl": masked_mean(rollout_logp_BT - logp_BT.detach(), mask_BT)}
    metrics.update({f"rollout_corr/{k}": v.to(logp_BT.dtype) for k, v in corr.items()})
    return loss, metrics


bind_builtins(_REGISTRY, __name__)  # the registry's built-in rows name the <mode>_policy_loss functions above
