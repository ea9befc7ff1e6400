"""How a run samples: the training, baseline and validation sampling settings, how a step gets its
responses (one batch or DAPO's refill loop), and how the reward worker decodes responses."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from grpo_dist.config.facts import rollout_log_probs
from grpo_dist.config.schema import GRPOConfig
from grpo_dist.rollout.base import SamplingSettings


def train_sampling(cfg: GRPOConfig, seed: int | None = None) -> SamplingSettings:
    r = cfg.actor_rollout_ref.rollout
    return SamplingSettings(
        n=r.n, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_tokens=r.response_length,
        do_sample=r.do_sample, seed=seed, logprobs=rollout_log_probs(cfg), ignore_eos=r.ignore_eos,
    )


def baseline_sampling(cfg: GRPOConfig) -> SamplingSettings:
    """One greedy response per prompt: the baseline rollout of estimators that need one (ReMax)."""
    r = cfg.actor_rollout_ref.rollout
    return replace(SamplingSettings.greedy(r.response_length), ignore_eos=r.ignore_eos)


@dataclass(frozen=True)
class FilterGroups:
    """DAPO's dynamic sampling as the configuration gives it (``algorithm.filter_groups``): the numbers
    of the driver's refill loop (:class:`grpo_dist.trainer.dynamic_sampling.DynamicSampling`, which
    checks them)."""

    train_batch_size: int
    metric: str
    max_num_gen_batches: int = 0
    on_exhausted: str = "error"
    mini_batch_prompts: int = 1


def step_sampling(cfg: GRPOConfig) -> FilterGroups | None:
    """How a step gets its responses: DAPO's refill loop (``algorithm.filter_groups``), or None: one batch."""
    fg = cfg.algorithm.filter_groups
    if not fg.enable:
        return None
    return FilterGroups(train_batch_size=cfg.data.train_batch_size, metric=fg.metric,
                        max_num_gen_batches=fg.max_num_gen_batches, on_exhausted=fg.on_exhausted,
                        mini_batch_prompts=cfg.actor_rollout_ref.actor.ppo_mini_batch_size)


def val_sampling(cfg: GRPOConfig) -> SamplingSettings:
    r = cfg.actor_rollout_ref.rollout
    v = r.val_kwargs
    greedy = not v.do_sample or v.temperature == 0
    return SamplingSettings(
        n=v.n, temperature=0.0 if greedy else v.temperature, top_p=v.top_p, top_k=v.top_k,
        max_tokens=r.response_length, do_sample=not greedy, seed=None, logprobs=False, ignore_eos=r.ignore_eos,
    )


def reward_decoder(cfg: GRPOConfig, tokenizer: Any) -> dict | None:
    """How the reward worker decodes responses without importing transformers: the driver's tokenizer
    rebuilt from its ``tokenizers`` backend (:func:`grpo_dist.rewards.decoding.decoder_spec`); None
    (the worker loads the tokenizer with transformers) when the tokenizer may run its own code or
    decodes in a way of its own."""
    from grpo_dist.rewards.decoding import decoder_spec

    if cfg.actor_rollout_ref.model.trust_remote_code or cfg.data.trust_remote_code:
        return None
    return decoder_spec(tokenizer)
