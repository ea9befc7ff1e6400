"""The base of the worker shells of the FSDP2 model roles: actor, reference, critic, reward model.

A shell is one per rank, living in the rank's :class:`~grpo_dist.workers.models.ModelWorker` process
with the rank's other FSDP2 models. What every shell does the same way is here: the process set-up,
the rendezvous address and node id the driver asks for, joining the rank's process group and
building the training module's object (:meth:`ModelShell.init_model`, with start-up moments named
``<role>: ...``), the peak-memory metric, and the checkpoint calls. A shell adds the calls of its
role, decorated with :func:`~grpo_dist.workers.common.timed` where they are a step phase's work.
"""

from __future__ import annotations

from typing import Any, ClassVar

from grpo_dist.distributed.process_group import free_port
from grpo_dist.utils import startup
from grpo_dist.workers.common import current_node_id, node_ip, process_memory_gb, setup_process
from grpo_dist.workers.models import shell_class

__all__ = ["ModelShell"]


class ModelShell:
    """One rank's shell around a training module's object (:attr:`model`, built by :meth:`init_model`)."""

    role: ClassVar[str]
    """The role's name in start-up moments and in ``perf/max_memory_gb/<role>``."""
    model_class: ClassVar[str]
    """``"module:QualName"`` of the training module's class, imported by :meth:`init_model` (the
    driver's processes and the shell's import stay light)."""

    def __init__(self, *, rank: int, world_size: int, device: str, num_threads: int,
                 external_libs: tuple[str, ...] = ()) -> None:
        setup_process(device, num_threads, external_libs)
        self.rank, self.world_size, self.device = rank, world_size, device
        self.model: Any = None
        self.peers: dict[str, Any] = {}
        """The shells of the rank's other model roles in this process, by role (set by the
        :class:`~grpo_dist.workers.models.ModelWorker` that holds them)."""

    def address(self) -> tuple[str, int]:
        """A rendezvous address on this node (the first rank's is the process group's)."""
        return node_ip(), free_port()

    def node_id(self) -> str:
        return current_node_id()

    def gpu_uuid(self) -> str | None:
        from grpo_dist.rollout.weight_sync import gpu_uuid

        return gpu_uuid()

    def init_model(self, *, master_addr: str, master_port: int, backend: str, model_path: str,
                   timeout_s: float = 600.0, **kwargs: Any) -> str | None:
        """Join the rank's process group (the first role of the process joins it; the others find it
        joined) and build the model: ``model_class(model_path, rank=, world_size=, device=, **kwargs)``.
        Returns what the auto memory choices chose (printed by the driver), None when nothing was auto."""
        startup.mark(f"{self.role}: init_model called")
        from grpo_dist.distributed.process_group import init_process_group

        cls = shell_class(self.model_class)
        startup.mark(f"{self.role}: training modules imported")
        init_process_group(backend=backend, rank=self.rank, world_size=self.world_size,
                           master_addr=master_addr, master_port=master_port, timeout_s=timeout_s)
        startup.mark(f"{self.role}: process group")
        self.model = self.build(cls, model_path, **kwargs)
        startup.mark(f"{self.role}: model built")
        return self.model.memory_note

    def build(self, cls: type, model_path: str, **kwargs: Any) -> Any:
        """The training module's object on this rank's device (a shell may say more when it fails)."""
        dev = "cuda" if self.device == "cuda" else "cpu"
        return cls(model_path, rank=self.rank, world_size=self.world_size, device=dev, **kwargs)

    def with_memory(self, metrics: dict[str, float]) -> dict[str, float]:
        """``metrics`` with ``perf/max_memory_gb/<role>``: the process's peak memory (all of the rank's models)."""
        metrics[f"perf/max_memory_gb/{self.role}"] = process_memory_gb()
        return metrics

    def save_checkpoint(self, directory: str) -> None:
        self.model.save_checkpoint(directory)

    def load_checkpoint(self, directory: str) -> None:
        self.model.load_checkpoint(directory)
