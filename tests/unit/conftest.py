"""Shared fixtures for the unit tests: a tiny character-level tokenizer built in memory (no network)."""

import os
import string

import pytest
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"]

if os.environ.get("PYTEST_XDIST_WORKER"):
    # scripts/test.sh runs this tier on several processes (pytest-xdist): each gets its share of the
    # cores for torch's intra-op threads, not all of them (two processes with two threads each on two
    # cores spin-wait for each other)
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))


def build_char_tokenizer(chat_template: str | None = CHATML_TEMPLATE) -> PreTrainedTokenizerFast:
    """One token per character of printable ASCII, plus ChatML special tokens (each one token).

    Ids: the special tokens first (<pad>=0, <unk>=1, <|im_start|>=2, <|im_end|>=3), then the
    characters in ``string.printable`` order, so ``tok.convert_tokens_to_ids(c)`` gives a char's id.
    """
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    for ch in string.printable:
        vocab.setdefault(ch, len(vocab))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        unk_token="<unk>",
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
    )
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


@pytest.fixture(scope="session")
def char_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer with a ChatML-like chat template."""
    return build_char_tokenizer()


@pytest.fixture(scope="session")
def plain_char_tokenizer() -> PreTrainedTokenizerFast:
    """The same tokenizer without a chat template."""
    return build_char_tokenizer(chat_template=None)
