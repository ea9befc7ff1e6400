"""KL estimators between the policy and the reference policy, and KL coefficient controllers.

Per-token estimators of ``KL(pi || pi_ref)`` from the log-probabilities of the sampled tokens
(J. Schulman, "Approximating KL divergence", 2020), with ``d = logp - ref_logp``:

=============  =========  ========================================================================
kind           alias      per-token value
=============  =========  ========================================================================
``kl``         ``k1``     ``d``
``abs``                   ``|d|``
``mse``        ``k2``     ``0.5 * d^2``
``low_var_kl`` ``k3``     ``exp(-d) + d - 1`` (clamped, see :func:`kl_penalty`); the unbiased,
                          non-negative estimator used by GRPO
``full``                  exact KL over the vocabulary: needs logits, see :func:`kl_full`
``kl+``        ``k1+``    straight-through: the value of k1, the gradient of k2 (see below)
``low_var_kl+`` ``k3+``   straight-through: the value of k3, the gradient of k2
=============  =========  ========================================================================

The ``+`` kinds (verl's): k1 and k3 are unbiased estimates of the KL's value, but their gradients
are not unbiased estimates of the KL's gradient; k2's gradient is (for samples from the policy).
``k+ = k2 - sg(k2) + sg(k)`` has k's value and k2's gradient. Folded into the reward (no gradient)
a ``+`` kind is the same as its base kind.

Used two ways, as in verl: folded into the rewards (``algorithm.use_kl_in_reward``, see
:func:`apply_kl_penalty` and the controllers) or added to the loss (``actor.use_kl_loss``,
``actor.kl_loss_type``).
"""

import math

import torch

from grpo_dist.core.names import (
    KL_ALIASES,
    KL_KINDS,
    STRAIGHT_THROUGH_KL_ALIASES,
    STRAIGHT_THROUGH_KL_KINDS,
    canonical_kl_kind,
)

__all__ = [
    "KL_KINDS",
    "KL_ALIASES",
    "STRAIGHT_THROUGH_KL_KINDS",
    "STRAIGHT_THROUGH_KL_ALIASES",
    "canonical_kl_kind",
    "kl_penalty",
    "kl_full",
    "FixedKLController",
    "AdaptiveKLController",
    "KLController",
    "make_kl_controller",
    "apply_kl_penalty",
]

def kl_penalty(logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate from the log-probabilities of the sampled tokens.

    With ``d = logp - ref_logp``::

        kl  (k1):        d
        abs:             |d|
        mse (k2):        0.5 * d^2
        low_var_kl (k3): clamp(exp(x) - x - 1, -10, 10),  x = clamp(ref_logp - logp, -20, 20)

        kl+ (k1+):           k2 - sg(k2) + sg(k1)      value of k1, gradient of k2 = d * grad(d)
        low_var_kl+ (k3+):   k2 - sg(k2) + sg(k3)      value of k3, gradient of k2

    (k3 is ``pi_ref/pi - log(pi_ref/pi) - 1``, DeepSeekMath's unbiased estimator; the clamps follow
    verl and keep it finite for extreme log-ratios; ``sg`` = stop-gradient.) Shapes: [B, T], [B, T]
    -> [B, T]; gradients flow through both inputs. ``kind="full"`` raises ``ValueError``: use
    :func:`kl_full` with logits.
    """
    kind = canonical_kl_kind(kind)
    if logp_BT.shape != ref_logp_BT.shape:
        raise ValueError(
            f"ref_logp_BT shape {tuple(ref_logp_BT.shape)} must equal logp_BT shape {tuple(logp_BT.shape)}"
        )
    if kind.endswith("+"):
        value_BT = kl_penalty(logp_BT, ref_logp_BT, kind[:-1])
        k2_BT = 0.5 * (logp_BT - ref_logp_BT).square()
        return k2_BT - k2_BT.detach() + value_BT.detach()
    if kind == "kl":
        return logp_BT - ref_logp_BT
    if kind == "abs":
        return (logp_BT - ref_logp_BT).abs()
    if kind == "mse":
        return 0.5 * (logp_BT - ref_logp_BT).square()
    if kind == "low_var_kl":
        x_BT = torch.clamp(ref_logp_BT - logp_BT, min=-20.0, max=20.0)
        return torch.clamp(torch.exp(x_BT) - x_BT - 1.0, min=-10.0, max=10.0)
    assert kind == "full", kind
    raise ValueError(
        "KL kind 'full' needs the logits over the whole vocabulary, not per-token log-probabilities: "
        "use kl_full(logits_BTV, ref_logits_BTV)"
    )


def kl_full(logits_BTV: torch.Tensor, ref_logits_BTV: torch.Tensor) -> torch.Tensor:
    """Exact ``KL(pi || pi_ref) = sum_v p_v (log p_v - log q_v)`` at each position.

    ``p = softmax(logits)``, ``q = softmax(ref_logits)``; entries with ``p_v = 0`` contribute 0.
    Shapes: [..., V], [..., V] -> [...] (e.g. [B, T, V] -> [B, T]). Gradients flow through both.
    """
    if logits_BTV.shape != ref_logits_BTV.shape:
        raise ValueError(
            f"ref_logits_BTV shape {tuple(ref_logits_BTV.shape)} must equal logits_BTV shape "
            f"{tuple(logits_BTV.shape)}"
        )
    logp_BTV = torch.log_softmax(logits_BTV, dim=-1)
    logq_BTV = torch.log_softmax(ref_logits_BTV.to(logits_BTV.dtype), dim=-1)
    p_BTV = logp_BTV.exp()
    diff_BTV = torch.where(p_BTV > 0, logp_BTV - logq_BTV, torch.zeros_like(logp_BTV))
    return (p_BTV * diff_BTV).sum(dim=-1)


class FixedKLController:
    """A constant KL coefficient: ``value = kl_coef``; ``update`` does nothing."""

    def __init__(self, kl_coef: float) -> None:
        if not kl_coef >= 0:
            raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op (the coefficient is fixed)."""


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, https://arxiv.org/abs/1909.08593).

    ``update(current_kl, n_steps)``::

        e = clip(current_kl / target_kl - 1, -0.2, 0.2)
        value *= 1 + e * n_steps / horizon
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float) -> None:
        if not init_kl_coef >= 0:
            raise ValueError(f"init_kl_coef (kl_ctrl.kl_coef) must be >= 0, got {init_kl_coef}")
        if not target_kl > 0:
            raise ValueError(f"target_kl (kl_ctrl.target_kl) must be > 0 for the adaptive controller, got {target_kl}")
        if not horizon > 0:
            raise ValueError(f"horizon (kl_ctrl.horizon) must be > 0 for the adaptive controller, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move ``value`` toward keeping ``current_kl`` near ``target_kl`` (formula in the class doc)."""
        if not math.isfinite(current_kl):
            raise ValueError(f"current_kl must be finite, got {current_kl}")
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


KLController = FixedKLController | AdaptiveKLController
"""Either controller: both have ``.value`` and ``.update(current_kl, n_steps)``."""


def make_kl_controller(
    type: str, kl_coef: float, target_kl: float | None = None, horizon: float | None = None
) -> KLController:
    """Controller for ``algorithm.kl_ctrl.type``: ``"fixed"`` or ``"adaptive"`` (ValueError otherwise)."""
    if type == "fixed":
        return FixedKLController(kl_coef)
    if type == "adaptive":
        if target_kl is None or horizon is None:
            raise ValueError(
                "the adaptive KL controller needs target_kl and horizon (algorithm.kl_ctrl.target_kl, "
                f".horizon); got target_kl={target_kl}, horizon={horizon}"
            )
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise ValueError(f"unknown KL controller type {type!r} (algorithm.kl_ctrl.type); valid types: ['fixed', 'adaptive']")


@torch.no_grad()
def apply_kl_penalty(
    token_level_scores_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    ref_logp_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    kl_coef: float,
    kind: str,
) -> tuple[torch.Tensor, float]:
    """Fold a KL penalty into the rewards (verl's ``algorithm.use_kl_in_reward`` path).

    ::

        kl[i, t]   = kl_penalty(old_logp, ref_logp, kind)[i, t] * mask[i, t]
        rewards    = scores - kl_coef * kl
        current_kl = mean_i ( sum_t kl[i, t] / (sum_t mask[i, t] + 1e-8) )

    ``current_kl`` is the batch mean of the per-sequence masked-mean KL (a row with an empty mask
    counts as 0, as in verl); feed it to the controller's ``update(current_kl, n_steps=B)``.

    Shapes: four [B, T] tensors -> (token_level_rewards_BT [B, T], python float).
    """
    if token_level_scores_BT.dim() != 2:
        raise ValueError(
            f"token_level_scores_BT must be 2-D [B, T], got shape {tuple(token_level_scores_BT.shape)}"
        )
    for name, t in (("old_logp_BT", old_logp_BT), ("ref_logp_BT", ref_logp_BT), ("mask_BT", mask_BT)):
        if t.shape != token_level_scores_BT.shape:
            raise ValueError(
                f"{name} shape {tuple(t.shape)} must equal token_level_scores_BT shape "
                f"{tuple(token_level_scores_BT.shape)}"
            )
    m_BT = mask_BT.to(token_level_scores_BT.dtype)
    kld_BT = kl_penalty(old_logp_BT, ref_logp_BT, kind).to(token_level_scores_BT.dtype)
    kld_BT = torch.where(m_BT != 0, kld_BT * m_BT, torch.zeros_like(kld_BT))
    rewards_BT = token_level_scores_BT - kl_coef * kld_BT
    if kld_BT.shape[0] == 0:
        return rewards_BT, 0.0
    per_seq_B = kld_BT.sum(-1) / (m_BT.sum(-1) + 1e-8)
    return rewards_BT, float(per_seq_B.mean().item())
