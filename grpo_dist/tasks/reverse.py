"""The embedded default task: reverse a string of digits.

Prompt (one user message): ``reverse 48213``; the right answer is ``31284``. The reward is 1.0
for exactly the reversed string and 0.0 otherwise (data_source ``grpo_dist/reverse``).

The base model is a small Qwen2-shaped model with a character tokenizer, warmed up with supervised
steps on answers that are the reversed string half the time and the copied string the other half.
So it knows the output format, and samples the reversal often enough that a group of ``rollout.n``
responses usually has reward variance, but it does not yet prefer reversing: what GRPO has to
teach. Everything is built locally in a few tens of seconds and cached (no downloads).

    python scripts/build_default_task.py [--out DIR]   # build (or rebuild) it explicitly
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator

DATA_SOURCE = "grpo_dist/reverse"
VERSION = "v1"
MIN_DIGITS, MAX_DIGITS = 3, 6
N_TRAIN, N_TEST = 4096, 256
DEFAULT_JOB_STEPS = 60
"""Length of the no-argument run (``python -m grpo_dist.main``) on this task: 60 steps of 32 prompts,
about half an epoch, which takes the base model's held-out accuracy from ~0.1 to ~0.9
(docs/quickstart.md). The configuration's ``trainer.total_training_steps`` resolves to it only for that
job; a run that names its own data or epochs gets verl's rule (epochs x steps per epoch)."""
VOCAB = list("0123456789 abcdefghijklmnopqrstuvwxyz\n")


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _build_once(final: Path, markers: Iterable[Path], lock: Path, build: Callable[[Path], object],
                note: str = "") -> None:
    """Build the folder ``final`` once, also across processes: unless every one of ``markers`` exists,
    take the file lock ``lock``, look again, and ``build`` into ``final.tmp`` that then replaces
    ``final`` whole (a reader never sees half a build). ``note`` is printed before building."""
    markers = list(markers)
    if all(p.exists() for p in markers):
        return
    with _lock(lock):
        if all(p.exists() for p in markers):
            return
        if note:
            print(note, flush=True)
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        build(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)


def make_prompt(digits: str) -> list[dict]:
    return [{"role": "user", "content": f"reverse {digits}"}]


def _digits(rng: random.Random, lengths: Callable[[random.Random], int] | None = None) -> str:
    length = rng.randint(MIN_DIGITS, MAX_DIGITS) if lengths is None else lengths(rng)
    return "".join(rng.choice("0123456789") for _ in range(length))


def long_tail_length(rng: random.Random, *, shortest: int = MIN_DIGITS, longest: int = 32, p: float = 0.2) -> int:
    """A string length with a long tail: ``shortest`` plus a geometric number of extra digits (each one more with
    probability ``1 - p``; mean about ``shortest + (1 - p) / p``), at most ``longest``. The default gives
    lengths of mean about 7 and a few in a hundred above 20: a workload whose longest responses set the
    step's generation time."""
    length = shortest
    while length < longest and rng.random() > p:
        length += 1
    return length


def score(solution_str: str, ground_truth, extra_info=None) -> float:
    """1.0 when the response is exactly the reversed digits (surrounding white space ignored)."""
    return 1.0 if solution_str.strip() == str(ground_truth).strip() else 0.0


def _register() -> None:
    from grpo_dist.rewards.scorers import DEFAULT_REGISTRY

    if DATA_SOURCE not in DEFAULT_REGISTRY:
        DEFAULT_REGISTRY.register(DATA_SOURCE)(score)


_register()


# ------------------------------------------------------------------------------------------ data
def write_data(out_dir: Path, *, seed: int = 0, lengths: Callable[[random.Random], int] | None = None) -> dict[str, Path]:
    """train.parquet / test.parquet in verl's row format; test strings never appear in train. ``lengths`` draws a
    string's length (default: uniform in ``MIN_DIGITS..MAX_DIGITS``; :func:`long_tail_length` for long tails)."""
    rng = random.Random(seed)
    test: list[str] = []
    seen: set[str] = set()
    while len(test) < N_TEST:
        d = _digits(rng, lengths)
        if d not in seen:
            seen.add(d)
            test.append(d)
    train = []
    while len(train) < N_TRAIN:
        d = _digits(rng, lengths)
        if d not in seen:
            train.append(d)
    rows = {}
    for split, items in (("train", train), ("test", test)):
        rows[split] = [
            {
                "data_source": DATA_SOURCE,
                "prompt": make_prompt(d),
                "ability": "string",
                "reward_model": {"style": "rule", "ground_truth": d[::-1]},
                "extra_info": {"split": split, "index": i},
            }
            for i, d in enumerate(items)
        ]
    return _write_splits(out_dir, rows)


def _write_splits(out_dir: Path, rows: dict[str, list[dict]]) -> dict[str, Path]:
    """``out_dir/{split}.parquet`` for each split's rows; their paths by split."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = {}
    out_dir.mkdir(parents=True, exist_ok=True)
    for split, split_rows in rows.items():
        path = out_dir / f"{split}.parquet"
        pq.write_table(pa.Table.from_pylist(split_rows), path)
        out[split] = path
    return out


def _ensure_splits(folder: Path, lock: Path, write: Callable[[Path], object]) -> dict[str, Path]:
    """``folder/train.parquet`` and ``folder/test.parquet``, written by ``write(folder)`` once
    (:func:`_build_once`, under the file lock ``lock``)."""
    paths = {"train": folder / "train.parquet", "test": folder / "test.parquet"}
    _build_once(folder, paths.values(), lock, write)
    return paths


# ----------------------------------------------------------------------------------------- model
def warm_up(model_dir: Path, *, steps: int, batch_size: int = 32, lr: float = 3e-3, seed: int = 0,
            reverse_fraction: float = 0.25, log_every: int = 0,
            lengths: Callable[[random.Random], int] | None = None) -> dict:
    """Supervised warm-up: answers are the reversal with probability ``reverse_fraction``, else a copy; string
    lengths as :func:`write_data`'s ``lengths`` draws them."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_dist.data.dataset import tokenize_prompt
    from grpo_dist.tasks.warmup import supervised_step

    torch.manual_seed(seed)
    rng = random.Random(seed + 1)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50) * max(0.05, 1 - s / steps))
    end_id = tok.convert_tokens_to_ids("<|im_end|>")
    pad_id = tok.pad_token_id
    t0 = time.perf_counter()
    loss_val = float("nan")
    for step in range(steps):
        seqs, labels = [], []
        for _ in range(batch_size):
            d = _digits(rng, lengths)
            ans = d[::-1] if rng.random() < reverse_fraction else d
            p = tokenize_prompt(tok, make_prompt(d))
            a = tok.encode(ans, add_special_tokens=False) + [end_id]
            seqs.append(list(p) + a)
            labels.append([-100] * len(p) + a)
        loss_val = supervised_step(model, opt, sched, seqs, labels, pad_id)
        if log_every and (step + 1) % log_every == 0:
            print(f"warm-up step {step + 1}/{steps}: loss {loss_val:.4f}", flush=True)
    model.save_pretrained(model_dir)
    return {"steps": steps, "final_loss": loss_val, "seconds": time.perf_counter() - t0}


def build_model(out_dir: Path, *, warmup_steps: int = 200, seed: int = 0, log_every: int = 0,
                lengths: Callable[[random.Random], int] | None = None) -> Path:
    import torch

    from grpo_dist.utils.tiny_model import build_tiny_model

    threads = torch.get_num_threads()
    try:
        build_tiny_model(out_dir, vocab=VOCAB, hidden_size=128, num_layers=4, num_heads=2, num_kv_heads=2,
                         head_dim=64, intermediate_size=256, max_position_embeddings=256, seed=seed)
        info = warm_up(out_dir, steps=warmup_steps, seed=seed, log_every=log_every, lengths=lengths)
    finally:
        torch.set_num_threads(threads)
    (out_dir / "grpo_dist_task.json").write_text(json.dumps({"task": "reverse", "version": VERSION, **info}))
    return out_dir


def ensure_model(cache: str | os.PathLike) -> Path:
    final = Path(cache) / f"tiny-reverse-{VERSION}"
    _build_once(final, [final / "grpo_dist_task.json"], Path(cache) / ".tiny-reverse.lock", build_model,
                note=f"grpo_dist: building the embedded base model in {final} (one time, about a minute)")
    return final


RM_VERSION = "v1"


def build_reward_model(out_dir: Path, policy_dir: Path, *, prompts: int = 512, n: int = 4, steps: int = 600,
                       lr: float = 3e-4, seed: int = 0, log_every: int = 0) -> dict:
    """A starting reward model for the task: the base policy's samples (``n`` per prompt, on prompts
    drawn like the training split's) and one edited copy of each (one digit replaced: a near-miss),
    labelled by :func:`score` at every prefix, and a head trained on the policy's backbone
    (:mod:`grpo_dist.training.reward_model_warmup`). About a minute on 2 CPU cores.

    Measured (512 prompts x 4, 600 steps): agreement with the verifier on held-out samples 0.64 before
    training, 0.92 after; on hand-made answers it accepts 83 % of exact reversals and rejects every
    copy, but still accepts a third of the reversals with one wrong digit: a reward model a policy
    can exploit, which iterative RL then retrains on the policy's own samples."""
    import torch
    from transformers import AutoTokenizer

    from grpo_dist.data.dataset import tokenize_prompt
    from grpo_dist.training.reward_model_warmup import sample_and_label, train_reward_model

    rng = random.Random(seed + 7)
    tok = AutoTokenizer.from_pretrained(policy_dir)
    items = []
    for _ in range(prompts):
        d = _digits(rng)
        items.append((list(tokenize_prompt(tok, make_prompt(d))), DATA_SOURCE, d[::-1], {}))
    threads = torch.get_num_threads()
    try:
        rows = sample_and_label(policy_dir, items, lambda src, text, truth, extra: score(text, truth), n=n,
                                max_new_tokens=MAX_DIGITS + 2, every_prefix=True, edits_per_response=1, seed=seed)
        report = train_reward_model(policy_dir, out_dir, rows, steps=steps, lr=lr, seed=seed, log_every=log_every)
    finally:
        torch.set_num_threads(threads)
    (out_dir / "grpo_dist_reward_model.json").write_text(json.dumps({"task": "reverse", "version": RM_VERSION,
                                                                     "policy": str(policy_dir), **report}))
    return report


def ensure_reward_model(cache: str | os.PathLike) -> Path:
    """The embedded task's starting reward model (built once from the embedded base policy, cached)."""
    final = Path(cache) / f"tiny-reverse-rm-{RM_VERSION}"
    marker = final / "grpo_dist_reward_model.json"
    if marker.exists():
        return final
    policy = ensure_model(cache)

    def build(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        build_reward_model(tmp, policy)

    _build_once(final, [marker], Path(cache) / ".tiny-reverse-rm.lock", build,
                note=f"grpo_dist: training a starting reward model in {final} (one time)")
    return final


def ensure_data(cache: str | os.PathLike) -> dict[str, Path]:
    return _ensure_splits(Path(cache) / f"reverse-data-{VERSION}", Path(cache) / ".reverse-data.lock", write_data)
