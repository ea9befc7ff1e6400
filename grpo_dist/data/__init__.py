"""Prompt datasets in verl's row format (parquet / jsonl), tokenisation, collation and sampling.

Modules: :mod:`~grpo_dist.data.readers` (data files -> raw records; paths), :mod:`~grpo_dist.data.rows`
(verl's row format: checks, normalisation, ``load_rows``), :mod:`~grpo_dist.data.dataset` (tokenised
prompts, truncation, collation) and :mod:`~grpo_dist.data.sampler` (batches of indices per epoch).
"""

from grpo_dist.data.dataset import (
    TRUNCATION_MODES,
    PromptDataset,
    collate_prompts,
    tokenize_prompt,
    truncate_ids,
)
from grpo_dist.data.readers import SUPPORTED_EXTENSIONS, DataError, as_path_list
from grpo_dist.data.rows import Rows, load_rows, normalize_messages, normalize_row
from grpo_dist.data.sampler import EpochSampler

__all__ = [
    "SUPPORTED_EXTENSIONS",
    "TRUNCATION_MODES",
    "DataError",
    "EpochSampler",
    "PromptDataset",
    "Rows",
    "as_path_list",
    "collate_prompts",
    "load_rows",
    "normalize_messages",
    "normalize_row",
    "tokenize_prompt",
    "truncate_ids",
]
