"""Write MATH (Hendrycks et al.) as train/test parquet files in verl's row format, for grpo_dist.

From local copies of the original data (columns ``problem`` and ``solution``, the solution with a
``\\boxed{}`` final answer, plus ``level`` and ``type`` when present): parquet, jsonl or json files
such as those of the Hugging Face repository DigitalLearningGmbH/MATH-lighteval, or a folder of
the original per-problem .json files (MATH/train/algebra/1.json, ...)::

    python scripts/data/prepare_math.py --train-file MATH/train --test-file MATH/test --output-dir ~/data/math
    python scripts/data/prepare_math.py --train-file math_train.parquet --test-file math_test.parquet

or from the local Hugging Face cache (needs the ``datasets`` package; nothing is downloaded)::

    python scripts/data/prepare_math.py --from-hub-cache DigitalLearningGmbH/MATH-lighteval

Each output row, as verl's examples/data_preprocess/math_dataset.py writes it::

    {"data_source": "DigitalLearningGmbH/MATH-lighteval",
     "prompt": [{"role": "user", "content": PROBLEM + " Let's think step by step and output the final answer within \\\\boxed{}."}],
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "\\\\frac{1}{2}"},   # the last \\boxed{} of the solution
     "extra_info": {"split": "train", "index": 0, "question": PROBLEM, "answer": SOLUTION,
                    "level": "Level 3", "type": "Algebra"}}

The ground truth is extracted with grpo_dist's own ``last_boxed_content`` (the function the MATH
scorer uses on responses). A solution without a ``\\boxed{}`` falls back to an ``answer`` column
when the input has one (MATH-500 does); otherwise the row stops the script with an error naming
it, unless ``--skip-bad-rows`` is given.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared helpers in prepare_gsm8k.py

from prepare_gsm8k import PrepError, add_common_args, main_with_errors, run  # noqa: E402

from grpo_dist.rewards.scorers import DEFAULT_REGISTRY, last_boxed_content, math_score  # noqa: E402

DEFAULT_DATA_SOURCE = "DigitalLearningGmbH/MATH-lighteval"
# verl's names for the data set ('lighteval/MATH' is the older one); both select the MATH scorer.
DATA_SOURCES = ("DigitalLearningGmbH/MATH-lighteval", "lighteval/MATH")
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def extract_ground_truth(record: dict) -> str | None:
    """The content of the last ``\\boxed{}`` of the solution, else the record's ``answer``; None if neither."""
    boxed = last_boxed_content(str(record["solution"]))
    if boxed is not None and boxed.strip():
        return boxed.strip()
    answer = record.get("answer")
    if answer is not None and str(answer).strip():
        return str(answer).strip()
    return None


def row_maker(data_source: str):
    def make_row(record: dict, split: str, index: int) -> dict:
        """One verl-format row from one original MATH record (``ValueError`` when it has no answer)."""
        problem, solution = str(record["problem"]), str(record["solution"])
        truth = extract_ground_truth(record)
        if truth is None:
            raise ValueError("its 'solution' has no \\boxed{...} final answer")
        extra = {"split": split, "index": index, "question": problem, "answer": solution}
        for key in ("level", "type"):
            if record.get(key) is not None:
                extra[key] = str(record[key])
        return {
            "data_source": data_source,
            "prompt": [{"role": "user", "content": problem + " " + INSTRUCTION}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": truth},
            "extra_info": extra,
        }

    return make_row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="prepare_math.py",
        description=__doc__.split("\n\n", 1)[0],
        epilog=__doc__.split("\n\n", 1)[1].split("\nThe reading and writing helpers")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common_args(parser, default_output="~/data/math", hub_example=DEFAULT_DATA_SOURCE,
                    file_kinds=".parquet, .jsonl or .json, or a folder of per-problem .json files")
    parser.add_argument("--hub-config", default=None,
                        help="dataset configuration for --from-hub-cache (default: the data set's default)")
    parser.add_argument("--data-source", default=None,
                        help=f"data_source written in every row: {' or '.join(DATA_SOURCES)} (default: the "
                             f"--from-hub-cache name when it is one of these, else {DEFAULT_DATA_SOURCE})")
    args = parser.parse_args(argv)

    def body() -> None:
        data_source = args.data_source
        if data_source is None:
            data_source = args.from_hub_cache if args.from_hub_cache in DATA_SOURCES else DEFAULT_DATA_SOURCE
        if data_source not in DATA_SOURCES or DEFAULT_REGISTRY.get(data_source) is not math_score:
            raise PrepError(f"--data-source {data_source!r}: expected {' or '.join(DATA_SOURCES)} "
                            "(the data sources grpo_dist scores with its MATH scorer)")
        run(args, required=("problem", "solution"), make_row=row_maker(data_source), hub_config=args.hub_config)

    return main_with_errors(parser.prog, body)


if __name__ == "__main__":
    sys.exit(main())
