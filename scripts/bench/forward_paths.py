"""Padded vs packed forward, log-probs over all positions at once vs in chunks: time and peak memory of the actor's forward +
backward on one CPU rank, each variant in a fresh process.

    .venv/bin/python scripts/bench/forward_paths.py            # both workloads, ~9 min on 2 cores
    .venv/bin/python scripts/bench/forward_paths.py --quick    # smaller, ~2 min

Workloads (random Qwen2-style models, float32, SDPA attention, no gradient checkpointing):

- ``generation-heavy``: 64 responses of 16..128 tokens after prompts of 16..48 tokens (left-padded to
  48), micro-batches of 8 rows, a 32k vocabulary;
- ``real-vocabulary``: 16 responses of 64..256 tokens, micro-batches of 4 rows, Qwen2.5's 151,936-token
  vocabulary (the output layer dominates memory).

grpo_dist's variants use the model builder's attention (per-sequence SDPA for packed rows) unless the
variant says "plain sdpa" (transformers' SDPA: a block-diagonal mask over the whole packed row).
"saving vs grpo_dist padded" is the time packing (and the rest) saves against grpo_dist's own padded
path, to compare with the padding fraction printed below each workload: the share of the padded path's
tokens that are padding. "peak above model" is the peak resident memory minus the memory held before
the first forward (model and rows), i.e. what the forwards and backwards added.

Every variant computes the same loss (sum of response log-probs and entropies, through
grpo_dist.training.policy.forward_logprobs) on the same rows and micro-batches; "bare torch" is the plain
Hugging Face forward with a padded batch and torch's own log-softmax, as a training loop without
grpo_dist would write it. The table lists tokens computed (what the model ran on) next to the tokens that
count (real prompt + response tokens).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

WORKLOADS = {
    "generation-heavy": dict(rows=64, micro=8, prompt=(16, 48), response=(16, 128), vocab=32_000, hidden=256, layers=4),
    "real-vocabulary": dict(rows=16, micro=4, prompt=(16, 48), response=(64, 256), vocab=151_936, hidden=256, layers=2),
}
QUICK = {
    "generation-heavy": dict(rows=16, micro=8, prompt=(8, 24), response=(8, 64), vocab=32_000, hidden=128, layers=2),
    "real-vocabulary": dict(rows=8, micro=4, prompt=(8, 24), response=(32, 128), vocab=151_936, hidden=128, layers=1),
}
VARIANTS = {
    "bare torch (padded)": dict(bare=True),
    "grpo_dist padded": dict(remove_padding=False, chunk=None),
    "grpo_dist packed, block-diagonal mask (plain sdpa)": dict(remove_padding=True, chunk=None, attn="sdpa"),
    "grpo_dist packed, log-probs unchunked": dict(remove_padding=True, chunk=10**9),
    "grpo_dist packed, chunked log-probs": dict(remove_padding=True, chunk=None),
    "grpo_dist packed, fused log-probs": dict(remove_padding=True, chunk=None, fused=True),
}


def run_variant(spec: dict, variant: dict, repeats: int) -> dict:
    """Runs in a child process: build the model and rows, time forward + backward of every micro-batch."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_dist.training.attention import VARLEN_SDPA
    from grpo_dist.training.policy import forward_logprobs

    torch.manual_seed(0)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    h = spec["hidden"]
    config = Qwen2Config(
        vocab_size=spec["vocab"], hidden_size=h, intermediate_size=4 * h, num_hidden_layers=spec["layers"],
        num_attention_heads=max(1, h // 64), num_key_value_heads=max(1, h // 64), max_position_embeddings=1024,
        tie_word_embeddings=False, attn_implementation=variant.get("attn", VARLEN_SDPA),
    )
    model = Qwen2ForCausalLM(config).train()
    g = torch.Generator().manual_seed(1)
    B, P, R = spec["rows"], spec["prompt"][1], spec["response"][1]
    ids = torch.randint(0, spec["vocab"], (B, P + R), generator=g)
    mask = torch.zeros(B, P + R, dtype=torch.long)
    for b in range(B):
        p = int(torch.randint(spec["prompt"][0], P + 1, (1,), generator=g))
        r = int(torch.randint(spec["response"][0], R + 1, (1,), generator=g))
        mask[b, P - p : P + r] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    micro = [list(range(s, min(s + spec["micro"], B))) for s in range(0, B, spec["micro"])]

    def loss_of(rows: list[int]) -> torch.Tensor:
        i, m, ps = ids[rows], mask[rows], pos[rows]
        rm = m[:, P:].float()
        if variant.get("bare"):
            logits = model(input_ids=i, attention_mask=m, position_ids=ps, use_cache=False).logits[:, P - 1 : -1]
            logsm = torch.log_softmax(logits.float(), -1)
            logp = logsm.gather(-1, i[:, P:, None]).squeeze(-1)
            ent = -(logsm.exp() * logsm).sum(-1)
        else:
            logp, ent = forward_logprobs(
                model, i, m, ps, response_length=R, temperature=1.0, compute_entropy=True,
                remove_padding=variant["remove_padding"], logits_chunk_size=variant["chunk"],
                fused=variant.get("fused", False),
            )
        return -((logp + 0.01 * ent) * rm).sum()

    baseline_mb = _rss_mb()
    times = []
    for rep in range(repeats + 1):  # the first pass warms up allocators and kernels
        model.zero_grad(set_to_none=True)
        t = time.perf_counter()
        for rows in micro:
            loss_of(rows).backward()
        if rep:
            times.append(time.perf_counter() - t)
    real = int(mask.sum())
    if variant.get("bare") or not variant["remove_padding"]:
        computed = sum(len(rows) * (P + R) for rows in micro)  # bare: the full padded width
        if not variant.get("bare"):  # grpo_dist's padded path trims all-padding columns per micro-batch
            computed = 0
            for rows in micro:
                any_col = mask[rows].bool().any(0)
                cols = any_col.nonzero()
                computed += len(rows) * int(cols[-1] - cols[0] + 1)
    else:
        computed = real
    return {
        "seconds": min(times),
        "tokens_computed": computed,
        "tokens_real": real,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_above_model_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - baseline_mb,
    }


def _rss_mb() -> float:
    """Resident memory of this process now (MB)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller workloads, one repetition")
    ap.add_argument("--workloads", nargs="*", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        job = json.loads(args.child)
        print(json.dumps(run_variant(job["spec"], job["variant"], job["repeats"])))
        return 0
    specs = QUICK if args.quick else WORKLOADS
    repeats = 1 if args.quick else 3
    print(f"| workload | variant | forward+backward s (best of {repeats}) | vs bare torch | saving vs grpo_dist padded "
          "| tokens computed | tokens that count | peak RSS MB | peak above model MB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.workloads:
        base = padded = None
        for vname, variant in VARIANTS.items():
            job = json.dumps({"spec": specs[name], "variant": variant, "repeats": repeats})
            out = subprocess.run([sys.executable, __file__, "--child", job], capture_output=True, text=True)
            if out.returncode != 0:
                print(f"| {name} | {vname} | failed: {out.stderr.strip().splitlines()[-1:]} | | | | | | |")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            base = r["seconds"] if base is None else base
            if vname == "grpo_dist padded":
                padded = r
            saving = "" if padded is None else f"{100 * (1 - r['seconds'] / padded['seconds']):.0f} %"
            print(f"| {name} | {vname} | {r['seconds']:.3f} | {base / r['seconds']:.2f}x | {saving} | "
                  f"{r['tokens_computed']} | {r['tokens_real']} | {r['peak_rss_mb']:.0f} | "
                  f"{r['peak_above_model_mb']:.0f} |", flush=True)
        if padded is not None:
            print(f"| {name} | padding fraction of the padded path: "
                  f"{100 * (1 - padded['tokens_real'] / padded['tokens_computed']):.0f} % | | | | | | | |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
