"""One update through the in-process API equals one update through the FSDP2 actor (1 rank, gloo).

Same starting weights (the tiny model directory), prompts, sampled completions (the API's rollout)
and rewards; the actor gets the batch the driver would build (advantages from the same estimator,
reference and old log-probs from its own forward). Three settings: the API's defaults as they are
(one on-policy step, sequence-sum aggregation of the policy term, the k1 KL aggregated by a token
mean: the actor's ``kl_loss_agg_mode``); the same with the KL term aggregated like the policy term
(verl's rule); and verl's choices (token-mean, low_var_kl, two PPO epochs over two mini-batches,
micro-batches, entropy bonus, clip-higher, a temperature). One spawned job runs all the actors.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from tests.distributed._dist_helpers import run_ranks

LR = 1e-5  # Adam turns float rounding of a near-zero gradient into a step of up to lr: keep it small
G = 4
COMMON = dict(group_size=G, kl_coef=0.1, learning_rate=LR, max_new_tokens=8, max_grad_norm=1.0)
CONFIGS = {
    "defaults": dict(),
    "document": dict(kl_loss_agg_mode=None),
    "verl": dict(
        kl_loss_agg_mode=None,
        loss_agg_mode="token-mean",
        kl_loss_type="low_var_kl",
        ppo_epochs=2,
        mini_batch_size=2,
        micro_batch_size=3,
        entropy_coeff=0.01,
        clip_ratio_high=0.28,
        temperature=0.7,
    ),
}


def actor_settings(api: dict):
    """The ActorSettings that express the same update as ``GRPO(**COMMON, **api)`` (what is not given
    is read from GRPO's own defaults)."""
    from grpo_dist import GRPO
    from grpo_dist.core.policy_loss import PolicyLossParams
    from grpo_dist.training.settings import ActorSettings

    defaults = {n: p.default for n, p in inspect.signature(GRPO).parameters.items() if p.default is not p.empty}
    kw = defaults | COMMON | api
    return ActorSettings(
        lr=kw["learning_rate"],
        weight_decay=0.0,  # the API's Adam
        grad_clip=kw["max_grad_norm"],
        temperature=kw["temperature"],
        loss_agg_mode=kw["loss_agg_mode"],
        norm_constant=float(kw["max_new_tokens"]),
        entropy_coeff=kw["entropy_coeff"],
        use_kl_loss=True,
        kl_loss_coef=kw["kl_coef"],
        kl_loss_type=kw["kl_loss_type"],
        kl_loss_agg_mode=kw["kl_loss_agg_mode"],
        policy_loss=PolicyLossParams(
            clip_ratio_low=kw["clip_ratio_low"], clip_ratio_high=kw["clip_ratio_high"], clip_ratio_c=kw["clip_ratio_c"]
        ),
        ppo_epochs=kw["ppo_epochs"],
        ppo_mini_batch_size_per_gpu=None if kw["mini_batch_size"] is None else kw["mini_batch_size"] * G,
        ppo_micro_batch_size_per_gpu=kw["micro_batch_size"],
    )


def job(rank: int, world_size: int, model_dir: str, batches: dict) -> dict:
    from grpo_dist.training.actor import FSDPActor

    out = {}
    for name, (settings, data) in batches.items():
        actor = FSDPActor(model_dir, settings, rank=rank, world_size=world_size, device="cpu")
        initial, _ = actor.compute_log_prob(data)  # the reference is the initial policy
        data = dict(data, ref_log_prob=initial)
        if settings.ppo_epochs > 1 or settings.ppo_mini_batch_size_per_gpu is not None:
            data["old_log_probs"] = initial
        metrics = actor.update_policy(data)
        out[name] = {"metrics": metrics, "params": actor.state_dict_for_sync()}
    return out


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b) and a, "parameter names differ or are empty"
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def runs(fsdp_model_dir):
    from transformers import AutoModelForCausalLM

    from grpo_dist import GRPO
    from grpo_dist.core.advantages import AdvantageInputs, AdvantageParams, compute_grpo_advantage

    # 4 prompts, left-padded with id 0 to different lengths; 4 end-of-sequence ids so that
    # completions of the random model end at different lengths
    prompts = torch.randint(10, 64, (4, 5), generator=torch.Generator().manual_seed(0))
    prompts[0, :3] = 0
    prompts[2, :1] = 0
    api, batches = {}, {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the spawned rank does: the same kernels, and no spin-waiting on a busy machine
    for name, options in CONFIGS.items():
        model = AutoModelForCausalLM.from_pretrained(fsdp_model_dir, dtype=torch.float32)
        initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
        trainer = GRPO(model, reward_fn=lambda c, p: [0.0] * len(c), pad_token_id=0, eos_token_id=[2, 3, 4, 5],
                       progress=False, **COMMON, **options)
        rollout = trainer.generate(prompts)
        rewards = torch.rand(len(rollout), generator=torch.Generator().manual_seed(1))
        metrics = trainer.update(rollout, rewards)
        api[name] = {"metrics": metrics, "params": {k: v.detach().clone() for k, v in model.state_dict().items()},
                     "initial": initial, "lengths": rollout.response_mask.sum(-1)}

        scores = torch.zeros_like(rollout.response_mask)
        last = rollout.response_mask.sum(-1).long() - 1
        scores[torch.arange(len(rollout)), last] = rewards
        inputs = AdvantageInputs(token_level_rewards_BT=scores, response_mask_BT=rollout.response_mask,
                                 index_B=rollout.group_ids.tolist())
        advantages, _ = compute_grpo_advantage(inputs, AdvantageParams())
        data = {"input_ids": rollout.input_ids, "attention_mask": rollout.attention_mask,
                "position_ids": rollout.position_ids, "responses": rollout.responses,
                "response_mask": rollout.response_mask, "advantages": advantages}
        batches[name] = (actor_settings(options), data)
    torch.set_num_threads(threads)
    (actor,) = run_ranks(job, 1, str(fsdp_model_dir), batches)
    return api, actor


@pytest.mark.parametrize("name", list(CONFIGS))
def test_api_and_fsdp_actor_give_the_same_weights(runs, name):
    api, actor = runs
    lengths = api[name]["lengths"]
    assert lengths.min() < lengths.max(), "the test needs completions of different lengths"
    assert max_diff(api[name]["params"], actor[name]["params"]) < 1e-6
    assert max_diff(api[name]["params"], api[name]["initial"]) > 5e-6, "the update should move the weights"


@pytest.mark.parametrize("name", list(CONFIGS))
def test_api_and_fsdp_actor_report_the_same_loss_terms(runs, name):
    api, actor = runs
    got, want = api[name]["metrics"], actor[name]["metrics"]
    pairs = [("pg_loss", "actor/pg_loss"), ("kl", "actor/kl_loss"), ("grad_norm", "actor/grad_norm"),
             ("actor/ppo_kl", "actor/ppo_kl"), ("actor/pg_clipfrac", "actor/pg_clipfrac")]
    if CONFIGS[name].get("loss_agg_mode") == "token-mean":  # the API's entropy is always a token mean
        pairs.append(("entropy", "actor/entropy"))
    for mine, theirs in pairs:
        assert got[mine] == pytest.approx(want[theirs], rel=1e-4, abs=1e-6), (mine, got[mine], want[theirs])
    if name == "verl":
        assert got["actor/ppo_kl"] != 0.0, "the second epoch is off-policy"
