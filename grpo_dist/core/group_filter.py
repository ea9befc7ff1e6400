"""Group filtering for dynamic sampling (DAPO): which prompts' groups carry a learning signal."""


from typing import Any, Sequence

import torch

__all__ = ["groups_with_spread"]


def groups_with_spread(values_B: torch.Tensor, index_B: Sequence[Any]) -> tuple[torch.Tensor, int, int]:
    """Keep the rows of groups whose metric has spread (DAPO's dynamic sampling filter).

    Rows with equal ``index_B`` entries form a group (one prompt's responses). A group is kept when
    the population standard deviation of its ``values_B`` is > 0, i.e. not all its values are equal,
    or when it has a single row (as verl). With a group-relative estimator a group of equal rewards
    has zero advantage everywhere: it adds no policy gradient, only dilutes the batch.

    Shapes: values_B [B] (any real dtype), index_B [B] hashable ids -> (keep_B bool [B], number of
    groups, number of kept groups). Groups are counted in order of first appearance.
    """
    if values_B.dim() != 1:
        raise ValueError(f"values_B must be 1-D [B], got shape {tuple(values_B.shape)}")
    ids = index_B.tolist() if hasattr(index_B, "tolist") else list(index_B)
    if len(ids) != values_B.shape[0]:
        raise ValueError(f"index_B has {len(ids)} entries but values_B has {values_B.shape[0]}")
    rows: dict[Any, list[int]] = {}
    for i, g in enumerate(ids):
        rows.setdefault(g, []).append(i)
    v = values_B.detach().double().cpu()
    keep_B = torch.zeros(len(ids), dtype=torch.bool)
    kept = 0
    for members in rows.values():
        vals = v[members]
        if len(members) == 1 or bool((vals != vals[0]).any()):
            keep_B[members] = True
            kept += 1
    return keep_B, len(rows), kept
