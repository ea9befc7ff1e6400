"""Prompt datasets in verl's row format (parquet / jsonl), tokenisation, collation and sampling."""

from grpo_dist.data.dataset import (
    DataError,
    EpochSampler,
    PromptDataset,
    Rows,
    collate_prompts,
    load_rows,
    normalize_messages,
    normalize_row,
    tokenize_prompt,
    truncate_ids,
)

__all__ = [
    "DataError",
    "EpochSampler",
    "PromptDataset",
    "Rows",
    "collate_prompts",
    "load_rows",
    "normalize_messages",
    "normalize_row",
    "tokenize_prompt",
    "truncate_ids",
]
