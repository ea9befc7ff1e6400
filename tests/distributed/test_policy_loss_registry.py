"""A policy-loss mode registered outside the project drives the real FSDP2 actor (gloo, 2 ranks).

The toy mode is registered when this module is imported: in pytest's process and in every spawned
rank, which imports this module to find the job function. The actor's update must be the one the toy
loss implies (checked against a plain single-process transformers model stepped with the same loss
and AdamW), and the toy loss's own metric must be reported as ``actor/<name>``.
"""

from __future__ import annotations

import math

import pytest
import torch

from grpo_dist.core.losses import agg_loss, masked_mean
from grpo_dist.core.policy_loss import register_policy_loss
from tests.distributed._dist_helpers import make_batch, noise, rows, run_ranks

T = 0.7  # sampling temperature
LR = 1e-5  # small enough that Adam's float rounding (~1e-7) stays far below the weights' movement
GRAD_CLIP = 1.0
WORLD_SIZE = 2
NUM_MINI_BATCHES = 2  # two optimizer steps, so the second depends on the first
TOY = "toy_reinforce"


@register_policy_loss(TOY)
def toy_reinforce_loss(inputs, *, agg, params):
    """REINFORCE without a ratio or clipping: per-token ``-A * logp``. Metric: the mean log-prob."""
    logp_BT, mask_BT = inputs.logp_BT, inputs.mask_BT
    loss = agg_loss(-inputs.advantages_BT.detach() * logp_BT, mask_BT, agg)
    return loss, {"toy_logp_mean": masked_mean(logp_BT.detach(), mask_BT)}


def step_batch() -> dict[str, torch.Tensor]:
    """8 rows; old log-probs away from the model's, so the PPO ratio (which the toy loss ignores)
    is not 1 and the clipped loss would give another update."""
    data = make_batch(21, rows=8)
    data["old_log_probs"] = -math.log(64.0) + noise(22, (8, 8), 0.3)
    data["advantages"] = noise(23, (8, 8), 1.0)
    return data


def job(rank: int, world_size: int, model_dir: str) -> dict:
    from grpo_dist.training.actor import FSDPActor
    from grpo_dist.training.micro_batches import rank_shard_indices
    from grpo_dist.training.settings import ActorSettings

    settings = ActorSettings(
        loss_mode=TOY,
        lr=LR,
        temperature=T,
        grad_clip=GRAD_CLIP,
        weight_decay=0.01,
        ppo_mini_batch_size_per_gpu=2,
        ppo_micro_batch_size_per_gpu=1,
    )
    actor = FSDPActor(model_dir, settings, rank=rank, world_size=world_size, device="cpu")
    data = step_batch()
    mine = rows(data, rank_shard_indices(8, num_mini_batches=NUM_MINI_BATCHES, rank=rank, world_size=world_size))
    metrics = actor.update_policy(mine)
    return {"metrics": metrics, "params": actor.state_dict_for_sync()}


def plain_update(model_dir, data, per_token_loss) -> tuple[dict[str, torch.Tensor], list[float], list[float]]:
    """One process, no FSDP: the same mini-batches, loss ``token-mean(per_token_loss)``, clipping and
    AdamW. Returns the new weights, each mini-batch's loss and mean log-prob before its step."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), weight_decay=0.01)
    R = data["responses"].shape[1]
    n = data["responses"].shape[0]
    mini = n // NUM_MINI_BATCHES
    losses, logp_means = [], []
    for k in range(NUM_MINI_BATCHES):
        mb = rows(data, list(range(k * mini, (k + 1) * mini)))
        logits = model(
            input_ids=mb["input_ids"], attention_mask=mb["attention_mask"], position_ids=mb["position_ids"]
        ).logits
        logp = torch.log_softmax(logits[:, -R - 1 : -1].float() / T, dim=-1)
        logp = logp.gather(-1, mb["responses"].unsqueeze(-1)).squeeze(-1)
        mask = mb["response_mask"]
        loss = (per_token_loss(logp, mb) * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        logp_means.append(((logp.detach() * mask).sum() / mask.sum()).item())
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses, logp_means


def reinforce(logp, mb):
    return -mb["advantages"] * logp


def ppo_clip(logp, mb):
    """The default (vanilla) loss written out: PPO clip with range 0.2 and dual clip 3."""
    adv = mb["advantages"]
    ratio = torch.exp((logp - mb["old_log_probs"]).clamp(-20, 20))
    clipped = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    return torch.where(adv < 0, torch.minimum(clipped, -adv * 3.0), clipped)


def max_param_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b) and a, "parameter names differ or are empty"
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def ranks(fsdp_model_dir):
    return run_ranks(job, WORLD_SIZE, str(fsdp_model_dir))


@pytest.fixture(scope="module")
def plain(fsdp_model_dir):
    data = step_batch()
    return {
        "toy": plain_update(str(fsdp_model_dir), data, reinforce),
        "vanilla": plain_update(str(fsdp_model_dir), data, ppo_clip),
    }


def test_registered_toy_loss_drives_the_fsdp_update(ranks, plain, fsdp_model_dir):
    from safetensors.torch import load_file

    initial = load_file(str(fsdp_model_dir / "model.safetensors"))
    got = ranks[0]["params"]
    want, _, _ = plain["toy"]
    assert max_param_diff(got, want) < 1e-6
    assert max_param_diff(got, initial) > 5e-6, "the update should move the weights"
    # control: the default loss would have given another update (the mode really was switched)
    vanilla, _, _ = plain["vanilla"]
    assert max_param_diff(got, vanilla) > 5e-6


def test_toy_loss_metrics_are_reported_under_actor(ranks, plain):
    m0, m1 = ranks[0]["metrics"], ranks[1]["metrics"]
    assert m0 == m1, "metrics must be identical on all ranks"
    _, losses, logp_means = plain["toy"]
    # a token-weighted mean over micro-batches and ranks, averaged over the mini-batches
    assert m0["actor/toy_logp_mean"] == pytest.approx(sum(logp_means) / len(logp_means), rel=1e-5)
    assert m0["actor/pg_loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-4, abs=1e-6)
    # the vanilla mode's metrics are not reported: the actor has no list of metric names
    assert not any(k in m0 for k in ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"))
    assert {"actor/entropy", "actor/grad_norm", "actor/lr"} <= set(m0)
