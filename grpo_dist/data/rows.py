"""Rows in verl's format: checking and normalising them, and loading them from data files.

A row (one line of jsonl, one row of parquet) looks like verl's::

    {
        "data_source": "openai/gsm8k",                       # str, picks the reward scorer
        "prompt": [{"role": "user", "content": "..."}],      # chat messages, or a plain string
        "ability": "math",                                   # optional
        "reward_model": {"style": "rule", "ground_truth": "72"},
        "extra_info": {"split": "train", "index": 0},        # optional
    }

The prompt column's name is configurable (``data.prompt_key``). After loading, every row is
*normalised*: its messages are under ``"prompt"`` whatever the column was called, ``extra_info``
is a dict (``{}`` when absent) and ``ability`` is a str or None. Other columns are kept as they are.

Errors in the data are reported as one :class:`~grpo_dist.data.readers.DataError` that names the
file, the row and the column, so the user can fix the file without reading a traceback.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Sequence

import numpy as np

from grpo_dist.data.readers import BadJson, DataError, read_file

logger = logging.getLogger(__name__)


class Rows(list):
    """The rows of one or several data files: a plain ``list[dict]`` with bookkeeping attached.

    Attributes:
        origins: ``(file, row index in that file)`` for each row, used to name rows in later errors.
        num_skipped: rows dropped because they were malformed (only with ``skip_bad_rows=True``).
        skipped_reasons: one line per skipped row, saying why.
    """

    def __init__(self, rows=(), origins=(), skipped_reasons=()):
        super().__init__(rows)
        self.origins: list[tuple[str, int]] = list(origins)
        self.skipped_reasons: list[str] = list(skipped_reasons)

    @property
    def num_skipped(self) -> int:
        return len(self.skipped_reasons)


def normalize_messages(prompt: Any) -> list[dict]:
    """Chat messages from a prompt cell: a list of ``{role, content}`` dicts, or a plain string.

    A string becomes one user message. Keys whose value is None (parquet fills absent struct
    fields with None) are dropped. Raises ``ValueError`` with the reason when malformed.
    """
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, np.ndarray):  # pandas-written parquet read elsewhere may give arrays
        prompt = prompt.tolist()
    if not isinstance(prompt, (list, tuple)):
        raise ValueError(
            f"must be a list of {{'role', 'content'}} messages or a string, got {type(prompt).__name__}"
        )
    if not prompt:
        raise ValueError("is an empty list of messages")
    messages = []
    for j, message in enumerate(prompt):
        if not isinstance(message, dict):
            raise ValueError(f"message {j} must be a dict with 'role' and 'content', got {type(message).__name__}")
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                got = "missing" if message.get(key) is None else type(message[key]).__name__
                raise ValueError(f"message {j} needs a string '{key}' ({got})")
        messages.append({k: v for k, v in message.items() if v is not None})
    return messages


def normalize_row(row: Any, prompt_key: str = "prompt") -> dict:
    """One row in canonical form; raises ``ValueError("column 'x' ...")`` when it is malformed.

    Required: ``prompt_key``, ``data_source`` (non-empty str), ``reward_model.ground_truth``
    (any non-null value; verl passes it to the scorer as it is). ``extra_info`` must be a dict
    when present. The messages end up under ``"prompt"``.
    """
    if not isinstance(row, dict):
        raise ValueError(f"row must be a JSON object (dict), got {type(row).__name__}")
    if row.get(prompt_key) is None:
        hint = " (set data.prompt_key to the column that holds the prompt)" if prompt_key not in row else ""
        raise ValueError(f"column '{prompt_key}' is missing or null{hint}")
    try:
        messages = normalize_messages(row[prompt_key])
    except ValueError as exc:
        raise ValueError(f"column '{prompt_key}' {exc}") from None
    data_source = row.get("data_source")
    if not isinstance(data_source, str) or not data_source:
        raise ValueError(f"column 'data_source' must be a non-empty string, got {data_source!r}")
    reward_model = row.get("reward_model")
    if not isinstance(reward_model, dict):
        raise ValueError(
            f"column 'reward_model' must be a dict like {{'style': 'rule', 'ground_truth': ...}}, "
            f"got {type(reward_model).__name__}"
        )
    if reward_model.get("ground_truth") is None:
        raise ValueError("column 'reward_model.ground_truth' is missing or null")
    extra_info = row.get("extra_info")
    if extra_info is None:
        extra_info = {}
    if not isinstance(extra_info, dict):
        raise ValueError(f"column 'extra_info' must be a dict when present, got {type(extra_info).__name__}")
    ability = row.get("ability")
    if ability is not None and not isinstance(ability, str):
        raise ValueError(f"column 'ability' must be a string when present, got {type(ability).__name__}")

    out = {k: v for k, v in row.items() if k != prompt_key}
    out.update(prompt=messages, data_source=data_source, ability=ability, reward_model=reward_model,
               extra_info=extra_info)
    return out


def load_rows(
    paths: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    prompt_key: str = "prompt",
    skip_bad_rows: bool = False,
) -> Rows:
    """Read and validate verl-format rows from .parquet / .jsonl / .json files, concatenated in order.

    File-level problems always raise :class:`DataError` (missing file, unsupported extension, empty
    file, a required column absent from a parquet schema). A malformed row raises too, naming the
    file, the row index (0-based, within that file; jsonl also gives the line) and the column -
    unless ``skip_bad_rows`` is set, in which case it is dropped, counted in ``Rows.num_skipped`` and
    summarised in one warning. If no row survives, that raises.

    Returns: a :class:`Rows` (a ``list[dict]`` of normalised rows, see :func:`normalize_row`).
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise DataError("no data files given (data.train_files / data.val_files is empty)")

    result = Rows()
    for path in paths:
        raw = read_file(path)
        if raw.columns is not None:
            required = [prompt_key, "data_source", "reward_model"]
            absent = [c for c in required if c not in raw.columns]
            if absent:
                hint = " (set data.prompt_key to the column that holds the prompt)" if prompt_key in absent else ""
                raise DataError(
                    f"{path}: required column {', '.join(repr(c) for c in absent)} not in the file{hint}; "
                    f"its columns are: {', '.join(raw.columns)}"
                )

        for i, record in enumerate(raw.records):
            where = f"{path}: row {i}" + (f" (line {raw.line_numbers[i]})" if raw.line_numbers else "")
            try:
                if isinstance(record, BadJson):
                    raise ValueError(record.reason)
                row = normalize_row(record, prompt_key)
            except ValueError as exc:
                message = f"{where}: {exc}"
                if not skip_bad_rows:
                    raise DataError(message + " (or set data.skip_bad_rows=true to drop bad rows and count them)") from None
                result.skipped_reasons.append(message)
                continue
            result.append(row)
            result.origins.append((path, i))

    if result.num_skipped:
        logger.warning(
            "skipped %d malformed row(s) of %d in %s; first: %s",
            result.num_skipped, result.num_skipped + len(result), ", ".join(paths), result.skipped_reasons[0],
        )
    if not result:
        raise DataError(
            f"no valid rows in {', '.join(paths)}: all {result.num_skipped} rows are malformed; "
            f"first: {result.skipped_reasons[0] if result.skipped_reasons else '-'}"
        )
    return result
