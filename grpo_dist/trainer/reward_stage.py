"""The reward stage of a step: rule-based (or custom) scores, a learned reward model's scores, and how
they make the step's token-level rewards.

Without a reward model this is the reward worker's result as it comes: the score of each response on
its last token, or with process supervision (``grpo_process``) the user function's step rewards on
the tokens that end each step, DAPO's overlong shaping on top.

With a reward model (``reward_model.enable``), its ranks score the responses (sharded like the
reference forward, one equal share per rank):

- an outcome reward model's score is read at the last valid token and placed on the last response
  token;
- a process reward model's scores are read at the step-end tokens (tokens whose text holds
  ``reward_model.process.step_separator``, and the last response token) and placed there, with
  ``step_end_mask`` marking them, so ``grpo_process`` works without a user function. A response with
  no separator is one step (said once per run).

The reward is then :func:`grpo_dist.rewards.combine.combine_scores` of the two (``reward_model.combine``).
Rule scores are computed only when the combination reads them or iterative RL needs them as labels;
with iterative RL the stage also writes ``rm_targets`` [B, R], the verifier's labels on the positions
the reward model is trained at (on the last response token; per step for a process reward model when
the function returns ``step_rewards``; NaN elsewhere): 1 where the rule score is at or above
``reward_model.iterative.label_threshold`` and 0 below it, or with a null threshold the score clamped
to [0, 1] (:func:`grpo_dist.core.reward_model.verifier_labels`).

Validation always scores with the rule-based scorers (the verifier), never with the reward model.

Metrics: ``reward_model/score/{mean,max,min}`` (the outcome score of each response, or a process
reward model's step scores), ``reward_model/rule_score/mean`` (when the rule scores were computed
beside the reward model), ``timing_s/reward_model`` and ``timing_s/reward_model/worker``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from grpo_dist.batch import Batch
from grpo_dist.config.spec import RunSpec
from grpo_dist.core.reward_model import verifier_labels
from grpo_dist.distributed.worker_group import WorkerGroup
from grpo_dist.rewards.combine import RewardCombine, combine_scores
from grpo_dist.rewards.shaping import OverlongBuffer, apply_overlong_penalty
from grpo_dist.rewards.tokens import SeparatorTokens, place_scores_on_last_token, token_step_ends
from grpo_dist.trainer.metrics import Timer
from grpo_dist.trainer.summary import ScoreCounts, TrainingError
from grpo_dist.training.settings import FORWARD_KEYS
from grpo_dist.workers.common import unwrap_timed

__all__ = ["RewardStage"]


def _last_token_mask(response_mask_BR: torch.Tensor) -> torch.Tensor:
    return place_scores_on_last_token(torch.ones(response_mask_BR.shape[0]), response_mask_BR)


class RewardStage:
    """Scores batches for the driver (``score``), from the reward worker and, when set, the reward model.

    Args:
        rule: the reward worker group (rule-based scorers and the custom function).
        needs_step_rewards: the advantage estimator reads step rewards (process supervision).
        overlong: DAPO's overlong shaping of training rewards, or None.
        rm: the reward-model worker group, or None without a reward model.
        world_size: reward-model ranks.
        combine, process_separator, iterative, reencode, rm_path, tokenizer: the reward model's
            settings (see the module docstring); ``process_separator`` None: an outcome reward model.
        label_threshold: with ``iterative``, the rule score at or above which a label is 1 (None: soft
            labels, the score clamped to [0, 1]).
    """

    def __init__(self, rule: WorkerGroup, *, needs_step_rewards: bool, overlong: OverlongBuffer | None,
                 rm: WorkerGroup | None = None, world_size: int = 1, combine: RewardCombine | None = None,
                 process_separator: str | None = None, iterative: bool = False, reencode: bool = False,
                 rm_path: str = "", tokenizer: Any = None, label_threshold: float | None = 0.5) -> None:
        self.rule, self.rm, self.world_size = rule, rm, world_size
        self.needs_step_rewards, self.overlong = needs_step_rewards, overlong
        self.combine = combine or RewardCombine()
        self.process = process_separator is not None
        self.separators = SeparatorTokens(tokenizer, process_separator) if self.process else None
        self.iterative, self.reencode, self.rm_path = iterative, reencode, rm_path
        self.label_threshold = label_threshold
        self.warned_no_separator = False
        self.counts = ScoreCounts()  # every score of the run, and the failed ones (on_error=zero)

    @classmethod
    def from_plan(cls, spec: RunSpec, plan: Any, rule: WorkerGroup, rm: WorkerGroup | None, *, world_size: int,
                  tokenizer: Any, tokenizer_path: str) -> "RewardStage":
        """The stage of a run: the combination, process separator and iterative switch from the driver's
        plan (:class:`grpo_dist.config.driver_plan.DriverPlan`); the reward model's folder and ranks from ``spec``
        (``world_size``, the training ranks, are its ranks unless it has a pool of its own)."""
        from grpo_dist.core.advantages import get_adv_estimator

        rm_path = spec.reward_model_path() if rm is not None else ""
        reencode = rm is not None and spec.reward_model_reencodes(rm_path, tokenizer_path) is not None
        return cls(rule, needs_step_rewards=get_adv_estimator(plan.estimator).needs_step_rewards,
                   overlong=plan.overlong, rm=rm, world_size=spec.reward_model_world_size if rm is not None
                   else world_size, combine=plan.reward_combine,
                   process_separator=plan.process_separator, iterative=plan.iterative is not None,
                   label_threshold=plan.iterative.label_threshold if plan.iterative is not None else None,
                   reencode=reencode, rm_path=rm_path, tokenizer=tokenizer)

    # ------------------------------------------------------------------------------------------
    def score(self, batch: Batch, *, token_level: bool = True, timer: Timer | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """Scores [B]; with ``token_level`` also ``token_level_scores`` in the batch (and
        ``step_end_mask`` with process supervision, ``rm_targets`` with iterative RL)."""
        if self.rm is None or not token_level:
            return self._rule_only(batch, token_level)
        timer = timer or Timer()
        want_rule = self.combine.uses_rule or self.iterative
        rule = None
        if want_rule:
            # step rewards from the function: required when the reward reads them for grpo_process with an
            # outcome reward model (as without one); taken when there are some with a process reward model
            steps = (self.needs_step_rewards and self.combine.uses_rule) or (self.process and self.iterative)
            rule = self._rule_call(batch, token_level=True, step_rewards=steps, optional=self.process)
        with timer("reward_model"):
            last_B, token_BR, busy_s = self._rm_forward(batch)
        timer.add("reward_model/worker", busy_s)
        mask_BR = batch["response_mask"]
        if self.process:
            ends_BR, has_sep_B = token_step_ends(batch["responses"], mask_BR, self.separators)
            self._warn_no_separator(has_sep_B, mask_BR)
            rm_BR = token_BR * ends_BR
            rm_B, rm_ends_BR = rm_BR.sum(-1), ends_BR
            stats_source = token_BR[ends_BR.bool()]
        else:
            rm_BR = place_scores_on_last_token(last_B, mask_BR)
            rm_B, rm_ends_BR, stats_source = last_B, _last_token_mask(mask_BR), last_B
        rule_BR = rule.token_level_scores_BR if rule is not None else None
        batch["token_level_scores"] = combine_scores(self.combine, rm_BR, rule_BR)
        scores_B = combine_scores(self.combine, rm_B, rule.scores_B if rule is not None else None)
        stats = {k: float(v) for k, v in rule.stats.items()} if rule is not None else {}
        if self.overlong is not None:
            batch["token_level_scores"], shaping = apply_overlong_penalty(batch["token_level_scores"], mask_BR, self.overlong)
            stats.update(shaping)
        if self.needs_step_rewards:
            ends = torch.zeros_like(mask_BR)
            if self.combine.uses_rm:
                ends = torch.maximum(ends, rm_ends_BR)
            if self.combine.uses_rule:
                rule_ends = rule.step_end_mask_BR if rule.step_end_mask_BR is not None else _last_token_mask(mask_BR)
                ends = torch.maximum(ends, rule_ends)
            batch["step_end_mask"] = ends
        if self.iterative:
            batch["rm_targets"] = self._targets(rule, mask_BR)
        if stats_source.numel():
            stats.update({"reward_model/score/mean": stats_source.mean().item(),
                          "reward_model/score/max": stats_source.max().item(),
                          "reward_model/score/min": stats_source.min().item()})
        if rule is not None:
            stats["reward_model/rule_score/mean"] = rule.scores_B.float().mean().item()
        return scores_B, stats

    # ------------------------------------------------------------------------------------------
    def _rule_call(self, batch: Batch, *, token_level: bool, step_rewards: bool, optional: bool = False):
        # reward_source: what the reward function gets as its data_source (data.reward_fn_key's column)
        source = batch["reward_source"] if "reward_source" in batch else batch["data_source"]
        result = self.rule.call("compute", batch["responses"], batch["response_mask"], list(source),
                                list(batch["ground_truth"]), list(batch["extra_info"]), token_level, step_rewards,
                                optional)[0]
        self.counts.add(len(result.scores_B), result.stats, result.first_error)
        return result

    def _rule_only(self, batch: Batch, token_level: bool) -> tuple[torch.Tensor, dict[str, float]]:
        step_rewards = token_level and self.needs_step_rewards
        result = self._rule_call(batch, token_level=token_level, step_rewards=step_rewards)
        if token_level:
            batch["token_level_scores"] = result.token_level_scores_BR
        stats = {k: float(v) for k, v in result.stats.items()}
        if token_level and self.overlong is not None:  # DAPO's overlong shaping (training rewards only)
            batch["token_level_scores"], shaping = apply_overlong_penalty(batch["token_level_scores"], batch["response_mask"], self.overlong)
            stats.update(shaping)
        if step_rewards:
            batch["step_end_mask"] = result.step_end_mask_BR
        return result.scores_B, stats

    def _rm_forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor | None, float]:
        """The reward model on equal shares of the rows (padded to a multiple of the ranks with copies
        of the last row, dropped after): ``last_B``, ``token_scores_BR`` (None when re-encoding) and
        the slowest rank's busy seconds. ``TrainingError`` naming the reward model on NaN/inf."""
        B, W = len(batch), self.world_size
        per = -(-B // W)
        idx = torch.cat([torch.arange(B), torch.full((per * W - B,), B - 1, dtype=torch.long)])
        tensors = {k: v[idx] for k, v in batch.select(*FORWARD_KEYS).tensor_dict().items()}
        raw = [batch["raw_prompt"][int(i)] for i in idx] if self.reencode else None
        per_rank = [({k: v[r * per:(r + 1) * per] for k, v in tensors.items()},
                     raw[r * per:(r + 1) * per] if raw is not None else None) for r in range(W)]
        outs, busy_s = unwrap_timed(self.rm.call("compute_rm_score", per_rank=per_rank))
        last_B = torch.cat([o["last_B"] for o in outs])[:B]
        token_BR = None if self.reencode else torch.cat([o["token_scores_BR"] for o in outs])[:B]
        bad = ~torch.isfinite(last_B)
        if token_BR is not None:
            bad |= ~torch.isfinite(token_BR).all(dim=1)
        if bad.any():
            raise TrainingError(
                f"the reward model {self.rm_path} gave non-finite scores (NaN or inf) for {int(bad.sum())} of {B} "
                "responses; check its weights and its compute dtype (reward_model.model.fsdp_config.dtype)")
        return last_B, token_BR, busy_s

    def _warn_no_separator(self, has_sep_B: torch.Tensor, mask_BR: torch.Tensor) -> None:
        missing = int(((~has_sep_B) & (mask_BR.sum(-1) > 0)).sum())
        if missing and not self.warned_no_separator:
            self.warned_no_separator = True
            sep = self.separators.separator
            print(f"grpo_dist: warning: {missing} of {len(has_sep_B)} responses hold no step separator "
                  f"(reward_model.process.step_separator = {sep!r}); each is scored as one step, at its last token. "
                  "Shown once per run.", flush=True)

    def _targets(self, rule, mask_BR: torch.Tensor) -> torch.Tensor:
        """The verifier's labels for training the reward model (module docstring)."""
        if self.process and rule.step_end_mask_BR is not None:
            return torch.where(rule.step_end_mask_BR.bool(),
                               verifier_labels(rule.token_level_scores_BR, self.label_threshold), torch.tensor(math.nan))
        last = _last_token_mask(mask_BR).bool()
        labels_BR = verifier_labels(rule.scores_B, self.label_threshold).unsqueeze(1).expand_as(mask_BR)
        return torch.where(last, labels_BR, torch.tensor(math.nan))
