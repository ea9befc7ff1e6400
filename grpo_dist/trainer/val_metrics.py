"""verl's validation metrics: each variable of the validation's responses reduced per prompt, then averaged
over each data source's prompts.

Variables: ``reward`` (every response's score by the verifier) and each numeric extra value the reward
function returned (verl's ``reward_extra_info``; a function that returns a number has ``acc`` = that number,
as verl's reward managers set it). Text values (e.g. ``pred``) are not reduced; ``pred`` chooses the majority
answer below.

For one prompt and one variable, with ``v`` its m values (the responses that have one; m = ``rollout.val_kwargs.n``
unless the function left the key out for some):

- ``mean@m`` = mean(v); when m > 1 also ``std@m`` = the population standard deviation of v, and for each
  k in 2, 4, 8, ... (powers of two below m) and m itself, over D = 1000 bootstrap draws
  ``I_d`` = k indices drawn from 0..m-1 with replacement (``numpy.random.RandomState(42).choice(m, (D, k))``,
  the same draws for every prompt and variable of that m):
  ``best@k/mean`` = mean_d max(v[I_d]), ``best@k/std`` = std_d max(v[I_d]); ``worst@k/...`` the same of the
  min; and when every response has a ``pred``, ``maj@k/mean``, ``maj@k/std`` of v[j_d], j_d the first index in
  I_d whose pred is the draw's most common one (ties: the pred seen first in the draw).

Each metric is averaged over the data source's prompts: ``<section>/<source>/<variable>/<metric>``, where the
section is ``val-core`` for the core variable's (``acc`` when the function gives one, else ``reward``)
``mean@k``, ``best@k/*`` and ``maj@k/*`` at the largest k, and ``val-aux`` for every other metric.
"""

from __future__ import annotations

from collections import defaultdict
from functools import lru_cache
from numbers import Real
from typing import Any, Sequence

import numpy as np

__all__ = ["majority_picks", "prompt_metrics", "validation_metrics"]

#: verl's bootstrap: draws per estimate and the seed of the draws.
BOOTSTRAP_DRAWS, BOOTSTRAP_SEED = 1000, 42


def _sizes(m: int) -> list[int]:
    """2, 4, 8, ... below ``m``, then ``m`` (none for m <= 1)."""
    if m <= 1:
        return []
    ks, k = [], 2
    while k < m:
        ks.append(k)
        k *= 2
    return ks + [m]


@lru_cache(maxsize=64)
def _draws(m: int, k: int) -> np.ndarray:
    """[D, k] bootstrap indices into m values (the same for every prompt and variable with m values)."""
    return np.random.RandomState(BOOTSTRAP_SEED).choice(m, size=(BOOTSTRAP_DRAWS, k), replace=True)


def _vote(pred: Any) -> Any:
    """``pred`` as a vote: itself, or its repr when it cannot be a dict key (a list)."""
    try:
        hash(pred)
        return pred
    except TypeError:
        return repr(pred)


def majority_picks(preds: Sequence[Any]) -> dict[int, np.ndarray]:
    """For each bootstrap size k of the m responses, [D] indices: in each draw, the first response whose pred is
    the draw's most common one (ties: the pred seen first in the draw). The same for every variable.

    In a draw, the first position whose pred has the top count holds the first-seen of the most common preds,
    and it is that pred's first occurrence, so it is the pick."""
    codes: dict[Any, int] = {}
    code_M = np.array([codes.setdefault(_vote(p), len(codes)) for p in preds])
    picks = {}
    for k in _sizes(len(preds)):
        idx_DK = _draws(len(preds), k)
        c_DK = code_M[idx_DK]
        counts_DC = (c_DK[:, :, None] == np.arange(len(codes))).sum(axis=1)
        count_at_DK = np.take_along_axis(counts_DC, c_DK, axis=1)
        first_D = np.argmax(count_at_DK == counts_DC.max(axis=1, keepdims=True), axis=1)
        picks[k] = idx_DK[np.arange(len(idx_DK)), first_D]
    return picks


def prompt_metrics(values: Sequence[float], picks: dict[int, np.ndarray] | None = None) -> dict[str, float]:
    """The metrics of one prompt's values of one variable (module docstring); ``picks``: the majority answers'
    indices (:func:`majority_picks`), or None when the function gives no ``pred``."""
    v = np.asarray(values, dtype=np.float64)
    m = len(v)
    out = {f"mean@{m}": float(v.mean())}
    if m <= 1:
        return out
    out[f"std@{m}"] = float(v.std())
    for k in _sizes(m):
        idx = _draws(m, k)
        best, worst = v[idx].max(axis=1), v[idx].min(axis=1)
        out.update({f"best@{k}/mean": float(best.mean()), f"best@{k}/std": float(best.std()),
                    f"worst@{k}/mean": float(worst.mean()), f"worst@{k}/std": float(worst.std())})
        if picks is not None:
            maj = v[picks[k]]
            out.update({f"maj@{k}/mean": float(maj.mean()), f"maj@{k}/std": float(maj.std())})
    return out


def _is_number(x: Any) -> bool:
    return isinstance(x, (Real, np.number)) and not isinstance(x, (str, bytes))


def validation_metrics(data_sources: Sequence[str], uids: Sequence[str], variables: dict[str, Sequence[Any]]) -> dict[str, float]:
    """verl's ``val-core/...`` and ``val-aux/...`` metrics of B responses: their data sources [B], their prompts'
    group ids [B] and each variable's B values (``reward`` and the reward function's extra values; a value that
    is not a number, or None, is left out of its variable)."""
    groups: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for i, (src, uid) in enumerate(zip(data_sources, uids)):
        groups[str(src)][str(uid)].append(i)
    preds = variables.get("pred")
    out: dict[str, float] = {}
    for src, prompts in groups.items():
        per_var: dict[str, dict[str, list[float]]] = {}
        picks: dict[tuple[int, ...], dict[int, np.ndarray] | None] = {}  # by the responses a variable has
        for name, vals in variables.items():
            for rows in prompts.values():
                kept = tuple(i for i in rows if _is_number(vals[i]))
                if not kept:
                    continue
                if kept not in picks:
                    has_preds = preds is not None and all(preds[i] is not None for i in kept)
                    picks[kept] = majority_picks([preds[i] for i in kept]) if has_preds else None
                for metric, x in prompt_metrics([float(vals[i]) for i in kept], picks[kept]).items():
                    per_var.setdefault(name, {}).setdefault(metric, []).append(x)
        core = "acc" if "acc" in per_var else "reward"
        for name, metrics in per_var.items():
            top = max(int(metric.split("@")[1].split("/")[0]) for metric in metrics)
            for metric, xs in metrics.items():
                is_core = (name == core and metric.split("@")[0] in ("mean", "best", "maj")
                           and int(metric.split("@")[1].split("/")[0]) == top)
                out[f"{'val-core' if is_core else 'val-aux'}/{src}/{name}/{metric}"] = float(np.mean(xs))
    return out
