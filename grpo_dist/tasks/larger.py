"""The real-model task: name the larger of two 2-digit numbers, for ``builtin:smollm2-135m-instruct``.

Prompt (one user message; the model's chat template adds its default system prompt):
``Which number is larger, 47 or 74? Reply with just the number.``; the answer is ``74``. The reward
is 1.0 when the **first number in the response** is the larger one and 0.0 otherwise (data_source
``grpo_dist/larger``): ``74``, ``74 is larger than 47.`` and ``The number 74 is larger.`` score 1;
``47 is larger than 74.`` and a response without a number score 0.

SmolLM2-135M-Instruct is weak at it: greedy, it is right on about a third of the held-out pairs (it
often names the first number of the question, or starts to explain and names none), while a group
of 8 samples at temperature 1 holds a right answer for nearly every prompt, so GRPO groups have
reward variance (measured numbers: docs/quickstart.md).

Held out by construction: no test pair ``(a, b)`` appears in the training split, in either order.
4,096 training and 256 test prompts, written once as parquet in verl's row format under the
grpo_dist cache (``builtin:larger/train``, ``builtin:larger/test``).
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

from grpo_dist.tasks.reverse import _ensure_splits, _write_splits

DATA_SOURCE = "grpo_dist/larger"
VERSION = "v1"
LOW, HIGH = 10, 99
N_TRAIN, N_TEST = 4096, 256
_NUMBER = re.compile(r"-?\d+")


def make_prompt(a: int, b: int) -> list[dict]:
    return [{"role": "user", "content": f"Which number is larger, {a} or {b}? Reply with just the number."}]


def first_number(text: str) -> str | None:
    """The first integer written in ``text`` (digits with an optional minus sign), or None."""
    found = _NUMBER.search(text)
    return found.group(0) if found else None


def score(solution_str: str, ground_truth, extra_info=None) -> float:
    """1.0 when the first number in the response equals ``ground_truth`` (the larger number), else 0.0."""
    got = first_number(solution_str)
    return 1.0 if got is not None and int(got) == int(ground_truth) else 0.0


def _register() -> None:
    from grpo_dist.rewards.scorers import DEFAULT_REGISTRY

    if DATA_SOURCE not in DEFAULT_REGISTRY:
        DEFAULT_REGISTRY.register(DATA_SOURCE)(score)


_register()


def split_pairs(*, seed: int = 0) -> dict[str, list[tuple[int, int]]]:
    """Disjoint train/test lists of ordered pairs ``(a, b)``, ``a != b``; no test pair appears in
    train in either order."""
    rng = random.Random(seed)
    pairs = [(a, b) for a in range(LOW, HIGH + 1) for b in range(LOW, HIGH + 1) if a != b]
    rng.shuffle(pairs)
    test = pairs[:N_TEST]
    held = {frozenset(p) for p in test}
    rest = [p for p in pairs[N_TEST:] if frozenset(p) not in held]
    return {"train": rest[:N_TRAIN], "test": test}


def write_data(out_dir: Path, *, seed: int = 0) -> dict[str, Path]:
    """train.parquet / test.parquet in verl's row format."""
    rows = {}
    for split, items in split_pairs(seed=seed).items():
        rows[split] = [
            {
                "data_source": DATA_SOURCE,
                "prompt": make_prompt(a, b),
                "ability": "comparison",
                "reward_model": {"style": "rule", "ground_truth": str(max(a, b))},
                "extra_info": {"split": split, "index": i},
            }
            for i, (a, b) in enumerate(items)
        ]
    return _write_splits(out_dir, rows)


def ensure_data(cache: str | os.PathLike) -> dict[str, Path]:
    return _ensure_splits(Path(cache) / f"larger-data-{VERSION}", Path(cache) / ".larger-data.lock", write_data)
