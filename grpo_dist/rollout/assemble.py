"""From prompts to the step's batch: spreading prompts over rollout ranks and turning the engines'
outputs into padded tensors.

The batch layout (verl's), with ``B`` prompts, ``n`` responses per prompt, ``P`` prompt and ``R``
response columns:

- rows are grouped by prompt: row ``i * n + j`` is sample ``j`` of prompt ``i`` (GRPO's group);
- ``prompts`` [B*n, P] left-padded, ``responses`` [B*n, R] right-padded with the pad id;
- ``input_ids`` = ``prompts ++ responses`` [B*n, P+R], ``attention_mask`` 1 on real prompt and
  response tokens, ``position_ids`` counting real tokens from 0 (response positions continue from the
  prompt's last position);
- ``response_mask`` [B*n, R] float32, 1 on generated tokens (up to and including EOS);
- ``rollout_log_probs`` [B*n, R] the engine's sampling log-probs (only when they were asked for);
- ``rollout_versions`` [B*n, R] long, the policy version that sampled each token, -1 on padding (partial
  rollouts only).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import numpy as np
import torch

from grpo_dist.batch import Batch
from grpo_dist.rollout.base import TRAJECTORY_FIELDS, RolloutOutput, SamplingSettings, pad_responses

__all__ = ["prompt_batch", "shard_prompts", "merge_outputs", "responses_to_batch", "response_tokens"]


def prompt_batch(collated: dict[str, Any], uid_prefix: str) -> Batch:
    """The batch a rollout starts from: one row per prompt.

    ``collated`` is :func:`grpo_dist.data.dataset.collate_prompts`' output (left-padded
    ``input_ids``/``attention_mask``/``position_ids`` [B, P] and per-row ``prompt_ids``,
    ``data_source``, ``ground_truth``, ``extra_info``, ``reward_source`` when the items have it (the
    value the reward function gets as ``data_source``), and ``raw_prompt`` (the chat messages, which a
    reward model with its own chat template reads) when the items have it). Each row gets the group id ``uid`` =
    ``f"{uid_prefix}-{i}"``, which the responses of prompt ``i`` share.
    """
    tensors = {k: collated[k] for k in ("input_ids", "attention_mask", "position_ids")}
    rows = len(collated["prompt_ids"])
    non = {k: collated[k] for k in ("data_source", "ground_truth", "extra_info", "prompt_ids", "raw_prompt") if k in collated}
    # what the reward function gets as its data_source (data.reward_fn_key's column; default: data_source)
    non["reward_source"] = collated.get("reward_source", collated["data_source"])
    non["uid"] = [f"{uid_prefix}-{i}" for i in range(rows)]
    return Batch.from_dict(tensors, non)


def shard_prompts(
    prompt_ids: Sequence[list[int]], num_ranks: int, sampling: SamplingSettings
) -> list[tuple[list[list[int]], SamplingSettings]]:
    """Contiguous, near-equal shares of the prompts for ``num_ranks`` rollout ranks, with their
    sampling settings.

    With a seed, rank ``k``'s share starts at prompt ``b_k`` and gets the seed ``seed + b_k * n``:
    every prompt is sampled with the seed of its global position, so the responses do not depend on
    how the prompts are spread over the ranks. A rank may get no prompts (fewer prompts than ranks).
    """
    if num_ranks < 1:
        raise ValueError(f"num_ranks must be >= 1, got {num_ranks}")
    bounds = np.linspace(0, len(prompt_ids), num_ranks + 1).astype(int)
    shares = []
    for k in range(num_ranks):
        start, stop = int(bounds[k]), int(bounds[k + 1])
        s = sampling if sampling.seed is None else replace(sampling, seed=sampling.seed + start * sampling.n)
        shares.append((list(prompt_ids[start:stop]), s))
    return shares


def merge_outputs(outputs: Sequence[RolloutOutput], sampling: SamplingSettings) -> RolloutOutput:
    """The ranks' outputs (in rank order, as :func:`shard_prompts` cut them) as one output; an agent-loop
    field is kept when every rank with responses has it."""
    trajectory = {}
    for name in TRAJECTORY_FIELDS:
        parts = [getattr(o, name) for o in outputs if len(o)]
        if parts and all(p is not None for p in parts):
            trajectory[name] = [x for p in parts for x in p]
    return RolloutOutput(
        response_ids=[r for o in outputs for r in o.response_ids],
        logprobs=[lp for o in outputs for lp in (o.logprobs or [])] if sampling.logprobs else None,
        finished_by_eos=[f for o in outputs for f in o.finished_by_eos],
        **trajectory,
    )


def responses_to_batch(prompts: Batch, output: RolloutOutput, *, n: int, pad_id: int, response_length: int) -> Batch:
    """The step's batch: each prompt row repeated ``n`` times with its responses appended (layout in
    the module docstring). ``output`` holds ``len(prompts) * n`` responses, prompt-major.

    Agent-loop trajectories: the attention covers every response token (tool responses are context),
    ``response_mask`` only the model's (the loss, KL and entropy count those); a trajectory that rendered
    its own prompt (``output.prompt_ids``) gets it in ``prompts`` (left-padded to the same width);
    ``num_turns`` and the loops' ``extra_fields`` join each row's ``extra_info`` (as verl's reward
    functions read them: ``extra_info["num_turns"]``, ``extra_info["rollout_reward_scores"]``)."""
    if len(output) != len(prompts) * n:
        raise ValueError(f"{len(output)} responses for {len(prompts)} prompts x n={n}")
    R = response_length
    responses, response_mask, rollout_logp = pad_responses(output, pad_id, R)
    rows = prompts.repeat_interleave(n)
    if output.prompt_ids is not None:
        _own_prompts(rows, output.prompt_ids, pad_id)
    prompt_mask = rows["attention_mask"]
    last_pos = rows["position_ids"][:, -1:]
    rows["prompts"] = rows["input_ids"]
    rows["responses"] = responses
    rows["response_mask"] = response_mask.float()
    if rollout_logp is not None:
        rows["rollout_log_probs"] = rollout_logp
    if output.token_versions is not None:  # partial rollouts: each token's policy version, -1 on padding
        versions_BR = torch.full((len(output), R), -1, dtype=torch.long)
        for i, v in enumerate(output.token_versions):
            versions_BR[i, : len(v)] = torch.tensor(v, dtype=torch.long)
        rows["rollout_versions"] = versions_BR
    present_BR = torch.arange(R).unsqueeze(0) < torch.tensor(output.response_lengths, dtype=torch.long).unsqueeze(1)
    rows["input_ids"] = torch.cat([rows["input_ids"], responses], dim=1)
    rows["attention_mask"] = torch.cat([prompt_mask, present_BR.to(prompt_mask.dtype)], dim=1)
    rows["position_ids"] = torch.cat([rows["position_ids"], last_pos + torch.arange(1, R + 1).unsqueeze(0)], dim=1)
    if any(getattr(output, f) is not None for f in ("num_turns", "extra_fields", "metrics")):
        _trajectory_info(rows, output)
    return rows


def _own_prompts(rows: Batch, prompt_ids: list[list[int]], pad_id: int) -> None:
    """Replace each row's prompt by the one its agent loop rendered (left-padded to the batch's width)."""
    P = rows["input_ids"].shape[1]
    longest = max((len(p) for p in prompt_ids), default=0)
    if longest > P:
        raise ValueError(f"an agent loop's prompt has {longest} tokens, more than data.max_prompt_length={P} "
                         "(a tool agent's prompt holds the tool schemas); raise data.max_prompt_length")
    ids = torch.full((len(prompt_ids), P), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompt_ids), P), dtype=rows["attention_mask"].dtype)
    for r, p in enumerate(prompt_ids):
        if p:
            ids[r, P - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[r, P - len(p):] = 1
    rows["input_ids"], rows["attention_mask"] = ids, mask
    rows["position_ids"] = (torch.cumsum(mask, dim=1) - 1).clamp(min=0)
    rows["prompt_ids"] = [list(p) for p in prompt_ids]


def _trajectory_info(rows: Batch, output: RolloutOutput) -> None:
    infos = []
    for r in range(len(output)):
        info = dict(rows["extra_info"][r] or {}) if "extra_info" in rows else {}
        if output.num_turns is not None:
            info["num_turns"] = output.num_turns[r]
        extra = (output.extra_fields or [{}] * len(output))[r] or {}
        if extra:
            info["rollout_reward_scores"] = dict(extra)
        infos.append(info)
    rows["extra_info"] = infos
    if output.num_turns is not None:
        rows["num_turns"] = list(output.num_turns)
    if output.metrics is not None:
        rows["agent_metrics"] = [dict(m) for m in output.metrics]


def response_tokens(batch: Batch) -> torch.Tensor:
    """``[B*n, R]`` 1 on every token of each response, the model's and (in agent-loop trajectories) the
    tools': what a reward function reads as the response text, as verl decodes it. ``response_mask``
    marks the model's tokens only."""
    return batch["attention_mask"][:, -batch["responses"].shape[1]:].to(torch.float32)
