"""Policy-loss modes: pure functions from log-probs and advantages to a scalar loss and its metrics.

Every mode is registered under a name (``actor_rollout_ref.actor.policy_loss.loss_mode``, verl's key)
with :func:`register_policy_loss` and looked up with :func:`get_policy_loss`. All modes share one
call, so the actor calls every mode the same way::

    spec = get_policy_loss("vanilla")
    loss, metrics = spec.fn(logp_BT, old_logp_BT, advantages_BT, mask_BT, agg=agg_spec, params=params)

What a loss function receives
-----------------------------
``B`` rows of ONE micro-batch on one data-parallel rank, ``T`` the padded response length:

- ``logp_BT`` [B, T] float32: log-probs of the response tokens under the policy being trained
  (at the rollout temperature); the only input that carries gradients.
- ``old_logp_BT`` [B, T]: log-probs under the policy that sampled the responses (the policy before
  this step's first optimizer step); detached. On-policy updates pass ``logp_BT.detach()``.
- ``advantages_BT`` [B, T]: per-token advantages; detached, zero outside the response.
- ``mask_BT`` [B, T] (float or bool): 1 on the response tokens that count.
- ``agg``: an :class:`~grpo_dist.core.losses.AggSpec` whose counts are those of the WHOLE
  mini-batch (all micro-batches on all ranks). Reduce the per-token loss with
  :func:`~grpo_dist.core.losses.agg_loss` and this spec, so that the pieces of all micro-batches and
  ranks add up to the loss of the whole mini-batch (the update then does not depend on the
  micro-batch size or the number of ranks).
- ``params``: a :class:`PolicyLossParams`, the numbers the losses use (clip ranges, ...).

It returns ``(loss, metrics)``: ``loss`` a 0-dim tensor (this micro-batch's piece of the mini-batch
loss, to be summed over micro-batches and ranks), ``metrics`` a ``dict[str, 0-dim tensor]``.

The metrics contract
--------------------
Each metric is a masked token mean over the rows of the call (``sum(x * mask) / sum(mask)``, 0 when
the mask is empty; :func:`~grpo_dist.core.losses.masked_mean`). The caller (the actor) weights each
by the call's token count, sums over micro-batches and ranks, divides by the mini-batch's token
count, averages over the step's mini-batches, and reports it as ``actor/<name>``. Whatever metrics a
loss returns are reported: a new mode's own diagnostics need no change in the caller. A mode must
return the same metric names on every call, and none of the names the actor reports itself
(:data:`RESERVED_METRIC_NAMES`).
"""


from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from grpo_dist.core.losses import AggSpec, ppo_clip_policy_loss

__all__ = [
    "PolicyLossParams",
    "PolicyLossFn",
    "PolicyLossSpec",
    "RESERVED_METRIC_NAMES",
    "register_policy_loss",
    "get_policy_loss",
    "list_policy_losses",
    "vanilla_policy_loss",
]

RESERVED_METRIC_NAMES: frozenset[str] = frozenset(
    {"pg_loss", "entropy", "kl_loss", "kl_coef", "grad_norm", "grad_norm_nonfinite_count", "lr"}
)
"""Metric names the actor reports itself (``actor/<name>``); a policy loss may not return them."""


@dataclass(frozen=True)
class PolicyLossParams:
    """The numbers policy losses use (``actor_rollout_ref.actor.*``). A mode reads the fields it needs.

    Attributes:
        clip_ratio_low: lower clip range: the ratio is clipped below at ``1 - clip_ratio_low``.
        clip_ratio_high: upper clip range ("clip-higher"): clipped above at ``1 + clip_ratio_high``.
        clip_ratio_c: dual-clip constant (> 1) bounding the loss of negative-advantage tokens.
    """

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.clip_ratio_low <= 1.0:
            raise ValueError(f"clip_ratio_low must be in [0, 1], got {self.clip_ratio_low}")
        if not self.clip_ratio_high >= 0.0:
            raise ValueError(f"clip_ratio_high must be >= 0, got {self.clip_ratio_high}")
        if not self.clip_ratio_c > 1.0:
            raise ValueError(f"clip_ratio_c (dual-clip lower bound) must be > 1, got {self.clip_ratio_c}")


class PolicyLossFn(Protocol):
    """The one call every policy-loss mode implements (see the module docstring)."""

    def __call__(
        self,
        logp_BT: torch.Tensor,
        old_logp_BT: torch.Tensor,
        advantages_BT: torch.Tensor,
        mask_BT: torch.Tensor,
        *,
        agg: AggSpec,
        params: PolicyLossParams,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...


@dataclass(frozen=True)
class PolicyLossSpec:
    """A registered policy-loss mode.

    Attributes:
        name: the registry name (``actor_rollout_ref.actor.policy_loss.loss_mode``).
        fn: the loss, called as described in the module docstring.
    """

    name: str
    fn: PolicyLossFn


_REGISTRY: dict[str, PolicyLossSpec] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator: register ``fn`` as the policy-loss mode called ``name``.

    Registering the same function again under its name is a no-op (a module imported twice);
    registering a different function under a name already taken raises ``ValueError``.
    Returns the function unchanged.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"policy loss name must be a non-empty string, got {name!r}")

    def decorator(fn: PolicyLossFn) -> PolicyLossFn:
        if not callable(fn):
            raise ValueError(f"policy loss {name!r} must be a function, got {type(fn).__name__}")
        old = _REGISTRY.get(name)
        if old is not None and old.fn is not fn:
            raise ValueError(
                f"policy loss {name!r} is already registered (to {old.fn.__qualname__}); choose another name"
            )
        _REGISTRY[name] = PolicyLossSpec(name=name, fn=fn)
        return fn

    return decorator


def get_policy_loss(name: str) -> PolicyLossSpec:
    """The registered mode ``name``; ``ValueError`` naming the valid modes if there is none."""
    spec = _REGISTRY.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ValueError(
            f"unknown policy loss mode {name!r} (actor_rollout_ref.actor.policy_loss.loss_mode); "
            f"valid modes: {list_policy_losses()}"
        )
    return spec


def list_policy_losses() -> list[str]:
    """Sorted names of all registered policy-loss modes."""
    return sorted(_REGISTRY)


# --------------------------------------------------------------------------------------------------
# modes
# --------------------------------------------------------------------------------------------------


@register_policy_loss("vanilla")
def vanilla_policy_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    agg: AggSpec,
    params: PolicyLossParams,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """verl's ``vanilla``: the PPO clipped surrogate with clip-higher and dual clip.

    Exactly :func:`~grpo_dist.core.losses.ppo_clip_policy_loss` (formula there) with the clip ranges
    of ``params``. Metrics: ``pg_clipfrac``, ``pg_clipfrac_lower``, ``ppo_kl``.
    Shapes: [B, T] each -> (0-dim loss, dict of 0-dim tensors).
    """
    return ppo_clip_policy_loss(
        logp_BT,
        old_logp_BT,
        advantages_BT,
        mask_BT,
        clip_ratio_low=params.clip_ratio_low,
        clip_ratio_high=params.clip_ratio_high,
        clip_ratio_c=params.clip_ratio_c,
        agg=agg,
    )


# The modes this package registers itself; registrations by user modules (or tests) come later and are
# not part of generated documentation.
BUILTIN_POLICY_LOSSES: tuple[str, ...] = tuple(list_policy_losses())
