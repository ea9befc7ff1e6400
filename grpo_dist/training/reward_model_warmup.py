"""A starting reward model: trained briefly, in one process, on a base policy's own samples labelled by a
rule-based verifier.

Iterative RL needs a reward model to begin with. The recipe here is the simplest one that works on a
verifiable task: sample responses from the base policy, label each with the verifier (1 correct, 0
not), and train a one-output head on the policy's backbone (``AutoModelForTokenClassification``,
``num_labels=1``, the policy's weights and a new head) with binary cross-entropy on the score at the
last response token, the loss iterative RL keeps training with. The result is a Hugging Face folder
(with the policy's tokenizer) that ``reward_model.model.path`` loads.

    rows = sample_and_label(policy_dir, prompts, label_fn, n=4, max_new_tokens=8, seed=0)
    report = train_reward_model(policy_dir, out_dir, rows, steps=150, batch_size=32, lr=1e-4, seed=0)

``scripts/train_reward_model.py`` runs both on a data file; :func:`grpo_dist.tasks.reverse.ensure_reward_model`
does it for the embedded task.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from grpo_dist.core.reward_model import labelled_bce, verifier_agreement

__all__ = ["PromptItem", "sample_and_label", "train_reward_model"]

PromptItem = tuple[list[int], str, Any, Any]
"""One prompt to sample from: ``(prompt token ids, data_source, ground_truth, extra_info)``."""


def _padded_rows(prompts: Sequence[list[int]], responses: Sequence[list[int]], *, pad_id: int, P: int, R: int) -> dict[str, torch.Tensor]:
    """The step batch's layout: left-padded prompts (width P), right-padded responses (width R)."""
    B = len(prompts)
    ids = torch.full((B, P + R), pad_id, dtype=torch.long)
    mask = torch.zeros((B, P + R), dtype=torch.long)
    for b, (p, r) in enumerate(zip(prompts, responses)):
        r = r[:R]
        ids[b, P - len(p):P] = torch.tensor(p, dtype=torch.long)
        mask[b, P - len(p):P] = 1
        if r:
            ids[b, P:P + len(r)] = torch.tensor(r, dtype=torch.long)
            mask[b, P:P + len(r)] = 1
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, P:].clone(), "response_mask": mask[:, P:].float()}


def _final_labels(targets_BR: torch.Tensor) -> torch.Tensor:
    """Only each row's last label (the whole response's), NaN elsewhere."""
    labelled = torch.isfinite(targets_BR)
    last_B = torch.where(labelled, torch.arange(targets_BR.shape[1]), -1).amax(dim=1)
    out = torch.full_like(targets_BR, math.nan)
    rows = torch.nonzero(last_B >= 0, as_tuple=True)[0]
    out[rows, last_B[rows]] = targets_BR[rows, last_B[rows]]
    return out


@torch.no_grad()
def sample_and_label(
    policy_dir: str | os.PathLike,
    prompts: Sequence[PromptItem],
    label_fn: Callable[[str, str, Any, Any], float],
    *,
    n: int = 4,
    max_new_tokens: int = 16,
    temperature: float = 1.0,
    batch_size: int = 64,
    every_prefix: bool = False,
    prefix_label_fn: Callable[[str, str, Any, Any], float] | None = None,
    edits_per_response: int = 0,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """``n`` sampled responses per prompt from the policy in ``policy_dir`` (Hugging Face ``generate``),
    each labelled ``label_fn(data_source, response_text, ground_truth, extra_info)`` (clamped to [0, 1]).

    Returns the rows in the step batch's layout (prompt width = the longest prompt, response width =
    ``max_new_tokens``) with ``rm_targets`` [N, R]: the label on the last response token, NaN
    elsewhere (an empty response has no label). With ``every_prefix``, every response token gets the
    verifier's label of the response cut after it: the score at a token is the score of that prefix
    (a causal model sees nothing after it), so this is the outcome objective on the prefixes too,
    at no extra forward cost; it teaches the reward model that an unfinished answer is not a correct
    one, which the base policy's complete samples alone never show. ``prefix_label_fn`` (same
    arguments) labels the prefixes that do not end the response instead (e.g. whether the answer is
    still on track: a process label); the last token keeps ``label_fn``'s. ``edits_per_response``
    adds that many edited copies of every sampled response, each with one random non-final token
    replaced by another token seen in the samples, labelled by the verifier like the rest: near-misses
    that the base policy rarely writes but a policy trained against the reward model soon does.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(policy_dir)
    model = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32).eval()
    gen_cfg = GenerationConfig.from_pretrained(policy_dir) if (Path(policy_dir) / "generation_config.json").exists() else None
    eos = gen_cfg.eos_token_id if gen_cfg is not None and gen_cfg.eos_token_id is not None else tok.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else next(iter(eos_ids))
    torch.manual_seed(seed)
    P = max(len(p[0]) for p in prompts)
    all_prompts, all_responses, labels, generated = [], [], [], []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start:start + batch_size]
        width = max(len(p[0]) for p in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        att = torch.zeros((len(chunk), width), dtype=torch.long)
        for b, (p, *_rest) in enumerate(chunk):
            ids[b, width - len(p):] = torch.tensor(p)
            att[b, width - len(p):] = 1
        out = model.generate(input_ids=ids, attention_mask=att, do_sample=True, temperature=temperature, top_k=0,
                             top_p=1.0, max_new_tokens=max_new_tokens, num_return_sequences=n, pad_token_id=pad_id,
                             eos_token_id=sorted(eos_ids))
        for row, seq in enumerate(out[:, width:].tolist()):
            resp = []
            for t in seq:
                resp.append(t)
                if t in eos_ids:
                    break
            generated.append((chunk[row // n], resp))
    rng = random.Random(seed)
    seen = sorted({t for _, resp in generated for t in resp} - eos_ids - set(tok.all_special_ids))
    samples = list(generated)
    for item, resp in generated:
        body = len(resp) - (1 if resp and resp[-1] in eos_ids else 0)
        for _ in range(edits_per_response if body and seen else 0):
            edited = list(resp)
            edited[rng.randrange(body)] = rng.choice(seen)
            samples.append((item, edited))
    for (p_ids, source, truth, extra), resp in samples:
        cuts = range(1, len(resp) + 1) if every_prefix else [len(resp)]
        all_prompts.append(list(p_ids))
        all_responses.append(resp)
        by_position = {}
        for t in cuts:
            fn = prefix_label_fn if (prefix_label_fn is not None and t < len(resp)) else label_fn
            y = float(fn(source, tok.decode(resp[:t], skip_special_tokens=True), truth, extra))
            by_position[t - 1] = min(1.0, max(0.0, y))
        labels.append(by_position)
    rows = _padded_rows(all_prompts, all_responses, pad_id=pad_id, P=P, R=max_new_tokens)
    targets = torch.full_like(rows["response_mask"], math.nan)
    for b, by_position in enumerate(labels):
        for t, y in by_position.items():
            targets[b, t] = y
    rows["rm_targets"] = targets
    return rows


def train_reward_model(
    policy_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    rows: dict[str, torch.Tensor],
    *,
    steps: int = 150,
    batch_size: int = 32,
    lr: float = 1e-4,
    heldout_fraction: float = 0.1,
    seed: int = 0,
    log_every: int = 0,
) -> dict[str, float]:
    """Train a reward model on the policy's backbone (new one-output head) and save it to ``out_dir``.

    ``rows``: :func:`sample_and_label`'s output (any rows with ``rm_targets``). A random
    ``heldout_fraction`` of them measures agreement with the verifier on whole responses (each row's
    last label) before and after training.
    Batches are balanced between positive and negative labels when both exist (a verifier that is
    rarely satisfied would otherwise teach "always wrong"). AdamW, constant ``lr``, gradient norm
    clipped to 1. Returns ``{"accuracy_before", "accuracy_after", "positives", "samples", "seconds"}``.
    """
    from transformers import AutoModelForTokenClassification

    from grpo_dist.training.checkpoint_io import copy_tokenizer_files
    from grpo_dist.training.reward_model import forward_scores

    t0 = time.perf_counter()
    g = torch.Generator().manual_seed(seed)
    n = rows["rm_targets"].shape[0]
    perm = torch.randperm(n, generator=g)
    n_held = int(round(n * heldout_fraction))
    held = {k: v[perm[:n_held]] for k, v in rows.items()}
    train = {k: v[perm[n_held:]] for k, v in rows.items()}
    label_B = torch.nan_to_num(_final_labels(train["rm_targets"]), nan=-1.0).amax(dim=1)
    pos = torch.nonzero(label_B > 0.5, as_tuple=True)[0].tolist()
    neg = torch.nonzero((label_B >= 0) & (label_B <= 0.5), as_tuple=True)[0].tolist()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForTokenClassification.from_pretrained(policy_dir, num_labels=1, dtype=torch.float32)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    R = rows["responses"].shape[1]

    def accuracy(data: dict[str, torch.Tensor]) -> float:
        if not data["rm_targets"].shape[0]:
            return math.nan
        model.eval()
        with torch.no_grad():
            scores, _ = forward_scores(model, data["input_ids"], data["attention_mask"], data["position_ids"], response_length=R)
        agree, total = verifier_agreement(scores, _final_labels(data["rm_targets"]))
        return agree / total if total else math.nan

    before = accuracy(held)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    for step in range(steps):
        if pos and neg:
            half = batch_size // 2
            index = [rng.choice(pos) for _ in range(half)] + [rng.choice(neg) for _ in range(batch_size - half)]
        else:
            index = [rng.randrange(train["rm_targets"].shape[0]) for _ in range(batch_size)]
        mb = {k: v[index] for k, v in train.items()}
        model.train()
        scores, _ = forward_scores(model, mb["input_ids"], mb["attention_mask"], mb["position_ids"], response_length=R)
        num = float(torch.isfinite(mb["rm_targets"]).sum())
        if num == 0:
            continue
        loss, _ = labelled_bce(scores, mb["rm_targets"], num_labels=num)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if log_every and (step + 1) % log_every == 0:
            print(f"reward model step {step + 1}/{steps}: loss {loss.item():.4f}", flush=True)
    after = accuracy(held)
    model.eval()
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    copy_tokenizer_files(policy_dir, out_dir)  # verbatim: the reward model reads the policy's token ids
    return {"accuracy_before": before, "accuracy_after": after, "positives": float(len(pos)),
            "samples": float(n), "seconds": time.perf_counter() - t0}
