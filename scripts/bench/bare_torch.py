"""Bare torch: the update phase as a plain single-process forward/backward/AdamW loop.

    python scripts/bench/bare_torch.py WORKLOAD_JSON OUT_JSON

The same model (``AutoModelForCausalLM.from_pretrained``, float32, sdpa, dropout as shipped = 0), the
same rows as one grpo_dist step (``batch_size x n`` sequences: each step's real prompts, left-padded,
followed by ``response_length`` response tokens), cut into the same micro-batches
(``micro_batch`` rows), the same loss shape (clipped policy-gradient term + ``kl_coef`` x k3 KL to
fixed reference log-probs, token-mean over the whole mini-batch), gradient clipping at 1.0 and one
AdamW step per step. No FSDP, no Ray, no process group, no metrics.

Also timed: a no-grad forward over the same rows in the same micro-batches, the work of grpo_dist's
``old_log_prob`` and ``ref`` phases.

The response tokens are random (the update's cost does not depend on their values). Their length
is ``response_tokens`` from the workload when given (the mean length grpo_dist generated), else
``response_length``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import load_prompt_dataset, subprocess_main  # noqa: E402


def _batch(w: dict, prompt_ids: list[list[int]], pad_id: int, vocab: int, gen):
    """input_ids / attention_mask / position_ids [B*n, P+R] and the response length R."""
    import torch

    n, P = w["n"], w["max_prompt_length"]
    R = int(w.get("response_tokens") or w["response_length"])
    rows = [p for p in prompt_ids for _ in range(n)]
    N = len(rows)
    ids = torch.full((N, P + R), pad_id, dtype=torch.long)
    mask = torch.zeros((N, P + R), dtype=torch.long)
    for i, p in enumerate(rows):
        ids[i, P - len(p):P] = torch.tensor(p)
        mask[i, P - len(p):] = 1
    ids[:, P:] = torch.randint(4, vocab, (N, R), generator=gen)
    # drop the prompt padding columns no row uses (plain batching: pad to the longest prompt)
    first = int(mask[:, :P].any(0).nonzero()[0])
    ids, mask = ids[:, first:], mask[:, first:]
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, pos, R


def _logp(model, ids, mask, pos, R):
    import torch

    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    logits = logits[:, -R - 1:-1, :].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, -R:].unsqueeze(-1)).squeeze(-1)


def run(w: dict) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    tok, ds = load_prompt_dataset(w)
    gen = torch.Generator().manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(w["model_dir"], dtype=torch.float32, attn_implementation="sdpa")
    model.config.use_cache = False
    vocab = model.config.vocab_size
    opt = torch.optim.AdamW(model.parameters(), lr=w["lr"], betas=(0.9, 0.999), weight_decay=0.01)
    m = w["micro_batch"]
    eps, beta = 0.2, w["kl_coef"]
    rows_out = []
    for k, idx in enumerate(w["step_prompts"]):
        ids, mask, pos, R = _batch(w, [ds[i]["prompt_ids"] for i in idx], tok.pad_token_id, vocab, gen)
        N = ids.shape[0]
        resp_mask = mask[:, -R:].float()
        adv = torch.randn(N, 1, generator=gen).expand(N, R)
        chunks = [slice(s, min(s + m, N)) for s in range(0, N, m)]

        model.eval()
        t = time.perf_counter()
        with torch.no_grad():
            ref = torch.cat([_logp(model, ids[c], mask[c], pos[c], R) for c in chunks])
        fwd_s = time.perf_counter() - t

        model.train()
        t = time.perf_counter()
        total_tokens = resp_mask.sum()
        for c in chunks:
            logp = _logp(model, ids[c], mask[c], pos[c], R)
            old = logp.detach()
            ratio = torch.exp(logp - old)
            pg = torch.maximum(-adv[c] * ratio, -adv[c] * ratio.clamp(1 - eps, 1 + eps))
            d = ref[c] - logp
            kl = torch.exp(d) - d - 1  # k3 (low_var_kl)
            loss = ((pg + beta * kl) * resp_mask[c]).sum() / total_tokens
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        update_s = time.perf_counter() - t
        rows_out.append({"step": k + 1, "update_s": update_s, "forward_s": fwd_s, "sequences": N,
                         "response_tokens": R, "tokens": int(mask.sum()), "warmup": k < w["warmup_steps"]})
    return {"steps": rows_out, "threads": torch.get_num_threads()}


if __name__ == "__main__":
    subprocess_main(run)
