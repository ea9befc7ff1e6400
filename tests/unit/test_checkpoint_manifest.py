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


@pytest.mark.parametrize("legacy", [False, True], ids=["with-manifest", "without-manifest"])
def test_missing_state_file_is_named_and_skipped(tmp_path, capsys, legacy):
    save(tmp_path, 2)
    newest = save(tmp_path, 4)
    (newest / checkpoint.STATE_FILE).unlink()
    if legacy:  # a folder written before manifests existed
        (newest / checkpoint.MANIFEST_FILE).unlink()
    point = checkpoint.choose_resume(trainer(tmp_path))
    assert point.path == tmp_path / "global_step_2" and point.step == 2
    err = capsys.readouterr().err
    assert f"skipping the damaged checkpoint {newest}" in err and checkpoint.STATE_FILE in err
    assert ("trainer_state.json is missing" if not legacy else "it has no trainer_state.json") in err


def test_nothing_to_resume_from_says_so(tmp_path, capsys):
    only = save(tmp_path, 1)
    (only / "actor" / "shard.bin").unlink()
    assert checkpoint.choose_resume(trainer(tmp_path)) is None
    err = capsys.readouterr().err
    assert f"skipping the damaged checkpoint {only}" in err and "starting from step 0" in err
    assert checkpoint.choose_resume(trainer(tmp_path / "empty")) is None
    assert capsys.readouterr().err == ""  # a fresh directory is not a warning


def test_retention_never_deletes_the_only_verified_checkpoint(tmp_path, capsys):
    """Step 2 verified, step 4 damaged; the run resumes from 2 and saves step 3 keeping one: step 3
    (the checkpoint just written) survives, not the damaged step 4 alone."""
    save(tmp_path, 2)
    damaged = save(tmp_path, 4)
    (damaged / "actor" / "shard.bin").write_bytes(b"weights")
    assert checkpoint.resume_target(trainer(tmp_path)) == tmp_path / "global_step_2"
    save(tmp_path, 3, keep=1)
    assert [p.name for _, p in checkpoint.step_folders(tmp_path)] == ["global_step_3", "global_step_4"]
    capsys.readouterr()
    assert checkpoint.resume_target(trainer(tmp_path)) == tmp_path / "global_step_3"
    assert f"skipping the damaged checkpoint {damaged}" in capsys.readouterr().err


def test_retention_counts_only_checkpoints_that_verify(tmp_path):
    for step in (1, 2, 3):
        save(tmp_path, step)
    (tmp_path / "global_step_3" / "actor" / "shard.bin").write_bytes(b"")  # damaged: does not count
    save(tmp_path, 4, keep=2)
    # kept: the new one and the newest older one that verifies (2); the damaged 3 and the surplus 1 go
    assert [p.name for _, p in checkpoint.step_folders(tmp_path)] == ["global_step_2", "global_step_4"]
    assert checkpoint.verify(tmp_path / "global_step_2") is None


# ---- every file hashed as written, verified in full at load -------------------------------------------
def test_a_same_size_change_to_a_file_over_256_mib_is_caught(tmp_path, capsys):
    """A model shard of a real model is hundreds of MiB: changing a byte of it (same size) makes the
    checkpoint damaged, and resume falls back to the previous one."""
    save(tmp_path, 2)
    tmp = checkpoint.tmp_dir(tmp_path, 4)
    (tmp / "actor").mkdir()
    shard = tmp / "actor" / "shard.bin"
    with open(shard, "wb") as f:
        f.truncate(300 * 2**20)  # 300 MiB (sparse: quick to make)
    newest = checkpoint.publish(tmp_path, tmp, 4, {"global_step": 4}, None)
    assert checkpoint.verify(newest) is None
    with open(newest / "actor" / "shard.bin", "r+b") as f:
        f.seek(123 * 2**20)
        f.write(b"\x01")
    assert (newest / "actor" / "shard.bin").stat().st_size == 300 * 2**20
    assert checkpoint.resume_target(trainer(tmp_path)) == tmp_path / "global_step_2"
    assert (f"skipping the damaged checkpoint {newest}: actor/shard.bin has changed since it was written (checksum)"
            in capsys.readouterr().err)


def legacy(root, step):
    """A checkpoint folder as written before manifests existed (or by hand): complete, but unverifiable."""
    ckpt = save(root, step)
    (ckpt / checkpoint.MANIFEST_FILE).unlink()
    return ckpt


def test_a_folder_without_manifest_is_not_resumed_from_silently(tmp_path, capsys):
    save(tmp_path, 2)
    unverifiable = legacy(tmp_path, 4)
    with pytest.raises(ValueError) as e:
        checkpoint.resume_target(trainer(tmp_path))
    msg = str(e.value)
    assert f"{unverifiable}, cannot be verified: it has no manifest.json" in msg
    # the ways on: resume from it explicitly, move it away, or start fresh
    assert f"trainer.resume_mode=resume_path trainer.resume_from_path={unverifiable}" in msg
    assert f"move it out of trainer.default_local_dir={tmp_path}" in msg and "trainer.resume_mode=disable" in msg
    assert unverifiable.exists() and capsys.readouterr().err == ""

    # named explicitly, it is taken as it is, with one warning
    got = checkpoint.choose_resume(trainer(tmp_path, "resume_path", str(unverifiable)))
    assert got.path == unverifiable and got.step == 4
    err = capsys.readouterr().err
    assert f"warning: resuming from {unverifiable} without verifying it: it has no manifest.json" in err

    # moved away, the newest verified checkpoint is resumed from
    unverifiable.rename(tmp_path.parent / "moved_away")
    assert checkpoint.resume_target(trainer(tmp_path)) == tmp_path / "global_step_2"


def test_a_folder_without_manifest_below_a_verified_one_is_not_in_the_way(tmp_path, capsys):
    legacy(tmp_path, 2)
    save(tmp_path, 4)
    assert checkpoint.resume_target(trainer(tmp_path)) == tmp_path / "global_step_4"
    assert capsys.readouterr().err == ""
