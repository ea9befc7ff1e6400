"""The local code sandbox (grpo_dist/tools/sandbox.py): each limit stops what it should, the output is capped
with a note, and nothing of a run's process group is left alive afterwards."""

from __future__ import annotations

import asyncio
import os

import pytest

from grpo_dist.tools.sandbox import SandboxLimits, SandboxPool, live_processes, run_python

# wall_s is generous: the CPU limit must stop the busy loop before it even on a loaded machine
LIMITS = SandboxLimits(wall_s=10.0, cpu_s=1, memory_mb=256, file_size_mb=1, max_processes=6, max_output_bytes=4096)


def run(code: str, limits: SandboxLimits = LIMITS, **kw):
    result = asyncio.run(run_python(code, limits, **kw))
    assert result.pgid is not None
    assert live_processes(result.pgid) == [], "processes of the run's group are still alive"
    return result


def test_a_plain_run_gives_stdout_stderr_and_exit_status_in_a_fresh_directory():
    r = run("import os, sys\nprint('hello', sorted(os.listdir('.')))\nprint('oops', file=sys.stderr)\nsys.exit(3)")
    assert r.stdout == "hello ['main.py']\n"
    assert r.stderr == "oops\n"
    assert (r.exit_code, r.stopped, r.reason, r.truncated) == (3, False, None, False)
    assert "[stopped" not in r.model_text()


def test_the_directory_is_fresh_for_each_run_and_removed_afterwards():
    first = run("import os\nprint(os.getcwd())\nopen('left.txt', 'w').write('x')")
    second = run("import os\nprint(os.getcwd(), os.listdir('.'))")
    assert first.stdout.strip() != second.stdout.split()[0]
    assert "left.txt" not in second.stdout
    assert not os.path.exists(first.stdout.strip())


def test_stdin_reaches_the_code_and_a_traceback_shows_only_the_code():
    r = run("x = input()\nprint(int(x) * 2)\nraise ValueError('bad')", stdin="21\n")
    assert r.stdout == "42\n"
    assert 'File "main.py", line 3' in r.stderr and r.stderr.rstrip().endswith("ValueError: bad")
    assert "<string>" not in r.stderr


def test_an_infinite_loop_is_stopped_by_the_cpu_limit():
    r = run("while True:\n    pass")
    assert r.stopped and r.reason == "cpu_time" and r.wall_s < LIMITS.wall_s, r
    assert r.model_text().endswith("[stopped: CPU time limit]")


def test_a_sleeping_program_is_killed_at_the_wall_time_limit():
    r = run("import time\nprint('start', flush=True)\ntime.sleep(60)", SandboxLimits(wall_s=0.5))
    assert r.stopped and r.reason == "wall_time" and r.exit_code == -9
    assert r.stdout == "start\n"  # what was printed before the kill is kept
    assert r.wall_s < 3


def test_a_memory_hog_fails_to_allocate():
    r = run("x = bytearray(1024 * 1024 * 1024)\nprint('allocated')")
    assert r.stopped and r.reason == "memory", r
    assert "MemoryError" in r.stderr and "allocated" not in r.stdout


def test_a_huge_print_is_cut_at_the_output_cap_with_a_note():
    r = run("print('x' * 10_000_000)")
    assert r.stopped and r.reason == "output" and r.truncated
    assert r.stdout.startswith("x" * 4096)
    assert r.stdout.endswith("[output truncated: more than 4096 bytes]")
    assert len(r.stdout) < 4096 + 100


def test_endless_printing_is_stopped_at_the_output_cap_not_the_wall_time():
    r = run("while True:\n    print('y' * 100)")
    assert r.reason == "output" and r.truncated and r.wall_s < LIMITS.wall_s


def test_a_file_larger_than_the_limit_cannot_be_written():
    r = run("open('big', 'wb').write(b'0' * (4 * 1024 * 1024))")
    assert r.stopped and r.reason == "file_size", r


def test_a_fork_bomb_hits_the_process_limit_and_leaves_nothing_behind():
    code = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60)\n"
        "            os._exit(0)\n"
        "        n += 1\n"
        "except OSError as e:\n"
        "    print('fork refused after', n)\n"
    )
    r = run(code)
    assert r.stdout.startswith("fork refused after"), r
    assert int(r.stdout.split()[-1]) <= LIMITS.max_processes
    assert r.wall_s < LIMITS.wall_s  # the main process exited; its sleeping children were killed with the group


def test_a_background_child_is_killed_when_the_main_process_exits():
    r = run("import subprocess\np = subprocess.Popen(['sleep', '60'])\nprint(p.pid)")
    assert r.exit_code == 0 and not r.stopped
    assert r.wall_s < LIMITS.wall_s


def test_a_child_in_a_new_process_group_is_killed_too():
    r = run("import os, time\nif os.fork() == 0:\n    os.setpgid(0, 0)\n    time.sleep(60)\n    os._exit(0)\nprint('parent done')")
    assert r.stdout == "parent done\n"


def test_the_pool_bounds_concurrency():
    pool = SandboxPool(max_concurrency=2, limits=LIMITS)

    async def many():
        return await asyncio.gather(*(pool.run("import time\ntime.sleep(0.2)\nprint('ok')") for _ in range(5)))

    results = asyncio.run(many())
    assert [r.stdout for r in results] == ["ok\n"] * 5
    assert pool.peak_in_flight == 2
    assert all(live_processes(r.pgid) == [] for r in results)
    with pytest.raises(ValueError, match="max_concurrency"):
        SandboxPool(max_concurrency=0)


def test_a_process_that_leaves_the_session_holding_the_output_does_not_hang_the_run():
    """Such a process escapes the group kill (see the module doc); the run still returns with what it read."""
    import time

    code = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(3)\n    os._exit(0)\n"
            "print('parent done', flush=True)")
    start = time.monotonic()
    r = asyncio.run(run_python(code, LIMITS))
    assert r.stdout == "parent done\n" and r.exit_code == 0
    assert time.monotonic() - start < LIMITS.wall_s
