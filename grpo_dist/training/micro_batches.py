"""Cutting a batch's rows into micro-batches, and putting results back in the original order.

Two ways (verl's ``ppo_micro_batch_size_per_gpu`` and ``use_dynamic_bsz`` + ``ppo_max_token_len_per_gpu``):

- by count: consecutive rows, ``micro_batch_size`` per micro-batch (the last may be smaller);
- by token budget: each row costs its real length (``attention_mask.sum()``, prompt + response);
  rows are packed first-fit-decreasing into as few micro-batches as that heuristic finds, each with
  total cost ``<= max_token_len``. A row longer than the budget goes alone. Deterministic: ties are
  broken by row index, so every rank that sees the same lengths makes the same packing.

All functions return lists of row-index lists; :func:`restore_order` puts per-micro-batch results
back in the order of the input rows. Micro-batch sizes are memory knobs only: the actor's loss uses
global normalisers, so the packing never changes an update (up to float rounding).

FSDP2 runs collectives inside every forward and backward, so all ranks must run the same number of
micro-batches; :func:`split_to_count` raises a rank's count to the maximum over ranks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist

__all__ = [
    "split_by_count",
    "split_by_token_budget",
    "split_to_count",
    "make_micro_batches",
    "restore_order",
    "take_rows",
    "row_lengths",
    "plan_micro_batches",
    "rank_shard_indices",
    "balanced_shard_order",
    "shard_token_loads",
    "seqlen_balance_metrics",
    "epoch_orders",
    "update_layout",
]


def split_by_count(num_rows: int, micro_batch_size: int) -> list[list[int]]:
    """``[[0..m-1], [m..2m-1], ...]``: consecutive rows, ``micro_batch_size`` each (last may be short)."""
    if micro_batch_size < 1:
        raise ValueError(f"micro batch size must be >= 1, got {micro_batch_size}")
    if num_rows < 0:
        raise ValueError(f"num_rows must be >= 0, got {num_rows}")
    return [list(range(s, min(s + micro_batch_size, num_rows))) for s in range(0, num_rows, micro_batch_size)]


def split_by_token_budget(lengths: Sequence[int], max_token_len: int) -> list[list[int]]:
    """Pack rows into micro-batches of total length ``<= max_token_len`` (first-fit decreasing).

    ``lengths[i]`` is row i's real token count. Rows are visited longest first (ties: lower index
    first) and put in the first micro-batch with room; a row longer than the budget gets its own
    micro-batch. Each returned list is sorted ascending; micro-batches are in creation order.
    """
    if max_token_len < 1:
        raise ValueError(f"max_token_len must be >= 1, got {max_token_len}")
    lens = [int(x) for x in lengths]
    if any(x < 0 for x in lens):
        raise ValueError("row lengths must be >= 0")
    order = sorted(range(len(lens)), key=lambda i: (-lens[i], i))
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        for b, load in enumerate(loads):
            if load + lens[i] <= max_token_len:
                bins[b].append(i)
                loads[b] += lens[i]
                break
        else:
            bins.append([i])
            loads.append(lens[i])
    return [sorted(b) for b in bins]


def split_to_count(micro_batches: list[list[int]], count: int) -> list[list[int]]:
    """Split micro-batches until there are ``count`` of them (never merges; budgets stay respected).

    The micro-batch with the most rows (ties: the first) is halved, repeatedly. ``ValueError`` when
    there are fewer rows than ``count``: every micro-batch must hold at least one row.
    """
    mbs = [list(m) for m in micro_batches if m]
    if count < len(mbs):
        raise ValueError(f"cannot reduce {len(mbs)} micro-batches to {count}")
    if sum(len(m) for m in mbs) < count:
        raise ValueError(
            f"{sum(len(m) for m in mbs)} rows cannot fill {count} micro-batches: every data-parallel rank "
            "must run the same number of micro-batches (FSDP collectives); give each rank the same number "
            "of rows"
        )
    while len(mbs) < count:
        k = max(range(len(mbs)), key=lambda j: (len(mbs[j]), -j))
        half = len(mbs[k]) // 2
        mbs[k : k + 1] = [mbs[k][:half], mbs[k][half:]]
    return mbs


def row_lengths(attention_mask: torch.Tensor) -> list[int]:
    """Real length of each row: ``attention_mask.sum(-1)`` as Python ints."""
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must be [B, L], got shape {tuple(attention_mask.shape)}")
    return [int(x) for x in attention_mask.sum(-1).tolist()]


def make_micro_batches(
    attention_mask: torch.Tensor,
    *,
    micro_batch_size: int | None = None,
    max_token_len: int | None = None,
) -> list[list[int]]:
    """Micro-batch index lists for the rows of ``attention_mask`` [B, L].

    Exactly one of ``micro_batch_size`` (by count) or ``max_token_len`` (by token budget) is given.
    """
    if (micro_batch_size is None) == (max_token_len is None):
        raise ValueError("give exactly one of micro_batch_size or max_token_len")
    if micro_batch_size is not None:
        return split_by_count(attention_mask.shape[0], micro_batch_size)
    assert max_token_len is not None
    return split_by_token_budget(row_lengths(attention_mask), max_token_len)


def take_rows(data: Mapping[str, torch.Tensor], index: Sequence[int] | torch.Tensor) -> dict[str, torch.Tensor]:
    """The rows ``index`` of every tensor of ``data`` (a dict or a TensorDict), as a new dict."""
    idx = index if isinstance(index, torch.Tensor) else torch.as_tensor(list(index), dtype=torch.long)
    return {k: v[idx.to(v.device)] for k, v in data.items()}


def restore_order(pieces: Sequence[torch.Tensor], micro_batches: Sequence[Sequence[int]]) -> torch.Tensor:
    """Concatenate per-micro-batch results and reorder rows to the original row order.

    ``pieces[k]`` holds the rows ``micro_batches[k]`` (in that order); the index lists together must
    be a permutation of ``0..N-1``.
    """
    if len(pieces) != len(micro_batches):
        raise ValueError(f"{len(pieces)} pieces for {len(micro_batches)} micro-batches")
    flat = [i for m in micro_batches for i in m]
    if sorted(flat) != list(range(len(flat))):
        raise ValueError("micro-batch index lists must be a permutation of 0..N-1")
    cat = torch.cat(list(pieces), dim=0)
    inverse = torch.empty(len(flat), dtype=torch.long)
    inverse[torch.as_tensor(flat, dtype=torch.long)] = torch.arange(len(flat))
    return cat[inverse.to(cat.device)]


def plan_micro_batches(
    attention_mask: torch.Tensor,
    *,
    micro_batch_size: int | None = None,
    max_token_len: int | None = None,
    sync_count: bool = True,
) -> list[list[int]]:
    """:func:`make_micro_batches`, then (when a process group is up and ``sync_count``) raise the
    count to the maximum over all ranks with :func:`split_to_count` (one all-reduce).

    Neither size given: the whole batch is one micro-batch.
    """
    n = attention_mask.shape[0]
    if micro_batch_size is None and max_token_len is None:
        mbs = [list(range(n))] if n else []
    else:
        mbs = make_micro_batches(attention_mask, micro_batch_size=micro_batch_size, max_token_len=max_token_len)
    if sync_count and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        device = attention_mask.device
        if dist.get_backend() == "nccl" and device.type != "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
        # one all-reduce gives the largest count and the smallest row count, so that an impossible
        # plan raises the same error on every rank instead of leaving the others in a collective
        stats = torch.tensor([len(mbs), -n], dtype=torch.long, device=device)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        count, min_rows = int(stats[0]), -int(stats[1])
        if min_rows < count:
            raise ValueError(
                f"a rank has {min_rows} rows but another needs {count} micro-batches: every data-parallel "
                "rank must run the same number of forwards (FSDP collectives); give ranks equal row counts"
            )
        mbs = split_to_count(mbs, count)
    return mbs


def epoch_orders(num_rows: int, *, epochs: int, seed: int) -> list[list[int]]:
    """The row order of every PPO epoch when the mini-batches are shuffled (verl's ``actor.shuffle`` /
    ``critic.shuffle`` with ``data_loader_seed``): one generator seeded with ``seed``, one
    ``torch.randperm(num_rows)`` from it per epoch, as verl's shuffled data loader over the step's
    responses draws them. Epoch ``e``'s mini-batch ``k`` is rows ``order[e][k * m:(k + 1) * m]`` of the
    whole step (``m`` = responses per mini-batch), so rows move between mini-batches, and the same for
    any number of ranks (each rank then takes its share of every mini-batch)."""
    gen = torch.Generator().manual_seed(int(seed))
    return [torch.randperm(num_rows, generator=gen).tolist() for _ in range(epochs)]


def update_layout(
    lengths: Sequence[int],
    *,
    num_mini_batches: int,
    world_size: int,
    balance: bool,
    orders: Sequence[Sequence[int]] | None = None,
) -> tuple[list[list[int]], dict[str, float]]:
    """Which of a step's rows each rank gets for an update, and the ``global_seqlen/*`` metrics.

    ``lengths``: every row's token count. ``orders``: the row order of each epoch
    (:func:`epoch_orders`, when the mini-batches are shuffled); None: one pass in the given order.
    For each epoch the rows are taken in its order, cut into ``num_mini_batches`` mini-batches, with
    ``balance`` reordered inside each mini-batch so the ranks get similar token counts
    (:func:`balanced_shard_order`), and rank ``r`` gets its share of every mini-batch
    (:func:`rank_shard_indices`); a rank's epochs follow one another. Returns the row indices of each
    rank and the balance metrics of the first epoch (empty without ``balance``)."""
    n = len(lengths)
    per_rank: list[list[int]] = [[] for _ in range(world_size)]
    metrics: dict[str, float] = {}
    for e, order in enumerate(orders if orders is not None else [list(range(n))]):
        order = list(order)
        if balance:
            epoch_lengths = [lengths[i] for i in order]
            balanced = balanced_shard_order(epoch_lengths, num_mini_batches=num_mini_batches, world_size=world_size)
            if e == 0:
                metrics = seqlen_balance_metrics(epoch_lengths, balanced, num_mini_batches=num_mini_batches,
                                                 world_size=world_size)
            order = [order[i] for i in balanced]
        for r in range(world_size):
            per_rank[r] += [order[i] for i in rank_shard_indices(n, num_mini_batches=num_mini_batches, rank=r,
                                                                  world_size=world_size)]
    return per_rank, metrics


def rank_shard_indices(num_rows: int, *, num_mini_batches: int, rank: int, world_size: int) -> list[int]:
    """Rows of a step's global batch that data-parallel ``rank`` gets, in the layout
    :meth:`FSDPActor.update_policy` expects.

    The global batch of ``num_rows`` rows is cut into ``num_mini_batches`` consecutive global
    mini-batches; each global mini-batch is cut into ``world_size`` consecutive equal chunks, and rank
    ``r`` takes chunk ``r`` of every mini-batch, in mini-batch order. So the rank's shard is
    ``num_mini_batches`` contiguous equal chunks and chunk ``k`` over all ranks is global mini-batch ``k``.
    ``num_rows`` must be divisible by ``num_mini_batches * world_size``.
    """
    if num_mini_batches < 1 or world_size < 1:
        raise ValueError("num_mini_batches and world_size must be >= 1")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if num_rows % (num_mini_batches * world_size):
        raise ValueError(
            f"{num_rows} rows cannot be cut into {num_mini_batches} mini-batches x {world_size} ranks evenly"
        )
    mini = num_rows // num_mini_batches
    per_rank = mini // world_size
    return [k * mini + rank * per_rank + j for k in range(num_mini_batches) for j in range(per_rank)]


def balanced_shard_order(lengths: Sequence[int], *, num_mini_batches: int, world_size: int) -> list[int]:
    """A row order for :func:`rank_shard_indices` under which every rank gets about the same number of
    tokens in each global mini-batch (verl's ``trainer.balance_batch``), without moving any row to
    another mini-batch.

    Rows only move inside their own global mini-batch (the ``num_rows // num_mini_batches`` consecutive
    rows ``rank_shard_indices`` cuts into ``world_size`` chunks). The update sums every rank's piece of a
    mini-batch with global normalisers, so such a permutation leaves it unchanged up to float rounding,
    while moving rows across mini-batches would change which optimizer step sees them.

    Within a mini-batch the rows are dealt longest first (ties: lower index first) to the rank with
    the fewest tokens so far among those with room (each rank takes exactly ``num_rows //
    (num_mini_batches * world_size)`` rows; ties: lower rank). Returns ``order`` with
    ``order[i]`` = the input row placed at position ``i``; deterministic.
    """
    n = len(lengths)
    if num_mini_batches < 1 or world_size < 1:
        raise ValueError("num_mini_batches and world_size must be >= 1")
    if n % (num_mini_batches * world_size):
        raise ValueError(f"{n} rows cannot be cut into {num_mini_batches} mini-batches x {world_size} ranks evenly")
    mini, per_rank = n // num_mini_batches, n // (num_mini_batches * world_size)
    order: list[int] = []
    for k in range(num_mini_batches):
        rows = range(k * mini, (k + 1) * mini)
        loads, members = [0] * world_size, [[] for _ in range(world_size)]
        for i in sorted(rows, key=lambda i: (-int(lengths[i]), i)):
            r = min((r for r in range(world_size) if len(members[r]) < per_rank), key=lambda r: (loads[r], r))
            members[r].append(i)
            loads[r] += int(lengths[i])
        order.extend(i for r in range(world_size) for i in sorted(members[r]))
    return order


def shard_token_loads(lengths: Sequence[int], order: Sequence[int], *, num_mini_batches: int, world_size: int) -> list[int]:
    """Tokens of each (mini-batch, rank) shard when rows are laid out in ``order``: a list of
    ``num_mini_batches * world_size`` sums, mini-batch major."""
    n = len(order)
    per_rank = n // (num_mini_batches * world_size)
    return [sum(int(lengths[order[j]]) for j in range(s, s + per_rank)) for s in range(0, n, per_rank)]


def seqlen_balance_metrics(lengths: Sequence[int], order: Sequence[int], *, num_mini_batches: int, world_size: int) -> dict[str, float]:
    """verl's ``global_seqlen/*`` metrics: tokens per rank over the step (summed over its shards of all
    mini-batches) in the original order (``min``, ``max``, ``minmax_diff``) and in ``order``
    (``balanced_min``, ``balanced_max``), and their ``mean``."""

    def per_rank(o: Sequence[int]) -> list[int]:
        loads = shard_token_loads(lengths, o, num_mini_batches=num_mini_batches, world_size=world_size)
        return [sum(loads[k * world_size + r] for k in range(num_mini_batches)) for r in range(world_size)]

    before, after = per_rank(list(range(len(order)))), per_rank(order)
    return {
        "global_seqlen/min": float(min(before)),
        "global_seqlen/max": float(max(before)),
        "global_seqlen/minmax_diff": float(max(before) - min(before)),
        "global_seqlen/balanced_min": float(min(after)),
        "global_seqlen/balanced_max": float(max(after)),
        "global_seqlen/mean": float(sum(before) / world_size),
    }
