"""DAPO's dynamic sampling: generate, drop the groups whose metric has no spread, generate more.

One step's protocol (Yu et al. 2025, arXiv:2503.14476, section 3.2; verl's ``algorithm.filter_groups``):

1. generate and score one generation batch (``data.gen_batch_size`` prompts x ``rollout.n``);
2. drop every group (one prompt's responses) whose metric is the same for all its responses
   (:func:`grpo_dist.core.group_filter.groups_with_spread`): under a group-relative estimator it has
   zero advantage and only dilutes the batch;
3. if fewer than ``data.train_batch_size`` groups are kept so far, draw the next prompts and go to 1,
   unless ``max_num_gen_batches`` batches were generated: then stop with
   :class:`DynamicSamplingError` (``on_exhausted="error"``, verl's behaviour) or train on the groups
   kept (``"train"``), cut to a whole number of PPO mini-batches (topped up to one mini-batch with
   dropped groups if fewer were kept);
4. the step trains on the first ``train_batch_size`` kept groups, in generation order.

The object talks to the driver only through two callables (the next prompts, and "generate and score
these prompts"), so it is tested with stand-ins (tests/unit/test_dynamic_sampling.py).
:class:`SingleBatch` is the same interface without filtering (one generation batch per step).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

from grpo_dist.core.group_filter import groups_with_spread

if TYPE_CHECKING:  # the batch container (tensordict) is loaded with the training loop, not with the run's plan
    from grpo_dist.batch import Batch
    from grpo_dist.config.sampling import FilterGroups

__all__ = ["FILTER_METRICS", "ON_EXHAUSTED", "DynamicSamplingError", "DynamicSampling", "SingleBatch", "metric_values",
           "merge_stats", "step_sampler"]

Generate = Callable[[list, int], "tuple[Batch, dict[str, float]]"]
"""``generate(items, k)``: generation batch ``k`` (0, 1, ...) of the step for the prompts ``items``,
scored, rows grouped by ``uid``; and its reward statistics."""

FILTER_METRICS: tuple[str, ...] = ("acc", "score", "seq_reward", "seq_final_reward")
"""Values of ``algorithm.filter_groups.metric`` (see :func:`metric_values`)."""
ON_EXHAUSTED: tuple[str, ...] = ("error", "train")


class DynamicSamplingError(RuntimeError):
    """Too few groups with spread within ``max_num_gen_batches`` generation batches."""


def metric_values(batch: Batch, metric: str) -> torch.Tensor:
    """The per-response value the filter compares within a group, [B].

    ``acc`` and ``score``: the reward function's score (``scores``, before any reward shaping);
    ``seq_reward``: the sum of the token-level scores (after overlong shaping); ``seq_final_reward``:
    the sum of the token-level rewards (``token_level_rewards`` when present, else the scores).
    """
    if metric in ("acc", "score"):
        return batch["scores"]
    if metric == "seq_reward":
        return batch["token_level_scores"].sum(-1)
    if metric == "seq_final_reward":
        key = "token_level_rewards" if "token_level_rewards" in batch else "token_level_scores"
        return batch[key].sum(-1)
    raise ValueError(f"unknown filter metric {metric!r} (algorithm.filter_groups.metric); valid: {', '.join(FILTER_METRICS)}")


def merge_stats(stats: list[dict[str, float]]) -> dict[str, float]:
    """The reward statistics of several generation batches as one: counts (``reward/num_*``) add up,
    the other values are averaged over the batches that report them."""
    out: dict[str, float] = {}
    for key in {k for s in stats for k in s}:
        vals = [s[key] for s in stats if key in s]
        out[key] = sum(vals) if key.startswith("reward/num_") else sum(vals) / len(vals)
    return out


def _group_rows(uids: Any) -> list[list[int]]:
    rows: dict[Any, list[int]] = {}
    for i, u in enumerate(uids):
        rows.setdefault(u, []).append(i)
    return list(rows.values())


def _first_groups(batch: Batch, num_groups: int) -> Batch:
    groups = _group_rows(batch["uid"])[:num_groups]
    return batch.reorder([i for g in groups for i in g])


@dataclass(frozen=True)
class SingleBatch:
    """No dynamic sampling: a step trains on its one generation batch."""

    def collect(self, first_items: list, next_items: Callable[[], list], generate: Generate) -> tuple[Batch, dict[str, float]]:
        """``generate(first_items, 0)``; its reward statistics are the metrics."""
        batch, stats = generate(first_items, 0)
        return batch, dict(stats)


@dataclass(frozen=True)
class DynamicSampling:
    """The refill loop (see the module docstring).

    Attributes:
        train_batch_size: prompts (groups) a step trains on.
        metric: one of :data:`FILTER_METRICS`.
        max_num_gen_batches: the most generation batches per step; <= 0: no limit (verl).
        on_exhausted: ``"error"`` or ``"train"`` (what happens at the limit).
        mini_batch_prompts: prompts per PPO mini-batch: a partial batch is cut to a multiple of it.
    """

    train_batch_size: int
    metric: str
    max_num_gen_batches: int = 0
    on_exhausted: str = "error"
    mini_batch_prompts: int = 1

    def __post_init__(self) -> None:
        if self.metric not in FILTER_METRICS:
            raise ValueError(f"unknown filter metric {self.metric!r}; valid: {', '.join(FILTER_METRICS)}")
        if self.on_exhausted not in ON_EXHAUSTED:
            raise ValueError(f"on_exhausted must be one of {', '.join(ON_EXHAUSTED)}, got {self.on_exhausted!r}")
        if self.train_batch_size < 1 or self.mini_batch_prompts < 1 or self.train_batch_size % self.mini_batch_prompts:
            raise ValueError(f"train_batch_size ({self.train_batch_size}) must be a positive multiple of "
                             f"mini_batch_prompts ({self.mini_batch_prompts})")

    def collect(
        self,
        first_items: list,
        next_items: Callable[[], list],
        generate: Generate,
    ) -> tuple[Batch, dict[str, float]]:
        """Run the loop: ``generate(items, k)`` generates and scores generation batch ``k`` (0, 1, ...)
        of the step (rows grouped by ``uid``, with the keys :func:`metric_values` reads) and returns
        it with its reward statistics; ``next_items()`` gives the prompts of the next one
        (``first_items`` are the first's).

        Returns the step's batch and the metrics: the reward statistics of all generation batches
        (:func:`merge_stats`), ``train/num_gen_batches`` and
        ``training/filter_groups/{num_groups, num_kept_groups, num_dropped_groups, kept_fraction,
        num_train_groups, exhausted}`` (groups generated, with spread, without, their ratio, groups
        trained on, 1.0 when the limit was reached short of a full batch).
        """
        kept: list[Batch] = []
        dropped: list[Batch] = []
        stats: list[dict[str, float]] = []
        n_groups = n_kept = 0
        k, items, exhausted = 0, first_items, False
        while True:
            batch, batch_stats = generate(items, k)
            stats.append(batch_stats)
            k += 1
            keep_B, groups, kept_groups = groups_with_spread(metric_values(batch, self.metric), batch["uid"])
            n_groups += groups
            n_kept += kept_groups
            kept.append(batch.reorder(torch.nonzero(keep_B, as_tuple=True)[0]))
            dropped.append(batch.reorder(torch.nonzero(~keep_B, as_tuple=True)[0]))
            if n_kept >= self.train_batch_size:
                break
            if self.max_num_gen_batches > 0 and k >= self.max_num_gen_batches:
                if self.on_exhausted == "error":
                    raise DynamicSamplingError(
                        f"dynamic sampling kept {n_kept} of the {self.train_batch_size} prompts a step needs after "
                        f"{k} generation batches ({n_groups} prompts; algorithm.filter_groups.max_num_gen_batches={k}): "
                        "too few prompts have responses that differ in algorithm.filter_groups.metric="
                        f"{self.metric}. Raise max_num_gen_batches (0 = no limit), set "
                        "algorithm.filter_groups.on_exhausted=train to train on the groups kept, or use easier data."
                    )
                exhausted = True
                break
            items = next_items()
        from grpo_dist.batch import Batch

        if not exhausted:
            out = _first_groups(Batch.concat(kept), self.train_batch_size)
        else:
            unit = self.mini_batch_prompts
            take = (n_kept // unit) * unit
            if take > 0:
                out = _first_groups(Batch.concat(kept), take)
            elif n_groups < unit:  # not even one mini-batch was generated: nothing could be trained on
                raise DynamicSamplingError(
                    f"dynamic sampling generated {n_groups} prompts in {k} generation batches "
                    f"(algorithm.filter_groups.max_num_gen_batches={k}, data.gen_batch_size), fewer than one PPO "
                    f"mini-batch (actor_rollout_ref.actor.ppo_mini_batch_size={unit}): raise max_num_gen_batches or "
                    "data.gen_batch_size")
            else:  # fewer than one mini-batch with spread: top up with groups without
                out = Batch.concat([Batch.concat(kept), _first_groups(Batch.concat(dropped), unit - n_kept)])
        n_train = len(_group_rows(out["uid"]))
        metrics = {
            **merge_stats(stats),
            "train/num_gen_batches": float(k),
            "training/filter_groups/num_groups": float(n_groups),
            "training/filter_groups/num_kept_groups": float(n_kept),
            "training/filter_groups/num_dropped_groups": float(n_groups - n_kept),
            "training/filter_groups/kept_fraction": n_kept / max(n_groups, 1),
            "training/filter_groups/num_train_groups": float(n_train),
            "training/filter_groups/exhausted": float(exhausted),
        }
        return out, metrics


def step_sampler(settings: FilterGroups | None) -> DynamicSampling | SingleBatch:
    """The step's sampling protocol for the run's ``algorithm.filter_groups`` (None: one batch per step)."""
    return SingleBatch() if settings is None else DynamicSampling(**asdict(settings))
