"""torch.distributed process groups and the FSDP2 device mesh, without Ray.

One process per data-parallel rank. The caller (a Ray worker, a test, or a launcher) picks the rank,
the world size and the rendezvous address, then calls :func:`init_process_group` before building an
FSDP2 model. ``gloo`` is the CPU backend, ``nccl`` the CUDA one; ``backend="auto"`` chooses by whether
CUDA is available.

The rendezvous listens where the ranks reach it, not on every interface: rank 0's TCP store is bound
to ``master_addr`` itself (torch's own would listen on all of them), and when ``master_addr`` is a
loopback address (a single-machine run) gloo's connections use the loopback interface too, unless
``GLOO_SOCKET_IFNAME`` says otherwise.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

__all__ = [
    "BACKENDS",
    "resolve_backend",
    "init_process_group",
    "open_side_group",
    "make_device_mesh",
    "destroy",
    "free_port",
    "is_initialized",
    "comm_device",
    "all_reduce_sum",
]

BACKENDS: tuple[str, ...] = ("auto", "gloo", "nccl")


def resolve_backend(backend: str) -> str:
    """``"auto"`` -> ``"nccl"`` when CUDA is available, else ``"gloo"``; other names are checked."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown torch.distributed backend {backend!r}; valid: {list(BACKENDS)}")
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("backend='nccl' needs CUDA, which is not available here; use 'gloo' or 'auto'")
    return backend


def init_process_group(
    *,
    backend: str,
    rank: int,
    world_size: int,
    master_addr: str,
    master_port: int,
    timeout_s: float = 600,
) -> str:
    """Join the default process group (TCP rendezvous at ``master_addr:master_port``).

    Returns the backend actually used. Idempotent for the same rank/world size: a second call in a
    process that already joined returns without re-initialising. With ``nccl``, the current CUDA
    device must be set by the caller (``torch.cuda.set_device(local_rank)``) before this call.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    resolved = resolve_backend(backend)
    if dist.is_initialized():
        if dist.get_rank() != rank or dist.get_world_size() != world_size:
            raise RuntimeError(
                f"process group already initialised as rank {dist.get_rank()}/{dist.get_world_size()}, "
                f"asked for rank {rank}/{world_size}"
            )
        return dist.get_backend()
    # Some torch internals (and DCP) read these; keep them consistent with the explicit arguments.
    os.environ["MASTER_ADDR"] = master_addr
    os.environ["MASTER_PORT"] = str(master_port)
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    timeout = datetime.timedelta(seconds=timeout_s)
    if _ip_literal(master_addr) is None:  # a host name: torch's own rendezvous
        dist.init_process_group(backend=resolved, init_method=f"tcp://{master_addr}:{master_port}", rank=rank,
                                world_size=world_size, timeout=timeout)
        return resolved
    store = _store(resolved, rank, world_size, master_addr, master_port, timeout)
    dist.init_process_group(backend=resolved, store=store, rank=rank, world_size=world_size, timeout=timeout)
    return resolved


def _store(backend: str, rank: int, size: int, master_addr: str, master_port: int,
           timeout: datetime.timedelta) -> dist.TCPStore:
    """The rendezvous store of a group whose rank 0 listens at ``master_addr:master_port`` (an IP literal): rank 0
    binds that address alone; gloo on a loopback address connects over the loopback interface."""
    ip = _ip_literal(master_addr)
    if ip is None:
        raise ValueError(f"expected an IP address for the rendezvous, got {master_addr!r}")
    if ip.is_loopback and backend == "gloo" and not os.environ.get("GLOO_SOCKET_IFNAME"):
        os.environ["GLOO_SOCKET_IFNAME"] = loopback_interface()
    if rank != 0:
        return dist.TCPStore(master_addr, master_port, size, is_master=False, timeout=timeout)
    listener = socket.socket(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((master_addr, master_port))
    listener.listen(max(128, size))
    _LISTENERS.append(listener)  # the store serves on this socket for the life of the process
    return dist.TCPStore(master_addr, master_port, size, is_master=True, timeout=timeout,
                         wait_for_workers=False, master_listen_fd=listener.fileno())


_LISTENERS: list[socket.socket] = []


def open_side_group(*, backend: str, rank: int, size: int, master_addr: str, master_port: int,
                    timeout_s: float = 600) -> dist.ProcessGroup:
    """Collective: a process group of ``size`` processes apart from their default groups, for processes of
    different worlds (the weight sync's: the actor's rank 0 and every rollout rank, each of which already
    belongs to its own role's default group). Rank 0 hosts the rendezvous at ``master_addr:master_port``
    (an IP literal); every rank must call this within ``timeout_s``. ``backend``: ``"gloo"`` (CPU tensors)
    or ``"nccl"`` (CUDA tensors on each process's current device; no two ranks on one GPU).

    Use the returned group's own methods (``group.broadcast(tensor, root).wait()``); it is not registered
    with ``torch.distributed``'s functional API."""
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"a side group's backend is gloo or nccl, got {backend!r}")
    if not 0 <= rank < size:
        raise ValueError(f"rank must be in [0, {size}), got {rank}")
    timeout = datetime.timedelta(seconds=timeout_s)
    store = _store(backend, rank, size, master_addr, master_port, timeout)
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    return dist.ProcessGroupNCCL(store, rank, size, options)


def _ip_literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def loopback_interface() -> str:
    """The name of this machine's loopback network interface (``lo`` on Linux)."""
    try:
        import psutil

        for name, addrs in psutil.net_if_addrs().items():
            if any(a.family == socket.AF_INET and a.address.startswith("127.") for a in addrs):
                return name
    except Exception:
        pass
    return "lo"


def make_device_mesh(world_size: int, device_type: str) -> DeviceMesh:
    """A 1-D data-parallel mesh over all ranks (dim name ``"dp"``), as FSDP2's ``fully_shard`` wants.

    ``device_type`` is ``"cpu"`` or ``"cuda"`` (a ``torch.device``'s ``.type``).
    """
    if not dist.is_initialized():
        raise RuntimeError("call init_process_group(...) before make_device_mesh(...)")
    if world_size != dist.get_world_size():
        raise ValueError(f"mesh size {world_size} != process group world size {dist.get_world_size()}")
    return init_device_mesh(device_type, (world_size,), mesh_dim_names=("dp",))


def comm_device(device: torch.device) -> torch.device:
    """Where the tensors of a collective on the default group live: the rank's compute ``device``
    under nccl, the CPU under gloo."""
    return device if dist.get_backend() == "nccl" else torch.device("cpu")


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Collective: ``values`` summed over all ranks (one float64 all-reduce on
    ``comm_device(device)``); every rank gets the sums."""
    t = torch.tensor(values, dtype=torch.float64, device=comm_device(device))
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def destroy() -> None:
    """Leave the default process group (no-op when none was joined)."""
    if is_initialized():
        dist.destroy_process_group()


def free_port(host: str = "") -> int:
    """A TCP port number that was free a moment ago on ``host``, for a rendezvous (``master_port``).

    The OS picks it: a socket is bound to port 0 on ``host`` and closed again, so another process
    may take the port before the caller binds it (callers bind it within seconds; a clash shows up
    as an "address in use" error at ``init_process_group``). ``host=""`` (the default) checks every
    interface of this machine, which is what a port other nodes connect to needs; ``"127.0.0.1"``
    checks the loopback interface only.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
        return int(s.getsockname()[1])
