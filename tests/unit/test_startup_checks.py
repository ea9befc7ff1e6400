"""Start-up checks a new user meets before Ray starts: which data key holds an unreadable file, a
custom reward function tried once on a training row, a full disk told apart from a permission problem.

The runs go through ``grpo_dist.trainer.run.run`` with the tiny model up to where Ray would start."""

from __future__ import annotations

import os
import time

import pytest

from grpo_dist.distributed import worker_group
from tests.unit.test_run_messages import one_message, tiny_cfg


@pytest.fixture
def no_ray(monkeypatch):
    """Ray must not start in these tests: the run stops at init_ray when its checks pass."""
    from grpo_dist.distributed.worker_group import RayStartError

    def stop_here(**kwargs):
        raise RayStartError("could not start a local Ray instance: stopped here by the test")

    monkeypatch.setattr(worker_group, "init_ray", stop_here)


# ---- an unreadable data file names its key ----------------------------------------------------------
@pytest.mark.parametrize("key", ["data.train_files", "data.val_files"])
def test_unreadable_parquet_names_the_key_and_the_file(key, tiny_model_dir, reverse_data, tmp_path, no_ray, capsys):
    bad = tmp_path / "broken.parquet"
    bad.write_bytes(b"PAR1 this is not parquet PAR1")
    code = run_cfg(tiny_cfg(tiny_model_dir, reverse_data, tmp_path / "o", f"{key}={bad}"))
    tail = one_message(capsys.readouterr().err, 2, code, f"{key}: {bad}: not a readable parquet file")
    other = "data.val_files" if key == "data.train_files" else "data.train_files"
    assert other not in tail


def run_cfg(cfg) -> int:
    from grpo_dist.trainer.run import run

    return run(cfg)


# ---- the custom reward function, tried once before Ray starts ------------------------------------------
REWARDS = '''import os
import time


def raises(data_source, solution_str, ground_truth, extra_info=None):
    table = {"other": 1.0}
    return table[solution_str]


def returns_text(data_source, solution_str, ground_truth, extra_info=None):
    return "1.0"


def sleeps(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep(30)
    return 1.0


def changes_its_process(data_source, solution_str, ground_truth, extra_info=None):
    os.environ["GRPO_DIST_TEST_TRIAL_MARK"] = "set"
    with open(os.path.join(os.path.dirname(__file__), "calls.txt"), "a") as f:
        f.write(f"{data_source} {solution_str!r} {ground_truth!r} {extra_info['index']}\\n")
    return float(solution_str == ground_truth)
'''


@pytest.fixture
def rewards_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(REWARDS)
    return path


def reward_cfg(tiny_model_dir, reverse_data, out, path, name, *extra):
    return tiny_cfg(tiny_model_dir, reverse_data, out, f"custom_reward_function.path={path}",
                    f"custom_reward_function.name={name}", "data.shuffle=false", *extra)


@pytest.fixture
def ray_must_not_start(monkeypatch):
    monkeypatch.setattr(worker_group, "init_ray", lambda **kw: pytest.fail("Ray was started"))


def test_a_reward_that_raises_stops_the_start_naming_its_file_and_line(tiny_model_dir, reverse_data, tmp_path,
                                                                       rewards_file, ray_must_not_start, capsys):
    line = next(i for i, text in enumerate(REWARDS.splitlines(), start=1) if "return table[" in text)
    code = run_cfg(reward_cfg(tiny_model_dir, reverse_data, tmp_path / "o", rewards_file, "raises"))
    tail = one_message(capsys.readouterr().err, 2, code,
                       f"reward function raises from {rewards_file} failed when tried once before the run",
                       f"raised KeyError: '", f"at {rewards_file}:{line} (in raises)",
                       "fix it (custom_reward_function.path / .name)", "reward_model.on_error=zero")
    assert "rerun" not in tail
    assert not (tmp_path / "o" / ".grpo_dist.lock").exists()


def test_a_reward_that_returns_text_stops_the_start(tiny_model_dir, reverse_data, tmp_path, rewards_file,
                                                    ray_must_not_start, capsys):
    code = run_cfg(reward_cfg(tiny_model_dir, reverse_data, tmp_path / "o", rewards_file, "returns_text"))
    one_message(capsys.readouterr().err, 2, code, "returns_text", "returned a str ('1.0'), not a number")


def test_a_reward_slower_than_its_limit_is_stopped_and_named(tiny_model_dir, reverse_data, tmp_path, rewards_file,
                                                             ray_must_not_start, capsys):
    t0 = time.monotonic()
    code = run_cfg(reward_cfg(tiny_model_dir, reverse_data, tmp_path / "o", rewards_file, "sleeps",
                              "reward_model.timeout_s=1"))
    assert time.monotonic() - t0 < 20
    one_message(capsys.readouterr().err, 2, code, "timed out after 1 s", "raise reward_model.timeout_s")


def test_with_on_error_zero_a_failing_reward_is_a_warning_and_the_run_starts(tiny_model_dir, reverse_data, tmp_path,
                                                                            rewards_file, no_ray, capsys):
    code = run_cfg(reward_cfg(tiny_model_dir, reverse_data, tmp_path / "o", rewards_file, "raises",
                              "reward_model.on_error=zero"))
    err = capsys.readouterr().err
    one_message(err, 1, code, "stopped here by the test")  # it went on to start Ray
    assert "grpo_dist: warning: reward function raises from" in err and "reward/num_errors" in err


def test_the_trial_call_gets_the_first_row_and_leaves_the_driver_alone(tiny_model_dir, reverse_data, tmp_path,
                                                                        rewards_file, no_ray, capsys, monkeypatch):
    """One call, in a process of its own: the row's data_source, its ground truth as the response, its
    extra_info; what the function does to its process (here its environment) stays there."""
    import pyarrow.parquet as pq

    monkeypatch.delenv("GRPO_DIST_TEST_TRIAL_MARK", raising=False)
    code = run_cfg(reward_cfg(tiny_model_dir, reverse_data, tmp_path / "o", rewards_file, "changes_its_process"))
    one_message(capsys.readouterr().err, 1, code, "stopped here by the test")
    first = pq.read_table(reverse_data["train"]).slice(0, 1).to_pylist()[0]
    truth = first["reward_model"]["ground_truth"]
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert calls == [f"{first['data_source']} {truth!r} {truth!r} {first['extra_info']['index']}"]
    assert "GRPO_DIST_TEST_TRIAL_MARK" not in os.environ
