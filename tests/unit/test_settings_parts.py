"""The trained models' settings are made of shared parts: one part's check refuses the same bad value
in every role's settings, and the parts' defaults are the ones each role had."""

from __future__ import annotations

from dataclasses import fields

import pytest

from grpo_dist.training.settings import (
    ActorSettings,
    CheckpointSettings,
    CriticSettings,
    FSDPModelSettings,
    OptimizerSettings,
    RewardModelSettings,
    ScheduleSettings,
    UpdateBatching,
)

ROLES = (ActorSettings, CriticSettings, RewardModelSettings)


@pytest.mark.parametrize("cls", ROLES)
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(betas=(0.9,)), "betas must be two floats, got (0.9,)"),
        (dict(param_dtype="fp8"), "fp8"),
        (dict(save_contents=("optimizer",)), ".save_contents must hold model and any of optimizer, extra"),
    ],
)
def test_a_shared_part_refuses_the_same_value_in_every_role(cls, kwargs, message):
    with pytest.raises(ValueError) as info:
        cls(**kwargs)
    assert message in str(info.value)
    if "save_contents" in kwargs:
        assert str(info.value).startswith(cls.__name__)


@pytest.mark.parametrize("cls", (ActorSettings, CriticSettings))
def test_the_update_batching_part_checks_counts_and_cuts_micro_batches(cls):
    with pytest.raises(ValueError, match=rf"^{cls.__name__}\.ppo_epochs must be an integer >= 1, got 0$"):
        cls(ppo_epochs=0)
    with pytest.raises(ValueError, match=rf"^{cls.__name__}\.ppo_mini_batch_size_per_gpu must be an integer >= 1 or None"):
        cls(ppo_mini_batch_size_per_gpu=0)
    s = cls(ppo_epochs=3, ppo_micro_batch_size_per_gpu=2)
    assert (s.update_epochs, s.micro_batch_cut(8)) == (3, {"micro_batch_size": 2})
    s = cls(ppo_epochs=3, epochs_in_rows=True, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=99)
    assert (s.update_epochs, s.micro_batch_cut(8)) == (1, {"max_token_len": 99})
    assert cls().micro_batch_cut(8) == {"micro_batch_size": 8}  # None: the whole mini-batch


def test_each_role_is_made_of_its_parts_with_its_own_defaults():
    parts = {ActorSettings: (UpdateBatching, OptimizerSettings, ScheduleSettings, FSDPModelSettings, CheckpointSettings),
             CriticSettings: (UpdateBatching, OptimizerSettings, ScheduleSettings, FSDPModelSettings, CheckpointSettings),
             RewardModelSettings: (OptimizerSettings, FSDPModelSettings, CheckpointSettings)}
    for cls, bases in parts.items():
        names = {f.name for f in fields(cls)}
        for base in bases:
            assert issubclass(cls, base) and {f.name for f in fields(base)} <= names
    assert not issubclass(RewardModelSettings, ScheduleSettings)  # its learning rate is constant
    assert (ActorSettings().lr, CriticSettings().lr, RewardModelSettings().lr) == (1e-6, 1e-5, 1e-5)
    assert (ActorSettings().ppo_max_token_len_per_gpu, CriticSettings().ppo_max_token_len_per_gpu) == (16384, 32768)
