"""Process set-up and busy-time measurement shared by the Ray worker shells."""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from typing import Callable, Generic, ParamSpec, Sequence, TypeVar

from grpo_dist.utils import profiling

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True)
class Timed(Generic[T]):
    """A worker method's result and the seconds its body took inside the worker (its busy time).

    Travels back with the result in the same Ray call, so the driver can tell a phase's work in the
    workers from the Ray, transfer and driver cost around it without another round trip.
    """

    value: T
    busy_s: float


def timed(method: Callable[P, T]) -> Callable[P, Timed[T]]:
    """Decorate a worker method so that it returns ``Timed(result, busy seconds)`` (``perf_counter``
    around the body; argument and result (de)serialisation by Ray are outside it). In a profiled step the
    body is a stage of the process's trace, labelled ``<role>.<method>`` (the shell's ``role``)
    (:func:`grpo_dist.utils.profiling.stage`)."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Timed[T]:
        t0 = time.perf_counter()
        with profiling.stage(f"{getattr(args[0], 'role', 'worker')}.{method.__name__}"):
            value = method(*args, **kwargs)
        return Timed(value, time.perf_counter() - t0)

    return wrapper


def unwrap_timed(results: Sequence[Timed[T]]) -> tuple[list[T], float]:
    """The per-rank values of a call to a :func:`timed` method, and the busy seconds of its slowest
    rank (the call waits for that one)."""
    return [r.value for r in results], max((r.busy_s for r in results), default=0.0)


def setup_process(device: str, num_threads: int, external_libs: tuple[str, ...] = ()) -> None:
    """Pin the intra-op thread count (ranks share the machine's cores) before heavy imports run, then import
    ``external_libs`` (verl's ``external_lib``: modules that register model classes), before any model or
    engine is built here."""
    import torch

    from grpo_dist.utils.imports import import_modules

    n = max(1, int(num_threads))
    os.environ.setdefault("OMP_NUM_THREADS", str(n))
    torch.set_num_threads(n)
    if device == "cuda" and torch.cuda.is_available():
        torch.cuda.set_device(0)  # Ray gives each worker its own CUDA_VISIBLE_DEVICES
    import_modules(external_libs, where="in a worker process")


def node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def current_node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def process_memory_gb() -> float:
    """Peak device memory on CUDA, else this process's resident memory, in GiB. Model roles share
    the rank's process (:mod:`grpo_dist.workers.models`), so this covers all of the rank's models."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated() / 2**30
    import psutil

    return psutil.Process().memory_info().rss / 2**30


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_free_heap() -> bool:
    """Hand the free pages of the C heap back to the system (glibc's ``malloc_trim(0)``, which also releases
    whole free pages between live blocks); False where the C library has no ``malloc_trim``.

    Why: a rollout worker generating partial rollouts in the background (each weight sync aborts its requests
    and re-adds them, prefix and tokens so far, as new ones) fragments the heap: the memory in use stays flat
    while free blocks the heap cannot reuse pile up, resident, at about 1 MiB a sync on the CPU
    (docs/benchmarks.md, "A long run"), and the workers' malloc settings (``trainer/roles.CPU_WORKER_MALLOC_ENV``)
    never give freed memory back on their own. Agent loops fragment it the same way (each turn is a new engine
    request, prefix and all). Called at each pause and after each agent rollout, while the engine is idle; it took
    4 ms (median, 10 ms at most) on the 2-core machine.
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
