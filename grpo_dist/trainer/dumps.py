"""verl's generation dumps: ``trainer.rollout_data_dir`` (the responses each training step trained on) and
``trainer.validation_data_dir`` (each validation's responses), as ``<folder>/<step>.jsonl``.

One JSON object per response, in the batch's order (the ``n`` responses of a prompt one after another), with
verl's fields:

- ``input``: the prompt's text, ``output``: the response's (its tools' tokens too, in an agent loop's
  trajectory), both decoded without special tokens, as verl decodes them;
- ``gts``: the row's ground truth (``reward_model.ground_truth``), ``score``: its reward (a training step's:
  the sum of its token-level scores, before any KL penalty, as verl's ``token_level_scores.sum(-1)``;
  validation's: the verifier's score);
- ``step``: the step (0: validation before training);
- the reward function's extra values: each key of its dict results other than ``score``.

The step numbers are the loop's (``training/global_step``), so a resumed run writes the steps after its
checkpoint and overwrites none of the earlier ones. A file is written whole or not at all (a temporary file
renamed over it). A failed write (a full disk) is said once per folder, as a warning, and the run goes on: a
dump is a record for the user, never what the run's results depend on.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

__all__ = ["GenerationDump", "batch_rows", "generation_rows"]


def _plain(value: Any) -> Any:
    """``value`` as JSON takes it: tensors and numpy values as lists or numbers, anything else it cannot write as
    text (``json.dumps(default=str)`` does the rest)."""
    tolist = getattr(value, "tolist", None)
    return tolist() if callable(tolist) else value


def generation_rows(*, inputs: Sequence[str], outputs: Sequence[str], gts: Sequence[Any], scores: Sequence[float],
                    step: int, extra: Sequence[dict] | None = None) -> list[dict]:
    """The dump's objects for B responses (every argument B long; ``extra``: each response's extra reward
    values, a dict per response). A key of ``extra`` never replaces one of verl's fields."""
    n = len(inputs)
    if not (len(outputs) == len(gts) == len(scores) == n and (extra is None or len(extra) == n)):
        raise ValueError(f"generation_rows got lists of different lengths: inputs {n}, outputs {len(outputs)}, "
                         f"gts {len(gts)}, scores {len(scores)}, extra {None if extra is None else len(extra)}")
    rows = []
    for i in range(n):
        row = {"input": inputs[i], "output": outputs[i], "gts": _plain(gts[i]), "score": float(scores[i]),
               "step": int(step)}
        for k, v in (extra[i] if extra is not None else {}).items():
            row.setdefault(str(k), _plain(v))
        rows.append(row)
    return rows


def batch_rows(batch: Any, tokenizer: Any, scores: Sequence[float], step: int) -> list[dict]:
    """The dump's objects for the responses of ``batch`` (:class:`grpo_dist.batch.Batch`, scored: its
    ``reward_extra_info``) with their ``scores`` [B]."""
    from grpo_dist.rollout.assemble import response_tokens
    from grpo_dist.trainer.metrics import decode_rows

    P = batch["prompts"].shape[1]
    extra = list(batch["reward_extra_info"]) if "reward_extra_info" in batch else None
    return generation_rows(inputs=decode_rows(tokenizer, batch["prompts"], batch["attention_mask"][:, :P]),
                           outputs=decode_rows(tokenizer, batch["responses"], response_tokens(batch)),
                           gts=list(batch["ground_truth"]) if "ground_truth" in batch else [None] * len(batch),
                           scores=list(scores), step=step, extra=extra)


class GenerationDump:
    """Writes the dumps of one folder (``key``: the configuration key that named it, for messages)."""

    def __init__(self, folder: str, key: str) -> None:
        self.folder, self.key, self.warned = Path(folder), key, False

    def write(self, step: int, rows: list[dict]) -> Path | None:
        """``<folder>/<step>.jsonl`` holding ``rows``; None when it could not be written (warned once)."""
        path = self.folder / f"{int(step)}.jsonl"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
            os.replace(tmp, path)
            return path
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if not self.warned:
                from grpo_dist.utils.disk import write_failure

                self.warned = True
                print(f"grpo_dist: warning: step {step}'s generations were not dumped: {write_failure(self.key, self.folder, exc)}. "
                      "Training goes on; later failures of this folder are not repeated.", file=sys.stderr, flush=True)
            return None
