#!/usr/bin/env python
"""Build (or rebuild) the embedded calculator task: its data and warmed-up base model; optionally measure it.

    python scripts/build_calculator_task.py [--cache DIR] [--force] [--evaluate N] [--steps S] [--out DIR]

The trainer builds them on first use anyway (`builtin:tiny-calculator`, `builtin:calculator/train|test`);
this script does it on its own, e.g. to prepare a machine or to inspect the base model. `--evaluate N` runs
the tool transcript loop on N test prompts at temperature 1 and prints accuracy and tool-use rate. `--out DIR`
builds a model into DIR (not the cache) with `--steps` warm-up steps, to try other settings.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from grpo_dist import tasks
from grpo_dist.tasks import calculator


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", default=tasks.cache_root(), help="cache folder (default: %(default)s)")
    ap.add_argument("--force", action="store_true", help="rebuild even if cached")
    ap.add_argument("--evaluate", type=int, default=0, metavar="N", help="measure the model on N test prompts")
    ap.add_argument("--out", type=Path, default=None, help="build the model into this folder instead of the cache")
    ap.add_argument("--steps", type=int, default=None, help="warm-up steps (with --out)")
    ap.add_argument("--batch-size", type=int, default=None, help="warm-up batch size (with --out)")
    args = ap.parse_args()
    cache = Path(args.cache)
    print("data: ", calculator.ensure_data(cache))
    t0 = time.perf_counter()
    if args.out is not None:
        shutil.rmtree(args.out, ignore_errors=True)
        kwargs = {"warmup_steps": args.steps, "batch_size": args.batch_size}
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        model = calculator.build_model(args.out, log_every=25, **kwargs)
    else:
        if args.force:
            shutil.rmtree(cache / f"tiny-calculator-{calculator.VERSION}", ignore_errors=True)
        model = calculator.ensure_model(cache)
    print(f"model: {model} ({time.perf_counter() - t0:.0f} s)")
    if args.evaluate:
        print(calculator.evaluate(model, args.evaluate, data=calculator.ensure_data(cache)["test"]))


if __name__ == "__main__":
    main()
