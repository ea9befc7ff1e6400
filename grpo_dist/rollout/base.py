"""The rollout contract: sampling settings in, token ids and their sampling log-probs out.

A rollout engine turns ``B`` prompts (token ids) into ``B x n`` responses. Every engine returns one
:class:`RolloutOutput`, flattened prompt-major::

    index = prompt_index * n + sample_index
    (prompt0-sample0, ..., prompt0-sample(n-1), prompt1-sample0, ...)

so that ``output.response_ids[i * n : (i + 1) * n]`` is the group of prompt ``i`` (GRPO's group).

Log-probs are those of the *processed* distribution the token was drawn from: the logits after
temperature, top-k and top-p, renormalised (tokens removed by top-k/top-p have probability 0 and are
never drawn). For greedy decoding (``do_sample=False``) that is the raw distribution,
``log_softmax(logits)``. With ``temperature=1, top_p=1, top_k=-1`` processed == raw, which is the
setting under which rollout log-probs and trainer log-probs are directly comparable.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch


@dataclass(frozen=True, kw_only=True)
class SamplingSettings:
    """How to sample responses (keyword-only).

    Attributes:
        n: responses per prompt (GRPO's group size), >= 1.
        temperature: > 0 when ``do_sample``; ignored (treated as 0) when greedy.
        top_p: nucleus sampling mass in (0, 1]; 1 disables it.
        top_k: keep the k most likely tokens; -1 disables it (0 is refused: ambiguous across engines).
        max_tokens: the most tokens generated per response (the EOS token counts), >= 1.
        do_sample: False means greedy decoding (temperature 0); then ``n`` must be 1, since all
            samples of a prompt would be identical.
        seed: seed of the sampling noise for this call; None draws from the engine's own stream.
        logprobs: return each sampled token's log-prob (``RolloutOutput.logprobs``); False leaves
            it ``None`` and spares the engine the work (10-20 % of vLLM's generation time on CPU).
        ignore_eos: keep sampling after an EOS token, to ``max_tokens`` (``rollout.ignore_eos``: fixed-length
            responses for throughput measurements); vLLM only.
    """

    n: int
    temperature: float
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int
    do_sample: bool = True
    seed: int | None = None
    logprobs: bool = True
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"SamplingSettings.n must be >= 1, got {self.n}")
        if self.max_tokens < 1:
            raise ValueError(f"SamplingSettings.max_tokens must be >= 1, got {self.max_tokens}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"SamplingSettings.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k != -1 and self.top_k < 1:
            raise ValueError(
                f"SamplingSettings.top_k must be -1 (disabled) or >= 1, got {self.top_k}"
            )
        if self.do_sample:
            if not (math.isfinite(self.temperature) and self.temperature > 0.0):
                raise ValueError(
                    "SamplingSettings.temperature must be > 0 when do_sample=True, got "
                    f"{self.temperature}; use do_sample=False for greedy decoding"
                )
        elif self.n != 1:
            raise ValueError(
                f"greedy decoding (do_sample=False) gives n={self.n} identical responses; use n=1 "
                "or do_sample=True"
            )

    @classmethod
    def greedy(cls, max_tokens: int) -> SamplingSettings:
        """One greedy response per prompt."""
        return cls(n=1, temperature=0.0, max_tokens=max_tokens, do_sample=False)


@dataclass
class RolloutOutput:
    """``B x n`` responses, flattened prompt-major (``prompt_index * n + sample_index``).

    Attributes:
        response_ids: ``[B*n][T_i]`` generated token ids; the EOS token is included when generation
            stopped on it. ``1 <= T_i <= max_tokens``.
        logprobs: ``[B*n][T_i]`` log-prob of each generated token under the engine's processed
            sampling distribution (see the module docstring); finite. ``None`` when the call's
            ``SamplingSettings.logprobs`` was False.
        finished_by_eos: ``[B*n]`` True when the response ended on an EOS / stop token, False when it
            was cut at ``max_tokens`` (or by the context length).

    Agent-loop rollouts (trajectories of several turns) also fill:

        response_masks: ``[B*n][T_i]`` 1 on the model's sampled tokens, 0 on tokens the model did not
            sample (tool responses, chat-template tokens between turns); None: every token is the
            model's. Log-probs of mask-0 tokens are 0.0.
        prompt_ids: ``[B*n][P_i]`` the prompt each trajectory started from, where the agent loop rendered
            its own (a tool agent's prompt carries the tool schemas); None: the dataset's prompts.
        num_turns: ``[B*n]`` chat turns of each trajectory (user, assistant and tool messages).
        metrics: ``[B*n]`` each trajectory's numbers (tool calls, tool errors, ...), averaged by the driver.
        extra_fields: ``[B*n]`` what each agent loop returned for the reward function (tool rewards, ...).

    Partial rollouts (:mod:`grpo_dist.rollout.partial`) also fill:

        token_versions: ``[B*n][T_i]`` the policy version that sampled each token (a response a weight
            sync interrupted holds tokens of more than one version).
    """

    response_ids: list[list[int]]
    logprobs: list[list[float]] | None
    finished_by_eos: list[bool]
    response_masks: list[list[int]] | None = None
    prompt_ids: list[list[int]] | None = None
    num_turns: list[int] | None = None
    metrics: list[dict[str, float]] | None = None
    extra_fields: list[dict[str, Any]] | None = None
    token_versions: list[list[int]] | None = None

    def __post_init__(self) -> None:
        n_lp = len(self.response_ids) if self.logprobs is None else len(self.logprobs)
        if not (len(self.response_ids) == n_lp == len(self.finished_by_eos)):
            raise ValueError(
                "RolloutOutput fields disagree on the number of responses: "
                f"{len(self.response_ids)} response_ids, {n_lp} logprobs, "
                f"{len(self.finished_by_eos)} finished_by_eos"
            )
        for name in TRAJECTORY_FIELDS:
            value = getattr(self, name)
            if value is not None and len(value) != len(self.response_ids):
                raise ValueError(f"RolloutOutput.{name} has {len(value)} entries for {len(self.response_ids)} responses")
        for i, (ids, lps) in enumerate(zip(self.response_ids, self.logprobs or [])):
            if len(ids) != len(lps):
                raise ValueError(
                    f"response {i} has {len(ids)} token ids but {len(lps)} logprobs"
                )
        for i, (ids, mask) in enumerate(zip(self.response_ids, self.response_masks or [])):
            if len(ids) != len(mask):
                raise ValueError(f"response {i} has {len(ids)} token ids but {len(mask)} mask entries")
        for i, (ids, versions) in enumerate(zip(self.response_ids, self.token_versions or [])):
            if len(ids) != len(versions):
                raise ValueError(f"response {i} has {len(ids)} token ids but {len(versions)} token versions")

    @classmethod
    def empty(cls, sampling: SamplingSettings) -> RolloutOutput:
        """The output of a call without prompts: no responses, log-probs as ``sampling`` asked."""
        return cls(response_ids=[], logprobs=[] if sampling.logprobs else None, finished_by_eos=[])

    def __len__(self) -> int:
        return len(self.response_ids)

    @property
    def response_lengths(self) -> list[int]:
        """``[B*n]`` number of generated tokens per response."""
        return [len(ids) for ids in self.response_ids]


@dataclass
class TokenOutput:
    """One request's answer from the asynchronous rollout server (verl's ``TokenOutput``): the sampled
    tokens of one turn, exactly as the engine drew them.

    Attributes:
        token_ids: ``[T]`` generated token ids (the EOS token included when generation stopped on it).
        log_probs: ``[T]`` each token's log-prob under the processed sampling distribution, or None when the
            request did not ask for them.
        stop_reason: ``"stop"`` (an EOS / stop token), ``"length"`` (``max_tokens`` or the context length) or
            ``"abort"`` (the request was cancelled).
        versions: ``[T]`` the policy version that sampled each token, from a server whose requests a weight
            sync may interrupt (partial rollouts); None otherwise.
    """

    token_ids: list[int]
    log_probs: list[float] | None = None
    stop_reason: str = "stop"
    versions: list[int] | None = None


#: The optional per-response fields of :class:`RolloutOutput` (agent-loop rollouts, partial rollouts).
TRAJECTORY_FIELDS = ("response_masks", "prompt_ids", "num_turns", "metrics", "extra_fields", "token_versions")


def rollout_step_seed(rollout_seed: int, global_step: int, responses: int) -> int:
    """Sampling seed of a training step: ``(rollout_seed * 100003 + global_step) * (responses + 1)``.

    ``global_step`` counts from 0 (the step being generated) and ``responses`` is the step's
    ``prompts x n``. Prompt ``i`` of the step is sampled with ``seed + i * n`` and vLLM gives its
    ``n`` samples ``seed + i * n + 0 .. n - 1``, so every response of every step has its own seed,
    whichever rank generates it (the result does not depend on the number of ranks)."""
    return (rollout_seed * 100_003 + global_step) * (responses + 1)


def pad_responses(
    output: RolloutOutput, pad_id: int, max_len: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Right-pad the responses of ``output`` into tensors of width ``max_len``.

    Returns:
        responses_BR: ``[B*n, max_len]`` long; token ids, ``pad_id`` after each response.
        response_mask_BR: ``[B*n, max_len]`` float32; 1.0 on generated tokens (up to and including
            EOS), 0.0 on padding and on the tokens ``output.response_masks`` marks 0 (tool responses).
        rollout_logp_BR: ``[B*n, max_len]`` float32; the sampling log-probs, 0.0 on padding; None
            when ``output.logprobs`` is None.

    Raises:
        ValueError: a response is longer than ``max_len``, or ``max_len < 1``.
    """
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    n_rows = len(output)
    responses_BR = torch.full((n_rows, max_len), pad_id, dtype=torch.long)
    response_mask_BR = torch.zeros((n_rows, max_len), dtype=torch.float32)
    with_logp = output.logprobs is not None
    rollout_logp_BR = torch.zeros((n_rows, max_len), dtype=torch.float32) if with_logp else None
    for row, ids in enumerate(output.response_ids):
        length = len(ids)
        if length > max_len:
            raise ValueError(
                f"response {row} has {length} tokens, more than max_len={max_len}; raise max_len "
                "to the rollout's max_tokens"
            )
        if length == 0:
            continue
        responses_BR[row, :length] = torch.tensor(ids, dtype=torch.long)
        if output.response_masks is None:
            response_mask_BR[row, :length] = 1.0
        else:
            response_mask_BR[row, :length] = torch.tensor(output.response_masks[row], dtype=torch.float32)
        if with_logp:
            rollout_logp_BR[row, :length] = torch.tensor(output.logprobs[row], dtype=torch.float32)
    return responses_BR, response_mask_BR, rollout_logp_BR


@runtime_checkable
class RolloutEngine(Protocol):
    """What the rollout worker needs from an inference engine."""

    def generate(
        self, prompt_token_ids: list[list[int]], sampling: SamplingSettings
    ) -> RolloutOutput:
        """Sample ``sampling.n`` responses for each prompt (``B`` prompts, unpadded token ids);
        return them flattened prompt-major."""
        ...

    accepts_partial_weights: bool
    """Whether ``update_weights`` may be called with part of the weights at a time (bucket by bucket);
    otherwise the caller collects every bucket and calls it once with all of them."""

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new weights in place (Hugging Face parameter names, e.g. a full state dict of the
        policy); no restart, no disk. The next ``generate`` uses them."""
        ...

    def sleep(self) -> None:
        """Free the engine's device memory (weights, KV cache) where supported; else a no-op."""
        ...

    def wake_up(self) -> None:
        """Restore what ``sleep`` freed; a no-op where ``sleep`` is."""
        ...

    def close(self) -> None:
        """Release the engine; the object is unusable afterwards."""
        ...
