"""Shared fixtures: a tiny model and a small task data set, built by the tests themselves."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A random 2-layer Qwen2 model (head_dim 64, as vLLM's CPU backend needs) with a char tokenizer."""
    from grpo_dist.tasks.reverse import VOCAB
    from grpo_dist.utils.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_model"), vocab=VOCAB, hidden_size=64, num_layers=2,
                            num_heads=1, num_kv_heads=1, head_dim=64, intermediate_size=128,
                            max_position_embeddings=256, seed=0)


@pytest.fixture(scope="session")
def reverse_data(tmp_path_factory) -> dict[str, Path]:
    """The embedded reverse task's train/test parquet files (verl row format)."""
    from grpo_dist.tasks.reverse import write_data

    return write_data(tmp_path_factory.mktemp("reverse_data"))
