"""Build a tiny, randomly initialised Qwen2-architecture causal LM and a character-level tokenizer.

No model can be downloaded on the project's machines, so tests, examples and benchmarks build their
own model directory with :func:`build_tiny_model`. The directory is written with ``save_pretrained``
and loads through the real code paths:

- ``transformers.AutoModelForCausalLM.from_pretrained(dir)`` and ``AutoTokenizer.from_pretrained(dir)``
- ``vllm.LLM(model=dir)``

Tokenizer: one token per character. It is Qwen2's own tokenizer class (a byte-level BPE) with a
vocabulary of single bytes and no merges, so every ASCII character is one token. It has to be
Qwen2's class: for ``model_type == "qwen2"`` transformers 5 ignores ``tokenizer_class`` in
``tokenizer_config.json`` and rebuilds the tokenizer as ``Qwen2Tokenizer`` (byte-level
pre-tokenizer), which would silently drop spaces and newlines from a WordLevel vocabulary. The
vocabulary is the special tokens (see :data:`SPECIAL_TOKENS`) followed by the characters of
``vocab`` (printable ASCII by default), so ``decode(encode(s)) == s`` for every string made of those
characters, spaces, tabs and newlines included. A character outside the vocabulary is dropped by
``encode`` (Qwen2's BPE has no unknown token).
Optional ``extra_tokens`` (e.g. ``<tool_call>``) follow the characters as
added, non-special tokens: one id each, kept by ``decode(..., skip_special_tokens=True)``.

End of sequence: the tokenizer's ``eos_token`` is ``<|endoftext|>``; ``generation_config.json`` lists
``[<|im_end|>, <|endoftext|>]`` as ``eos_token_id`` so that Hugging Face ``generate`` and vLLM both stop
on either (a chat turn ends with ``<|im_end|>``).
"""

from __future__ import annotations

import string
from pathlib import Path

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|endoftext|>"
IM_START_TOKEN = "<|im_start|>"
IM_END_TOKEN = "<|im_end|>"
#: Special tokens, in id order: ``<|pad|>`` = 0, ``<|endoftext|>`` = 1, ``<|im_start|>`` = 2,
#: ``<|im_end|>`` = 3.
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, EOS_TOKEN, IM_START_TOKEN, IM_END_TOKEN)

#: Head sizes that vLLM 0.32's CPU attention backend accepts (``CPUAttentionBackend.get_supported_head_sizes``).
VLLM_CPU_HEAD_DIMS: tuple[int, ...] = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)

#: ChatML, as Qwen2 uses it: ``<|im_start|>{role}\n{content}<|im_end|>\n`` per message, and
#: ``<|im_start|>assistant\n`` when a generation prompt is asked for.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def default_vocab() -> list[str]:
    """The 100 printable ASCII characters (``string.printable``: letters, digits, punctuation, whitespace)."""
    return list(string.printable)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable-unicode map used by byte-level BPE (space -> 'Ġ', newline -> 'Ċ')."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + shifted)
            shifted += 1
    return mapping


def _build_tokenizer(chars: list[str], extra_tokens: tuple[str, ...] = (), chat_template: str = CHATML_TEMPLATE):
    """A ``Qwen2Tokenizer`` (a ``PreTrainedTokenizerFast``) over ``SPECIAL_TOKENS + chars``, one token per character,
    then ``extra_tokens`` as added (not special) tokens."""
    from transformers import Qwen2Tokenizer

    byte_to_symbol = _bytes_to_unicode()
    token_to_id = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in chars:
        token_to_id[byte_to_symbol[ord(ch)]] = len(token_to_id)
    tokenizer = Qwen2Tokenizer(
        vocab=token_to_id,
        merges=[],
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=None,
        extra_special_tokens=[IM_START_TOKEN, IM_END_TOKEN],
        chat_template=chat_template,
        clean_up_tokenization_spaces=False,
    )
    if extra_tokens:
        tokenizer.add_tokens(list(extra_tokens))
    return tokenizer


def build_tiny_model(
    out_dir: str | Path,
    *,
    vocab: list[str] | None = None,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 1,
    num_kv_heads: int = 1,
    head_dim: int = 64,
    intermediate_size: int = 128,
    max_position_embeddings: int = 512,
    seed: int = 0,
    extra_tokens: tuple[str, ...] = (),
    chat_template: str = CHATML_TEMPLATE,
) -> Path:
    """Write a random Qwen2ForCausalLM (float32, untied embeddings) and its tokenizer to ``out_dir``.

    Args:
        out_dir: directory to write (created if needed; files in it are overwritten).
        vocab: the characters of the tokenizer, each a one-character ASCII string, no duplicates;
            default :func:`default_vocab` (printable ASCII). The model's ``vocab_size`` is
            ``len(SPECIAL_TOKENS) + len(vocab) + len(extra_tokens)``.
        hidden_size, num_layers, num_heads, num_kv_heads, head_dim, intermediate_size,
        max_position_embeddings: the Qwen2 shape. ``head_dim`` must be one that vLLM's CPU
            attention supports (:data:`VLLM_CPU_HEAD_DIMS`; 16 is refused), and ``num_heads`` a multiple of
            ``num_kv_heads``.
        seed: seed of the random initialisation; the same arguments give the same weights.
        extra_tokens: multi-character strings that become one token each (ids after the characters, in
            order), as added tokens that are not special: ``decode(..., skip_special_tokens=True)`` keeps
            them (e.g. ``<tool_call>``, which a tool-call parser reads from the decoded text). The model's
            ``vocab_size`` grows by ``len(extra_tokens)``.
        chat_template: the tokenizer's Jinja chat template; default :data:`CHATML_TEMPLATE`.

    Returns:
        ``Path(out_dir)``.

    With the defaults the model has about 0.1 M parameters and writes in well under a second.
    """
    chars = default_vocab() if vocab is None else list(vocab)
    bad = [c for c in chars if not isinstance(c, str) or len(c) != 1 or ord(c) > 127]
    if bad:
        raise ValueError(f"vocab must hold one-character ASCII strings; got {bad[:5]!r}")
    if len(set(chars)) != len(chars):
        raise ValueError("vocab has duplicate characters")
    if not chars:
        raise ValueError("vocab is empty")
    extra = tuple(extra_tokens)
    bad_extra = [t for t in extra if not isinstance(t, str) or len(t) < 2 or t in SPECIAL_TOKENS]
    if bad_extra or len(set(extra)) != len(extra):
        raise ValueError(f"extra_tokens must be distinct strings of two or more characters, none of them one of "
                         f"{SPECIAL_TOKENS}; got {list(extra)!r}")
    for name, value in {
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "num_heads": num_heads,
        "num_kv_heads": num_kv_heads,
        "head_dim": head_dim,
        "intermediate_size": intermediate_size,
        "max_position_embeddings": max_position_embeddings,
    }.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if num_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
        )
    if head_dim not in VLLM_CPU_HEAD_DIMS:
        raise ValueError(
            f"head_dim={head_dim} is not supported by vLLM's CPU attention; "
            f"use one of {VLLM_CPU_HEAD_DIMS}"
        )

    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = _build_tokenizer(chars, extra, chat_template)
    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    im_end_id = tokenizer.convert_tokens_to_ids(IM_END_TOKEN)
    vocab_size = len(SPECIAL_TOKENS) + len(chars) + len(extra)
    assert len(tokenizer) == vocab_size, (len(tokenizer), vocab_size)

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=False,
        pad_token_id=pad_id,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        dtype="float32",
        use_cache=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)  # Qwen2's init: matrices N(0, 0.02)
        # With N(0, 0.02) the output layer gives logits of std ~0.16: a near-uniform next-token
        # distribution. Std 2/sqrt(hidden) gives logits of std ~2: peaked enough that greedy
        # decoding is not decided by float rounding, spread enough that sampling varies.
        with torch.no_grad():
            model.lm_head.weight.normal_(0.0, 2.0 / hidden_size**0.5)
    model.generation_config = GenerationConfig(
        eos_token_id=[im_end_id, eos_id],
        pad_token_id=pad_id,
        bos_token_id=eos_id,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
