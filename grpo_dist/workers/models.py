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

from typing import Any

import ray


class ModelWorker:
    """The rank's model roles, each built from ``parts[role] = (shell class, constructor kwargs)`` in
    the given order."""

    def __init__(self, parts: dict[str, tuple[type, dict[str, Any]]]) -> None:
        if not parts:
            raise ValueError("a model worker needs at least one role")
        self.parts: dict[str, Any] = {role: cls(**kwargs) for role, (cls, kwargs) in parts.items()}

    def call(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method(*args, **kwargs)`` of ``role``'s shell."""
        part = self.parts.get(role)
        if part is None:
            raise KeyError(f"this model worker holds no {role!r} role; it holds {sorted(self.parts)}")
        return getattr(part, method)(*args, **kwargs)


RemoteModelWorker = ray.remote(ModelWorker)
"""The Ray actor class (its process title is ``ray::ModelWorker``)."""
