"""The prompt dataset: rows tokenised into prompts (with truncation of overlong ones), and collation
into a left-padded batch.

Rows come from :func:`~grpo_dist.data.rows.load_rows` (verl's row format); files are read by
:mod:`grpo_dist.data.readers`; batches of indices are drawn by :class:`~grpo_dist.data.sampler.EpochSampler`.
"""

from __future__ import annotations

import logging
from typing import Any, Literal, Sequence, get_args

import numpy as np

from grpo_dist.data.readers import DataError
from grpo_dist.data.rows import Rows, load_rows, normalize_row

logger = logging.getLogger(__name__)

#: How an overlong prompt is handled (``data.truncation``): refused, or cut keeping its end, its
#: start, or both ends.
Truncation = Literal["error", "left", "right", "middle"]
TRUNCATION_MODES: tuple[str, ...] = get_args(Truncation)


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


def tokenize_prompt(tokenizer, messages: list[dict], chat_template_kwargs: dict | None = None) -> list[int]:
    """Token ids of a prompt.

    With a chat template: the template rendered with ``add_generation_prompt=True`` (and
    ``chat_template_kwargs``, verl's ``data.apply_chat_template_kwargs``, e.g. ``enable_thinking``) and
    encoded without extra special tokens (the template carries them; this is what verl does). Without
    a template: the message contents joined by newlines, encoded with the tokenizer's usual special
    tokens (e.g. a base model's BOS).
    """
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                             **(chat_template_kwargs or {}))
        return list(tokenizer.encode(text, add_special_tokens=False))
    text = "\n".join(m["content"] for m in messages)
    return list(tokenizer.encode(text, add_special_tokens=True))


def select_rows(rows: Rows, max_samples: int, *, seed: int | None, randomly: bool) -> Rows:
    """At most ``max_samples`` of ``rows`` (all when ``max_samples <= 0``): without replacement from
    ``numpy.random.default_rng(seed)`` when ``randomly`` (a fresh choice when ``seed`` is None), else
    the first ``max_samples``; in the order chosen, keeping each row's origin."""
    if max_samples <= 0 or max_samples >= len(rows):
        return rows
    index = (np.random.default_rng(seed).choice(len(rows), size=max_samples, replace=False).tolist() if randomly
             else list(range(max_samples)))
    origins = getattr(rows, "origins", None)
    return Rows([rows[i] for i in index], [origins[i] for i in index] if origins else (),
                getattr(rows, "skipped_reasons", ()))


class PromptDataset:
    """Tokenised prompts with what the reward needs, built once at start-up.

    Every prompt is tokenised in the constructor, so an overlong prompt is reported before training
    starts (verl reports it when the row is first drawn). Prompts longer than ``max_prompt_length``:

    - ``filter_overlong_prompts=True``: the row is dropped (counted in ``num_filtered``);
    - otherwise ``truncation`` decides: ``"error"`` raises :class:`DataError` naming the row,
      ``"left"`` / ``"right"`` / ``"middle"`` cut as :func:`truncate_ids` (counted in ``num_truncated``).

    Items (``dataset[i]``) are dicts: ``prompt_ids: list[int]``, ``data_source: str``, ``reward_source``
    (the row's ``reward_fn_key`` column, which the reward function gets as its data_source),
    ``ground_truth``, ``extra_info: dict``, ``index`` (``extra_info["index"]`` when present, as in
    verl, else the row's position in this dataset), ``raw_prompt`` (the messages), ``ability``,
    ``agent_name`` (the row's agent loop in ``rollout.mode=async``; None: the default loop).
    """

    def __init__(
        self,
        rows: Sequence[dict],
        tokenizer,
        *,
        max_prompt_length: int,
        filter_overlong_prompts: bool,
        truncation: Truncation,
        reward_fn_key: str = "data_source",
        chat_template_kwargs: dict | None = None,
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
            reward_source = row.get(reward_fn_key)
            if not isinstance(reward_source, str) or not reward_source:
                where = f"{origins[i][0]}: row {origins[i][1]}" if origins else f"row {i}"
                raise DataError(f"{where}: column '{reward_fn_key}' (data.reward_fn_key: the data_source handed to the "
                                f"reward function) must be a non-empty string, got {reward_source!r}")
            ids = tokenize_prompt(tokenizer, row["prompt"], chat_template_kwargs)
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
                "reward_source": reward_source,
                "ground_truth": row["reward_model"]["ground_truth"],
                "extra_info": row["extra_info"],
                "index": index if index is not None else len(self._items),
                "raw_prompt": row["prompt"],
                "ability": row["ability"],
                "agent_name": _agent_name(row, i, origins),
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
        reward_fn_key: str = "data_source",
        chat_template_kwargs: dict | None = None,
        max_samples: int = -1,
        sample_seed: int | None = None,
        sample_randomly: bool = False,
        key: str | None = None,
    ) -> "PromptDataset":
        """The prompts of ``paths``; with ``max_samples > 0`` at most that many rows (verl's
        ``data.train_max_samples`` / ``val_max_samples``): a random choice seeded by ``sample_seed``
        when ``sample_randomly`` (verl: when the data is shuffled), else the first ones, taken before
        long prompts are filtered. ``key``: the configuration key the paths came from
        (``data.train_files`` / ``data.val_files``); a :class:`DataError` then starts with it, so a
        user with the same file format in both knows which list holds the bad file."""
        try:
            rows = select_rows(load_rows(paths, prompt_key=prompt_key, skip_bad_rows=skip_bad_rows), max_samples,
                               seed=sample_seed, randomly=sample_randomly)
            return cls(rows, tokenizer, max_prompt_length=max_prompt_length,
                       filter_overlong_prompts=filter_overlong_prompts, truncation=truncation,
                       reward_fn_key=reward_fn_key, chat_template_kwargs=chat_template_kwargs)
        except DataError as exc:
            if key is None or str(exc).startswith(key):
                raise
            raise DataError(f"{key}: {exc}") from None

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


def _agent_name(row: dict, i: int, origins: Any) -> str | None:
    name = row.get("agent_name")
    if name is None or (isinstance(name, str) and name):
        return name
    where = f"{origins[i][0]}: row {origins[i][1]}" if origins else f"row {i}"
    raise DataError(f"{where}: column 'agent_name' must be an agent loop's name (a non-empty string) or null, got {name!r}")


def collate_prompts(items: Sequence[dict], pad_id: int, max_prompt_length: int) -> dict:
    """Stack dataset items into a left-padded batch of fixed width P = ``max_prompt_length``.

    Returns:
        ``input_ids`` LongTensor [B, P] (pad_id on the left), ``attention_mask`` LongTensor [B, P]
        (1 on tokens), ``position_ids`` LongTensor [B, P] (``cumsum(mask) - 1`` clamped at 0, so
        positions start at 0 on the first real token), and python lists of length B for every other
        field of the items (``prompt_ids`` unpadded, ``data_source``, ``ground_truth``, ...).
    """
    import torch  # here, not at the top: the configuration reads this package's names without torch

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
