"""A loss parameter is declared once, as a field of PolicyLossParams, and everything else is derived.

For every field whose config key is ``actor_rollout_ref.actor.policy_loss.<name>``: the key exists in
the schema with the field's default and help, in the generated conf/grpo_trainer.yaml and
docs/configuration.md, a Hydra override of it reaches ``ActorSettings.policy_loss`` (and so the loss
function's ``params``), a bad value is refused at validation naming the key, and the Python API takes
it in ``policy_loss_params``. A new field therefore needs no edit outside core/policy_loss.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from grpo_dist.config import docgen
from grpo_dist.config.fields import ConfigError
from grpo_dist.config.loader import compose, to_typed
from grpo_dist.config.schema import PolicyLossConfig
from grpo_dist.config.validate import validate_config
from grpo_dist.core.losses import agg_loss
from grpo_dist.core.policy_loss import POLICY_LOSS_KEY, PolicyLossParams, policy_loss_keys

PRE = "actor_rollout_ref.actor.policy_loss."
KEYS = policy_loss_keys()


def another_value(f: dataclasses.Field):
    """A valid value of the field other than its default (extend for a new field type)."""
    if isinstance(f.default, bool):
        return not f.default
    if isinstance(f.default, int):
        return f.default + 1
    if isinstance(f.default, float):
        return f.default / 2
    if f.default is None and f.type in ("float | None", float | None):  # a number with no default (dro_beta)
        return 0.25
    raise AssertionError(f"PolicyLossParams.{f.name}: teach another_value a value of {type(f.default).__name__}")


def load(*overrides: str):
    cfg = to_typed(compose(list(overrides)), list(overrides))
    validate_config(cfg, check_paths=False)
    return cfg


def test_the_policy_loss_section_is_the_parameters_plus_the_mode():
    assert {f.name for f in KEYS} == {"clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef",
                                      "dro_beta"}
    assert all(f.metadata["key"] == POLICY_LOSS_KEY and f.metadata["help"] for f in KEYS)
    names = [f.name for f in dataclasses.fields(PolicyLossConfig)]
    # the declaration's order, then the other spelling of SAPO's temperatures that verl's SAPO scripts use
    assert names == ["loss_mode", *(f.name for f in KEYS), "tau_pos", "tau_neg"]
    # the other fields are keys elsewhere (actor.clip_ratio_*, actor.tau_*, algorithm.rollout_correction), not here
    others = {f.name for f in dataclasses.fields(PolicyLossParams)} - {f.name for f in KEYS}
    assert others == {"clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "rollout_correction", "tau_pos", "tau_neg"}
    assert not (others - {"tau_pos", "tau_neg"}) & set(names)


@pytest.mark.parametrize("f", KEYS, ids=lambda f: f.name)
def test_each_parameter_is_a_documented_config_key_with_its_default(f):
    schema_field = {g.name: g for g in dataclasses.fields(PolicyLossConfig)}[f.name]
    assert schema_field.default == f.default
    assert schema_field.metadata["help"] == f.metadata["help"]
    assert getattr(load().actor_rollout_ref.actor.policy_loss, f.name) == f.default
    shown = "null" if f.default is None else repr(f.default)
    yaml_line = f"{f.name}: {shown}  # {f.metadata['help']}"
    assert yaml_line in {line.strip() for line in docgen.YAML_PATH.read_text().splitlines()}
    row = f"| `{PRE}{f.name}` | `{shown}` | honoured | {f.metadata['help'].replace('|', '/')} |"
    assert row in docgen.DOC_PATH.read_text().splitlines()
    assert docgen.main(["--check"]) == 0


@pytest.mark.parametrize("f", KEYS, ids=lambda f: f.name)
def test_an_override_reaches_the_actor_settings_and_the_loss(f, monkeypatch):
    from grpo_dist.core import policy_loss, policy_loss_registry
    from grpo_dist.config.role_settings import actor_settings
    from grpo_dist.training.objective import PolicyObjective

    value = another_value(f)
    monkeypatch.setattr(policy_loss_registry, "_REGISTRY", dict(policy_loss_registry._REGISTRY))
    seen = []

    @policy_loss.register_policy_loss("params_probe")
    def probe(inputs, *, agg, params):
        seen.append(getattr(params, f.name))
        return agg_loss(-inputs.advantages_BT * inputs.logp_BT, inputs.mask_BT, agg), {}

    cfg = load(f"{PRE}{f.name}={value}", f"{PRE}loss_mode=params_probe")
    settings = actor_settings(cfg, "cpu", total_training_steps=10)
    assert settings.policy_loss == PolicyLossParams(**{f.name: value})
    objective = PolicyObjective.from_settings(settings)
    x = torch.zeros(2, 3)
    objective.policy_loss.fn(policy_loss.PolicyLossInputs(x, x, x, x + 1), agg=objective.agg_spec(6.0, 2.0),
                             params=objective.params)
    assert seen == [value]


def test_a_value_the_parameters_refuse_is_a_config_error_naming_the_key(monkeypatch):
    """Validation runs PolicyLossParams' own checks, so a new parameter's check needs no line there."""

    def refuse_the_bound(self):
        raise ValueError(f"clip_cov_ub must not be {self.clip_cov_ub}")

    monkeypatch.setattr(PolicyLossParams, "__post_init__", refuse_the_bound)
    with pytest.raises(ConfigError) as info:
        load(f"{PRE}clip_cov_ub=4.0")
    assert str(info.value) == f"{PRE}clip_cov_ub must not be 4.0"


def test_the_python_api_takes_every_parameter_by_name():
    from grpo_dist import GRPO

    values = {f.name: another_value(f) for f in KEYS}
    model = nn.Sequential(nn.Embedding(8, 4), nn.Linear(4, 8))
    trainer = GRPO(model, reward_fn=lambda completions, prompts: [0.0] * len(completions),
                   policy_loss_params=values, progress=False)
    assert trainer.objective.params == PolicyLossParams(**values)
