"""Process set-up shared by the Ray worker shells."""

from __future__ import annotations

import os
import socket


def setup_process(device: str, num_threads: int) -> None:
    """Pin the intra-op thread count (ranks share the machine's cores) before heavy imports run."""
    import torch

    n = max(1, int(num_threads))
    os.environ.setdefault("OMP_NUM_THREADS", str(n))
    torch.set_num_threads(n)
    if device == "cuda" and torch.cuda.is_available():
        torch.cuda.set_device(0)  # Ray gives each worker its own CUDA_VISIBLE_DEVICES


def node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def current_node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def process_memory_gb() -> float:
    """Peak device memory on CUDA, else this process's resident memory, in GiB."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated() / 2**30
    import psutil

    return psutil.Process().memory_info().rss / 2**30
