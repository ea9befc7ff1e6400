"""PF-PPO's weights and draws (grpo_dist.core.pf_ppo): hand-computed weights for verl's three methods, a plain
loop as the reference, draws that follow the weights and repeat with the same generator, and the configuration."""

from __future__ import annotations

import pytest
import torch

from grpo_dist.core.pf_ppo import WEIGHT_FLOOR, pf_ppo_indices, pf_ppo_weights
from tests.configs import cfg_of, refused


def reference_weights(scores, method, p):
    hi, lo = max(scores), min(scores)
    out = []
    for s in scores:
        if method == "pow":
            w = abs(s) ** p
        elif method == "max_min":
            w = 1.0 if s in (hi, lo) else 0.0
        else:
            w = 0.4 if s == hi else 0.1
        out.append(max(w + WEIGHT_FLOOR, WEIGHT_FLOOR))
    return out


@pytest.mark.parametrize("method,p,want", [  # scores 1, -0.5, -1, 2, 0.5
    ("pow", 2.0, [1.0, 0.25, 1.0, 4.0, 0.25]),
    ("pow", 1.0, [1.0, 0.5, 1.0, 2.0, 0.5]),
    ("pow", 0.0, [1.0, 1.0, 1.0, 1.0, 1.0]),
    ("max_min", 2.0, [0.0, 0.0, 1.0, 1.0, 0.0]),  # the min (-1) and the max (2)
    ("max_random", 2.0, [0.1, 0.1, 0.1, 0.4, 0.1]),
])
def test_hand_computed_weights(method, p, want):
    scores = [1.0, -0.5, -1.0, 2.0, 0.5]
    w = pf_ppo_weights(torch.tensor(scores), method, p)
    assert w.tolist() == pytest.approx([x + WEIGHT_FLOOR for x in want], abs=1e-7)
    assert w.tolist() == pytest.approx(reference_weights(scores, method, p), abs=1e-7)
    assert (w > 0).all()


def test_a_zero_weight_keeps_the_floor_and_ties_share_the_extremes():
    assert pf_ppo_weights(torch.zeros(3), "pow", 2.0).tolist() == pytest.approx([WEIGHT_FLOOR] * 3)
    assert pf_ppo_weights(torch.tensor([1.0, 1.0, 0.0, 0.5]), "max_min", 2.0).tolist() == pytest.approx(
        [1.0, 1.0, 1.0, WEIGHT_FLOOR], abs=1e-7)
    with pytest.raises(ValueError, match="unknown PF-PPO reweight method 'top'"):
        pf_ppo_weights(torch.ones(2), "top", 2.0)


def test_draws_follow_the_weights_and_repeat_with_the_same_generator():
    w = pf_ppo_weights(torch.tensor([1.0, 0.0, 0.0, 3.0]), "pow", 1.0)  # P = 1/4, ~0, ~0, 3/4
    idx = pf_ppo_indices(w, torch.Generator().manual_seed(0))
    assert idx.shape == (4,) and idx.dtype == torch.int64
    assert torch.equal(idx, pf_ppo_indices(w, torch.Generator().manual_seed(0)))
    many = torch.cat([pf_ppo_indices(w, torch.Generator().manual_seed(s)) for s in range(2000)])
    freq = torch.bincount(many, minlength=4).float() / len(many)
    assert freq[1] == freq[2] == 0 and freq[0] == pytest.approx(0.25, abs=0.02) and freq[3] == pytest.approx(0.75, abs=0.02)


def test_the_configuration_takes_verls_keys_with_gae_only():
    cfg = cfg_of("algorithm.adv_estimator=gae", "algorithm.use_pf_ppo=true", "algorithm.pf_ppo.reweight_method=max_min")
    assert cfg.algorithm.use_pf_ppo and cfg.algorithm.pf_ppo.reweight_method == "max_min"
    msg = refused("algorithm.use_pf_ppo=true")
    assert "only with adv_estimator=gae" in msg and "'grpo'" in msg
    assert "pow, max_min, max_random" in refused("algorithm.adv_estimator=gae", "algorithm.use_pf_ppo=true",
                                                 "algorithm.pf_ppo.reweight_method=top")
    assert "finite number >= 0" in refused("algorithm.adv_estimator=gae", "algorithm.use_pf_ppo=true",
                                           "algorithm.pf_ppo.weight_pow=-1")
    cfg_of("algorithm.pf_ppo.reweight_method=top")  # (read only with use_pf_ppo, as in verl)
