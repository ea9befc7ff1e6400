#!/usr/bin/env python
"""Build (or rebuild) the embedded default task: the digit-reversal data and its warmed-up base model.

    python scripts/build_default_task.py [--cache DIR] [--force]

The trainer builds them on first use anyway (`builtin:tiny-reverse`, `builtin:reverse/train|test`);
this script does it on its own, e.g. to prepare a machine or to inspect the base model.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from grpo_dist import tasks
from grpo_dist.tasks import reverse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", default=tasks.cache_root(), help="cache folder (default: %(default)s)")
    ap.add_argument("--force", action="store_true", help="rebuild even if cached")
    args = ap.parse_args()
    cache = Path(args.cache)
    if args.force:
        for p in cache.glob(f"*-{reverse.VERSION}"):
            shutil.rmtree(p)
    print("data: ", reverse.ensure_data(cache))
    print("model:", reverse.ensure_model(cache))


if __name__ == "__main__":
    main()
