"""One supervised step of an embedded task's warm-up (the base models are taught their task's format before RL)."""

from __future__ import annotations

from typing import Any


def supervised_step(model: Any, opt: Any, sched: Any, seqs: list[list[int]], labels: list[list[int]], pad_id: int) -> float:
    """Cross-entropy on ``labels`` (-100: not trained) of the right-padded ``seqs``, one clipped (norm 1) optimizer
    and scheduler step; the loss."""
    import torch

    batch_size, width = len(seqs), max(len(s) for s in seqs)
    ids_BT = torch.full((batch_size, width), pad_id)
    lab_BT = torch.full((batch_size, width), -100)
    att_BT = torch.zeros((batch_size, width), dtype=torch.long)
    for i, (s, l) in enumerate(zip(seqs, labels)):
        ids_BT[i, : len(s)] = torch.tensor(s)
        lab_BT[i, : len(l)] = torch.tensor(l)
        att_BT[i, : len(s)] = 1
    loss = model(input_ids=ids_BT, attention_mask=att_BT, labels=lab_BT).loss
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    return loss.item()
