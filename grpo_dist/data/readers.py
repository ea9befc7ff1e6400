"""Reading data files: .parquet, .jsonl and .json, into raw records, with errors worded for the user.

This module knows file formats, not the row format (that is :mod:`grpo_dist.data.rows`). A problem
with a file (missing, a folder, an unsupported extension, unreadable, empty) is one
:class:`DataError` that names the file and, for a missing one, what exists near it.
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass
from typing import Any

SUPPORTED_EXTENSIONS = (".parquet", ".jsonl", ".json")


class DataError(ValueError):
    """A problem with a data file or one of its rows, worded for the user who owns the file."""


def as_path_list(value: Any) -> list[str]:
    """A configured path or list of paths (``data.train_files``, ...) as a list of strings: None -> [],
    a list or tuple -> one string per item, anything else -> ``[str(value)]``."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [str(value)]


def describe_missing(path: str) -> str:
    """Say what exists near a path that does not: its folder's data files, or the nearest folder."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        ancestor = folder
        while ancestor and not os.path.isdir(ancestor):
            parent = os.path.dirname(ancestor)
            if parent == ancestor:
                break
            ancestor = parent
        return f"its folder {folder} does not exist either (nearest existing folder: {ancestor})"
    names = sorted(os.listdir(folder))
    data_files = [n for n in names if n.endswith(SUPPORTED_EXTENSIONS)]
    close = difflib.get_close_matches(os.path.basename(path), names, n=3)
    parts = []
    if close:
        parts.append(f"did you mean {', '.join(close)}?")
    if data_files:
        shown = ", ".join(data_files[:10]) + (" ..." if len(data_files) > 10 else "")
        parts.append(f"data files in {folder}: {shown}")
    else:
        parts.append(f"{folder} holds no {'/'.join(SUPPORTED_EXTENSIONS)} files")
    return "; ".join(parts)


@dataclass
class BadJson:
    """A line of a JSON-lines file that does not parse; kept in place so the row can be named later."""

    reason: str


@dataclass
class RawFile:
    """The records of one data file, before any check of their contents.

    Attributes:
        path: the file.
        records: one item per row: a dict for a well-formed row; anything JSON holds for a
            malformed one; a :class:`BadJson` for a JSON line that does not parse.
        columns: the parquet schema's column names; None for JSON files.
        line_numbers: for JSON lines, the 1-based line of each record; None otherwise.
    """

    path: str
    records: list[Any]
    columns: list[str] | None
    line_numbers: list[int] | None


def read_file(path: str) -> RawFile:
    """Read one .parquet / .jsonl / .json file. :class:`DataError` when it is a folder, has an
    unsupported extension, does not exist, cannot be read, or holds no rows."""
    ext = os.path.splitext(path)[1].lower()
    if os.path.isdir(path):
        inside = sorted(n for n in os.listdir(path) if n.endswith(SUPPORTED_EXTENSIONS))
        raise DataError(f"{path}: is a folder, not a data file; name the files in it "
                        f"({', '.join(inside[:10]) or f'it holds no {SUPPORTED_EXTENSIONS} files'})")
    if ext not in SUPPORTED_EXTENSIONS:
        raise DataError(
            f"{path}: unsupported file extension {ext or '(none)'!r}; "
            f"valid extensions are {', '.join(SUPPORTED_EXTENSIONS)}"
        )
    if not os.path.isfile(path):
        raise DataError(f"{path}: file not found; {describe_missing(path)}")

    columns: list[str] | None = None
    line_numbers: list[int] | None = None
    if ext == ".parquet":
        records, columns = read_parquet(path)
    elif ext == ".jsonl":
        records, line_numbers = read_json_lines(path)
    else:
        records, line_numbers = read_json(path)
        if not isinstance(records, list):
            raise DataError(f"{path}: a .json file must hold a list of rows or JSON lines")
    if not records:
        raise DataError(f"{path}: the file holds no rows")
    return RawFile(path=path, records=records, columns=columns, line_numbers=line_numbers)


def read_parquet(path: str) -> tuple[list[dict], list[str]]:
    """The rows of a parquet file as dicts, and its column names."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for unreadable files
        raise DataError(f"{path}: not a readable parquet file ({type(exc).__name__}: {exc})") from None
    return table.to_pylist(), list(table.column_names)


def read_json_lines(path: str) -> tuple[list[Any], list[int]]:
    """Rows of a .jsonl file (or a .json file holding JSON lines), with their 1-based line numbers.
    Blank lines are skipped; a line that does not parse becomes a :class:`BadJson`."""
    rows, lines = [], []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                # Keep the position of the bad line: the row is reported (or skipped) later.
                rows.append(BadJson(f"line {line_no} is not valid JSON ({exc.msg} at column {exc.colno})"))
            lines.append(line_no)
    return rows, lines


def read_json(path: str) -> tuple[Any, list[int] | None]:
    """A .json file: either one JSON value (a list of rows, when well-formed; no line numbers), or
    JSON lines (as Hugging Face datasets accepts)."""
    with open(path, encoding="utf-8") as f:
        head = f.read(4096).lstrip()
    if head.startswith("["):
        with open(path, encoding="utf-8") as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as exc:
                raise DataError(
                    f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
                ) from None
        return data, None
    return read_json_lines(path)
