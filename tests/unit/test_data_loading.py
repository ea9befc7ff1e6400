"""load_rows: verl's row format from parquet / jsonl / json, and its error messages."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_dist.data import DataError, load_rows


def make_row(i, **overrides):
    row = {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": f"question {i}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(i)},
        "extra_info": {"split": "train", "index": i},
    }
    row.update(overrides)
    return row


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_parquet_and_jsonl_are_concatenated_in_order(tmp_path):
    pq_file = write_parquet(tmp_path / "a.parquet", [make_row(0), make_row(1)])
    jl_file = write_jsonl(tmp_path / "b.jsonl", [make_row(2)])
    rows = load_rows([str(pq_file), str(jl_file)])
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["0", "1", "2"]
    assert rows[0]["prompt"] == [{"role": "user", "content": "question 0"}]
    assert rows[2]["extra_info"] == {"split": "train", "index": 2}
    assert rows[1]["ability"] == "math"
    assert rows.origins == [(str(pq_file), 0), (str(pq_file), 1), (str(jl_file), 0)]
    assert rows.num_skipped == 0


def test_string_prompt_becomes_one_user_message_and_prompt_key_is_configurable(tmp_path):
    row = make_row(0)
    del row["prompt"], row["extra_info"], row["ability"]
    row["question"] = "what is 2+2?"
    rows = load_rows(str(write_jsonl(tmp_path / "q.jsonl", [row])), prompt_key="question")
    assert rows[0]["prompt"] == [{"role": "user", "content": "what is 2+2?"}]
    assert "question" not in rows[0]
    assert rows[0]["extra_info"] == {} and rows[0]["ability"] is None


def test_json_array_file(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([make_row(0), make_row(1)]))
    assert len(load_rows(str(path))) == 2


def test_missing_file_names_it_and_lists_what_is_nearby(tmp_path):
    write_parquet(tmp_path / "train.parquet", [make_row(0)])
    with pytest.raises(DataError) as err:
        load_rows(str(tmp_path / "trian.parquet"))
    msg = str(err.value)
    assert "trian.parquet: file not found" in msg
    assert "train.parquet" in msg  # the close match / nearby data file


def test_missing_folder_is_reported(tmp_path):
    with pytest.raises(DataError, match="does not exist either"):
        load_rows(str(tmp_path / "nope" / "train.parquet"))


def test_unsupported_extension_lists_valid_ones(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text("a,b\n")
    with pytest.raises(DataError) as err:
        load_rows(str(path))
    assert "train.csv" in str(err.value) and "'.csv'" in str(err.value)
    assert ".parquet, .jsonl, .json" in str(err.value)


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_empty_file(tmp_path, kind):
    if kind == "jsonl":
        path = tmp_path / "empty.jsonl"
        path.write_text("\n\n")
    else:
        path = tmp_path / "empty.parquet"
        schema = pa.schema([("data_source", pa.string()), ("prompt", pa.string())])
        pq.write_table(schema.empty_table(), path)
    with pytest.raises(DataError, match=r"empty\.(jsonl|parquet): the file holds no rows"):
        load_rows(str(path))


def test_parquet_missing_prompt_column_names_file_column_and_key(tmp_path):
    row = make_row(0)
    row["question"] = row.pop("prompt")
    path = write_parquet(tmp_path / "t.parquet", [row])
    with pytest.raises(DataError) as err:
        load_rows(str(path))
    msg = str(err.value)
    assert str(path) in msg and "'prompt'" in msg and "data.prompt_key" in msg
    assert "question" in msg  # the columns the file does have


@pytest.mark.parametrize(
    "bad_row, column",
    [
        ({"data_source": None}, "data_source"),
        ({"reward_model": {"style": "rule"}}, "reward_model.ground_truth"),
        ({"reward_model": "72"}, "reward_model"),
        ({"prompt": 17}, "prompt"),
        ({"prompt": [{"role": "user"}]}, "prompt"),
        ({"prompt": [["user", "hi"]]}, "prompt"),
        ({"extra_info": "split=train"}, "extra_info"),
    ],
)
def test_bad_row_names_file_row_and_column(tmp_path, bad_row, column):
    path = write_jsonl(tmp_path / "t.jsonl", [make_row(0), make_row(1), make_row(2, **bad_row)])
    with pytest.raises(DataError) as err:
        load_rows(str(path))
    msg = str(err.value)
    assert f"{path}: row 2 (line 3): column '{column}'" in msg
    assert "skip_bad_rows" in msg
    assert "data.skip_bad_rows=true" in msg  # the full key, as it is written on the command line


def test_missing_key_in_jsonl_row(tmp_path):
    row = make_row(1)
    del row["data_source"]
    path = write_jsonl(tmp_path / "t.jsonl", [make_row(0), row])
    with pytest.raises(DataError, match=r"t\.jsonl: row 1 \(line 2\): column 'data_source'"):
        load_rows(str(path))


def test_invalid_json_line_names_the_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(make_row(0)) + "\n\n{not json\n")
    with pytest.raises(DataError, match=r"t\.jsonl: row 1 \(line 3\): line 3 is not valid JSON"):
        load_rows(str(path))


def test_skip_bad_rows_drops_and_counts(tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [make_row(0), make_row(1, prompt=None), make_row(2), make_row(3, data_source="")]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{broken\n")
    loaded = load_rows(str(path), skip_bad_rows=True)
    assert [r["reward_model"]["ground_truth"] for r in loaded] == ["0", "2"]
    assert loaded.num_skipped == 3
    assert loaded.origins == [(str(path), 0), (str(path), 2)]
    assert "row 1 (line 2): column 'prompt'" in loaded.skipped_reasons[0]


def test_skip_bad_rows_with_nothing_left_raises(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [make_row(0, prompt=3)])
    with pytest.raises(DataError, match="no valid rows"):
        load_rows(str(path), skip_bad_rows=True)


def test_parquet_struct_nulls_are_dropped_from_messages(tmp_path):
    # parquet stores messages as structs: a key present in one message is null in the others
    row = make_row(0, prompt=[{"role": "system", "content": "be brief", "name": "sys"},
                              {"role": "user", "content": "hi"}])
    rows = load_rows(str(write_parquet(tmp_path / "t.parquet", [row])))
    assert rows[0]["prompt"] == [{"role": "system", "content": "be brief", "name": "sys"},
                                 {"role": "user", "content": "hi"}]


def test_a_path_or_a_list_of_paths():
    """data.train_files / data.val_files take one path or a list of them; unset means none."""
    from pathlib import Path

    from grpo_dist.data import as_path_list

    assert as_path_list(None) == []
    assert as_path_list("a.parquet") == ["a.parquet"]
    assert as_path_list(Path("d/a.jsonl")) == ["d/a.jsonl"]
    assert as_path_list(["a.parquet", Path("b.jsonl")]) == ["a.parquet", "b.jsonl"]
    assert as_path_list(("a.parquet",)) == ["a.parquet"]
