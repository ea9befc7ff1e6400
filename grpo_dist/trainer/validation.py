"""Validation: the held-out prompts generated with the validation sampling and scored by the
rule-based verifier (never by a learned reward model), reduced to verl's ``val-core/<source>/acc/mean@n`` and
its other validation metrics (:mod:`grpo_dist.trainer.val_metrics`; with agent loops also ``val-aux/num_turns/*``);
with ``trainer.log_val_generations`` N > 0 also N samples (input, output, score; verl's fixed-seed
choice) logged to the tracker as a table, and with ``trainer.validation_data_dir`` every response written to
``<folder>/<step>.jsonl`` (:mod:`grpo_dist.trainer.dumps`).
"""

from __future__ import annotations

from typing import Any, Callable

from grpo_dist.batch import Batch
from grpo_dist.trainer.dumps import GenerationDump, batch_rows
from grpo_dist.trainer.metrics import pick_val_generations
from grpo_dist.trainer.val_metrics import validation_metrics

__all__ = ["validate"]


def validate(val_data: Any, *, generate: Callable[[list[dict], str], Batch], score: Callable[[Batch], Any],
             batch_size: int | None, tokenizer: Any, log_generations: int = 0, tracker: Any = None,
             step: int = 0, dump: GenerationDump | None = None) -> dict[str, float]:
    """Scores of ``val_data`` (None: ``{}``), ``batch_size`` prompts per generation (None: all at once).

    ``generate(items, uid_prefix)``: the responses of a batch of prompts; ``score(batch)``: their
    scores [B] by the verifier (responses of one prompt share their ``uid``). Samples are logged to ``tracker`` at
    ``step`` when ``log_generations`` > 0; every response goes to ``dump`` when given.
    """
    if val_data is None:
        return {}
    bs = batch_size or len(val_data)
    sources, uids, scores, extras, rows = [], [], [], [], []  # rows: decoded only when logged or dumped
    turns: list[float] = []  # agent-loop trajectories' turns
    for start in range(0, len(val_data), bs):
        batch = generate([val_data[i] for i in range(start, min(start + bs, len(val_data)))], f"v{start}")
        sources += [str(x) for x in batch["data_source"]]
        uids += [str(x) for x in batch["uid"]]
        batch_scores = score(batch).tolist()
        scores += batch_scores
        extras += list(batch["reward_extra_info"]) if "reward_extra_info" in batch else [{}] * len(batch)
        turns += [float(t) for t in batch["num_turns"]] if "num_turns" in batch else []
        if log_generations > 0 or dump is not None:
            rows += batch_rows(batch, tokenizer, batch_scores, step)
    if dump is not None:
        dump.write(step, rows)
    if log_generations > 0 and tracker is not None:
        tracker.log_generations(pick_val_generations([r["input"] for r in rows], [r["output"] for r in rows], scores,
                                                     log_generations), step=step)
    variables: dict[str, list] = {"reward": scores}
    for key in sorted({k for e in extras for k in e}):
        variables.setdefault(key, [e.get(key) for e in extras])
    out = validation_metrics(sources, uids, variables)
    if turns:  # verl's val-aux/num_turns/* of agent-loop trajectories
        out.update({"val-aux/num_turns/min": min(turns), "val-aux/num_turns/max": max(turns),
                    "val-aux/num_turns/mean": sum(turns) / len(turns)})
    return out
