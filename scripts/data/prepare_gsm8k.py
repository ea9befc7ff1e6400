"""Write GSM8K as train/test parquet files in verl's row format, for grpo_dist (and verl).

From local copies of the original data (columns ``question`` and ``answer``, the answer ending
in ``#### <number>``; parquet, jsonl or json), e.g. the files of the Hugging Face repository
openai/gsm8k::

    python scripts/data/prepare_gsm8k.py \\
        --train-file gsm8k/main/train-00000-of-00001.parquet \\
        --test-file gsm8k/main/test-00000-of-00001.parquet --output-dir ~/data/gsm8k

or from the local Hugging Face cache (needs the ``datasets`` package; nothing is downloaded)::

    python scripts/data/prepare_gsm8k.py --from-hub-cache openai/gsm8k --output-dir ~/data/gsm8k

Each output row, as verl's examples/data_preprocess/gsm8k.py writes it::

    {"data_source": "openai/gsm8k",
     "prompt": [{"role": "user", "content": QUESTION + ' Let\\'s think step by step and output the final answer after "####".'}],
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "72"},       # the number after ####, commas removed
     "extra_info": {"split": "train", "index": 0, "answer": ANSWER, "question": QUESTION}}

``index`` is the row's position in its input split. A row without a ``#### <number>`` answer stops
the script with an error naming it, unless ``--skip-bad-rows`` is given.

The reading and writing helpers below are shared with ``prepare_math.py`` (same folder).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
SPLITS = ("train", "test")
INPUT_EXTENSIONS = (".parquet", ".jsonl", ".json")

# The same pattern as verl's preprocessing and grpo_dist's scorer (grpo_dist.rewards.scorers).
_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")


class PrepError(Exception):
    """A user-facing problem (missing file, missing column, data not cached): printed as one line."""


# ----------------------------------------------------------------------------------------------
# Shared helpers (also used by prepare_math.py)
# ----------------------------------------------------------------------------------------------


def read_records(path: str | os.PathLike) -> list[dict]:
    """The rows of a local .parquet / .jsonl / .json file (a JSON array or JSON lines), or of a
    folder of per-item .json files (searched recursively, in sorted path order)."""
    p = Path(os.path.expanduser(os.fspath(path)))
    if not p.exists():
        parent = p.parent.resolve()
        where = f"its folder {parent} exists" if parent.is_dir() else f"its folder {parent} does not exist either"
        raise PrepError(f"{p}: no such file ({where})")
    if p.is_dir():
        files = sorted(f for f in p.rglob("*.json") if f.is_file())
        if not files:
            raise PrepError(f"{p}: a folder without .json files; pass a {'/'.join(INPUT_EXTENSIONS)} file")
        return [_json_object(f) for f in files]
    ext = p.suffix.lower()
    if ext == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(p).to_pylist()
        except Exception as exc:  # pyarrow raises several types for unreadable files
            raise PrepError(f"{p}: not a readable parquet file ({type(exc).__name__}: {_first_line(exc)})") from None
    if ext in (".jsonl", ".json"):
        return _read_json(p)
    raise PrepError(f"{p}: unsupported file type {ext or '(none)'!r}; expected {', '.join(INPUT_EXTENSIONS)}")


def _json_object(path: Path) -> dict:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise PrepError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(obj, dict):
        raise PrepError(f"{path}: expected one JSON object, got {type(obj).__name__}")
    return obj


def _read_json(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PrepError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    else:
        rows = []
        for line_no, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise PrepError(f"{path}: line {line_no} is not valid JSON ({exc.msg})") from None
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise PrepError(f"{path}: row {i} is a {type(row).__name__}, expected a JSON object")
    return rows


def require_columns(rows: list[dict], columns: Iterable[str], source: str) -> None:
    """``PrepError`` naming the first required column that a row lacks (or holds null in)."""
    if not rows:
        raise PrepError(f"{source}: holds no rows")
    for column in columns:
        for i, row in enumerate(rows):
            if row.get(column) is None:
                have = ", ".join(sorted(rows[0])) or "(none)"
                what = "has no" if column not in row else "has a null"
                raise PrepError(f"{source}: row {i} {what} '{column}' column (columns: {have})")


def load_hub_splits(name: str, config: str | None, splits: Iterable[str] = SPLITS) -> dict[str, list[dict]]:
    """``datasets.load_dataset(name, config)`` from the local Hugging Face cache, offline.

    ``datasets`` is imported here, not at the top: the local-file path works without it.
    """
    # Offline: read the cache, never the network (these must be set before datasets is imported).
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    try:
        import datasets
    except ImportError:
        raise PrepError(
            "--from-hub-cache needs the 'datasets' package (pip install datasets); "
            "without it, pass local files with --train-file/--test-file"
        ) from None
    call = f"datasets.load_dataset({name!r}{', ' + repr(config) if config else ''})"
    try:
        ds = datasets.load_dataset(name, config) if config else datasets.load_dataset(name)
    except Exception as exc:  # datasets raises many types for "not in the cache"
        raise PrepError(
            f"could not load {name} from the local Hugging Face cache ({type(exc).__name__}: {_first_line(exc)}); "
            f"if it is not cached, run {call} once with network access and the same HF_HOME, "
            f"or pass local files with --train-file/--test-file"
        ) from None
    out = {s: [dict(r) for r in ds[s]] for s in splits if s in ds}
    if not out:
        raise PrepError(f"{call} has no split named {' or '.join(splits)} (it has: {', '.join(ds)})")
    return out


def write_parquet(rows: list[dict], path: Path) -> None:
    """Write ``rows`` to ``path`` (through a temporary file, so a failed run leaves no half file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    os.replace(tmp, path)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "no message"


def add_common_args(parser: argparse.ArgumentParser, *, default_output: str, hub_example: str,
                    file_kinds: str = ".parquet, .jsonl or .json") -> None:
    src = parser.add_argument_group("input (local files, or the Hugging Face cache)")
    src.add_argument("--train-file", help=f"the original train split: {file_kinds}")
    src.add_argument("--test-file", help=f"the original test split: {file_kinds}")
    src.add_argument("--from-hub-cache", metavar="NAME",
                     help=f"load NAME (e.g. {hub_example}) with datasets.load_dataset from the local "
                          "Hugging Face cache, offline (needs the datasets package)")
    parser.add_argument("--output-dir", "--local-save-dir", "--local_save_dir", "--local_dir", dest="output_dir",
                        default=default_output,
                        help=f"where train.parquet and test.parquet are written (default: {default_output})")
    parser.add_argument("--skip-bad-rows", action="store_true",
                        help="drop rows whose final answer cannot be extracted (and count them) instead of stopping")


def gather_inputs(args: argparse.Namespace, hub_config: str | None) -> dict[str, tuple[str, list[dict]]]:
    """``{split: (description, raw rows)}`` from --train-file/--test-file or --from-hub-cache."""
    files = {"train": args.train_file, "test": args.test_file}
    if args.from_hub_cache:
        if any(files.values()):
            raise PrepError("pass either --from-hub-cache or --train-file/--test-file, not both")
        loaded = load_hub_splits(args.from_hub_cache, hub_config)
        return {s: (f"{args.from_hub_cache}[{s}]", rows) for s, rows in loaded.items()}
    if not any(files.values()):
        raise PrepError("no input: pass --train-file and/or --test-file (local files), or --from-hub-cache NAME")
    return {s: (str(f), read_records(f)) for s, f in files.items() if f}


def convert_split(rows: list[dict], split: str, source: str, make_row: Callable[[dict, str, int], dict],
                  *, skip_bad_rows: bool) -> tuple[list[dict], int]:
    """``make_row`` over ``rows``; a ``ValueError`` from it names the bad row (or skips it)."""
    out, skipped = [], 0
    for i, raw in enumerate(rows):
        try:
            out.append(make_row(raw, split, i))
        except ValueError as exc:
            if not skip_bad_rows:
                raise PrepError(f"{source}: row {i}: {exc} (--skip-bad-rows drops such rows)") from None
            skipped += 1
    if not out:
        raise PrepError(f"{source}: no usable rows ({skipped} skipped)")
    return out, skipped


def run(args: argparse.Namespace, *, required: tuple[str, ...], make_row: Callable[[dict, str, int], dict],
        hub_config: str | None) -> list[Path]:
    """Read, check, convert and write every split given; returns the files written."""
    inputs = gather_inputs(args, hub_config)
    converted = {}
    for split, (source, rows) in inputs.items():
        require_columns(rows, required, source)
        converted[split] = convert_split(rows, split, source, make_row, skip_bad_rows=args.skip_bad_rows)
    out_dir = Path(os.path.expanduser(args.output_dir))
    written = []
    for split, (rows, skipped) in converted.items():
        path = out_dir / f"{split}.parquet"
        write_parquet(rows, path)
        note = f" ({skipped} bad rows skipped)" if skipped else ""
        print(f"wrote {len(rows)} rows to {path}{note}")
        written.append(path)
    return written


def main_with_errors(prog: str, body: Callable[[], Any]) -> int:
    try:
        body()
    except PrepError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    return 0


# ----------------------------------------------------------------------------------------------
# GSM8K
# ----------------------------------------------------------------------------------------------


def extract_final_answer(answer: str) -> str | None:
    """The number after ``#### `` in a GSM8K answer, commas removed; None when there is none."""
    m = _ANSWER.search(str(answer))
    return m.group(1).replace(",", "") if m else None


def make_row(record: dict, split: str, index: int) -> dict:
    """One verl-format row from one original GSM8K record (``ValueError`` when it has no answer)."""
    question, answer = str(record["question"]), str(record["answer"])
    truth = extract_final_answer(answer)
    if truth is None:
        raise ValueError("its 'answer' has no '#### <number>' final answer")
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question + " " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="prepare_gsm8k.py",
        description=__doc__.split("\n\n", 1)[0],
        epilog=__doc__.split("\n\n", 1)[1].split("\nThe reading and writing helpers")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common_args(parser, default_output="~/data/gsm8k", hub_example="openai/gsm8k")
    parser.add_argument("--hub-config", default="main", help="dataset configuration for --from-hub-cache (default: main)")
    args = parser.parse_args(argv)
    return main_with_errors(
        parser.prog,
        lambda: run(args, required=("question", "answer"), make_row=make_row, hub_config=args.hub_config or None),
    )


if __name__ == "__main__":
    sys.exit(main())
