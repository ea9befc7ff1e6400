"""Start-up checks a new user meets before Ray starts: which data key holds an unreadable file, a
custom reward function tried once on a training row, a full disk told apart from a permission problem.

The runs go through ``grpo_dist.trainer.run.run`` with the tiny model up to where Ray would start."""

from __future__ import annotations

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
