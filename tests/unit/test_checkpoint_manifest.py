"""Checkpoints prove themselves: a manifest written last; resume falls back from a damaged newest
checkpoint to the newest one that verifies, naming what it skipped."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from grpo_dist.trainer import checkpoint


def save(root, step, payload=b"weights" * 100, keep=None):
    tmp = checkpoint.tmp_dir(root, step)
    (tmp / "actor").mkdir()
    (tmp / "actor" / "shard.bin").write_bytes(payload)
    return checkpoint.publish(root, tmp, step, {"global_step": step}, keep)


def trainer(root, mode="auto", path=None):
    return SimpleNamespace(default_local_dir=str(root), resume_mode=mode, resume_from_path=path)


def test_manifest_lists_every_file_and_a_fresh_checkpoint_verifies(tmp_path):
    ckpt = save(tmp_path, 2)
    files = json.loads((ckpt / checkpoint.MANIFEST_FILE).read_text())["files"]
    assert set(files) == {"actor/shard.bin", checkpoint.STATE_FILE}
    assert files["actor/shard.bin"]["size"] == 700 and len(files["actor/shard.bin"]["sha256"]) == 64
    assert checkpoint.verify(ckpt) is None


@pytest.mark.parametrize("damage, why", [
    (lambda c: (c / "actor" / "shard.bin").write_bytes(b"weights"), "actor/shard.bin has 7 bytes, 700 were written"),
    (lambda c: (c / "actor" / "shard.bin").write_bytes(b"X" * 700), "actor/shard.bin has changed"),
    (lambda c: (c / "actor" / "shard.bin").unlink(), "actor/shard.bin is missing"),
    (lambda c: (c / checkpoint.STATE_FILE).write_text('{"global_st'), "trainer_state.json has"),
])
def test_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, capsys, damage, why):
    save(tmp_path, 2)
    newest = save(tmp_path, 4)
    damage(newest)
    got = checkpoint.resume_target(trainer(tmp_path))
    assert got == tmp_path / "global_step_2"
    err = capsys.readouterr().err
    assert f"skipping the damaged checkpoint {newest}" in err and why in err
    assert newest.exists(), "a damaged checkpoint is reported, never deleted"


def test_resume_path_that_does_not_verify_is_refused(tmp_path):
    ckpt = save(tmp_path, 3)
    (ckpt / "actor" / "shard.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="resume_from_path=.*is damaged: actor/shard.bin has 0 bytes"):
        checkpoint.resume_target(trainer(tmp_path, "resume_path", str(ckpt)))


def test_truncated_state_file_is_named(tmp_path):
    ckpt = save(tmp_path, 1)
    (ckpt / checkpoint.STATE_FILE).write_text('{"global_st')
    with pytest.raises(ValueError, match=r"trainer_state.json is damaged"):
        checkpoint.read_state(ckpt)


def test_retention_keeps_the_newest(tmp_path):
    for step in (1, 2, 3):
        save(tmp_path, step, keep=2)
    assert [p.name for p in checkpoint.complete_checkpoints(tmp_path)] == ["global_step_2", "global_step_3"]
