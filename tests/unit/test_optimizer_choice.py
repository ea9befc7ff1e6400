"""verl's optimizer keys (``optim.optimizer``, ``optim.optimizer_impl``, ``optim.override_optimizer_config``):
which class a trained model gets, with which arguments, and the one-message refusals before anything starts.
(The FSDP2 actor building another optimizer and resuming it exactly: tests/distributed/test_fsdp_actor.py.)"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from grpo_dist.training.optim import make_optimizer
from grpo_dist.training.optimizer_choice import optimizer_arguments, optimizer_class
from tests.configs import cfg_of as load
from tests.configs import refused

OPTIM = "actor_rollout_ref.actor.optim"


def test_the_class_comes_from_the_module_and_a_wrong_name_lists_the_valid_ones():
    assert optimizer_class("torch.optim", "SGD") is torch.optim.SGD
    with pytest.raises(ValueError, match=r"optimizer 'Adamw' is not an optimizer class of torch.optim; valid: .*AdamW"):
        optimizer_class("torch.optim", "Adamw")
    with pytest.raises(ValueError, match="re-evaluates the loss"):
        optimizer_class("torch.optim", "LBFGS")
    with pytest.raises(ValueError, match="optimizer_impl 'no_such_pkg.optim' does not import"):
        optimizer_class("no_such_pkg.optim", "AdamW")
    with pytest.raises(ValueError, match="not an optimizer class"):
        optimizer_class("torch.optim", "lr_scheduler")  # a module attribute, not an optimizer


def test_arguments_follow_verls_rule_and_the_overrides_win():
    base = dict(lr=0.1, betas=(0.8, 0.9), weight_decay=0.01)
    assert optimizer_arguments("SGD", **base) == {"lr": 0.1, "weight_decay": 0.01}
    assert optimizer_arguments("AdamW", **base) == {"lr": 0.1, "weight_decay": 0.01, "betas": (0.8, 0.9)}
    assert optimizer_arguments("AdamW8bit", **base)["betas"] == (0.8, 0.9)  # by name, as verl: any "adam"
    assert optimizer_arguments("SGD", **base, extra={"momentum": 0.9, "lr": 0.2}) == {
        "lr": 0.2, "weight_decay": 0.01, "momentum": 0.9}


def test_make_optimizer_builds_the_class_over_the_trainable_parameters():
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    model[0].weight.requires_grad_(False)
    default = make_optimizer(model, lr=1e-3, betas=(0.9, 0.999), weight_decay=0.01)
    assert type(default) is torch.optim.AdamW and default.defaults["foreach"] is True  # as before the keys existed
    assert default.defaults["betas"] == (0.9, 0.999) and default.defaults["weight_decay"] == 0.01
    sgd = make_optimizer(model, lr=0.5, betas=(0.9, 0.999), weight_decay=0.0, optimizer="SGD",
                         extra={"momentum": 0.9, "nesterov": True})
    assert type(sgd) is torch.optim.SGD and (sgd.defaults["momentum"], sgd.defaults["nesterov"]) == (0.9, True)
    held = {id(p) for g in sgd.param_groups for p in g["params"]}
    assert held == {id(p) for p in model.parameters() if p.requires_grad} and id(model[0].weight) not in held


def test_the_keys_reach_the_actor_and_the_critic():
    from grpo_dist.config.role_settings import actor_settings, critic_settings

    cfg = load(f"{OPTIM}.optimizer=SGD", f"+{OPTIM}.override_optimizer_config.momentum=0.9",
               "critic.optim.optimizer=Adam", "+critic.optim.override_optimizer_config.eps=1e-6")
    a = actor_settings(cfg, "cpu", total_training_steps=10)
    assert (a.optimizer, a.optimizer_impl, a.optimizer_kwargs) == ("SGD", "torch.optim", {"momentum": 0.9})
    c = critic_settings(cfg, "cpu", total_training_steps=10)
    assert (c.optimizer, c.optimizer_kwargs) == ("Adam", {"eps": 1e-6})
    d = actor_settings(load(), "cpu", total_training_steps=10)
    assert (d.optimizer, d.optimizer_impl, d.optimizer_kwargs) == ("AdamW", "torch.optim", {})


@pytest.mark.parametrize("overrides,key,words", [
    ([f"{OPTIM}.optimizer=Sgd"], f"{OPTIM}.optimizer", "valid: "),
    ([f"{OPTIM}.optimizer_impl=no_such_pkg.optim"], f"{OPTIM}.optimizer_impl", "does not import"),
    ([f"{OPTIM}.optimizer=SGD", f"+{OPTIM}.override_optimizer_config.eps=1e-8"], f"{OPTIM}.override_optimizer_config",
     "unexpected keyword argument 'eps'"),
    ([f"{OPTIM}.optimizer=SGD", f"+{OPTIM}.override_optimizer_config.momentum=-1"], f"{OPTIM}.override_optimizer_config",
     "momentum"),
    (["algorithm.adv_estimator=gae", "critic.optim.optimizer=LBFGS"], "critic.optim.optimizer", "re-evaluates the loss"),
])
def test_a_bad_optimizer_is_one_message_naming_the_key(overrides, key, words):
    msg = refused(*overrides)
    assert msg.startswith(key) and words in msg and "\n" not in msg, msg
