"""The critic's math: the clipped value loss (PPO with a critic) and the explained variance of values.

Shapes: ``B`` rows (responses) of a micro-batch, ``T`` padded response length. Masks are float or
bool [B, T], 1 on the response tokens that count. ``values_BT`` are the critic's values of the
response tokens when the responses were scored (before this step's critic update), ``vpreds_BT`` the
values of the critic being trained, ``returns_BT`` the targets (GAE's ``advantages + values`` before
whitening).

Like the policy losses, :func:`value_loss` reduces with :func:`~grpo_dist.core.losses.agg_loss` and
an :class:`~grpo_dist.core.losses.AggSpec` carrying the counts of the WHOLE mini-batch, so that the
pieces of all micro-batches on all ranks add up to the loss of the whole mini-batch (the critic's
update does not depend on the micro-batch size or the number of ranks).
"""

import torch

from grpo_dist.core.losses import AggSpec, agg_loss, masked_mean

__all__ = ["value_loss", "explained_variance"]


def value_loss(
    vpreds_BT: torch.Tensor,
    values_BT: torch.Tensor,
    returns_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    cliprange_value: float,
    agg: AggSpec,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped value loss (verl's ``compute_value_loss``, ``critic.cliprange_value``)::

        vclipped = clamp(vpreds, values - c, values + c)
        per_token = max((vpreds - returns)^2, (vclipped - returns)^2)
        loss = 0.5 * agg_loss(per_token, mask, agg)

    with ``c = cliprange_value``: a prediction that moved more than ``c`` away from the old value is
    scored at the clipped value where that is worse, so one update cannot move the values far.

    Metrics (0-dim detached tensors, masked means over the rows of this call; the caller weights
    them by the call's token count across micro-batches and ranks):

    - ``vf_clipfrac``: fraction of tokens where the clipped term is the larger one (the clip bites);
    - ``vpred_mean``: mean of ``vpreds``.

    Shapes: vpreds_BT, values_BT, returns_BT, mask_BT [B, T] -> (0-dim loss, dict). Gradients flow
    through ``vpreds_BT`` only. ``ValueError`` if ``cliprange_value < 0`` or the shapes differ.
    """
    if not cliprange_value >= 0:
        raise ValueError(f"cliprange_value (critic.cliprange_value) must be >= 0, got {cliprange_value}")
    if vpreds_BT.dim() != 2:
        raise ValueError(f"vpreds_BT must be 2-D [B, T], got shape {tuple(vpreds_BT.shape)}")
    for name, t in (("values_BT", values_BT), ("returns_BT", returns_BT), ("mask_BT", mask_BT)):
        if t.shape != vpreds_BT.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} must equal vpreds_BT shape {tuple(vpreds_BT.shape)}")
    # padding positions become 0 in every input, so garbage there (NaN, inf) reaches neither the loss
    # nor, through a 0 * NaN in the backward pass, the gradient
    keep_BT = mask_BT != 0
    zero_BT = torch.zeros_like(vpreds_BT)
    vpreds_BT = torch.where(keep_BT, vpreds_BT, zero_BT)
    values_BT = torch.where(keep_BT, values_BT.detach().to(vpreds_BT.dtype), zero_BT)
    returns_BT = torch.where(keep_BT, returns_BT.detach().to(vpreds_BT.dtype), zero_BT)
    vclipped_BT = torch.clamp(vpreds_BT, values_BT - cliprange_value, values_BT + cliprange_value)
    unclipped_BT = (vpreds_BT - returns_BT).square()
    clipped_BT = (vclipped_BT - returns_BT).square()
    loss = 0.5 * agg_loss(torch.maximum(unclipped_BT, clipped_BT), mask_BT, agg)
    with torch.no_grad():
        metrics = {
            "vf_clipfrac": masked_mean((clipped_BT > unclipped_BT).to(vpreds_BT.dtype), mask_BT).detach(),
            "vpred_mean": masked_mean(vpreds_BT.detach(), mask_BT).detach(),
        }
    return loss, metrics


@torch.no_grad()
def explained_variance(values_BT: torch.Tensor, returns_BT: torch.Tensor, mask_BT: torch.Tensor) -> float:
    """How much of the returns' variance the values explain (verl's ``critic/vf_explained_var``)::

        ev = 1 - var(returns - values) / (var(returns) + 1e-5)

    over the masked tokens of the whole batch, ``var`` unbiased (``n - 1``). 1: the values predict
    the returns; 0: no better than their mean; negative: worse. Fewer than two masked tokens give
    NaN (no variance to explain).

    Shapes: values_BT, returns_BT, mask_BT [B, T] -> python float.
    """
    for name, t in (("returns_BT", returns_BT), ("mask_BT", mask_BT)):
        if t.shape != values_BT.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} must equal values_BT shape {tuple(values_BT.shape)}")
    m = mask_BT.bool()
    v, r = values_BT[m].double(), returns_BT[m].double()
    if r.numel() < 2:
        return float("nan")
    return float(1.0 - torch.var(r - v) / (torch.var(r) + 1e-5))
