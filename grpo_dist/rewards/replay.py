"""Samples for training a reward model: a bounded replay buffer of the policy's labelled responses.

A sample is one row of a step's batch with the keys the reward model's update reads
(:data:`grpo_dist.training.settings.RM_UPDATE_KEYS`: the prompt + response tokens, their masks and
position ids, and ``rm_targets``, the verifier's labels). Rows of one run share their widths (the
prompt is padded to ``data.max_prompt_length``, the response to ``data.max_response_length``).

The buffer keeps the newest ``capacity`` rows (the oldest go first) and draws uniformly without
replacement. Its state is plain tensors (saved as safetensors by the caller), never pickles.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

__all__ = ["SampleRows", "ReplayBuffer", "concat_rows", "take"]

SampleRows = dict[str, torch.Tensor]
"""Rows of reward-model training samples: tensors sharing their first (row) dimension."""


def _rows(rows: Mapping[str, torch.Tensor]) -> int:
    sizes = {v.shape[0] for v in rows.values()}
    if len(sizes) > 1:
        raise ValueError(f"sample tensors disagree on the number of rows: {sorted(sizes)}")
    return sizes.pop() if sizes else 0


def concat_rows(parts: list[Mapping[str, torch.Tensor]]) -> SampleRows:
    """The rows of ``parts`` one after the other (empty parts are skipped); ``ValueError`` when their
    keys or widths differ."""
    parts = [p for p in parts if p and _rows(p)]
    if not parts:
        return {}
    keys = set(parts[0])
    for p in parts[1:]:
        if set(p) != keys:
            raise ValueError(f"sample rows with different keys: {sorted(keys)} and {sorted(p)}")
        for k in keys:
            if p[k].shape[1:] != parts[0][k].shape[1:]:
                raise ValueError(f"sample rows of {k!r} with different widths: {tuple(parts[0][k].shape)} and {tuple(p[k].shape)}")
    return {k: torch.cat([p[k] for p in parts]) for k in sorted(keys)}


def take(rows: Mapping[str, torch.Tensor], index: torch.Tensor) -> SampleRows:
    return {k: v[index] for k, v in rows.items()}


class ReplayBuffer:
    """The newest ``capacity`` labelled samples seen so far.

    Args:
        capacity: the most rows kept (>= 1).
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.rows: SampleRows = {}

    def __len__(self) -> int:
        return _rows(self.rows) if self.rows else 0

    def add(self, rows: Mapping[str, torch.Tensor]) -> None:
        """Append ``rows``; the oldest rows beyond ``capacity`` are dropped."""
        merged = concat_rows([self.rows, dict(rows)])
        n = _rows(merged) if merged else 0
        self.rows = take(merged, torch.arange(n - self.capacity, n)) if n > self.capacity else merged

    def sample(self, k: int, generator: torch.Generator) -> SampleRows:
        """``k`` rows drawn uniformly without replacement (in buffer order); ``ValueError`` when
        ``k`` is more than the buffer holds."""
        if not 0 <= k <= len(self):
            raise ValueError(f"cannot draw {k} samples from a replay buffer of {len(self)}")
        if k == 0:
            return {}
        index = torch.randperm(len(self), generator=generator)[:k].sort().values
        return take(self.rows, index)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The buffer's rows as named tensors (for safetensors)."""
        return {k: v.contiguous() for k, v in self.rows.items()}

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.rows = {k: v.clone() for k, v in tensors.items()}
        if len(self) > self.capacity:
            raise ValueError(f"the saved replay buffer holds {len(self)} samples, more than its capacity {self.capacity} "
                             "(reward_model.iterative.buffer_size): set it to the run's value")
