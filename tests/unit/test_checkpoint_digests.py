"""Every checkpoint file is hashed while it is written (no second read), by the code that writes it:
DCP's shards and metadata, the per-rank state file, the Hugging Face export; the manifest holds each
file's size and SHA-256, and a same-size change to any of them is caught at resume.

A plain module with AdamW in one process (DCP writes without a process group here); the FSDP2 workers
call the same functions."""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from grpo_dist.trainer import checkpoint
from grpo_dist.training import checkpoint_io
from grpo_dist.utils import file_digest

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def trained():
    torch.manual_seed(0)
    model = nn.Linear(64, 32)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(2, 64)).pow(2).sum().backward()
    opt.step()
    return model, opt


def save_step(root, step, *, also=None):
    model, opt = trained()
    tmp = checkpoint.tmp_dir(root, step)
    checkpoint_io.save_train_state(tmp / "actor", model, opt, None, {"update_count": step})
    checkpoint_io.save_model_sharded(tmp / "ref", model)
    if also:
        also(tmp)
    return checkpoint.publish(root, tmp, step, {"global_step": step}, None)


def test_the_workers_files_are_hashed_as_written_not_read_back(tmp_path, monkeypatch):
    read_back = []
    real = file_digest.digest_of
    monkeypatch.setattr(file_digest, "digest_of", lambda p: read_back.append(str(p)) or real(p))
    ckpt = save_step(tmp_path, 2)
    files = json.loads((ckpt / checkpoint.MANIFEST_FILE).read_text())["files"]
    written = {p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*") if p.is_file()} - {checkpoint.MANIFEST_FILE}
    assert set(files) == written  # and no writer's record is left in the checkpoint
    assert {"actor/dcp/.metadata", "actor/extra_rank0.pt", "ref/dcp/.metadata", checkpoint.STATE_FILE} <= written
    assert any(f.startswith("actor/dcp/") and f.endswith(".distcp") for f in written)
    for rel, entry in files.items():
        assert entry == {"size": (ckpt / rel).stat().st_size, "sha256": sha256(ckpt / rel)}, rel
    # only the driver's own file was hashed by reading it back; the workers' were hashed as they were written
    assert [p.rsplit("/", 1)[-1] for p in read_back] == [checkpoint.STATE_FILE]


def test_the_hf_export_is_recorded_by_its_writer(tmp_path, tiny_model_dir, monkeypatch):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tmp = checkpoint.tmp_dir(tmp_path, 1)
    checkpoint_io.export_hf(tmp / "actor" / "huggingface", model, config=model.config, tokenizer_path=tiny_model_dir)
    read_back = []
    real = file_digest.digest_of
    monkeypatch.setattr(file_digest, "digest_of", lambda p: read_back.append(str(p)) or real(p))
    ckpt = checkpoint.publish(tmp_path, tmp, 1, {"global_step": 1}, None)
    files = json.loads((ckpt / checkpoint.MANIFEST_FILE).read_text())["files"]
    hf = {rel for rel in files if rel.startswith("actor/huggingface/")}
    assert {"actor/huggingface/model.safetensors", "actor/huggingface/config.json"} <= hf
    for rel in hf:
        assert files[rel] == {"size": (ckpt / rel).stat().st_size, "sha256": sha256(ckpt / rel)}, rel
    assert [p.rsplit("/", 1)[-1] for p in read_back] == [checkpoint.STATE_FILE]  # the export was recorded
    assert not list(ckpt.rglob(file_digest.DIGESTS_PREFIX + "*"))


@pytest.mark.parametrize("victim", ["actor/dcp/__0_0.distcp", "actor/extra_rank0.pt", "ref/dcp/.metadata"])
def test_a_byte_flipped_in_any_written_file_falls_back_to_the_previous_checkpoint(tmp_path, capsys, victim):
    save_step(tmp_path, 2)
    newest = save_step(tmp_path, 4)
    path = newest / victim
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size
    path.write_bytes(bytes(data))
    trainer = SimpleNamespace(default_local_dir=str(tmp_path), resume_mode="auto", resume_from_path=None)
    point = checkpoint.choose_resume(trainer)
    assert point.path == tmp_path / "global_step_2" and point.step == 2
    assert (f"skipping the damaged checkpoint {newest}: {victim} has changed since it was written (checksum)"
            in capsys.readouterr().err)


def test_a_writer_that_seeks_back_is_hashed_from_disk(tmp_path):
    digests = file_digest.Digests()
    p = tmp_path / "f.bin"
    with file_digest.hashing_open(p, digests) as f:
        f.write(b"a" * 100)
        f.seek(10)
        f.write(b"b")
    assert digests.files[str(p)] == {"size": 100, "sha256": sha256(p)}
