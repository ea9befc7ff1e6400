"""Reward-model math: the training loss on verifier labels, agreement with the verifier, and the size
of the replay share in iterative RL.

A reward model's output at a token is a logit ``s``: the reward model's belief, as log-odds, that the
response is correct up to that token (an outcome reward model is read at the last response token; a
process reward model at the end of every step). The verifier's label ``y`` is in [0, 1] (1 correct,
0 incorrect) on the positions that have one, NaN elsewhere.

Loss (binary cross-entropy on the logit, normalised by the labelled positions of the mini-batch)::

    L = (1 / K) * sum_{(b, t): y_bt labelled} [ softplus(s_bt) - y_bt * s_bt ]

with ``softplus(s) - y s = -y log sigmoid(s) - (1 - y) log(1 - sigmoid(s))``, and ``K`` the number
of labelled positions of the whole mini-batch (over every micro-batch and rank), so that pieces
computed on micro-batches add up to the mini-batch's loss.

Agreement with the verifier: a position agrees when ``s > 0`` (sigmoid(s) > 0.5) and ``y > 0.5`` are
both true or both false.

Labels from rule scores (iterative RL): the verifier's score ``v`` of a response (or of a step)
becomes ``y = 1`` when ``v >= threshold`` and ``y = 0`` otherwise (``reward_model.iterative.label_threshold``,
0.5 by default: a full score of 1 is correct; a format-only score such as 0.1, 0 and a negative score
such as DAPO's -1 are incorrect). Without a threshold the label is ``v`` clamped to [0, 1] (a soft
label: 0.1 asks the reward model for a 10% belief).

Replay share: with ``F`` fresh samples and a replay fraction ``r`` in [0, 1), ``H = round(r F / (1 - r))``
historical samples make ``H / (F + H)`` as close to ``r`` as whole samples allow (never more than the
``available`` ones).
"""

import torch

__all__ = ["labelled_bce", "verifier_agreement", "verifier_labels", "replay_count"]


def labelled_bce(scores_BR: torch.Tensor, targets_BR: torch.Tensor, *, num_labels: float) -> tuple[torch.Tensor, torch.Tensor]:
    """This micro-batch's piece of the mini-batch's loss ``L`` (module docstring).

    Args:
        scores_BR: [B, R] logits (gradients flow through them).
        targets_BR: [B, R] labels in [0, 1]; NaN where a position has no label.
        num_labels: ``K``, the labelled positions of the whole mini-batch (> 0; a mini-batch without
            labels has loss 0 and this is not called with 0).

    Returns:
        ``(loss, correct)``: the 0-dim loss piece (float32) and the number of labelled positions of
        this micro-batch where the score agrees with the label (0-dim, no gradient).
    """
    if scores_BR.shape != targets_BR.shape:
        raise ValueError(f"scores {tuple(scores_BR.shape)} and targets {tuple(targets_BR.shape)} differ in shape")
    if not num_labels > 0:
        raise ValueError(f"num_labels must be > 0, got {num_labels}")
    labelled_BR = torch.isfinite(targets_BR)
    s_K = scores_BR[labelled_BR].float()
    y_K = targets_BR[labelled_BR].float()
    loss = (torch.nn.functional.softplus(s_K) - y_K * s_K).sum() / num_labels
    correct = ((s_K.detach() > 0) == (y_K > 0.5)).sum()
    return loss, correct


def verifier_agreement(scores_BR: torch.Tensor, targets_BR: torch.Tensor) -> tuple[int, int]:
    """``(agreeing, labelled)``: labelled positions (finite ``targets_BR``) and how many of them have
    ``scores_BR > 0`` exactly when ``targets_BR > 0.5``. Shapes: both [B, R] (or any equal shape)."""
    if scores_BR.shape != targets_BR.shape:
        raise ValueError(f"scores {tuple(scores_BR.shape)} and targets {tuple(targets_BR.shape)} differ in shape")
    labelled = torch.isfinite(targets_BR)
    agree = (scores_BR[labelled] > 0) == (targets_BR[labelled] > 0.5)
    return int(agree.sum()), int(labelled.sum())


def verifier_labels(scores: torch.Tensor, threshold: float | None) -> torch.Tensor:
    """Labels (float32, same shape) from the verifier's scores (module docstring): 1 where
    ``scores >= threshold``, 0 elsewhere; ``threshold`` None: ``scores`` clamped to [0, 1]. NaN stays NaN
    (a position without a label)."""
    scores = scores.float()
    if threshold is None:
        return scores.clamp(0.0, 1.0)
    return torch.where(torch.isnan(scores), scores, (scores >= threshold).float())


def replay_count(fresh: int, fraction: float, available: int) -> int:
    """Historical samples to mix with ``fresh`` ones: ``min(available, round(fraction * fresh / (1 - fraction)))``.

    ``fraction`` in [0, 1); ``fresh``, ``available`` >= 0.
    """
    if not 0 <= fraction < 1:
        raise ValueError(f"fraction must be in [0, 1), got {fraction}")
    if fresh < 0 or available < 0:
        raise ValueError(f"fresh and available must be >= 0, got {fresh}, {available}")
    return min(int(available), int(round(fraction * fresh / (1.0 - fraction))))
