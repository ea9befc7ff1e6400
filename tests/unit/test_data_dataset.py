"""PromptDataset (chat template, overlong prompts, truncation) and collate_prompts."""

import pytest
import torch

from grpo_dist.data import DataError, PromptDataset, Rows, collate_prompts


def row(content, i=0, **extra_info):
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": content}],
        "reward_model": {"style": "rule", "ground_truth": str(i)},
        "extra_info": extra_info,
    }


def ids_of(tok, text):
    """Char-level ids written out: one id per character."""
    return tok.convert_tokens_to_ids(list(text))


def make(rows, tok, max_len=100, filt=False, trunc="error"):
    return PromptDataset(rows, tok, max_prompt_length=max_len, filter_overlong_prompts=filt, truncation=trunc)


def test_chat_template_applied_with_generation_prompt(char_tokenizer):
    tok = char_tokenizer
    ds = make([row("hi", 7, index=41)], tok)
    item = ds[0]
    im_start, im_end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    expected = [im_start] + ids_of(tok, "user\nhi") + [im_end] + ids_of(tok, "\n") + [im_start] + ids_of(tok, "assistant\n")
    assert item["prompt_ids"] == expected
    assert item["data_source"] == "openai/gsm8k"
    assert item["ground_truth"] == "7"
    assert item["extra_info"] == {"index": 41}
    assert item["index"] == 41
    assert item["raw_prompt"] == [{"role": "user", "content": "hi"}]


def test_index_defaults_to_position(char_tokenizer):
    ds = make([row("a"), row("b")], char_tokenizer)
    assert [ds[0]["index"], ds[1]["index"]] == [0, 1]


def test_without_chat_template_contents_are_joined(plain_char_tokenizer):
    tok = plain_char_tokenizer
    r = row("x")
    r["prompt"] = [{"role": "system", "content": "ab"}, {"role": "user", "content": "cd"}]
    assert make([r], tok)[0]["prompt_ids"] == ids_of(tok, "ab\ncd")


def test_filter_overlong_prompts_drops_and_counts(plain_char_tokenizer):
    ds = make([row("abcd"), row("abcdefgh", 1), row("abc", 2)], plain_char_tokenizer, max_len=4, filt=True)
    assert len(ds) == 2
    assert ds.num_filtered == 1
    assert [ds[i]["ground_truth"] for i in range(2)] == ["0", "2"]


def test_filter_wins_over_error_truncation(plain_char_tokenizer):
    ds = make([row("abcdefgh"), row("ab")], plain_char_tokenizer, max_len=4, filt=True, trunc="error")
    assert len(ds) == 1


@pytest.mark.parametrize(
    "mode, kept",
    [("left", "ghij"), ("right", "abcd"), ("middle", "abij")],
)
def test_truncation_modes_exact_ids(plain_char_tokenizer, mode, kept):
    tok = plain_char_tokenizer
    ds = make([row("abcdefghij"), row("xy")], tok, max_len=4, trunc=mode)
    assert ds[0]["prompt_ids"] == ids_of(tok, kept)
    assert ds[1]["prompt_ids"] == ids_of(tok, "xy")  # short prompts untouched
    assert ds.num_truncated == 1


def test_middle_truncation_odd_length(plain_char_tokenizer):
    tok = plain_char_tokenizer
    ds = make([row("abcdefghij")], tok, max_len=5, trunc="middle")
    assert ds[0]["prompt_ids"] == ids_of(tok, "abhij")  # 5 // 2 = 2 from the start, 3 from the end


def test_truncation_error_names_row_length_limit_and_keys(plain_char_tokenizer):
    rows = Rows([row("ab"), row("abcdefghij")], origins=[("train.parquet", 5), ("train.parquet", 6)])
    with pytest.raises(DataError) as err:
        make(rows, plain_char_tokenizer, max_len=4, trunc="error")
    msg = str(err.value)
    assert "train.parquet: row 6" in msg
    assert "10 tokens" in msg and "data.max_prompt_length=4" in msg
    assert "data.filter_overlong_prompts" in msg and "data.truncation" in msg


def test_everything_filtered_raises(plain_char_tokenizer):
    with pytest.raises(DataError, match="filtered out"):
        make([row("abcdefgh")], plain_char_tokenizer, max_len=4, filt=True)


def test_bad_truncation_mode(plain_char_tokenizer):
    with pytest.raises(ValueError, match="data.truncation"):
        make([row("ab")], plain_char_tokenizer, trunc="both")


def test_collate_left_pads_with_positions():
    items = [
        {"prompt_ids": [5, 6, 7], "data_source": "a", "ground_truth": "1", "extra_info": {}, "index": 0},
        {"prompt_ids": [8], "data_source": "b", "ground_truth": "2", "extra_info": {"k": 1}, "index": 1},
    ]
    batch = collate_prompts(items, pad_id=0, max_prompt_length=4)
    assert batch["input_ids"].dtype == torch.long
    assert batch["input_ids"].tolist() == [[0, 5, 6, 7], [0, 0, 0, 8]]
    assert batch["attention_mask"].tolist() == [[0, 1, 1, 1], [0, 0, 0, 1]]
    assert batch["position_ids"].tolist() == [[0, 0, 1, 2], [0, 0, 0, 0]]
    assert batch["data_source"] == ["a", "b"]
    assert batch["ground_truth"] == ["1", "2"]
    assert batch["extra_info"] == [{}, {"k": 1}]
    assert batch["prompt_ids"] == [[5, 6, 7], [8]]


def test_collate_rejects_overlong_item():
    with pytest.raises(ValueError, match="max_prompt_length=2"):
        collate_prompts([{"prompt_ids": [1, 2, 3]}], pad_id=0, max_prompt_length=2)


def test_dataset_to_collate_round_trip(char_tokenizer):
    ds = make([row("hello"), row("a")], char_tokenizer, max_len=40)
    batch = collate_prompts([ds[0], ds[1]], pad_id=ds.pad_id, max_prompt_length=40)
    for b in range(2):
        n = len(ds[b]["prompt_ids"])
        assert batch["input_ids"][b, -n:].tolist() == ds[b]["prompt_ids"]
        assert batch["attention_mask"][b].sum().item() == n
        assert batch["position_ids"][b, -n:].tolist() == list(range(n))
