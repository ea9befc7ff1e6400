"""Decoding responses for rule rewards without importing transformers.

The reward worker only turns token ids into text. Loading the tokenizer with transformers'
``AutoTokenizer`` costs that process the import of transformers, torch's compiler and distributed
tensor modules among it (7.7 s of CPU at start-up on 2 cores, taken from the rollout worker that
imports vLLM beside it). A fast tokenizer's decoding is done by the ``tokenizers`` library; this
module decodes with that library alone, from the tokenizer transformers built.

:func:`decoder_spec` runs where the transformers tokenizer is already loaded (the driver): it returns
the tokenizer's backend as transformers built it (``backend_tokenizer.to_str()``: transformers 5
rebuilds some tokenizers by model type instead of reading ``tokenizer.json`` as it is, so the file on
disk is not enough) and whether transformers would clean up spaces after decoding, or None when the
tokenizer decodes some other way (a slow tokenizer, a class of its own or remote code that overrides
decoding): the reward worker then loads it with transformers as before.
:class:`FastDecoder` rebuilds the backend from that spec and decodes exactly as transformers'
``batch_decode(ids, skip_special_tokens=True)`` does.
"""

from __future__ import annotations

from typing import Any, Sequence


def _same_function(cls: type, base: type, name: str) -> bool:
    return getattr(cls, name, None) is getattr(base, name, None)


def decoder_spec(tokenizer: Any) -> dict[str, Any] | None:
    """What :class:`FastDecoder` needs to decode as ``tokenizer`` (a transformers tokenizer) does, or
    None when its decoding is not the ``tokenizers`` backend's alone (then load it with transformers)."""
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # another transformers layout: keep its own decoding
        return None
    cls = type(tokenizer)
    if not isinstance(tokenizer, TokenizersBackend):
        return None
    if not (_same_function(cls, TokenizersBackend, "_decode") and _same_function(cls, PreTrainedTokenizerBase, "decode")
            and _same_function(cls, PreTrainedTokenizerBase, "batch_decode")
            and _same_function(cls, PreTrainedTokenizerBase, "clean_up_tokenization")):
        return None
    backend = tokenizer.backend_tokenizer
    # transformers' TokenizersBackend._decode: clean up spaces when the tokenizer says so, except for BPE
    # models unless explicitly forced
    clean_up = bool(tokenizer.clean_up_tokenization_spaces)
    if clean_up and type(backend.model).__name__ == "BPE":
        clean_up = bool(getattr(tokenizer, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output",
                                False))
    return {"tokenizer_json": backend.to_str(), "clean_up_tokenization_spaces": clean_up}


def clean_up_tokenization(text: str) -> str:
    """Spaces before punctuation and English contractions removed (transformers' clean-up, which
    WordPiece tokenizers ask for)."""
    return (text.replace(" .", ".").replace(" ?", "?").replace(" !", "!").replace(" ,", ",").replace(" ' ", "'")
            .replace(" n't", "n't").replace(" 'm", "'m").replace(" 's", "'s").replace(" 've", "'ve")
            .replace(" 're", "'re"))


class FastDecoder:
    """Decodes token ids with the ``tokenizers`` library, as the transformers tokenizer that
    :func:`decoder_spec` described does (the same texts)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_str(spec["tokenizer_json"])
        self._clean_up = bool(spec["clean_up_tokenization_spaces"])

    def batch_decode(self, ids_B: Sequence[Sequence[int]], skip_special_tokens: bool = False) -> list[str]:
        """One text per sequence of ids (transformers' ``batch_decode`` with its default clean-up)."""
        texts = [self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens) for ids in ids_B]
        return [clean_up_tokenization(t) for t in texts] if self._clean_up else texts
