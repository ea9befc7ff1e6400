"""The reward stage of a step: the run's reward sources scored and summed into the step's token-level
rewards.

The sources (:mod:`grpo_dist.config.reward_sources`) are the rule source (the reward worker's function:
the built-in scorers, or the custom function) and any number of learned reward models, each with a
weight. Without a reward model this is the reward worker's result as it comes (times the rule source's
weight): the score of each response on its last token, or with process supervision (``grpo_process``)
the user function's step rewards on the tokens that end each step, DAPO's overlong shaping on top.

Each reward model's ranks score the responses (sharded like the reference forward, one equal share
per rank of its pool):

- an outcome reward model's score is read at the last valid token and placed on the last response
  token;
- a process reward model's scores are read at its step-end tokens (tokens whose text holds its step
  separator, and the last response token) and placed there, so ``grpo_process`` works without a user
  function. A response with no separator is one step (said once per run and model).

The reward is :func:`grpo_dist.rewards.combine.weighted_sum` of the sources' placed scores (sources of
weight 0 left out), and the response's score the same sum of their response scores; with
``grpo_process``, ``step_end_mask`` marks every token a weighted source put a score on. The rule
scores are computed only when their weight is not 0 or iterative RL needs them as labels; with
iterative RL the stage also writes ``rm_targets`` [B, R], the verifier's labels on the positions the
trained reward model is trained at (on the last response token; per step for a process reward model
when the function returns ``step_rewards``; NaN elsewhere): 1 where the rule score is at or above
``reward_model.iterative.label_threshold`` and 0 below it, or with a null threshold the score clamped
to [0, 1] (:func:`grpo_dist.core.reward_model.verifier_labels`).

Validation always scores with the rule-based scorers (the verifier), never with a reward model.

Metrics, per reward model under its prefix (``reward_model`` for verl's one, ``reward_model/<name>`` for a
source of ``reward.sources``): ``<prefix>/score/{mean,max,min}`` (the outcome score of each response, or
a process reward model's step scores), ``timing_s/<prefix>`` and ``timing_s/<prefix>/worker``; and
``reward_model/rule_score/mean`` when the rule scores were computed beside the reward models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from grpo_dist.batch import Batch
from grpo_dist.config.reward_sources import IMPLICIT_MODEL, RewardSource
from grpo_dist.config.spec import RunSpec
from grpo_dist.core.reward_model import verifier_labels
from grpo_dist.distributed.worker_group import WorkerGroup
from grpo_dist.rewards.combine import weighted_sum
from grpo_dist.rewards.shaping import OverlongBuffer, apply_overlong_penalty
from grpo_dist.rewards.tokens import SeparatorTokens, place_scores_on_last_token, token_step_ends
from grpo_dist.rollout.assemble import response_tokens
from grpo_dist.trainer.metrics import Timer
from grpo_dist.trainer.summary import ScoreCounts, TrainingError
from grpo_dist.training.settings import FORWARD_KEYS
from grpo_dist.workers.common import unwrap_timed

__all__ = ["ModelScorer", "RewardStage"]


def _last_token_mask(response_mask_BR: torch.Tensor) -> torch.Tensor:
    return place_scores_on_last_token(torch.ones(response_mask_BR.shape[0]), response_mask_BR)


@dataclass
class ModelScorer:
    """One reward model of the run at work: its source, its worker group, its folder (for messages), whether
    it reads re-encoded text, and for a process reward model the tokens that end a step (from ``tokenizer``)."""

    source: RewardSource
    group: WorkerGroup
    path: str
    reencode: bool = False
    tokenizer: Any = field(default=None, repr=False)
    warned_no_separator: bool = False

    def __post_init__(self) -> None:
        self.separators = SeparatorTokens(self.tokenizer, self.source.step_separator) if self.source.is_process else None

    @property
    def label(self) -> str:
        """How messages name it: its folder, and its source's name when it has one."""
        return self.path if self.source.name == IMPLICIT_MODEL else f"{self.path} (reward source {self.source.name!r})"


class RewardStage:
    """Scores batches for the driver (``score``): the rule source from the reward worker, and the reward models.

    Args:
        rule: the reward worker group (rule-based scorers and the custom function).
        needs_step_rewards: the advantage estimator reads step rewards (process supervision).
        overlong: DAPO's overlong shaping of training rewards, or None.
        rule_weight: the rule source's weight (0 when the run has none: its scores are then computed only as
            iterative RL's labels).
        models: the run's reward models, in the order of its sources.
        label_threshold: with a trained reward model, the rule score at or above which a label is 1 (None:
            soft labels, the score clamped to [0, 1]).
    """

    def __init__(self, rule: WorkerGroup, *, needs_step_rewards: bool, overlong: OverlongBuffer | None,
                 rule_weight: float = 1.0, models: list[ModelScorer] | tuple[ModelScorer, ...] = (),
                 label_threshold: float | None = 0.5) -> None:
        self.rule, self.rule_weight, self.models = rule, rule_weight, list(models)
        self.needs_step_rewards, self.overlong = needs_step_rewards, overlong
        self.trained = next((m for m in self.models if m.source.trained), None)
        self.label_threshold = label_threshold
        self.counts = ScoreCounts()  # every score of the run, and the failed ones (on_error=zero)

    @classmethod
    def from_plan(cls, spec: RunSpec, plan: Any, rule: WorkerGroup, groups: dict[str, WorkerGroup], *,
                  tokenizer: Any, tokenizer_path: str) -> "RewardStage":
        """The stage of a run: its sources from ``spec``, each reward model's worker group from ``groups``
        (by its role), the overlong shaping and the labels' threshold from the driver's plan
        (:class:`grpo_dist.config.driver_plan.DriverPlan`)."""
        from grpo_dist.core.advantages import get_adv_estimator

        models = []
        for s in spec.reward_sources:
            if s.is_model:
                path = spec.reward_model_path(s.role)
                models.append(ModelScorer(s, groups[s.role], path, tokenizer=tokenizer,
                                          reencode=spec.reward_model_reencodes(path, tokenizer_path) is not None))
        rule_weight = next((s.weight for s in spec.reward_sources if s.kind == "rule"), 0.0)
        return cls(rule, needs_step_rewards=get_adv_estimator(plan.estimator).needs_step_rewards,
                   overlong=plan.overlong, rule_weight=rule_weight, models=models,
                   label_threshold=plan.iterative.label_threshold if plan.iterative is not None else None)

    # ------------------------------------------------------------------------------------------
    def score(self, batch: Batch, *, token_level: bool = True, timer: Timer | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """Scores [B]; with ``token_level`` also ``token_level_scores`` in the batch (and
        ``step_end_mask`` with process supervision, ``rm_targets`` with iterative RL). The batch also gets
        ``reward_extra_info``: per row, the reward function's extra values (a dict: the keys of its dict result,
        or ``acc`` for a number it returned; empty when it did not score the batch)."""
        batch["reward_extra_info"] = [{} for _ in range(len(batch))]
        if not self.models or not token_level:
            return self._rule_only(batch, token_level)
        timer = timer or Timer()
        rule = None
        if self.rule_weight != 0 or self.trained is not None:
            # step rewards from the function: required when the reward reads them for grpo_process (as without a
            # reward model); taken when there are some beside a process reward model, or as its labels
            steps = (self.needs_step_rewards and self.rule_weight != 0) or (
                self.trained is not None and self.trained.source.is_process)
            rule = self._rule_call(batch, token_level=True, step_rewards=steps,
                                   optional=any(m.source.is_process for m in self.models))
        mask_BR = batch["response_mask"]
        stats = {k: float(v) for k, v in rule.stats.items()} if rule is not None else {}
        token_parts, score_parts, ends = [], [], []
        for m in self.models:
            placed_BR, score_B, ends_BR = self._model_scores(m, batch, timer, stats)
            token_parts.append((m.source.weight, placed_BR))
            score_parts.append((m.source.weight, score_B))
            if m.source.weight != 0:
                ends.append(ends_BR)
        if rule is not None:
            token_parts.append((self.rule_weight, rule.token_level_scores_BR))
            score_parts.append((self.rule_weight, rule.scores_B))
            if self.rule_weight != 0:
                ends.append(rule.step_end_mask_BR if rule.step_end_mask_BR is not None else _last_token_mask(mask_BR))
        batch["token_level_scores"] = weighted_sum(token_parts)
        scores_B = weighted_sum(score_parts)
        if self.overlong is not None:
            batch["token_level_scores"], shaping = apply_overlong_penalty(batch["token_level_scores"], mask_BR, self.overlong)
            stats.update(shaping)
        if self.needs_step_rewards:
            step_ends = torch.zeros_like(mask_BR)
            for e in ends:
                step_ends = torch.maximum(step_ends, e)
            batch["step_end_mask"] = step_ends
        if self.trained is not None:
            batch["rm_targets"] = self._targets(rule, mask_BR, self.trained.source.is_process)
        if rule is not None:
            stats["reward_model/rule_score/mean"] = rule.scores_B.float().mean().item()
        return scores_B, stats

    def _model_scores(self, m: ModelScorer, batch: Batch, timer: Timer,
                      stats: dict[str, float]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One reward model's scores placed per token [B, R], per response [B], and the tokens it scored
        [B, R]; its metrics go into ``stats``."""
        prefix, mask_BR = m.source.metric_prefix, batch["response_mask"]
        with timer(prefix):
            last_B, token_BR, busy_s = self._rm_forward(m, batch)
        timer.add(prefix + "/worker", busy_s)
        if m.separators is not None:
            ends_BR, has_sep_B = token_step_ends(batch["responses"], mask_BR, m.separators)
            self._warn_no_separator(m, has_sep_B, mask_BR)
            placed_BR = token_BR * ends_BR
            score_B, scored = placed_BR.sum(-1), token_BR[ends_BR.bool()]
        else:
            placed_BR, score_B, ends_BR = place_scores_on_last_token(last_B, mask_BR), last_B, _last_token_mask(mask_BR)
            scored = last_B
        if scored.numel():
            stats.update({f"{prefix}/score/mean": scored.mean().item(), f"{prefix}/score/max": scored.max().item(),
                          f"{prefix}/score/min": scored.min().item()})
        return placed_BR, score_B, ends_BR

    # ------------------------------------------------------------------------------------------
    def _rule_call(self, batch: Batch, *, token_level: bool, step_rewards: bool, optional: bool = False):
        # reward_source: what the reward function gets as its data_source (data.reward_fn_key's column)
        source = batch["reward_source"] if "reward_source" in batch else batch["data_source"]
        result = self.rule.call("compute", batch["responses"], response_tokens(batch), list(source),
                                list(batch["ground_truth"]), list(batch["extra_info"]), token_level, step_rewards,
                                optional)[0]
        self.counts.add(len(result.scores_B), result.stats, result.first_error)
        batch["reward_extra_info"] = [{k: v[i] for k, v in result.extra.items()}
                                      for i in range(len(batch))]
        return result

    def _rule_only(self, batch: Batch, token_level: bool) -> tuple[torch.Tensor, dict[str, float]]:
        """The rule source alone (runs without a reward model, and validation, which always scores with the
        verifier, unweighted)."""
        step_rewards = token_level and self.needs_step_rewards
        result = self._rule_call(batch, token_level=token_level, step_rewards=step_rewards)
        scores_B = result.scores_B
        if token_level:
            batch["token_level_scores"] = result.token_level_scores_BR
            if self.rule_weight != 1:  # a reward.sources list of one rule source with a weight
                batch["token_level_scores"] = weighted_sum([(self.rule_weight, result.token_level_scores_BR)])
                scores_B = weighted_sum([(self.rule_weight, scores_B)])
        stats = {k: float(v) for k, v in result.stats.items()}
        if token_level and self.overlong is not None:  # DAPO's overlong shaping (training rewards only)
            batch["token_level_scores"], shaping = apply_overlong_penalty(batch["token_level_scores"], response_tokens(batch), self.overlong)
            stats.update(shaping)
        if step_rewards:
            batch["step_end_mask"] = result.step_end_mask_BR
        return scores_B, stats

    def _rm_forward(self, m: ModelScorer, batch: Batch) -> tuple[torch.Tensor, torch.Tensor | None, float]:
        """Reward model ``m`` on equal shares of the rows (padded to a multiple of the ranks with copies
        of the last row, dropped after): ``last_B``, ``token_scores_BR`` (None when re-encoding) and
        the slowest rank's busy seconds. ``TrainingError`` naming the reward model on NaN/inf."""
        B, W = len(batch), m.source.world_size
        per = -(-B // W)
        idx = torch.cat([torch.arange(B), torch.full((per * W - B,), B - 1, dtype=torch.long)])
        tensors = {k: v[idx] for k, v in batch.select(*FORWARD_KEYS).tensor_dict().items()}
        raw = [batch["raw_prompt"][int(i)] for i in idx] if m.reencode else None
        per_rank = [({k: v[r * per:(r + 1) * per] for k, v in tensors.items()},
                     raw[r * per:(r + 1) * per] if raw is not None else None) for r in range(W)]
        outs, busy_s = unwrap_timed(m.group.call("compute_rm_score", per_rank=per_rank))
        last_B = torch.cat([o["last_B"] for o in outs])[:B]
        token_BR = None if m.reencode else torch.cat([o["token_scores_BR"] for o in outs])[:B]
        bad = ~torch.isfinite(last_B)
        if token_BR is not None:
            bad |= ~torch.isfinite(token_BR).all(dim=1)
        if bad.any():
            raise TrainingError(
                f"the reward model {m.label} gave non-finite scores (NaN or inf) for {int(bad.sum())} of {B} "
                "responses; check its weights and its compute dtype (reward_model.model.fsdp_config.dtype)")
        return last_B, token_BR, busy_s

    def _warn_no_separator(self, m: ModelScorer, has_sep_B: torch.Tensor, mask_BR: torch.Tensor) -> None:
        missing = int(((~has_sep_B) & (mask_BR.sum(-1) > 0)).sum())
        if missing and not m.warned_no_separator:
            m.warned_no_separator = True
            sep = m.separators.separator
            key = ("reward_model.process" if m.source.declared == IMPLICIT_MODEL else m.source.declared) + ".step_separator"
            print(f"grpo_dist: warning: {missing} of {len(has_sep_B)} responses hold no step separator "
                  f"({key} = {sep!r}, the reward model {m.label}); each is scored as one step, at its last token. "
                  "Shown once per run.", flush=True)

    def _targets(self, rule, mask_BR: torch.Tensor, process: bool) -> torch.Tensor:
        """The verifier's labels for training the reward model (module docstring)."""
        if process and rule.step_end_mask_BR is not None:
            return torch.where(rule.step_end_mask_BR.bool(),
                               verifier_labels(rule.token_level_scores_BR, self.label_threshold), torch.tensor(math.nan))
        last = _last_token_mask(mask_BR).bool()
        labels_BR = verifier_labels(rule.scores_B, self.label_threshold).unsqueeze(1).expand_as(mask_BR)
        return torch.where(last, labels_BR, torch.tensor(math.nan))
