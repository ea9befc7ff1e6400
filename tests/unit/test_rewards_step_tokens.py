"""Step ends in tokens on real tokenizers: each step's reward lands on the token that completes the step's
last character, as decoding every prefix of the response tells, with non-ASCII text (accents, CJK, emoji)
that the tokenizers split into bytes.

Tokenizers: a SentencePiece-style one (Llama's layout: metaspace "▁", byte fallback <0xNN>, the decoder
that strips the first leading space), with and without the decoder's clean-up of spaces; a byte-level BPE
(Qwen2's class, as the tiny test model has) whose merges end tokens inside multi-byte characters; and the
real SmolLM2 tokenizer where the model is already on this machine (tests/e2e/test_smollm2.py checks it
wherever the model can be obtained).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from grpo_dist.rewards.manager import RewardScorer
from grpo_dist.rewards.rewarder import BatchRewarder
from grpo_dist.rewards.tokens import step_char_ends, step_end_tokens

#: Responses of a few lines (steps): accents, the euro sign (3 bytes), CJK (3 bytes), emoji (4 bytes), spaces
#: before punctuation (which a clean-up removes), an empty line, a response without a final newline.
TEXTS = [
    "Le café coûte 3 € .\nÉtape 二: 😀 ok , fini !\nnaïve",
    "Step one: twelve plus thirty five\nthen check : 47 .\n",
    "二三 😀😀\n\nçà et là, déjà vu\n",
    "über straße ñandú ☃ 🚀 done",
]
#: What the SentencePiece-style tokenizer is trained on: no newline, CJK or emoji (those fall back to bytes).
TRAINING = ["The café serves crème brûlée and a naïve soufflé.", "Step one: add the numbers, then check them .",
            "We compute the sum of twelve and thirty five.", "Il a dit : c'est déjà fini !", "ça et là, l'été"]


def sentencepiece_tokenizer(clean_up: bool):
    """A Llama-layout tokenizer: BPE over "▁"-joined text with <0x00>..<0xFF> byte fallback, the decoder
    Replace("▁", " ") + ByteFallback + Fuse + Strip(one leading space); ``clean_up`` forces transformers'
    clean-up of spaces before punctuation, which it otherwise leaves off for BPE."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.normalizer = normalizer
    trained.train_from_iterator(TRAINING, trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                                               show_progress=False))
    model = json.loads(trained.to_str())["model"]
    vocab = {t: i for i, t in enumerate(specials + [f"<0x{b:02X}>" for b in range(256)])}
    for piece in sorted(model["vocab"], key=model["vocab"].get):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizer
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    extra = {"clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output": True} if clean_up else {}
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   clean_up_tokenization_spaces=clean_up, **extra)


def byte_level_tokenizer():
    """Qwen2's byte-level BPE over all 256 bytes with merges that end tokens inside multi-byte characters
    ("f" + the first byte of "é", the first two bytes of "二" and of "😀")."""
    from transformers import Qwen2Tokenizer

    from grpo_dist.utils.tiny_model import EOS_TOKEN, IM_END_TOKEN, IM_START_TOKEN, PAD_TOKEN, SPECIAL_TOKENS, _bytes_to_unicode

    symbol = _bytes_to_unicode()
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for b in range(256):
        vocab[symbol[b]] = len(vocab)
    as_symbols = lambda s: "".join(symbol[b] for b in s.encode())  # noqa: E731
    first_two = lambda ch: tuple(as_symbols(ch)[:2])  # noqa: E731  the first two bytes of a character
    merges = [("f", as_symbols("é")[0]), ("c", "a"), first_two("二"), first_two("😀"),
              ("Ġ", "o"), ("Ġo", "k"), ("Ċ", "Ċ")]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    return Qwen2Tokenizer(vocab=vocab, merges=merges, pad_token=PAD_TOKEN, eos_token=EOS_TOKEN, unk_token=None,
                          extra_special_tokens=[IM_START_TOKEN, IM_END_TOKEN], clean_up_tokenization_spaces=False)


def local_smollm2_dir() -> Path | None:
    """SmolLM2-135M-Instruct's folder when it is already on this machine (nothing is downloaded here)."""
    from grpo_dist import tasks
    from grpo_dist.tasks import smollm2

    built = smollm2.built_dir(tasks.cache_root())
    return smollm2.from_hf_cache() or (built if (built / smollm2.MARKER).is_file() else None)


@pytest.fixture(scope="module", params=["sentencepiece", "sentencepiece+clean_up", "byte_level", "smollm2"])
def tokenizer(request):
    if request.param == "smollm2":
        path = local_smollm2_dir()
        if path is None:
            pytest.skip("SmolLM2-135M-Instruct is not on this machine (tests/e2e/test_smollm2.py obtains it)")
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)
    if request.param == "byte_level":
        return byte_level_tokenizer()
    return sentencepiece_tokenizer(clean_up=request.param.endswith("clean_up"))


def decode(tokenizer, seqs):
    """As the rewarder decodes what the scorer sees."""
    return tokenizer.batch_decode(seqs, skip_special_tokens=True)


def tokens_by_prefix_decoding(tokenizer, ids: list[int], text: str) -> list[int]:
    """For every character offset c of ``text`` (the decoded ``ids``): the first token i whose prefix
    ``ids[:i + 1]`` decodes to a text that starts with ``text[:c + 1]`` (one decode per prefix)."""
    prefixes = decode(tokenizer, [ids[:n] for n in range(1, len(ids) + 1)])
    return [next(i for i, p in enumerate(prefixes) if p.startswith(text[:c + 1])) for c in range(len(text))]


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def check_every_offset(tokenizer, text: str) -> None:
    ids = encode(tokenizer, text)
    decoded = decode(tokenizer, [ids])[0]
    want = tokens_by_prefix_decoding(tokenizer, ids, decoded)
    prefixes = lambda ns: decode(tokenizer, [ids[:n] for n in ns])  # noqa: E731
    every = list(range(1, len(decoded) + 1))
    assert step_end_tokens(every, decoded, len(ids), prefixes) == want
    assert [step_end_tokens([e], decoded, len(ids), prefixes)[0] for e in every] == want


@pytest.mark.parametrize("text", TEXTS)
def test_every_character_offset_maps_to_the_token_that_prefix_decoding_gives(tokenizer, text):
    check_every_offset(tokenizer, text)


def one_per_line(data_source, solution_str, ground_truth, extra_info=None):
    """Step k (line k) gets reward k + 1."""
    return {"score": 0.0, "step_rewards": [float(k + 1) for k in range(len(step_char_ends(solution_str)))]}


def test_step_rewards_land_where_prefix_decoding_puts_the_step_ends(tokenizer):
    check_step_rewards_through_the_rewarder(tokenizer)


def check_step_rewards_through_the_rewarder(tokenizer) -> None:
    """Responses padded to R, the EOS after each: the step rewards are on the tokens that complete each
    line (not where the lengths of tokens decoded one at a time would put them)."""
    eos = tokenizer.eos_token_id
    rows = [encode(tokenizer, t) + [eos] for t in TEXTS]
    R = max(map(len, rows)) + 2
    responses = torch.full((len(rows), R), eos, dtype=torch.long)
    mask = torch.zeros((len(rows), R))
    for b, ids in enumerate(rows):
        responses[b, :len(ids)] = torch.tensor(ids)
        mask[b, :len(ids)] = 1.0
    rewarder = BatchRewarder(tokenizer, RewardScorer(one_per_line, num_workers=0, timeout_s=None, on_error="raise"))
    out = rewarder.compute(responses, mask, ["d"] * len(rows), [None] * len(rows), [{}] * len(rows),
                           token_level=True, step_rewards=True)
    for b, ids in enumerate(rows):
        text = decode(tokenizer, [ids])[0]
        by_offset = tokens_by_prefix_decoding(tokenizer, ids, text)
        want = torch.zeros(R)
        for k, end in enumerate(step_char_ends(text)):
            want[by_offset[end - 1]] += k + 1
        assert out.token_level_scores_BR[b].tolist() == want.tolist(), f"response {b}: {text!r}"
        assert out.step_end_mask_BR[b].tolist() == (want != 0).float().tolist()
