"""The batch that moves between the stages of a step.

``Batch`` is one container of per-row data: named tensors sharing a leading batch dimension (a
``tensordict.TensorDict``) plus per-row non-tensor fields (numpy object arrays: data_source,
ground truth, group uid, ...) and batch-level ``meta`` (plain values). It has the handful of
operations the driver needs (``select``, ``split``, ``chunk``, ``concat``, ``reorder``,
``repeat_interleave``, ``union``) and pickles cheaply for Ray.

Tensor names used across the project (B rows, P prompt tokens, R response tokens):
  prompts [B,P] (left-padded), responses [B,R] (right-padded), input_ids [B,P+R],
  attention_mask [B,P+R], position_ids [B,P+R], response_mask [B,R], rollout_log_probs [B,R] (only
  with rollout.calculate_log_probs),
  token_level_scores [B,R], token_level_rewards [B,R], old_log_probs [B,R], ref_log_prob [B,R],
  advantages [B,R], returns [B,R].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
import torch
from tensordict import TensorDict


def _as_object_array(values: Sequence[Any]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = list(values)
    return arr


@dataclass
class Batch:
    tensors: TensorDict
    non_tensors: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = self.tensors.batch_size[0] if len(self.tensors.batch_size) else None
        for k, v in self.non_tensors.items():
            if not isinstance(v, np.ndarray) or v.dtype != object:
                self.non_tensors[k] = v = _as_object_array(list(v))
            assert n is None or len(v) == n, f"non-tensor field {k!r} has {len(v)} rows, tensors have {n}"

    # ---- construction ----------------------------------------------------------------------
    @classmethod
    def from_dict(cls, tensors: dict[str, torch.Tensor], non_tensors: dict[str, Sequence[Any]] | None = None,
                  meta: dict[str, Any] | None = None) -> "Batch":
        sizes = {v.shape[0] for v in tensors.values()}
        sizes |= {len(v) for v in (non_tensors or {}).values()}
        assert len(sizes) <= 1, f"fields disagree on the number of rows: {sizes}"
        n = sizes.pop() if sizes else 0
        return cls(
            TensorDict(dict(tensors), batch_size=[n]),
            {k: _as_object_array(list(v)) for k, v in (non_tensors or {}).items()},
            dict(meta or {}),
        )

    # ---- access ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.tensors.batch_size[0]) if len(self.tensors.batch_size) else 0

    def __getitem__(self, key: str) -> Any:
        if key in self.non_tensors:
            return self.non_tensors[key]
        return self.tensors[key]

    def __contains__(self, key: str) -> bool:
        return key in self.non_tensors or key in self.tensors.keys()

    def __setitem__(self, key: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            self.tensors[key] = value
        else:
            value = _as_object_array(list(value))
            assert len(value) == len(self), f"{key}: {len(value)} rows, batch has {len(self)}"
            self.non_tensors[key] = value

    def tensor_dict(self, keys: Iterable[str] | None = None) -> dict[str, torch.Tensor]:
        """Plain dict of tensors (what the training library takes)."""
        keys = list(self.tensors.keys()) if keys is None else list(keys)
        return {k: self.tensors[k] for k in keys}

    # ---- row operations --------------------------------------------------------------------
    def select(self, *keys: str) -> "Batch":
        t = [k for k in keys if k in self.tensors.keys()]
        nt = [k for k in keys if k in self.non_tensors]
        missing = set(keys) - set(t) - set(nt)
        assert not missing, f"batch has no field(s) {sorted(missing)}"
        return Batch(self.tensors.select(*t), {k: self.non_tensors[k] for k in nt}, dict(self.meta))

    def reorder(self, index: Sequence[int] | torch.Tensor) -> "Batch":
        idx = torch.as_tensor(index, dtype=torch.long)
        np_idx = idx.numpy()
        return Batch(self.tensors[idx], {k: v[np_idx] for k, v in self.non_tensors.items()}, dict(self.meta))

    def slice(self, start: int, stop: int) -> "Batch":
        return Batch(self.tensors[start:stop], {k: v[start:stop] for k, v in self.non_tensors.items()}, dict(self.meta))

    def split(self, size: int) -> list["Batch"]:
        """Consecutive pieces of ``size`` rows (the last may be shorter)."""
        assert size > 0
        return [self.slice(i, min(i + size, len(self))) for i in range(0, len(self), size)]

    def chunk(self, n: int) -> list["Batch"]:
        """``n`` consecutive pieces of equal size; len(self) must be divisible by n."""
        assert n > 0 and len(self) % n == 0, f"{len(self)} rows do not split into {n} equal chunks"
        return self.split(len(self) // n)

    def repeat_interleave(self, n: int) -> "Batch":
        """Each row n times in a row: [a, b] -> [a, a, b, b] for n=2 (the GRPO group layout)."""
        idx = torch.arange(len(self)).repeat_interleave(n)
        return self.reorder(idx)

    def union(self, other: "Batch") -> "Batch":
        """Fields of both batches (same rows). A field present in both must be identical."""
        assert len(self) == len(other), f"union of batches with {len(self)} and {len(other)} rows"
        tensors = self.tensors.clone(recurse=False)
        for k in other.tensors.keys():
            if k in tensors.keys():
                assert torch.equal(tensors[k], other.tensors[k]), f"union: field {k!r} differs"
            else:
                tensors[k] = other.tensors[k]
        nt = dict(self.non_tensors)
        nt.update(other.non_tensors)
        return Batch(tensors, nt, {**self.meta, **other.meta})

    @staticmethod
    def concat(batches: Sequence["Batch"]) -> "Batch":
        assert batches, "concat of no batches"
        tensors = torch.cat([b.tensors for b in batches], dim=0)
        keys = batches[0].non_tensors.keys()
        nt = {k: np.concatenate([b.non_tensors[k] for b in batches]) for k in keys}
        return Batch(tensors, nt, dict(batches[0].meta))
