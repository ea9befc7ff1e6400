"""Call a test module's function in a process of its own: ``python call_in_process.py MODULE:FUNCTION CALL.pkl``
unpickles ``(args, result path)`` from ``CALL.pkl``, calls ``FUNCTION(*args)`` and pickles what it returns there.

:func:`call_in_processes` starts one such process per call, all at once: on the test session's cluster each is forked
from the warm process that has torch and vLLM imported (tests/warm_workers.py), as the runs' workers are, instead of
a fresh Python importing them again (what multiprocessing's ``spawn`` does).
"""

from __future__ import annotations

import importlib
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]


def call_in_processes(calls: list[tuple[Callable[..., Any], tuple]], folder: Path, timeout_s: float = 600) -> list[Any]:
    """``[fn(*args) for fn, args in calls]``, each call in a process of its own, the processes running at once
    (``folder``: where their arguments and results go); an ``AssertionError`` with a process's output if one fails."""
    from tests import shared_ray

    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, **shared_ray.warm_env())
    procs = []
    for i, (fn, args) in enumerate(calls):
        call, result = folder / f"call-{i}.pkl", folder / f"result-{i}.pkl"
        call.write_bytes(pickle.dumps((args, str(result))))
        log = open(folder / f"call-{i}.log", "w+")  # noqa: SIM115 (closed below)
        cmd = [*shared_ray.driver_command(), __file__, f"{fn.__module__}:{fn.__qualname__}", str(call)]
        procs.append((subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), log, result))
    deadline = time.monotonic() + timeout_s
    try:
        for proc, log, _ in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        results = []
        for proc, log, result in procs:
            log.seek(0)
            assert proc.returncode == 0 and result.exists(), log.read()[-4000:]
            results.append(pickle.loads(result.read_bytes()))
        return results
    finally:
        for proc, log, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()


def main() -> None:
    sys.path.insert(0, str(ROOT))
    module, _, name = sys.argv[1].partition(":")
    fn = getattr(importlib.import_module(module), name)
    args, result = pickle.loads(Path(sys.argv[2]).read_bytes())
    Path(result).write_bytes(pickle.dumps(fn(*args)))


if __name__ == "__main__":
    main()
