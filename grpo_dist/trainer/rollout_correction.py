"""The rollout correction of a step's batch on the driver (verl's decoupled mode).

The math is :func:`grpo_dist.core.rollout_correction.correct`; this applies it to a
:class:`~grpo_dist.batch.Batch` that holds the trainer's ``old_log_probs`` and the engine's
``rollout_log_probs``. In bypass mode nothing happens here: the rollout log-probs stand in for the
old log-probs and the ``bypass_mode`` policy loss corrects inside the update.
"""

from __future__ import annotations

from grpo_dist.batch import Batch
from grpo_dist.core.rollout_correction import RolloutCorrectionParams, correct

__all__ = ["apply_rollout_correction"]


def apply_rollout_correction(batch: Batch, params: RolloutCorrectionParams) -> dict[str, float]:
    """Weights, rejection and mismatch metrics from ``old_log_probs`` vs ``rollout_log_probs``.

    Writes ``rollout_is_weights`` [B, R] (with ``params.is_level``; the actor multiplies the policy
    loss by them) and replaces ``response_mask`` by the mask without the rejected tokens (with
    ``params.rejection``), so the advantages, the loss and its normalisers see only the kept tokens.
    Returns the ``rollout_corr/*`` metrics. Call it before the advantages.
    """
    weights_BR, mask_BR, metrics = correct(batch["old_log_probs"], batch["rollout_log_probs"],
                                           batch["response_mask"], params)
    if weights_BR is not None:
        batch["rollout_is_weights"] = weights_BR
    batch["response_mask"] = mask_BR
    return metrics
