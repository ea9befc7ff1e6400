"""The optimizer, its learning-rate schedule and gradient clipping of an FSDP2-trained model.

Functions rather than a base class: a trained role (the actor, the critic) calls them with the
numbers from its settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LambdaLR

from grpo_dist.core.schedules import LRMultiplier, resolve_warmup_steps
from grpo_dist.training.optimizer_choice import optimizer_arguments, optimizer_class
from grpo_dist.training.update import grad_norm_tensor

__all__ = ["make_optimizer", "make_lr_scheduler", "clip_grad_norm", "move_optimizer_state"]


def make_optimizer(model: nn.Module, *, lr: float, betas: tuple[float, float], weight_decay: float,
                   optimizer: str = "AdamW", optimizer_impl: str = "torch.optim",
                   extra: Mapping[str, Any] | None = None) -> torch.optim.Optimizer:
    """The optimizer over the trainable parameters: ``optimizer_impl.optimizer`` (:func:`optimizer_class`)
    with :func:`optimizer_arguments`. torch's AdamW (the default) runs ``foreach``, one multi-tensor op per
    step instead of a Python loop of DTensor ops per parameter (torch picks the loop for CPU tensors),
    unless ``extra`` says otherwise."""
    cls = optimizer_class(optimizer_impl, optimizer)
    args = optimizer_arguments(optimizer, lr=lr, betas=betas, weight_decay=weight_decay, extra=extra)
    if cls is torch.optim.AdamW:
        args = {"foreach": True, **args}
    return cls([p for p in model.parameters() if p.requires_grad], **args)


def make_lr_scheduler(optimizer: torch.optim.Optimizer, *, kind: str, warmup_steps: int | None, warmup_ratio: float,
                      total_steps: int, min_lr_ratio: float, num_cycles: float = 0.5,
                      zero_indexed_step: bool = True) -> LambdaLR:
    """Linear warm-up, then ``kind`` (:data:`grpo_dist.core.schedules.LR_SCHEDULER_TYPES`); stepped
    once per training step."""
    warmup = resolve_warmup_steps(warmup_steps, warmup_ratio, total_steps)
    return LambdaLR(optimizer, LRMultiplier(kind, warmup, total_steps, min_lr_ratio, num_cycles, zero_indexed_step))


def clip_grad_norm(model: nn.Module, max_norm: float | None) -> float:
    """Collective: the global L2 norm of the (sharded, DTensor) gradients, clipped to ``max_norm``
    when it is > 0 (None or <= 0: only measured). 0.0 when no parameter has a gradient."""
    norm = grad_norm_tensor(model, max_norm)
    if norm is None:
        return 0.0
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return float(norm)


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device | str) -> None:
    """Move the optimizer's state tensors (not the step counters) to ``device``."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step":
                state[key] = value.to(device, non_blocking=True)
