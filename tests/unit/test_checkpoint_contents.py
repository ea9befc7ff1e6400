"""checkpoint.save_contents / load_contents: a checkpoint holds only the parts asked for, resume
restores only the parts asked for, and asking for a part a checkpoint lacks is one clear error.

A plain module with AdamW in one process (DCP writes and reads without a process group here); the FSDP2
path calls the same two functions (tests/distributed/test_fsdp_actor.py covers its full round trip)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from grpo_dist.training import checkpoint_io

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def trained(seed: int):
    torch.manual_seed(seed)
    model = nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    for _ in range(2):
        model(torch.ones(2, 4)).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    return model, opt, sched


def fresh(seed: int = 99):
    torch.manual_seed(seed)
    model = nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))


def is_fresh(opt) -> bool:
    """No AdamW step taken: the state is empty or all zeros at step 0 (DCP initialises it so)."""
    return all(float(v.abs().sum()) == 0 for st in opt.state_dict()["state"].values() for v in st.values())


def test_all_parts_round_trip(tmp_path):
    m, o, s = trained(0)
    checkpoint_io.save_train_state(tmp_path, m, o, s, {"update_count": 2})
    assert checkpoint_io.saved_parts(tmp_path) == {"model", "optimizer"}
    m2, o2, s2 = fresh()
    assert checkpoint_io.load_train_state(tmp_path, m2, o2, s2) == {"update_count": 2}
    assert torch.equal(m2.weight, m.weight) and s2.last_epoch == s.last_epoch == 2
    assert torch.equal(o2.state_dict()["state"][0]["exp_avg"], o.state_dict()["state"][0]["exp_avg"])


def test_model_only_checkpoint_resumes_the_weights_and_refuses_the_rest(tmp_path):
    m, o, s = trained(0)
    checkpoint_io.save_train_state(tmp_path, m, o, s, {"update_count": 2}, contents=("model",))
    assert checkpoint_io.saved_parts(tmp_path) == {"model"}
    m2, o2, s2 = fresh()
    with pytest.raises(FileNotFoundError, match="no optimizer state.*load_contents"):
        checkpoint_io.load_train_state(tmp_path, m2, o2, s2)
    with pytest.raises(FileNotFoundError, match="no LR-scheduler state.*load_contents"):
        checkpoint_io.load_train_state(tmp_path, m2, o2, s2, contents=("model", "extra"))
    assert checkpoint_io.load_train_state(tmp_path, m2, o2, s2, contents=("model",)) == {"update_count": 2}
    assert torch.equal(m2.weight, m.weight)
    assert is_fresh(o2) and s2.last_epoch == 0  # what was not loaded starts fresh


def test_loading_less_than_was_saved_keeps_the_rest_fresh(tmp_path):
    m, o, s = trained(0)
    checkpoint_io.save_train_state(tmp_path, m, o, s, {"update_count": 2})
    m2, o2, s2 = fresh()
    checkpoint_io.load_train_state(tmp_path, m2, o2, s2, contents=("model", "optimizer"))
    assert torch.equal(m2.weight, m.weight) and not is_fresh(o2) and s2.last_epoch == 0
