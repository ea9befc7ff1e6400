"""``release_free_heap``: the rollout worker's answer to a heap that partial rollouts fragment (free blocks
between live ones stay resident until the C library is asked to hand their pages back)."""

import ctypes
import ctypes.util
import os

import pytest

from grpo_dist.workers.common import release_free_heap


def _rss_mib() -> float:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads resident memory from /proc")
def test_free_pages_between_live_blocks_go_back_to_the_system():
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    block, count = 64 * 1024, 3200  # 200 MiB of heap blocks (below malloc's mmap threshold)
    blocks = [libc.malloc(block) for _ in range(count)]
    assert all(blocks)
    for b in blocks:
        ctypes.memset(b, 1, block)  # resident
    kept = blocks[::8]  # one live block in eight pins the heap: free() alone cannot shrink it
    for i, b in enumerate(blocks):
        if i % 8:
            libc.free(b)
    try:
        before = _rss_mib()
        if not release_free_heap():
            pytest.skip("this C library has no malloc_trim")
        after = _rss_mib()
        assert before - after > 100, (before, after)  # 175 MiB were free between the live blocks
    finally:
        for b in kept:
            libc.free(b)
