"""scripts/data/prepare_gsm8k.py and prepare_math.py: verl-format rows from small hand-written
inputs, loadable by grpo_dist's data loader, with ground truths that the project's scorers accept;
one-line errors for a missing file, a missing column, a bad row, and a Hugging Face cache without
the data (or without the `datasets` package)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_dist.data.rows import load_rows
from grpo_dist.rewards.scorers import default_compute_score, gsm8k_score, math_score

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts" / "data"

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."

GSM8K_TRAIN = [
    {"question": "Tom has 3 apples and buys 4 more. How many apples does he have?",
     "answer": "He has 3 + 4 = <<3+4=7>>7 apples.\n#### 7"},
    {"question": "A car costs $1,200 more than a $300 bike. What does the car cost?",
     "answer": "300 + 1,200 = <<300+1200=1500>>1,500\n#### 1,500"},
    {"question": "It is 2 degrees and falls by 5. What is the temperature?",
     "answer": "2 - 5 = <<2-5=-3>>-3\n#### -3"},
]
GSM8K_TEST = [
    {"question": "Half of 8.4?", "answer": "8.4 / 2 = 4.2\n#### 4.2"},
]
GSM8K_TRUTHS = {"train": ["7", "1500", "-3"], "test": ["4.2"]}

MATH_TEST = [
    {"problem": "What is $\\frac{3}{6}$ in lowest terms?",
     "solution": "Divide by 3: $\\frac{3}{6} = \\boxed{\\frac{1}{2}}$.", "level": "Level 1", "type": "Prealgebra"},
    {"problem": "Solve $x^2 = 4$ for $x > 0$.",
     "solution": "First $x = \\pm 2$; the positive one is $\\boxed{2}$.", "level": "Level 2", "type": "Algebra"},
    {"problem": "Give the point $(1, 2)$ reflected in the $y$-axis.",
     "solution": "Negate $x$: $\\boxed{(-1, 2)}$", "level": "Level 3", "type": "Geometry"},
]
MATH_TRUTHS = ["\\frac{1}{2}", "2", "(-1, 2)"]
MATH_TRAIN_FILES = {  # the original release's layout: one JSON object per problem
    "algebra/1.json": {"problem": "Compute $2+3$.", "solution": "$2+3=\\boxed{5}$.",
                       "level": "Level 1", "type": "Algebra"},
    "geometry/7.json": {"problem": "A square has side $\\sqrt{2}$. Its area?",
                        "solution": "The area is $(\\sqrt{2})^2=\\boxed{2}$.", "level": "Level 2", "type": "Geometry"},
}


@pytest.fixture
def prep(monkeypatch):
    """The two scripts as modules (prepare_math imports its helpers from prepare_gsm8k)."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    return types.SimpleNamespace(gsm8k=importlib.import_module("prepare_gsm8k"),
                                 math=importlib.import_module("prepare_math"))


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    columns = list(dict.fromkeys(k for r in rows for k in r))  # every row's columns, absent = null
    pq.write_table(pa.Table.from_pylist([{k: r.get(k) for k in columns} for r in rows]), path)
    return path


def one_line_error(capsys, prog: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"{prog}: error: ") and "\n" not in err, err
    assert "Traceback" not in err
    return err


# ---------------------------------------------------------------------------------------- GSM8K


def test_gsm8k_rows_are_in_verl_format_and_score(prep, tmp_path, capsys):
    train = write_jsonl(tmp_path / "train.jsonl", GSM8K_TRAIN)
    test = write_parquet(tmp_path / "test.parquet", GSM8K_TEST)
    out = tmp_path / "out"
    assert prep.gsm8k.main(["--train-file", str(train), "--test-file", str(test), "--output-dir", str(out)]) == 0
    assert "wrote 3 rows" in capsys.readouterr().out

    for split, originals in (("train", GSM8K_TRAIN), ("test", GSM8K_TEST)):
        rows = load_rows(out / f"{split}.parquet")
        assert len(rows) == len(originals)
        for i, (row, orig) in enumerate(zip(rows, originals)):
            truth = GSM8K_TRUTHS[split][i]
            assert row["data_source"] == "openai/gsm8k"
            assert row["prompt"] == [{"role": "user", "content": orig["question"] + " " + GSM8K_INSTRUCTION}]
            assert row["ability"] == "math"
            assert row["reward_model"] == {"style": "rule", "ground_truth": truth}
            assert row["extra_info"] == {"split": split, "index": i, "answer": orig["answer"],
                                         "question": orig["question"]}
            # a correct response scores 1, a wrong one 0, by the project's scorer and its registry
            correct = f"Step by step ... so the answer is\n#### {truth}"
            assert gsm8k_score(correct, row["reward_model"]["ground_truth"]) == 1.0
            assert default_compute_score(row["data_source"], correct, truth) == 1.0
            assert gsm8k_score("#### 123456", truth) == 0.0
            # the dataset's own solution (with "1,500" style numbers) is a correct response too
            assert gsm8k_score(orig["answer"], truth) == 1.0


def test_gsm8k_parquet_written_like_verl(prep, tmp_path):
    """Column types as verl's preprocessing writes them: prompt a list of {role, content} structs."""
    out = tmp_path / "out"
    prep.gsm8k.main(["--train-file", str(write_jsonl(tmp_path / "t.jsonl", GSM8K_TRAIN)), "--output-dir", str(out)])
    schema = pq.read_schema(out / "train.parquet")
    assert schema.names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert str(schema.field("prompt").type) == "list<element: struct<role: string, content: string>>"
    assert schema.field("reward_model").type.field("ground_truth").type == pa.string()
    assert not (out / "test.parquet").exists()  # only the splits given are written
    assert not list(out.glob("*.tmp"))


def test_gsm8k_local_files_need_no_datasets_package(prep, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` now raises ImportError
    out = tmp_path / "out"
    assert prep.gsm8k.main(["--train-file", str(write_jsonl(tmp_path / "t.jsonl", GSM8K_TRAIN)),
                            "--output-dir", str(out)]) == 0
    assert len(load_rows(out / "train.parquet")) == 3


def test_gsm8k_accepts_json_array_and_verl_flag_names(prep, tmp_path):
    src = tmp_path / "train.json"
    src.write_text(json.dumps(GSM8K_TRAIN), encoding="utf-8")
    out = tmp_path / "verl_style"
    assert prep.gsm8k.main(["--train-file", str(src), "--local_save_dir", str(out)]) == 0
    assert [r["reward_model"]["ground_truth"] for r in load_rows(out / "train.parquet")] == GSM8K_TRUTHS["train"]


def test_missing_file_is_one_clear_line(prep, tmp_path, capsys):
    missing = tmp_path / "nope" / "train.parquet"
    assert prep.gsm8k.main(["--train-file", str(missing), "--output-dir", str(tmp_path / "o")]) == 2
    err = one_line_error(capsys, "prepare_gsm8k.py")
    assert str(missing) in err and "no such file" in err
    assert not (tmp_path / "o").exists()


def test_missing_column_is_one_clear_line(prep, tmp_path, capsys):
    src = write_parquet(tmp_path / "train.parquet", [{"question": "q", "solution": "#### 1"}])
    assert prep.gsm8k.main(["--train-file", str(src), "--output-dir", str(tmp_path / "o")]) == 2
    err = one_line_error(capsys, "prepare_gsm8k.py")
    assert "'answer'" in err and str(src) in err and "question" in err  # names the column and what there is
    assert not (tmp_path / "o").exists()


def test_row_without_final_answer_stops_or_is_skipped(prep, tmp_path, capsys):
    rows = [GSM8K_TRAIN[0], {"question": "q?", "answer": "no marker here"}, GSM8K_TRAIN[1]]
    src = write_jsonl(tmp_path / "train.jsonl", rows)
    out = tmp_path / "out"
    assert prep.gsm8k.main(["--train-file", str(src), "--output-dir", str(out)]) == 2
    err = one_line_error(capsys, "prepare_gsm8k.py")
    assert "row 1" in err and "####" in err and "--skip-bad-rows" in err
    assert not out.exists()

    assert prep.gsm8k.main(["--train-file", str(src), "--output-dir", str(out), "--skip-bad-rows"]) == 0
    assert "1 bad rows skipped" in capsys.readouterr().out
    kept = load_rows(out / "train.parquet")
    assert [r["extra_info"]["index"] for r in kept] == [0, 2]  # the input position, not renumbered


@pytest.mark.parametrize(
    "argv, expected",
    [
        ([], "no input"),
        (["--train-file", "x.jsonl", "--from-hub-cache", "openai/gsm8k"], "not both"),
        (["--train-file", "{tmp}/train.csv"], "unsupported file type '.csv'"),
        (["--train-file", "{tmp}/bad.jsonl"], "line 2 is not valid JSON"),
    ],
)
def test_input_errors(prep, tmp_path, capsys, argv, expected):
    (tmp_path / "train.csv").write_text("question,answer\n")
    (tmp_path / "bad.jsonl").write_text(json.dumps(GSM8K_TRAIN[0]) + "\n{not json\n")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert prep.gsm8k.main(argv + ["--output-dir", str(tmp_path / "o")]) == 2
    assert expected in one_line_error(capsys, "prepare_gsm8k.py")


# ---------------------------------------------------------------------------------- Hugging Face cache


def fake_datasets(splits: dict[str, list[dict]] | None = None, error: Exception | None = None):
    calls = []

    def load_dataset(*args):
        calls.append((args, os.environ.get("HF_HUB_OFFLINE"), os.environ.get("HF_DATASETS_OFFLINE")))
        if error is not None:
            raise error
        return splits

    return types.SimpleNamespace(load_dataset=load_dataset), calls


def test_from_hub_cache_loads_offline_with_gsm8k_config(prep, tmp_path, monkeypatch):
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)  # restored after the test
    module, calls = fake_datasets({"train": GSM8K_TRAIN, "test": GSM8K_TEST})
    monkeypatch.setitem(sys.modules, "datasets", module)
    out = tmp_path / "out"
    assert prep.gsm8k.main(["--from-hub-cache", "openai/gsm8k", "--output-dir", str(out)]) == 0
    assert calls == [(("openai/gsm8k", "main"), "1", "1")]  # GSM8K's "main" configuration, offline
    assert [r["reward_model"]["ground_truth"] for r in load_rows(out / "train.parquet")] == GSM8K_TRUTHS["train"]
    assert [r["extra_info"]["split"] for r in load_rows(out / "test.parquet")] == ["test"]


def test_from_hub_cache_without_datasets_package(prep, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "datasets", None)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    assert prep.gsm8k.main(["--from-hub-cache", "openai/gsm8k", "--output-dir", str(tmp_path / "o")]) == 2
    err = one_line_error(capsys, "prepare_gsm8k.py")
    assert "'datasets' package" in err and "pip install datasets" in err and "--train-file" in err


def test_from_hub_cache_not_cached(prep, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    module, _ = fake_datasets(error=ConnectionError("Couldn't reach 'x' on the Hub (OfflineModeIsEnabled)\nmore"))
    monkeypatch.setitem(sys.modules, "datasets", module)
    assert prep.math.main(["--from-hub-cache", "DigitalLearningGmbH/MATH-lighteval", "--output-dir", str(tmp_path / "o")]) == 2
    err = one_line_error(capsys, "prepare_math.py")
    assert "DigitalLearningGmbH/MATH-lighteval" in err and "cache" in err and "ConnectionError" in err
    assert "datasets.load_dataset('DigitalLearningGmbH/MATH-lighteval')" in err


def test_real_datasets_with_an_empty_cache_fails_fast_and_offline(tmp_path):
    """The real `datasets` package, an empty HF_HOME, no network: one line, exit 2, no download tried."""
    pytest.importorskip("datasets")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    env["HF_HOME"] = str(tmp_path / "hf")
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "prepare_gsm8k.py"), "--from-hub-cache", "openai/gsm8k",
         "--output-dir", str(tmp_path / "o")],
        capture_output=True, text=True, env=env, timeout=180,
    )
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip()
    assert err.startswith("prepare_gsm8k.py: error: could not load openai/gsm8k") and "\n" not in err, err
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------------------ MATH


def test_math_rows_are_in_verl_format_and_score(prep, tmp_path, capsys):
    train_dir = tmp_path / "MATH" / "train"
    for rel, obj in MATH_TRAIN_FILES.items():
        (train_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (train_dir / rel).write_text(json.dumps(obj), encoding="utf-8")
    test = write_jsonl(tmp_path / "test.jsonl", MATH_TEST)
    out = tmp_path / "out"
    assert prep.math.main(["--train-file", str(train_dir), "--test-file", str(test), "--output-dir", str(out)]) == 0

    originals = {"train": [MATH_TRAIN_FILES[k] for k in sorted(MATH_TRAIN_FILES)], "test": MATH_TEST}
    truths = {"train": ["5", "2"], "test": MATH_TRUTHS}
    for split in ("train", "test"):
        rows = load_rows(out / f"{split}.parquet")
        assert len(rows) == len(originals[split])
        for i, (row, orig) in enumerate(zip(rows, originals[split])):
            truth = truths[split][i]
            assert row["data_source"] == "DigitalLearningGmbH/MATH-lighteval"
            assert row["prompt"] == [{"role": "user", "content": orig["problem"] + " " + MATH_INSTRUCTION}]
            assert row["ability"] == "math"
            assert row["reward_model"] == {"style": "rule", "ground_truth": truth}
            assert row["extra_info"] == {"split": split, "index": i, "question": orig["problem"],
                                         "answer": orig["solution"], "level": orig["level"], "type": orig["type"]}
            correct = f"Let me work it out. The final answer is $\\boxed{{{truth}}}$."
            assert math_score(correct, row["reward_model"]["ground_truth"]) == 1.0
            assert default_compute_score(row["data_source"], correct, truth) == 1.0
            assert math_score(orig["solution"], truth) == 1.0
            assert math_score("The final answer is $\\boxed{17}$.", truth) == 0.0


def test_math_parquet_input_answer_fallback_and_data_source(prep, tmp_path):
    rows = [dict(MATH_TEST[0], level=3),
            {"problem": "What is 6 x 7?", "solution": "Six sevens are forty-two.", "answer": "42",
             "level": 1, "subject": "Prealgebra"}]  # MATH-500 style: an answer column, level as a number
    src = write_parquet(tmp_path / "test.parquet", rows)
    out = tmp_path / "out"
    assert prep.math.main(["--test-file", str(src), "--output-dir", str(out), "--data-source", "lighteval/MATH"]) == 0
    got = load_rows(out / "test.parquet")
    assert [r["reward_model"]["ground_truth"] for r in got] == ["\\frac{1}{2}", "42"]
    assert {r["data_source"] for r in got} == {"lighteval/MATH"}
    assert [r["extra_info"]["level"] for r in got] == ["3", "1"]
    assert got[1]["extra_info"].get("type") is None  # MATH-500 has 'subject', not 'type'
    assert math_score("so \\boxed{42}", got[1]["reward_model"]["ground_truth"]) == 1.0


def test_math_errors(prep, tmp_path, capsys):
    src = write_jsonl(tmp_path / "test.jsonl", [{"problem": "p", "answer_text": "x"}])
    assert prep.math.main(["--test-file", str(src), "--output-dir", str(tmp_path / "o")]) == 2
    assert "'solution'" in one_line_error(capsys, "prepare_math.py")

    src = write_jsonl(tmp_path / "nobox.jsonl", [MATH_TEST[0], {"problem": "p", "solution": "it is 3"}])
    assert prep.math.main(["--test-file", str(src), "--output-dir", str(tmp_path / "o")]) == 2
    err = one_line_error(capsys, "prepare_math.py")
    assert "row 1" in err and "\\boxed" in err

    good = write_jsonl(tmp_path / "good.jsonl", MATH_TEST)
    assert prep.math.main(["--test-file", str(good), "--data-source", "my/math", "--output-dir", str(tmp_path / "o")]) == 2
    assert "DigitalLearningGmbH/MATH-lighteval" in one_line_error(capsys, "prepare_math.py")
    assert not (tmp_path / "o").exists()


def test_math_from_hub_cache_keeps_a_known_name_as_data_source(prep, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    module, calls = fake_datasets({"train": MATH_TEST[:1], "test": MATH_TEST})
    monkeypatch.setitem(sys.modules, "datasets", module)
    out = tmp_path / "out"
    assert prep.math.main(["--from-hub-cache", "lighteval/MATH", "--output-dir", str(out)]) == 0
    assert calls[0][0] == ("lighteval/MATH",)  # no configuration unless --hub-config
    assert {r["data_source"] for r in load_rows(out / "test.parquet")} == {"lighteval/MATH"}


def test_scripts_run_as_commands(tmp_path):
    """As documented: `python scripts/data/prepare_*.py ...` from any directory."""
    train = write_jsonl(tmp_path / "g.jsonl", GSM8K_TRAIN)
    math = write_jsonl(tmp_path / "m.jsonl", MATH_TEST)
    for script, arg in (("prepare_gsm8k.py", train), ("prepare_math.py", math)):
        proc = subprocess.run([sys.executable, str(SCRIPTS / script), "--train-file", str(arg),
                               "--output-dir", str(tmp_path / script)], capture_output=True, text=True,
                              cwd=tmp_path, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert len(load_rows(tmp_path / script / "train.parquet")) == 3
