"""Validation: the held-out prompts generated with the validation sampling and scored by the
rule-based verifier (never by a learned reward model), reduced to verl's ``val-core/<source>/acc/mean@n``;
with ``trainer.log_val_generations`` N > 0 also N samples (input, output, score; verl's fixed-seed
choice) logged to the tracker as a table.
"""

from __future__ import annotations

from typing import Any, Callable

from grpo_dist.batch import Batch
from grpo_dist.rollout.assemble import response_tokens
from grpo_dist.trainer.metrics import decode_rows, pick_val_generations, reduce_validation

__all__ = ["validate"]


def validate(val_data: Any, *, generate: Callable[[list[dict], str], Batch], score: Callable[[Batch], Any],
             batch_size: int | None, n: int, tokenizer: Any, log_generations: int = 0, tracker: Any = None,
             step: int = 0) -> dict[str, float]:
    """Scores of ``val_data`` (None: ``{}``), ``batch_size`` prompts per generation (None: all at once).

    ``generate(items, uid_prefix)``: the responses of a batch of prompts; ``score(batch)``: their
    scores [B] by the verifier; ``n``: responses per prompt. Samples are logged to ``tracker`` at
    ``step`` when ``log_generations`` > 0.
    """
    if val_data is None:
        return {}
    bs = batch_size or len(val_data)
    sources, scores, inputs, outputs = [], [], [], []
    for start in range(0, len(val_data), bs):
        batch = generate([val_data[i] for i in range(start, min(start + bs, len(val_data)))], f"v{start}")
        sources += [str(x) for x in batch["data_source"]]
        scores += score(batch).tolist()
        if log_generations > 0:
            inputs += decode_rows(tokenizer, batch["prompts"], batch["attention_mask"][:, : batch["prompts"].shape[1]])
            outputs += decode_rows(tokenizer, batch["responses"], response_tokens(batch))
    if log_generations > 0 and tracker is not None:
        tracker.log_generations(pick_val_generations(inputs, outputs, scores, log_generations), step=step)
    return reduce_validation(sources, scores, n)
