"""grpo_dist.rollout.vllm_engine.share_one_rank_process_groups: in a one-rank world a group of that
rank is the world group (no new gloo group, no new event-loop thread), other requests are untouched,
and destroying through a shared handle leaves the world group until it is destroyed itself. In a
subprocess, so the patched torch.distributed stays out of this test process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import os
    import time
    import torch.distributed as dist
    from grpo_dist.distributed.process_group import free_port, init_process_group
    from grpo_dist.rollout.vllm_engine import share_one_rank_process_groups

    def loops(at_least=0):
        # gloo's event-loop threads, counted once there are at_least and the count has held for 0.5 s (at most
        # 10 s): a loop thread names itself after it starts, so a count taken at once can miss one on a busy machine
        def count():
            return sum("gloo_tcp_loop" in open(f"/proc/self/task/{t}/comm").read() for t in os.listdir("/proc/self/task"))

        last, since, end = count(), time.monotonic(), time.monotonic() + 10
        while time.monotonic() < end and (last < at_least or time.monotonic() - since < 0.5):
            time.sleep(0.05)
            n = count()
            if n != last:
                last, since = n, time.monotonic()
        return last

    init_process_group(backend="gloo", rank=0, world_size=1, master_addr="127.0.0.1", master_port=free_port())
    dist.barrier()
    before = loops(at_least=1)  # the world group's own loop
    share_one_rank_process_groups()
    share_one_rank_process_groups()  # idempotent
    a, b, c = dist.new_group([0], backend="gloo"), dist.new_group(backend="gloo"), dist.new_group([0])
    assert a is dist.group.WORLD and b is dist.group.WORLD and c is dist.group.WORLD
    assert loops() == before, (loops(), before)
    dist.destroy_process_group(a)  # a shared handle: the world group lives on
    assert dist.is_initialized()
    t = __import__("torch").ones(2)
    dist.all_reduce(t, group=b)
    assert t.tolist() == [1.0, 1.0]
    dist.destroy_process_group()
    assert not dist.is_initialized()
    print("OK", flush=True)
    # leave without the interpreter's teardown: there torch's gloo threads met their destructors out of order once
    # in a loaded run ("terminate called without an active exception", rc -6 after OK), which is not what this checks
    os._exit(0)
""")


def test_one_rank_groups_are_the_world_group():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stderr[-3000:]
