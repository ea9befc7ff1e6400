"""Checkpoint files are never unpickled with code: a planted payload in any file that resume reads is
refused with a message naming the file, and the payload does not run."""

from __future__ import annotations

import os
import pickle
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from grpo_dist.training.checkpoint_io import (
    UnsafeCheckpointError,
    read_dcp_metadata,
    rng_state,
    safe_dcp_load,
    safe_torch_load,
    set_rng_state,
)


class Payload:
    """Unpickling this runs ``touch <marker>``."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_planted_payload_in_a_per_rank_file_is_refused(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "extra_rank0.pt"
    torch.save({"update_count": 3, "evil": Payload(marker)}, path)
    with pytest.raises(UnsafeCheckpointError, match="refusing to load .*extra_rank0.pt"):
        safe_torch_load(path)
    assert not marker.exists(), "the payload ran"


def test_plain_values_and_rng_state_round_trip(tmp_path):
    import random

    import numpy as np

    state = {"update_count": 3, "rng": rng_state(), "sched": {"last_epoch": 2, "base_lrs": [1e-3], "lr_lambdas": [None]}}
    torch.save(state, tmp_path / "f.pt")
    want = (torch.rand(3), random.random(), np.random.rand())
    set_rng_state(safe_torch_load(tmp_path / "f.pt")["rng"])
    assert (torch.rand(3).tolist(), random.random(), np.random.rand()) == (want[0].tolist(), want[1], want[2])


def dcp_save(state, directory: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # single process, no process group: DCP says so
        dcp.save(state, checkpoint_id=str(directory))


def test_dcp_checkpoint_loads_tensors_and_plain_entries(tmp_path):
    dcp_save({"w": torch.arange(6.0).view(2, 3), "groups": [{"lr": 0.1, "betas": (0.9, 0.99), "params": ["w"]}]}, tmp_path)
    state = {"w": torch.zeros(2, 3), "groups": [{"lr": 0.0, "betas": (0.0, 0.0), "params": [""]}]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        safe_dcp_load(state, tmp_path)
    assert torch.equal(state["w"], torch.arange(6.0).view(2, 3))
    assert state["groups"] == [{"lr": 0.1, "betas": (0.9, 0.99), "params": ["w"]}]


def test_planted_payload_in_a_dcp_entry_is_refused(tmp_path):
    marker = tmp_path / "ran"
    dcp_save({"w": torch.ones(2), "groups": Payload(marker)}, tmp_path / "ckpt")
    with pytest.raises(UnsafeCheckpointError, match="'groups'"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        safe_dcp_load({"w": torch.zeros(2), "groups": 0}, tmp_path / "ckpt")
    assert not marker.exists(), "the payload ran"


def test_planted_payload_in_dcp_metadata_is_refused(tmp_path):
    marker = tmp_path / "ran"
    dcp_save({"w": torch.ones(2)}, tmp_path / "ckpt")
    assert read_dcp_metadata(tmp_path / "ckpt" / ".metadata") is not None  # the real one is accepted
    (tmp_path / "ckpt" / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(UnsafeCheckpointError, match=r"\.metadata: it names posix\.system"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        safe_dcp_load({"w": torch.zeros(2)}, tmp_path / "ckpt")
    assert not marker.exists(), "the payload ran"
