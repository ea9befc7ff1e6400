"""Which optimizer a trained model gets (verl's ``optim.optimizer_impl``, ``optim.optimizer`` and
``optim.override_optimizer_config``), and with which arguments.

Light on purpose (importlib, and torch when an optimizer class is looked up): the driver checks a
configuration's optimizer with it before any worker starts; :func:`grpo_dist.training.optim.make_optimizer`
builds it in the workers.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["optimizer_class", "optimizer_arguments"]


def optimizer_class(impl: str, name: str) -> type[torch.optim.Optimizer]:
    """verl's ``optim.optimizer_impl`` / ``optim.optimizer``: the optimizer class ``name`` of the module
    ``impl`` (``torch.optim``, or an installed package such as ``torchao.optim`` or ``bitsandbytes.optim``).
    ``ValueError`` naming what is wrong and what is there when the module does not import or holds no such
    optimizer class."""
    import torch

    try:
        module = importlib.import_module(impl)
    except ImportError as e:
        raise ValueError(f"optimizer_impl {impl!r} does not import ({e}); torch.optim, or a package installed "
                         "where the workers run") from None
    cls = getattr(module, name, None)
    usable = lambda v: (isinstance(v, type) and issubclass(v, torch.optim.Optimizer)  # noqa: E731
                        and v not in (torch.optim.Optimizer, torch.optim.LBFGS))
    if not usable(cls):
        there = sorted(n for n, v in vars(module).items() if usable(v) and not n.startswith("_"))
        why = " (it re-evaluates the loss in its step, which an RL update cannot)" if cls is torch.optim.LBFGS else ""
        raise ValueError(f"optimizer {name!r} is not an optimizer class of {impl}{why}; valid: {', '.join(there)}")
    return cls


def optimizer_arguments(name: str, *, lr: float, betas: tuple[float, float], weight_decay: float,
                        extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The keyword arguments the optimizer ``name`` is built with, by verl's rule: ``lr`` and
    ``weight_decay``, ``betas`` when the name contains "adam" (or "ademamix"), then ``extra``
    (``optim.override_optimizer_config``), which may override any of them."""
    args: dict[str, Any] = {"lr": lr, "weight_decay": weight_decay}
    if "adam" in name.lower() or "ademamix" in name.lower():
        args["betas"] = tuple(betas)
    args.update(extra or {})
    return args
