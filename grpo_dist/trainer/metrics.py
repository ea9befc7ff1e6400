"""Per-step metrics with verl's names, so dashboards built for verl read ours."""

from __future__ import annotations

import math

import time
from collections import defaultdict
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

import torch

from grpo_dist.core.diagnostics import zero_advantage_group_ratio
from grpo_dist.core.value import explained_variance

if TYPE_CHECKING:  # the batch container (tensordict) is loaded with the training loop, not with the run's plan
    from grpo_dist.batch import Batch


def _stats(prefix: str, x: torch.Tensor) -> dict[str, float]:
    if x.numel() == 0:
        return {}
    x = x.float()
    return {f"{prefix}/mean": x.mean().item(), f"{prefix}/max": x.max().item(), f"{prefix}/min": x.min().item()}


def data_metrics(batch: Batch, max_response_length: int) -> dict[str, float]:
    """Scores, rewards, advantages and lengths of one step's responses."""
    from grpo_dist.rollout.assemble import response_tokens  # with the batch container, loaded by now

    mask = batch["response_mask"].bool()
    out: dict[str, float] = {}
    out.update(_stats("critic/score", batch["token_level_scores"].sum(-1)))
    out.update(_stats("critic/rewards", batch["token_level_rewards"].sum(-1)))
    out.update(_stats("critic/advantages", batch["advantages"][mask]))
    out["training/zero_advantage_group_ratio"] = zero_advantage_group_ratio(batch["advantages"], mask, list(batch["uid"]))
    out.update(_stats("critic/returns", batch["returns"][mask]))
    resp_len = response_tokens(batch).sum(-1)  # a trajectory's tool tokens count, as in verl
    out.update(_stats("response_length", resp_len))
    out["response_length/clip_ratio"] = (resp_len >= max_response_length).float().mean().item()
    prompt_len = batch["attention_mask"][:, : batch["prompts"].shape[1]].sum(-1).float()
    out.update(_stats("prompt_length", prompt_len))
    if "num_turns" in batch:
        out.update(agent_metrics(batch))
    return out


def agent_metrics(batch: Batch) -> dict[str, float]:
    """Agent-loop trajectories: verl's ``num_turns/{min,max,mean}``, the share of response tokens that are the
    model's (``agent/model_token_ratio``), and the mean of each number the loops report per trajectory
    (``agent/<name>/mean``: tool calls, tool errors, tool seconds, cut by the budget, ...)."""
    from grpo_dist.rollout.assemble import response_tokens

    turns = torch.tensor([float(t) for t in batch["num_turns"]])
    out = {"num_turns/min": turns.min().item(), "num_turns/max": turns.max().item(), "num_turns/mean": turns.mean().item()}
    present = response_tokens(batch).sum()
    out["agent/model_token_ratio"] = (batch["response_mask"].sum() / present.clamp(min=1)).item()
    rows = list(batch["agent_metrics"]) if "agent_metrics" in batch else []
    for key in sorted({k for row in rows for k in row}):
        out[f"agent/{key}/mean"] = sum(float(row.get(key, 0.0)) for row in rows) / len(rows)
    return out


def critic_data_metrics(batch: Batch) -> dict[str, float]:
    """The critic's values of the step's response tokens and how much of the returns' variance they
    explain (``critic/vf_explained_var``, verl's)."""
    mask = batch["response_mask"].bool()
    out = _stats("critic/values", batch["values"][mask])
    out["critic/vf_explained_var"] = explained_variance(batch["values"], batch["returns"], batch["response_mask"])
    return out


def token_count(batch: Batch) -> int:
    return int(batch["attention_mask"].sum().item())


class Timer:
    """Wall time of named phases of a step: ``with timer("gen"): ...`` -> ``timing_s/gen``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - t0

    def add(self, name: str, seconds: float) -> None:
        """Record a time measured elsewhere (e.g. a worker's busy time) as ``timing_s/<name>``."""
        self.seconds[name] += seconds

    def metrics(self) -> dict[str, float]:
        return {f"timing_s/{k}": v for k, v in self.seconds.items()}


def throughput_metrics(num_tokens: int, step_seconds: float, n_devices: int) -> dict[str, float]:
    return {
        "perf/total_num_tokens": float(num_tokens),
        "perf/time_per_step": step_seconds,
        "perf/throughput": num_tokens / max(step_seconds, 1e-9) / max(n_devices, 1),
    }


#: verl's seed for choosing the validation samples it logs (``trainer.log_val_generations``).
VAL_GENERATIONS_SEED = 42


def pick_val_generations(inputs, outputs, scores, n: int, seed: int = VAL_GENERATIONS_SEED) -> list[tuple[str, str, float]]:
    """``n`` validation samples ``(input, output, score)`` to log, chosen as verl chooses them: the
    samples sorted (by input, then output and score), shuffled by ``numpy.random.RandomState(seed)``,
    the first ``n`` kept. The same validation set therefore logs the same inputs every time, whatever
    order the responses came back in, and their outputs show how the policy changed."""
    import numpy as np

    samples = sorted(zip(inputs, outputs, scores))
    rng = np.random.RandomState(seed)
    rng.shuffle(samples)
    return [(str(a), str(b), float(c)) for a, b, c in samples[: max(0, int(n))]]


def decode_rows(tokenizer, ids_BT, mask_BT) -> list[str]:
    """The text of each row's tokens where ``mask_BT`` is set (special tokens left out, as verl logs them)."""
    return [tokenizer.decode(ids[m.bool()].tolist(), skip_special_tokens=True) for ids, m in zip(ids_BT, mask_BT)]


#: A step whose ``response_length/clip_ratio`` is above this (more than half of its responses cut at
#: the response limit) triggers :class:`ResponseClipWarning`.
CLIP_RATIO_WARN_THRESHOLD = 0.5


class ResponseClipWarning:
    """Warns once per run when most responses of a step were cut at the response limit.

    A response that reaches ``data.max_response_length`` tokens without its EOS is cut there, and the
    reward scores the cut text: an answer that would have come after the cut is never seen, so the
    reward looks like a model that cannot answer. ``response_length/clip_ratio`` (verl's metric:
    the fraction of responses whose length equals the limit) shows it every step; this says it in
    words, once, the first time a step's ratio is above ``threshold``.

    Args:
        max_response_length: the response limit in tokens (named in the message).
        threshold: the clip ratio above which to warn, in [0, 1); default 0.5.
        emit: where the message goes (default: print to stdout).
    """

    def __init__(self, max_response_length: int, threshold: float = CLIP_RATIO_WARN_THRESHOLD,
                 emit=None) -> None:
        if not 0.0 <= threshold < 1.0:
            raise ValueError(f"threshold = {threshold} is not valid: expected a fraction in [0, 1)")
        self.max_response_length = max_response_length
        self.threshold = threshold
        self.emit = emit if emit is not None else (lambda msg: print(msg, flush=True))
        self.warned = False

    def observe(self, clip_ratio: float, step: int) -> str | None:
        """Look at one step's clip ratio; returns (and emits) the warning the first time it is above
        the threshold, None otherwise."""
        if self.warned or not clip_ratio > self.threshold:
            return None
        self.warned = True
        msg = (f"grpo_dist: warning: {clip_ratio:.0%} of the responses of step {step} were cut at "
               f"data.max_response_length = {self.max_response_length} tokens before they ended, so the "
               "reward never saw the rest of them. Raise data.max_response_length (or ask for shorter "
               "answers in the prompt). Shown once per run; response_length/clip_ratio tracks it each step.")
        self.emit(msg)
        return msg


NO_SIGNAL_RATIO = 0.95
"""The share of groups with no learning signal above which a step counts as teaching nothing (:class:`NoSignalWarning`)."""
NO_SIGNAL_STEPS = 10
"""Steps in a row that teach nothing before :class:`NoSignalWarning` says so."""


class NoSignalWarning:
    """Warns when the policy gradient has all but vanished for ``steps`` steps in a row.

    A group whose responses all have advantage 0 (under GRPO: they all scored alike) adds nothing to the policy
    gradient; when nearly every group of a step is such a group (``training/zero_advantage_group_ratio`` >=
    ``ratio``), the step teaches the policy nothing but the KL term. That happens when the task is solved at this
    difficulty (every response right) or when the policy collapsed (its entropy near 0, every response the same
    and wrong): a run that goes on like that spends its steps for nothing, silently. Said once per such stretch,
    when it reaches ``steps`` steps, with the score and the entropy that tell the two apart.

    Args:
        steps: steps in a row; default :data:`NO_SIGNAL_STEPS`.
        ratio: the share of groups with no signal, in (0, 1]; default :data:`NO_SIGNAL_RATIO`.
        emit: where the message goes (default: print to stdout).
    """

    def __init__(self, steps: int = NO_SIGNAL_STEPS, ratio: float = NO_SIGNAL_RATIO, emit=None) -> None:
        if steps < 1 or not 0.0 < ratio <= 1.0:
            raise ValueError(f"steps = {steps}, ratio = {ratio} are not valid: expected steps >= 1 and a ratio in (0, 1]")
        self.steps, self.ratio = steps, ratio
        self.emit = emit if emit is not None else (lambda msg: print(msg, flush=True))
        self.streak = 0
        self.first_entropy: tuple[int, float] | None = None  # (step, actor/entropy) of the first step seen

    def observe(self, metrics: dict[str, float], step: int) -> str | None:
        """Look at one step's metrics; returns (and emits) the warning when the stretch reaches ``steps`` steps."""
        if self.first_entropy is None and metrics.get("actor/entropy") is not None:
            self.first_entropy = (step, metrics["actor/entropy"])
        ratio = metrics.get("training/zero_advantage_group_ratio")
        if ratio is None:
            return None
        self.streak = self.streak + 1 if ratio >= self.ratio else 0
        if self.streak != self.steps:
            return None
        score, entropy = metrics.get("critic/score/mean"), metrics.get("actor/entropy")
        said = ", ".join(f"{name} {value:.3g}" for name, value in (("critic/score/mean", score), ("actor/entropy", entropy))
                         if value is not None)
        if entropy is not None and self.first_entropy is not None and self.first_entropy[0] < step:
            said += f" ({self.first_entropy[1]:.3g} at step {self.first_entropy[0]})"
        msg = (f"grpo_dist: warning: in each of steps {step - self.steps + 1}-{step}, at least {self.ratio:.0%} of the "
               f"groups had responses that all scored alike, so their advantages were 0: these steps taught the policy "
               f"nothing (at step {step}: {said}). Either the task is solved at this difficulty (harder prompts, or "
               "stop), or the policy collapsed (entropy near 0, the same wrong response every time): lower "
               "actor_rollout_ref.actor.optim.lr, raise actor_rollout_ref.rollout.temperature or rollout.n, or keep only "
               "groups that differ (algorithm.filter_groups.enable=true). training/zero_advantage_group_ratio tracks "
               "it each step.")
        self.emit(msg)
        return msg


class NonfiniteGuard:
    """Counts steps in a row whose update was skipped for a non-finite loss or gradient norm (actor or
    critic) and says when to stop: ``trainer.max_consecutive_nonfinite_steps`` of them (0: never).
    Adds ``training/nonfinite_streak`` to each step's metrics."""

    def __init__(self, limit: int) -> None:
        self.limit, self.streak = limit, 0

    def observe(self, metrics: dict[str, float]) -> bool:
        bad = (metrics.get("actor/grad_norm_nonfinite_count", 0.0) > 0
               or not math.isfinite(metrics.get("actor/pg_loss", 0.0))
               or metrics.get("critic/grad_norm_nonfinite_count", 0.0) > 0)
        self.streak = self.streak + 1 if bad else 0
        metrics["training/nonfinite_streak"] = self.streak
        return bool(self.limit) and self.streak >= self.limit

    def message(self, step: int, *, saved: str) -> str:
        return (f"{self.streak} steps in a row (up to step {step}) had a non-finite loss or gradient norm, so their "
                f"optimizer steps were skipped; stopped after saving {saved}. Lower actor_rollout_ref.actor.optim.lr "
                "(and critic.optim.lr with a critic), check the rewards, or raise trainer.max_consecutive_nonfinite_steps.")
