"""One process per rank for every FSDP2 model of the rank: actor, reference, critic, reward model.

The roles of the role table that hold a model (:mod:`grpo_dist.trainer.roles`) do not each get a Ray
worker process of their own: each rank runs one :class:`ModelWorker` holding one shell per role (the
classes of :mod:`grpo_dist.workers.actor`, ``.reference``, ``.critic``, ``.reward_model``), and
the driver's per-role :class:`~grpo_dist.distributed.worker_group.WorkerGroup` views route a call
``group.call("compute_ref_log_prob", ...)`` to ``ModelWorker.call("reference", "compute_ref_log_prob",
...)``. This is verl's "hybrid" worker layout, for two reasons:

- **Fewer processes.** The models' phases run one after the other; a separate process per role kept
  a copy of Python, torch and transformers in each (0.6 GiB more at peak on the benchmark's
  gen_heavy workload) and left idle Ray workers beside the one computing, each waking a hundred
  times a second (Ray's signal check; docs/benchmarks.md, "Where the gap to the bare libraries
  goes").
- **One process group.** The models share the rank's torch.distributed group (the first role's
  ``init_model`` joins it; the others find it joined) and the rank's device.

Calls run one at a time in the order the driver submits them (a Ray actor's default), the same order
on every rank, so the collectives of the different models cannot interleave differently on two ranks.
"""

from __future__ import annotations

import importlib
from typing import Any

import ray

from grpo_dist.utils import startup
from grpo_dist.utils.profiling import Profiled


def shell_class(cls: type | str) -> type:
    """A shell class, or the class a ``"module:QualName"`` string names (imported here: the process's
    start-up split then shows the shells' imports, torch's among them, as a phase of their own)."""
    if not isinstance(cls, str):
        return cls
    module, _, name = cls.partition(":")
    return getattr(importlib.import_module(module), name)


class ModelWorker(Profiled):
    """The rank's model roles, each built from ``parts[role] = (shell class or "module:QualName",
    constructor kwargs)`` in the given order."""

    def __init__(self, parts: dict[str, tuple[type | str, dict[str, Any]]]) -> None:
        startup.mark("constructor")
        if not parts:
            raise ValueError("a model worker needs at least one role")
        classes = {role: shell_class(cls) for role, (cls, _) in parts.items()}
        startup.mark("shell modules imported")
        self.parts: dict[str, Any] = {role: classes[role](**kwargs) for role, (_, kwargs) in parts.items()}
        for part in self.parts.values():  # a shell may build on a sibling's model (the reference under LoRA)
            if hasattr(part, "peers"):
                part.peers = self.parts
        startup.mark("shells built")

    def call(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method(*args, **kwargs)`` of ``role``'s shell."""
        part = self.parts.get(role)
        if part is None:
            raise KeyError(f"this model worker holds no {role!r} role; it holds {sorted(self.parts)}")
        return getattr(part, method)(*args, **kwargs)

    def startup_moments(self) -> dict[str, Any]:
        """This process's start-up moments (:func:`grpo_dist.utils.startup.moments`)."""
        return startup.moments()


RemoteModelWorker = ray.remote(ModelWorker)
"""The Ray actor class (its process title is ``ray::ModelWorker``)."""
