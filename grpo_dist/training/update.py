"""The update loop shared by every trained model: passes over mini-batches, and one optimizer step.

Callers: :class:`~grpo_dist.training.actor.FSDPActor` (every rank, FSDP2), the FSDP scaffold of
every trained role (:class:`~grpo_dist.training.fsdp_role.FSDPRole`: the loop and the step's
clip-and-step) and the in-process API (:mod:`grpo_dist.api`, one process, no FSDP). One step's
recipe, for the policy::

    counts  = response tokens and non-empty responses of the WHOLE mini-batch (summed over ranks)
    for each micro-batch:   loss_mb = micro_batch_loss(model, mb, agg=spec(counts))
                            backward(loss_mb * loss_scale)
    grad_norm = global L2 norm of the gradients, clipped to grad_clip when > 0
    optimizer step unless grad_norm is not finite; zero the gradients

Nothing here uses ``torch.distributed``: what differs between one process and FSDP2 comes in as
arguments: ``all_reduce_sum`` (sums over ranks; identity in one process), ``loss_scale`` (FSDP2
averages gradients over ``W`` ranks, so each rank back-propagates ``W`` times its piece),
``on_micro_batch`` (FSDP2's deferred gradient reduce-scatter) and ``grad_norm`` (the norm of sharded
DTensor gradients, :func:`grpo_dist.training.optim.clip_grad_norm`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from grpo_dist.core.losses import AggSpec, agg_loss, global_counts
from grpo_dist.training.model_forward import tokens_computed
from grpo_dist.training.micro_batches import take_rows
from grpo_dist.training.objective import PolicyObjective, TermSums, micro_batch_loss

__all__ = [
    "grad_norm_tensor",
    "local_grad_norm",
    "clip_and_step",
    "PolicyStep",
    "policy_mini_batch_step",
    "run_mini_batches",
]

GradNorm = Callable[[nn.Module, "float | None"], float]
TOKEN_SUM = AggSpec(mode="token-sum")


def grad_norm_tensor(model: nn.Module, max_norm: float | None) -> torch.Tensor | None:
    """The global L2 norm of ``model``'s gradients before clipping (0-dim; a DTensor when the
    gradients are sharded DTensors), clipped to ``max_norm`` when it is > 0 (None or <= 0: only
    measured). None when no parameter has a gradient."""
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return None
    if max_norm is not None and max_norm > 0:
        return torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm)
    return torch.nn.utils.get_total_norm([p.grad for p in params])


def local_grad_norm(model: nn.Module, max_norm: float | None) -> float:
    """:func:`grad_norm_tensor` of plain (unsharded) gradients, as a float (0.0: no gradient)."""
    norm = grad_norm_tensor(model, max_norm)
    return 0.0 if norm is None else float(norm)


def clip_and_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, max_norm: float | None, grad_norm: GradNorm = local_grad_norm
) -> tuple[float, bool]:
    """Measure (and clip) the gradient norm, take the optimizer step unless the norm is NaN or
    infinite (the step is skipped: the weights keep their values), and zero the gradients.
    Returns ``(grad_norm, finite)``."""
    norm = grad_norm(model, max_norm)
    finite = math.isfinite(norm)
    if finite:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm, finite


@dataclass
class PolicyStep:
    """What one :func:`policy_mini_batch_step` did.

    Attributes:
        totals: the mini-batch's values (identical on all ranks): the objective's terms
            ``pg_loss``, ``entropy`` (both aggregated like the loss) and ``kl_loss`` (with the KL
            loss), then the policy loss's own metrics (token means over the mini-batch).
        metric_names: the names in ``totals`` that the policy loss returned.
        grad_norm: the gradient norm before clipping.
        finite: whether the optimizer step was taken.
        global_tokens: response tokens in the mini-batch (over all ranks).
        entropy_token_sum: 0-dim, this process's sum of per-token entropy over its response tokens
            (divided by ``global_tokens`` in one process: the entropy's token mean).
        tokens: ``(computed, real)`` over all ranks when counted (``remove_padding`` given): the
            positions the model ran on (padding included on the padded path) and the attended ones.
    """

    totals: dict[str, float]
    metric_names: tuple[str, ...]
    grad_norm: float
    finite: bool
    global_tokens: float
    entropy_token_sum: torch.Tensor
    tokens: tuple[float, float] | None = None

    def actor_metrics(self) -> dict[str, float]:
        """verl's names: ``actor/<name>`` for every total, and ``actor/grad_norm``; with counted tokens
        also ``perf/update_tokens_computed`` and ``perf/update_tokens_real``."""
        out = {f"actor/{name}": value for name, value in self.totals.items()}
        out["actor/grad_norm"] = self.grad_norm
        if self.tokens is not None:
            out["perf/update_tokens_computed"], out["perf/update_tokens_real"] = self.tokens
        return out


def _local_sum(values: list[float]) -> list[float]:
    return values


def policy_mini_batch_step(
    model: nn.Module,
    mb_data: Mapping[str, torch.Tensor],
    micro_batches: Sequence[Sequence[int]],
    *,
    objective: PolicyObjective,
    optimizer: torch.optim.Optimizer,
    grad_clip: float | None,
    device: torch.device,
    all_reduce_sum: Callable[[list[float]], list[float]] = _local_sum,
    loss_scale: float = 1.0,
    on_micro_batch: Callable[[int, int], None] | None = None,
    grad_norm: GradNorm = local_grad_norm,
    remove_padding: bool | None = None,
) -> PolicyStep:
    """One optimizer step of the policy over one mini-batch (module docstring).

    ``mb_data``: this process's rows of the mini-batch (the keys :func:`micro_batch_loss` reads),
    moved to ``device`` micro-batch by micro-batch; ``micro_batches``: row indices into it, one list
    per forward/backward (every rank must run the same number). ``model`` is what
    :func:`micro_batch_loss` calls and whose gradients are clipped. ``on_micro_batch(i, count)`` runs
    before the ``i``-th of ``count`` micro-batches. With ``remove_padding`` (whether the forwards run
    packed) the tokens the model ran on are counted (:attr:`PolicyStep.tokens`).
    """
    tokens, seqs = global_counts(mb_data["response_mask"])
    g_tokens, g_seqs = all_reduce_sum([tokens, seqs])
    spec = objective.agg_spec(g_tokens, g_seqs)
    R = mb_data["responses"].shape[1]
    # local sums (0-dim tensors on the device, read once per mini-batch: no sync per micro-batch)
    sums = TermSums(objective, device)
    entropy_token_sum = torch.zeros((), dtype=torch.float64, device=device)
    computed = 0
    for i, idx in enumerate(micro_batches):
        if on_micro_batch is not None:
            on_micro_batch(i, len(micro_batches))
        mb = {k: v.to(device, non_blocking=True) for k, v in take_rows(mb_data, idx).items()}
        if remove_padding is not None:
            computed += tokens_computed(mb["attention_mask"], remove_padding)
        out = micro_batch_loss(model, mb, objective=objective, agg=spec, response_length=R)
        sums.add(out)
        (out.loss if loss_scale == 1.0 else out.loss * loss_scale).backward()
        entropy_token_sum += agg_loss(out.entropy_BR, mb["response_mask"], TOKEN_SUM).double()

    local = sums.local()
    counts = [float(computed), float(mb_data["attention_mask"].sum())] if remove_padding is not None else []
    reduced = all_reduce_sum(local + counts)  # one collective for the terms and the token counts
    totals = sums.totals(reduced[: len(local)], g_tokens)
    norm, finite = clip_and_step(model, optimizer, grad_clip, grad_norm)
    return PolicyStep(totals=totals, metric_names=sums.metric_names or (), grad_norm=norm, finite=finite,
                      global_tokens=g_tokens, entropy_token_sum=entropy_token_sum,
                      tokens=(reduced[len(local)], reduced[len(local) + 1]) if counts else None)


def run_mini_batches(
    step: Callable[[torch.Tensor], tuple[Mapping[str, float], bool]],
    mini_batches: Sequence[Sequence[int] | torch.Tensor],
    *,
    epochs: int,
    shuffle: torch.Generator | None = None,
    summed: tuple[str, ...] = (),
) -> tuple[dict[str, float], int]:
    """``epochs`` passes over ``mini_batches`` (row indices, one optimizer step each), in order.

    ``step(rows)`` takes one mini-batch's rows and returns its metrics and whether its optimizer
    step was taken. ``shuffle``: a generator that permutes the rows WITHIN each mini-batch before
    the step (it changes only which rows share a micro-batch). Returns the mean of every metric
    over the steps (the sum for names starting with one of ``summed``: counts), and the number of
    steps skipped for a non-finite gradient norm.
    """
    history: dict[str, list[float]] = {}
    skipped = 0
    for _epoch in range(epochs):
        for rows in mini_batches:
            rows = torch.as_tensor(rows, dtype=torch.long)
            if shuffle is not None:
                rows = rows[torch.randperm(len(rows), generator=shuffle)]
            metrics, finite = step(rows)
            skipped += 0 if finite else 1
            for name, value in metrics.items():
                history.setdefault(name, []).append(value)
    return {name: float(np.sum(values) if name.startswith(summed) else np.mean(values))
            for name, values in history.items()}, skipped
