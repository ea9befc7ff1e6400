"""One rollout replica's share of a step through agent loops, as the same :class:`RolloutOutput` the
synchronous path returns (plus the trajectories' masks, prompts, turns and metrics).

:func:`agent_rollout` is what the rollout worker calls: it runs every trajectory of its share at once
(:func:`grpo_dist.agents.runner.run_trajectories`) on the replica's asynchronous server and converts the agent
loops' outputs, checking what the trainer relies on (a response within the budget, one log-prob per token when
log-probs were asked for, a mask of 0s and 1s).
"""

from __future__ import annotations

from typing import Any, Sequence

from grpo_dist.agents.settings import AgentSettings
from grpo_dist.rollout.base import RolloutOutput, SamplingSettings

__all__ = ["agent_rollout", "agent_row", "align_versions", "to_rollout_output", "ROW_FIELDS"]

#: the dataset item fields an agent loop gets as keyword arguments (verl passes a row's non-tensor fields).
ROW_FIELDS = ("prompt_ids", "raw_prompt", "extra_info", "agent_name", "data_source", "ground_truth", "index")


def agent_row(item: dict[str, Any]) -> dict[str, Any]:
    """What an agent loop gets of a dataset item (:data:`ROW_FIELDS`), with verl's ``tools_kwargs`` (the row's
    ``extra_info.tools_kwargs``) beside them."""
    row = {k: item[k] for k in ROW_FIELDS if k in item}
    row["tools_kwargs"] = dict((item.get("extra_info") or {}).get("tools_kwargs") or {})
    return row


def agent_rollout(rows: Sequence[dict[str, Any]], sampling: SamplingSettings, *, server: Any, tokenizer: Any,
                  settings: AgentSettings) -> RolloutOutput:
    """``len(rows) * sampling.n`` trajectories (prompt-major) of the rows, by their agent loops."""
    from grpo_dist.agents.runner import run_trajectories_sync

    if not rows:
        return RolloutOutput.empty(sampling)
    outs = run_trajectories_sync(list(rows), sampling, server=server, tokenizer=tokenizer, settings=settings)
    return to_rollout_output(outs, logprobs=sampling.logprobs, response_length=settings.response_length)


def align_versions(mask: Sequence[int], sampled: Sequence[int], *, default: int) -> list[int]:
    """Each response token's policy version, from the versions of the tokens the server answered the trajectory
    with (``sampled``, in order; partial rollouts).

    The model tokens (mask 1) take ``sampled`` in order: a loop keeps the model's tokens as sampled and may only
    drop the end of its last turn (the budget), so the ``k``-th model token is the ``k``-th token sampled. A
    tool or template token (mask 0) takes the version of the model token before it, or of the first one when
    it comes first (versions never decrease along a trajectory, so its first and last tokens carry the
    smallest and largest). Beyond ``sampled`` (a loop that made model tokens up), the last version repeats;
    with nothing sampled, every token gets ``default``.
    """
    out, k, last = [], 0, (sampled[0] if sampled else default)
    for m in mask:
        if m:
            last = sampled[k] if k < len(sampled) else last
            k += 1
        out.append(last)
    return out


def to_rollout_output(outs: Sequence[Any], *, logprobs: bool, response_length: int,
                      versions: Sequence[Sequence[int]] | None = None, default_version: int = 0) -> RolloutOutput:
    """The agent loops' outputs (``AgentLoopOutput``) as one :class:`RolloutOutput`; with ``versions`` (each
    trajectory's sampled tokens' versions, partial rollouts) its ``token_versions`` (:func:`align_versions`).

    Raises:
        ValueError: a trajectory longer than ``response_length``, without log-probs when they were asked
            for, or with a mask value other than 0 or 1 (names the trajectory).
    """
    response_ids, lps, eos, masks, prompts, turns, metrics, extras = [], [], [], [], [], [], [], []
    for k, out in enumerate(outs):
        ids, mask = list(out.response_ids), [int(m) for m in out.response_mask]
        if len(ids) > response_length:
            raise ValueError(f"trajectory {k} has {len(ids)} response tokens, more than rollout.response_length="
                             f"{response_length}; an agent loop must stop at the budget")
        if any(m not in (0, 1) for m in mask):
            raise ValueError(f"trajectory {k}: response_mask must hold 0 (tool/template token) or 1 (model token)")
        if logprobs:
            if out.response_logprobs is None:
                raise ValueError(f"trajectory {k} has no response_logprobs, but this run needs the rollout's "
                                 "log-probs: an agent loop must return the server's log_probs")
            lps.append([float(x) for x in out.response_logprobs])
        response_ids.append(ids)
        masks.append(mask)
        eos.append(bool(getattr(out, "finished_by_eos", True)))
        prompts.append(list(out.prompt_ids))
        turns.append(int(out.num_turns))
        metrics.append({k2: float(v) for k2, v in (out.metrics or {}).items()})
        extras.append(dict(out.extra_fields or {}))
    token_versions = None if versions is None else [
        align_versions(mask, v, default=default_version) for mask, v in zip(masks, versions, strict=True)]
    return RolloutOutput(response_ids=response_ids, logprobs=lps if logprobs else None, finished_by_eos=eos,
                         response_masks=masks, prompt_ids=prompts, num_turns=turns, metrics=metrics,
                         extra_fields=extras, token_versions=token_versions)
