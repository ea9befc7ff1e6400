"""Calls on one worker group with a share of the step's rows per rank: a no-grad forward (log-probs,
values) on equal consecutive shares, and an update (the actor's policy update, the critic's value
update) on each rank's share of every mini-batch.

The step's rows are laid out for :func:`~grpo_dist.training.micro_batches.rank_shard_indices`: cut
into ``num_mini_batches`` global mini-batches, each cut into one consecutive share per rank. With
``trainer.balance_batch`` the rows are first reordered inside each mini-batch so that every rank gets
about the same number of tokens (:func:`~grpo_dist.training.micro_batches.balanced_shard_order`); the
update sums all ranks' pieces of a mini-batch with global normalisers, so this changes its speed only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from grpo_dist.distributed.worker_group import WorkerGroup
from grpo_dist.training.micro_batches import epoch_orders, update_layout
from grpo_dist.training.settings import FORWARD_KEYS
from grpo_dist.workers.common import unwrap_timed

if TYPE_CHECKING:  # the batch container (tensordict) is loaded with the training loop, not with the run's plan
    from grpo_dist.batch import Batch

__all__ = ["sharded_forward", "sharded_forward_cat", "sharded_update"]


def sharded_forward(group: WorkerGroup, method: str, batch: Batch, world_size: int, *args: object,
                    extra_keys: Sequence[str] = ()) -> tuple[list, float]:
    """``group.<method>(rows, *args)`` on equal, consecutive shares of the batch's forward keys (and
    ``extra_keys``), one per rank: the per-rank results in rank order and the slowest rank's busy seconds."""
    shares = batch.select(*FORWARD_KEYS, *extra_keys).chunk(world_size)
    return unwrap_timed(group.call(method, per_rank=[(s.tensor_dict(), *args) for s in shares]))


def sharded_forward_cat(group: WorkerGroup, method: str, batch: Batch, world_size: int, *args: object,
                        extra_keys: Sequence[str] = ()) -> tuple[torch.Tensor, float]:
    """:func:`sharded_forward` whose per-rank results (a tensor, or a tuple whose first item is the
    tensor) are joined in rank order: ``[B, ...]`` for the whole batch, and the slowest rank's busy
    seconds."""
    outs, busy_s = sharded_forward(group, method, batch, world_size, *args, extra_keys=extra_keys)
    return torch.cat([o[0] if isinstance(o, tuple) else o for o in outs], dim=0), busy_s


def sharded_update(
    group: WorkerGroup,
    method: str,
    batch: Batch,
    keys: Sequence[str],
    *,
    num_mini_batches: int,
    world_size: int,
    balance: bool,
    role: str,
    shuffle: tuple[int, int] | None = None,
) -> tuple[dict[str, float], dict[str, float], float]:
    """``group.<method>(rows)`` on every rank with its share of every mini-batch of ``batch[keys]``.

    ``shuffle = (epochs, seed)`` (``actor.shuffle`` / ``critic.shuffle``): every epoch's rows in their own
    global order (:func:`~grpo_dist.training.micro_batches.epoch_orders`), one epoch after the other in
    each rank's rows (whose settings then have ``epochs_in_rows``); balancing applies inside each
    epoch's mini-batches (its metrics are the first epoch's).

    Returns rank 0's metrics (identical on all ranks) with ``perf/max_memory_gb/<role>`` the maximum
    over ranks; the ``global_seqlen/*`` balance metrics (empty without ``balance``); and the slowest
    rank's busy seconds.
    """
    sel = batch.select(*keys)
    orders = epoch_orders(len(sel), epochs=shuffle[0], seed=shuffle[1]) if shuffle else None
    shares, balance_metrics = update_layout(sel["attention_mask"].sum(-1).tolist(), num_mini_batches=num_mini_batches,
                                            world_size=world_size, balance=balance, orders=orders)
    per_rank = [(sel.reorder(index).tensor_dict(),) for index in shares]
    metrics, busy_s = unwrap_timed(group.call(method, per_rank=per_rank))
    out = dict(metrics[0])
    memory_key = f"perf/max_memory_gb/{role}"
    out[memory_key] = max(m.get(memory_key, 0.0) for m in metrics)
    return out, balance_metrics, busy_s
