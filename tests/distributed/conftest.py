"""Fixtures for the FSDP2 tests (gloo, several processes): a tiny Qwen2 model directory built here."""

from __future__ import annotations

import pytest

from tests.distributed._dist_helpers import build_tiny_model


@pytest.fixture(scope="session")
def fsdp_model_dir(tmp_path_factory: pytest.TempPathFactory):
    """A 2-layer Qwen2 (vocab 64, hidden 64, head_dim 64) + a word-level tokenizer, via save_pretrained."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen2"))
