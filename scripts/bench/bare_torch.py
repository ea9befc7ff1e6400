"""Bare torch: the update phase as a plain single-process forward/backward/AdamW loop.

    python scripts/bench/bare_torch.py WORKLOAD_JSON OUT_JSON

The same model (``AutoModelForCausalLM.from_pretrained``, float32 weights, dropout as shipped = 0;
on CUDA bf16 autocast and fused AdamW), the same rows as one grpo_dist step (``batch_size x n``
sequences: each step's real prompts, left-padded, followed by the responses, right-padded), cut into
the same micro-batches (``micro_batch`` rows), the same loss shape (clipped policy-gradient term +
``kl_coef`` x k3 KL to fixed reference log-probs, token-mean over the whole mini-batch), gradient
clipping at 1.0 and one AdamW step per step. No FSDP, no Ray, no process group, no metrics.

Also timed: a no-grad forward over the same rows in the same micro-batches, the work of grpo_dist's
``old_log_prob`` and ``ref`` phases.

The response tokens are random (the update's cost does not depend on their values). Their lengths
(``bench_common.response_lengths``): grpo_dist's own, row for row, when the workload carries the bare
vLLM run's (``step_response_lengths``: it sent grpo_dist's seeds, so it sampled grpo_dist's
responses); else per row from the workload's length distribution when it has one (the same lengths
in every run), else all ``response_tokens`` (the mean grpo_dist generated) or ``response_length``.

``bare_variant`` (the workload key) picks how the loop computes, one variant per process (so each
one's peak memory is its own):

- ``naive``: what a loop written without grpo_dist does: the batch padded to the longest prompt and the
  longest response, transformers' SDPA, the full logits and torch's ``log_softmax``;
- ``padded``: grpo_dist's forward (``training.policy.forward_logprobs``) on the same padded micro-batches
  (all-padding columns trimmed, log-probs a few positions at a time);
- ``packed``: the same forward packed (real tokens only, per-sequence attention): grpo_dist's default
  work, without FSDP, Ray or the worker;
- ``packed_fused``: packed, log-probs fused with the output layer (no logits formed).

The ``packed`` process also times ``padded`` on the same batches, alternating the two within every
step (``also.padded`` in its result), so that packing's saving is measured without the drift between
processes that a machine shared with other jobs has.

Each step reports the tokens the model ran on ("computed") and the real prompt + response tokens
("that count").

With ``lora_rank`` in the workload (run_bench.py --lora-rank) the model is wrapped in peft adapters of that rank
(alpha twice it, every linear layer of the blocks), AdamW and clipping take the adapters only, and the reference
forward runs with the adapters off.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import (is_bf16, load_prompt_dataset, peft_lora_config, response_lengths, subprocess_main,  # noqa: E402
                          train_flops)

VARIANTS = ("naive", "padded", "packed", "packed_fused")


def _batch(w: dict, prompt_ids: list[list[int]], pad_id: int, vocab: int, gen, step: int = 0):
    """input_ids / attention_mask / position_ids [B*n, P'+R'] (P': the longest prompt, R': the longest
    response of the step) and R'."""
    import torch

    n = w["n"]
    rows = [p for p in prompt_ids for _ in range(n)]
    N = len(rows)
    lens = response_lengths(w, step, N)
    P, R = max(len(p) for p in rows), max(lens)
    ids = torch.full((N, P + R), pad_id, dtype=torch.long)
    mask = torch.zeros((N, P + R), dtype=torch.long)
    for i, (p, r) in enumerate(zip(rows, lens, strict=True)):
        ids[i, P - len(p):P] = torch.tensor(p)
        mask[i, P - len(p):P + r] = 1
    resp = torch.randint(4, vocab, (N, R), generator=gen)
    ids[:, P:] = torch.where(mask[:, P:].bool(), resp, torch.full_like(resp, pad_id))
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, pos, R


def _naive_logp(model, ids, mask, pos, R):
    import torch

    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    logits = logits[:, -R - 1:-1, :].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, -R:].unsqueeze(-1)).squeeze(-1)


def _computed_tokens(variant: str, mask, chunks) -> int:
    """Tokens the model runs on: the padded width (naive), the trimmed width (padded), the real ones (packed)."""
    if variant == "naive":
        return int(mask.shape[0] * mask.shape[1])
    if variant == "padded":
        total = 0
        for c in chunks:
            cols = mask[c].bool().any(0).nonzero()
            total += (c.stop - c.start) * int(cols[-1] - cols[0] + 1)
        return total
    return int(mask.sum())


def run(w: dict) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_dist.training.attention import VARLEN_SDPA
    from grpo_dist.training.policy import forward_logprobs

    variant = w.get("bare_variant", "naive")
    if variant not in VARIANTS:
        raise ValueError(f"bare_variant {variant!r} unknown; valid: {VARIANTS}")
    cuda = w.get("device") == "cuda"
    device = torch.device("cuda" if cuda else "cpu")
    tok, ds = load_prompt_dataset(w)
    gen = torch.Generator().manual_seed(0)
    attn = "sdpa" if variant == "naive" else VARLEN_SDPA
    model = AutoModelForCausalLM.from_pretrained(w["model_dir"], dtype=torch.float32, attn_implementation=attn)
    model.to(device)
    model.config.use_cache = False
    lora = w.get("lora_rank")
    if lora:  # peft adapters on every linear layer of the blocks; the reference is the base model, adapters off
        from peft import get_peft_model

        model = get_peft_model(model, peft_lora_config(w))
    params = [p for p in model.parameters() if p.requires_grad]
    vocab = len(tok)  # sample real token ids only (a real-vocabulary model's extra rows are never used)
    # fused AdamW on CUDA: what a user of a plain loop would pick (one kernel launch per step)
    opt = torch.optim.AdamW(params, lr=w["lr"], betas=(0.9, 0.999), weight_decay=0.01,
                            **({"fused": True} if cuda else {}))
    # bf16 (CUDA's default): float32 master weights, bf16 compute (as grpo_dist's mixed precision and
    # TRL's bf16=True)
    amp = torch.autocast(device.type, dtype=torch.bfloat16) if is_bf16(w) else contextlib.nullcontext()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def logp_of(v, ids, mask, pos, R):
        if v == "naive":
            return _naive_logp(model, ids, mask, pos, R)
        logp, _ = forward_logprobs(model, ids, mask, pos, response_length=R, temperature=1.0, compute_entropy=False,
                                   remove_padding=v != "padded", fused=v == "packed_fused")
        return logp

    m = w["micro_batch"]
    eps, beta = 0.2, w["kl_coef"]

    def _step(v, k, ids, mask, pos, R, resp_mask, adv, chunks) -> dict:
        """One step of variant ``v``: the no-grad forward, then the update (timed separately)."""
        model.eval()
        sync()
        t = time.perf_counter()
        with torch.no_grad(), amp, (model.disable_adapter() if lora else contextlib.nullcontext()):
            ref = torch.cat([logp_of(v, ids[c], mask[c], pos[c], R) for c in chunks])
        sync()
        fwd_s = time.perf_counter() - t

        model.train()
        t = time.perf_counter()
        total_tokens = resp_mask.sum()
        for c in chunks:
            with amp:
                logp = logp_of(v, ids[c], mask[c], pos[c], R)
            old = logp.detach()
            ratio = torch.exp(logp - old)
            pg = torch.maximum(-adv[c] * ratio, -adv[c] * ratio.clamp(1 - eps, 1 + eps))
            d = ref[c] - logp
            kl = torch.exp(d) - d - 1  # k3 (low_var_kl)
            loss = ((pg + beta * kl) * resp_mask[c]).sum() / total_tokens
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        update_s = time.perf_counter() - t
        flops = train_flops(w["matmul_params"], w["attn_width"], mask.sum(-1).tolist()) if "matmul_params" in w else None
        N = ids.shape[0]
        return {"step": k + 1, "update_s": update_s, "forward_s": fwd_s, "sequences": N,
                "response_tokens": float(resp_mask.sum() / N), "tokens": int(mask.sum()),
                "tokens_computed": _computed_tokens(v, mask, chunks), "train_flops": flops,
                "warmup": k < w["warmup_steps"]}

    timed = [variant, "padded"] if variant == "packed" else [variant]
    rows_by: dict[str, list] = {v: [] for v in timed}
    for k, idx in enumerate(w["step_prompts"]):
        ids, mask, pos, R = _batch(w, [ds[i]["prompt_ids"] for i in idx], tok.pad_token_id, vocab, gen, k)
        ids, mask, pos = ids.to(device), mask.to(device), pos.to(device)
        N = ids.shape[0]
        resp_mask = mask[:, -R:].float()
        adv = torch.randn(N, 1, generator=gen).expand(N, R).to(device)
        chunks = [slice(s, min(s + m, N)) for s in range(0, N, m)]
        for v in (timed if k % 2 == 0 else timed[::-1]):
            rows_by[v].append(_step(v, k, ids, mask, pos, R, resp_mask, adv, chunks))
    out = {"steps": rows_by[variant], "variant": variant, "threads": torch.get_num_threads(),
           "also": {v: rows for v, rows in rows_by.items() if v != variant}}
    if cuda:
        out["max_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


if __name__ == "__main__":
    subprocess_main(run)
