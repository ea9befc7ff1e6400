"""Prompt datasets in verl's row format: loading, tokenisation, collation and the epoch sampler.

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

Errors in the data are reported as one :class:`DataError` that names the file, the row and the
column, so the user can fix the file without reading a traceback.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Iterator, Literal, Sequence

import numpy as np
import torch

logger = logging.getLogger(__name__)

SUPPORTED_EXTENSIONS = (".parquet", ".jsonl", ".json")
TRUNCATION_MODES = ("error", "left", "right", "middle")
Truncation = Literal["error", "left", "right", "middle"]


class DataError(ValueError):
    """A problem with a data file or one of its rows, worded for the user who owns the file."""


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


# ----------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------


def _describe_missing(path: str) -> str:
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


def _read_parquet(path: str) -> tuple[list[dict], list[str]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for unreadable files
        raise DataError(f"{path}: not a readable parquet file ({type(exc).__name__}: {exc})") from None
    return table.to_pylist(), list(table.column_names)


def _read_json_lines(path: str) -> tuple[list[Any], list[int]]:
    """Rows of a .jsonl file (or a .json file holding JSON lines), with their 1-based line numbers."""
    rows, lines = [], []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                # Keep the position of the bad line: the row is reported (or skipped) later.
                rows.append(_BadJson(f"line {line_no} is not valid JSON ({exc.msg} at column {exc.colno})"))
            lines.append(line_no)
    return rows, lines


@dataclass
class _BadJson:
    reason: str


def _read_json(path: str) -> tuple[list[Any], list[int] | None]:
    """A .json file: either one JSON array of rows, or JSON lines (as Hugging Face datasets accepts)."""
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
    return _read_json_lines(path)


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
            raise DataError(f"{path}: file not found; {_describe_missing(path)}")

        line_numbers: list[int] | None = None
        if ext == ".parquet":
            raw_rows, columns = _read_parquet(path)
            required = [prompt_key, "data_source", "reward_model"]
            absent = [c for c in required if c not in columns]
            if absent and raw_rows:
                hint = " (set data.prompt_key to the column that holds the prompt)" if prompt_key in absent else ""
                raise DataError(
                    f"{path}: required column {', '.join(repr(c) for c in absent)} not in the file{hint}; "
                    f"its columns are: {', '.join(columns)}"
                )
        elif ext == ".jsonl":
            raw_rows, line_numbers = _read_json_lines(path)
        else:
            raw_rows, line_numbers = _read_json(path)
            if not isinstance(raw_rows, list):
                raise DataError(f"{path}: a .json file must hold a list of rows or JSON lines")
        if not raw_rows:
            raise DataError(f"{path}: the file holds no rows")

        for i, raw in enumerate(raw_rows):
            where = f"{path}: row {i}" + (f" (line {line_numbers[i]})" if line_numbers else "")
            try:
                if isinstance(raw, _BadJson):
                    raise ValueError(raw.reason)
                row = normalize_row(raw, prompt_key)
            except ValueError as exc:
                message = f"{where}: {exc}"
                if not skip_bad_rows:
                    raise DataError(message + " (or set skip_bad_rows to drop bad rows)") from None
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


# ----------------------------------------------------------------------------------------------
# Tokenisation
# ----------------------------------------------------------------------------------------------


def truncate_ids(ids: list[int], max_length: int, mode: str) -> list[int]:
    """Cut ``ids`` to ``max_length`` as verl does: ``left`` keeps the end, ``right`` keeps the start,
    ``middle`` keeps ``max_length // 2`` from the start and the rest from the end."""
    if len(ids) <= max_length:
        return ids
    if mode == "left":
        return ids[len(ids) - max_length:]
    if mode == "right":
        return ids[:max_length]
    if mode == "middle":
        left = max_length // 2
        right = max_length - left
        return ids[:left] + (ids[len(ids) - right:] if right else [])
    raise ValueError(f"truncation mode {mode!r} cannot cut; expected one of left, right, middle")


def tokenize_prompt(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a prompt.

    With a chat template: the template rendered with ``add_generation_prompt=True`` and encoded
    without extra special tokens (the template carries them; this is what verl does). Without a
    template: the message contents joined by newlines, encoded with the tokenizer's usual special
    tokens (e.g. a base model's BOS).
    """
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(tokenizer.encode(text, add_special_tokens=False))
    text = "\n".join(m["content"] for m in messages)
    return list(tokenizer.encode(text, add_special_tokens=True))


class PromptDataset:
    """Tokenised prompts with what the reward needs, built once at start-up.

    Every prompt is tokenised in the constructor, so an overlong prompt is reported before training
    starts (verl reports it when the row is first drawn). Prompts longer than ``max_prompt_length``:

    - ``filter_overlong_prompts=True``: the row is dropped (counted in ``num_filtered``);
    - otherwise ``truncation`` decides: ``"error"`` raises :class:`DataError` naming the row,
      ``"left"`` / ``"right"`` / ``"middle"`` cut as :func:`truncate_ids` (counted in ``num_truncated``).

    Items (``dataset[i]``) are dicts: ``prompt_ids: list[int]``, ``data_source: str``,
    ``ground_truth``, ``extra_info: dict``, ``index`` (``extra_info["index"]`` when present, as in
    verl, else the row's position in this dataset), ``raw_prompt`` (the messages), ``ability``.
    """

    def __init__(
        self,
        rows: Sequence[dict],
        tokenizer,
        *,
        max_prompt_length: int,
        filter_overlong_prompts: bool,
        truncation: Truncation,
    ):
        if truncation not in TRUNCATION_MODES:
            raise ValueError(f"data.truncation={truncation!r}; expected one of {', '.join(TRUNCATION_MODES)}")
        if max_prompt_length <= 0:
            raise ValueError(f"data.max_prompt_length={max_prompt_length} must be positive")
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length
        self.truncation = truncation
        self.filter_overlong_prompts = filter_overlong_prompts
        origins = getattr(rows, "origins", None)

        self._items: list[dict] = []
        self.num_filtered = 0
        self.num_truncated = 0
        for i, row in enumerate(rows):
            row = normalize_row(row, "prompt")
            ids = tokenize_prompt(tokenizer, row["prompt"])
            if len(ids) > max_prompt_length:
                if filter_overlong_prompts:
                    self.num_filtered += 1
                    continue
                if truncation == "error":
                    where = f"{origins[i][0]}: row {origins[i][1]}" if origins else f"row {i}"
                    raise DataError(
                        f"{where}: the prompt is {len(ids)} tokens, longer than data.max_prompt_length="
                        f"{max_prompt_length}. Raise data.max_prompt_length, set data.filter_overlong_prompts"
                        f"=True to drop such rows, or set data.truncation to left, right or middle."
                    )
                ids = truncate_ids(ids, max_prompt_length, truncation)
                self.num_truncated += 1
            index = row["extra_info"].get("index")
            self._items.append({
                "prompt_ids": ids,
                "data_source": row["data_source"],
                "ground_truth": row["reward_model"]["ground_truth"],
                "extra_info": row["extra_info"],
                "index": index if index is not None else len(self._items),
                "raw_prompt": row["prompt"],
                "ability": row["ability"],
            })
        if self.num_filtered:
            logger.info("dropped %d of %d prompts longer than %d tokens (data.filter_overlong_prompts)",
                        self.num_filtered, len(rows), max_prompt_length)
        if self.num_truncated:
            logger.info("truncated %d prompts to %d tokens (data.truncation=%s)",
                        self.num_truncated, max_prompt_length, truncation)
        if not self._items:
            raise DataError(
                f"all {len(rows)} prompts are longer than data.max_prompt_length={max_prompt_length} "
                f"and were filtered out; raise data.max_prompt_length"
            )

    @classmethod
    def from_files(
        cls,
        paths: str | Sequence[str],
        tokenizer,
        *,
        prompt_key: str,
        max_prompt_length: int,
        filter_overlong_prompts: bool,
        truncation: Truncation,
        skip_bad_rows: bool = False,
    ) -> "PromptDataset":
        rows = load_rows(paths, prompt_key=prompt_key, skip_bad_rows=skip_bad_rows)
        return cls(rows, tokenizer, max_prompt_length=max_prompt_length,
                   filter_overlong_prompts=filter_overlong_prompts, truncation=truncation)

    @property
    def pad_id(self) -> int:
        """The tokenizer's pad id, or its EOS id when it has no pad token (as verl does)."""
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else self.tokenizer.eos_token_id

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i: int) -> dict:
        return dict(self._items[i])


# ----------------------------------------------------------------------------------------------
# Collation
# ----------------------------------------------------------------------------------------------


def collate_prompts(items: Sequence[dict], pad_id: int, max_prompt_length: int) -> dict:
    """Stack dataset items into a left-padded batch of fixed width P = ``max_prompt_length``.

    Returns:
        ``input_ids`` LongTensor [B, P] (pad_id on the left), ``attention_mask`` LongTensor [B, P]
        (1 on tokens), ``position_ids`` LongTensor [B, P] (``cumsum(mask) - 1`` clamped at 0, so
        positions start at 0 on the first real token), and python lists of length B for every other
        field of the items (``prompt_ids`` unpadded, ``data_source``, ``ground_truth``, ...).
    """
    if not items:
        raise ValueError("collate_prompts got an empty batch")
    B, P = len(items), max_prompt_length
    input_ids_BP = torch.full((B, P), pad_id, dtype=torch.long)
    mask_BP = torch.zeros((B, P), dtype=torch.long)
    for b, item in enumerate(items):
        ids = item["prompt_ids"]
        if len(ids) > P:
            raise ValueError(f"item {b} has {len(ids)} prompt tokens, more than max_prompt_length={P}")
        if ids:
            input_ids_BP[b, P - len(ids):] = torch.tensor(ids, dtype=torch.long)
            mask_BP[b, P - len(ids):] = 1
    position_ids_BP = (torch.cumsum(mask_BP, dim=1) - 1).clamp(min=0)
    batch: dict[str, Any] = {"input_ids": input_ids_BP, "attention_mask": mask_BP, "position_ids": position_ids_BP}
    for key in items[0]:
        batch[key] = [item[key] for item in items]
    return batch


# ----------------------------------------------------------------------------------------------
# Sampling
# ----------------------------------------------------------------------------------------------


class EpochSampler:
    """Batches of dataset indices, epoch after epoch, reproducible from ``seed`` and resumable.

    Epoch ``e`` visits a permutation of ``range(num_samples)`` drawn from ``(seed, e)`` (or the
    identity when ``shuffle=False``) in ``steps_per_epoch = num_samples // batch_size`` batches.
    The last ``num_samples % batch_size`` indices of each epoch's order are dropped, as verl's
    dataloader does (``drop_last=True``): every batch has exactly ``batch_size`` prompts, and since
    the order changes each epoch, different rows are left out each time.

    The sampler is an endless iterator; ``next(sampler)`` returns ``list[int]``. ``epoch`` and
    ``step_in_epoch`` always describe the *next* batch: after the last batch of an epoch they move
    to ``(epoch + 1, 0)``. ``state_dict()`` taken after any batch and loaded into a fresh sampler
    continues with exactly the batch the original would have produced next.
    """

    def __init__(self, num_samples: int, batch_size: int, *, seed: int, shuffle: bool):
        if batch_size <= 0:
            raise ValueError(f"data.train_batch_size={batch_size} must be positive")
        if num_samples < batch_size:
            raise ValueError(
                f"the dataset has {num_samples} prompts, fewer than data.train_batch_size={batch_size}: "
                f"no full batch can be formed; lower data.train_batch_size or add data"
            )
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.step_in_epoch = 0
        self._order: np.ndarray | None = None
        self._order_epoch = -1

    @property
    def steps_per_epoch(self) -> int:
        return self.num_samples // self.batch_size

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The order in which epoch ``epoch`` visits the indices (before dropping the tail)."""
        if not self.shuffle:
            return np.arange(self.num_samples)
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)

    def __iter__(self) -> Iterator[list[int]]:
        return self

    def __next__(self) -> list[int]:
        if self._order_epoch != self.epoch:
            self._order = self.epoch_order(self.epoch)
            self._order_epoch = self.epoch
        start = self.step_in_epoch * self.batch_size
        batch = self._order[start:start + self.batch_size].tolist()
        self.step_in_epoch += 1
        if self.step_in_epoch >= self.steps_per_epoch:
            self.epoch += 1
            self.step_in_epoch = 0
        return batch

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "step_in_epoch": self.step_in_epoch,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_samples": self.num_samples,
            "batch_size": self.batch_size,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``. Raises ``ValueError`` if the data or the sampling settings changed
        since it was saved, because the run could then not continue with the same batches."""
        changed = [
            f"{key}: saved {state[key]!r}, now {getattr(self, key)!r}"
            for key in ("seed", "shuffle", "num_samples", "batch_size")
            if key in state and state[key] != getattr(self, key)
        ]
        if changed:
            raise ValueError(
                "cannot resume the data sampler: " + "; ".join(changed)
                + " (num_samples is the dataset size after filtering; keep data files, data.seed, "
                  "data.shuffle, data.train_batch_size and the prompt filter as they were)"
            )
        epoch, step = int(state["epoch"]), int(state["step_in_epoch"])
        if not 0 <= step <= self.steps_per_epoch or epoch < 0:
            raise ValueError(f"sampler state out of range: epoch={epoch}, step_in_epoch={step} "
                             f"(steps_per_epoch={self.steps_per_epoch})")
        if step == self.steps_per_epoch:  # saved at the end of an epoch: the next batch opens the next one
            epoch, step = epoch + 1, 0
        self.epoch, self.step_in_epoch = epoch, step
