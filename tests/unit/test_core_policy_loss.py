"""The policy-loss registry: lookup, registration rules, vanilla == the PPO clip loss, and the
settings / configuration that name a mode."""

from __future__ import annotations

import pickle

import pytest
import torch

from grpo_dist.core import policy_loss, policy_loss_registry
from grpo_dist.core.losses import LOSS_AGG_MODES, AggSpec, agg_loss, ppo_clip_policy_loss
from grpo_dist.core.policy_loss import (
    PolicyLossInputs,
    PolicyLossParams,
    get_policy_loss,
    list_policy_losses,
    register_policy_loss,
    vanilla_policy_loss,
)
from grpo_dist.core.schedules import LRMultiplier, lr_lambda
from grpo_dist.training.settings import ActorSettings


@pytest.fixture
def registry(monkeypatch):
    """A copy of the registry for the test, so toy modes do not leak into other tests."""
    monkeypatch.setattr(policy_loss_registry, "_REGISTRY", dict(policy_loss_registry._REGISTRY))


def toy_loss(inputs, *, agg, params):
    return agg_loss(-inputs.advantages_BT * inputs.logp_BT, inputs.mask_BT, agg), {}


def other_toy_loss(inputs, *, agg, params):
    return agg_loss(inputs.advantages_BT * inputs.logp_BT, inputs.mask_BT, agg), {}


def random_inputs(seed: int, B: int = 6, T: int = 9):
    g = torch.Generator().manual_seed(seed)
    old = -2.0 + 0.5 * torch.randn(B, T, generator=g)
    logp = (old + 0.4 * torch.randn(B, T, generator=g)).requires_grad_(True)
    adv = torch.randn(B, 1, generator=g).expand(B, T).contiguous()
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    return logp, old, adv, mask


def test_vanilla_is_registered_and_listed():
    assert "vanilla" in list_policy_losses()
    assert list_policy_losses() == sorted(list_policy_losses())
    spec = get_policy_loss("vanilla")
    assert spec.name == "vanilla" and spec.fn is vanilla_policy_loss


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vanilla_equals_ppo_clip_policy_loss(mode, seed):
    logp, old, adv, mask = random_inputs(seed)
    params = PolicyLossParams(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    agg = AggSpec(mode=mode, global_tokens=40.0, global_seqs=5.0, norm_constant=12.0)

    loss_a, metrics_a = get_policy_loss("vanilla").fn(PolicyLossInputs(logp, old, adv, mask), agg=agg, params=params)
    (grad_a,) = torch.autograd.grad(loss_a, logp)
    loss_b, metrics_b = ppo_clip_policy_loss(
        logp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, agg=agg
    )
    (grad_b,) = torch.autograd.grad(loss_b, logp)

    assert torch.equal(loss_a, loss_b)
    assert torch.equal(grad_a, grad_b)
    assert set(metrics_a) == {"pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"}
    for name, value in metrics_b.items():
        assert value.dim() == 0 and torch.equal(metrics_a[name], value), name
    assert grad_a.abs().sum() > 0  # not a degenerate comparison of zeros


def test_vanilla_uses_the_params_clip_ranges():
    logp, old, adv, mask = random_inputs(3)
    agg = AggSpec(mode="token-mean")
    fn, inputs = get_policy_loss("vanilla").fn, PolicyLossInputs(logp, old, adv, mask)
    narrow, m_narrow = fn(inputs, agg=agg, params=PolicyLossParams(clip_ratio_low=0.01, clip_ratio_high=0.01))
    wide, m_wide = fn(inputs, agg=agg, params=PolicyLossParams(clip_ratio_low=0.9, clip_ratio_high=5.0))
    assert m_narrow["pg_clipfrac"] > m_wide["pg_clipfrac"]
    assert not torch.equal(narrow, wide)


def test_unknown_mode_names_the_valid_ones():
    with pytest.raises(ValueError) as info:
        get_policy_loss("gspo-typo")
    msg = str(info.value)
    assert "'gspo-typo'" in msg and "loss_mode" in msg and "vanilla" in msg


def test_registering_a_different_function_under_a_taken_name_is_refused(registry):
    register_policy_loss("toy")(toy_loss)
    register_policy_loss("toy")(toy_loss)  # the same function again (a module imported twice): fine
    with pytest.raises(ValueError, match="'toy' is already registered"):
        register_policy_loss("toy")(other_toy_loss)
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("vanilla")(toy_loss)
    assert get_policy_loss("toy").fn is toy_loss
    assert get_policy_loss("vanilla").fn is vanilla_policy_loss


def test_register_returns_the_function_and_lists_the_new_mode(registry):
    before = set(list_policy_losses())  # other test modules may have registered modes of their own
    assert "vanilla" in before and "toy" not in before
    assert register_policy_loss("toy")(toy_loss) is toy_loss
    assert list_policy_losses() == sorted(before | {"toy"})
    with pytest.raises(ValueError):
        register_policy_loss("")


@pytest.mark.parametrize(
    "kwargs", [dict(clip_ratio_c=1.0), dict(clip_ratio_low=-0.1), dict(clip_ratio_low=1.5), dict(clip_ratio_high=-0.1)]
)
def test_policy_loss_params_reject_bad_values(kwargs):
    with pytest.raises(ValueError):
        PolicyLossParams(**kwargs)


def test_actor_settings_validate_loss_mode_against_the_registry(registry):
    with pytest.raises(ValueError) as info:
        ActorSettings(loss_mode="toy")
    assert "loss_mode" in str(info.value) and "vanilla" in str(info.value)
    register_policy_loss("toy")(toy_loss)
    s = ActorSettings(loss_mode="toy", policy_loss=PolicyLossParams(clip_ratio_high=0.28))
    assert s.loss_mode == "toy"
    assert s.policy_loss == PolicyLossParams(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    assert ActorSettings().loss_mode == "vanilla"


def _config(*overrides: str):
    from grpo_dist.config.loader import compose, to_typed
    from grpo_dist.config.validate import validate_config

    cfg = to_typed(compose(list(overrides)), list(overrides))
    validate_config(cfg, check_paths=False)
    return cfg


def test_config_key_is_validated_and_mapped_onto_the_actor_settings(registry):
    from grpo_dist.config.loader import ConfigError
    from grpo_dist.config.role_settings import actor_settings

    assert _config().actor_rollout_ref.actor.policy_loss.loss_mode == "vanilla"
    with pytest.raises(ConfigError) as info:
        _config("actor_rollout_ref.actor.policy_loss.loss_mode=toy")
    msg = str(info.value)
    assert "actor_rollout_ref.actor.policy_loss.loss_mode" in msg and "'toy'" in msg and "vanilla" in msg

    register_policy_loss("toy")(toy_loss)
    cfg = _config("actor_rollout_ref.actor.policy_loss.loss_mode=toy")
    assert actor_settings(cfg, "cpu", total_training_steps=10).loss_mode == "toy"


def test_sapo_and_dro_keys_reach_the_actor_and_bad_values_are_one_message():
    """verl's SAPO temperatures (actor keys) and DRO's beta (a policy_loss key) reach the actor's loss
    parameters; dro without its beta, or a temperature <= 0, is refused naming the key before anything runs."""
    from grpo_dist.config.loader import ConfigError
    from grpo_dist.config.role_settings import actor_settings

    cfg = _config("actor_rollout_ref.actor.policy_loss.loss_mode=sapo", "actor_rollout_ref.actor.tau_pos=0.9",
                  "actor_rollout_ref.actor.tau_neg=1.3")
    s = actor_settings(cfg, "cpu", total_training_steps=10)
    assert (s.loss_mode, s.policy_loss.tau_pos, s.policy_loss.tau_neg) == ("sapo", 0.9, 1.3)
    cfg = _config("actor_rollout_ref.actor.policy_loss.loss_mode=dro", "actor_rollout_ref.actor.policy_loss.dro_beta=0.2")
    assert actor_settings(cfg, "cpu", total_training_steps=10).policy_loss.dro_beta == 0.2
    for overrides, key in [
        (["actor_rollout_ref.actor.policy_loss.loss_mode=dro"], "actor_rollout_ref.actor.policy_loss.dro_beta"),
        (["actor_rollout_ref.actor.policy_loss.loss_mode=dro", "actor_rollout_ref.actor.policy_loss.dro_beta=-1"],
         "actor_rollout_ref.actor.policy_loss.dro_beta"),
        (["actor_rollout_ref.actor.policy_loss.loss_mode=sapo", "actor_rollout_ref.actor.tau_neg=0"],
         "actor_rollout_ref.actor.tau_neg"),
    ]:
        with pytest.raises(ConfigError) as info:
            _config(*overrides)
        assert key in str(info.value) and "\n" not in str(info.value).strip(), (overrides, str(info.value))
    with pytest.raises(ValueError, match="dro_beta"):
        ActorSettings(loss_mode="dro")


# --- the LR schedule object the actor's LambdaLR holds -----------------------------------------
def test_lr_multiplier_follows_lr_lambda_and_survives_pickling():
    m = LRMultiplier("cosine", warmup_steps=2, total_steps=10, min_lr_ratio=0.1)
    want = [lr_lambda(s, kind="cosine", warmup_steps=2, total_steps=10, min_lr_ratio=0.1) for s in range(11)]
    assert [m(s) for s in range(11)] == want
    copy = pickle.loads(pickle.dumps(m))
    assert [copy(s) for s in range(11)] == want


def test_lr_multiplier_state_is_saved_with_the_scheduler():
    """A resumed run's scheduler gets the saved schedule, not the one it was built with."""
    saved = torch.optim.lr_scheduler.LambdaLR(
        torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), LRMultiplier("constant", 4, 10, 0.0)
    )
    fresh = torch.optim.lr_scheduler.LambdaLR(
        torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), LRMultiplier("constant", 0, 10, 0.0)
    )
    fresh.load_state_dict(saved.state_dict())
    assert fresh.lr_lambdas[0].warmup_steps == 4
    assert fresh.lr_lambdas[0](2) == 0.5


def test_lr_multiplier_rejects_unknown_schedule():
    with pytest.raises(ValueError, match="linear"):
        LRMultiplier("linear", 0, 10, 0.0)
