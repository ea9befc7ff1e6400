"""The update phase in one process: grpo_dist's FSDPActor against the bare torch loop, on the benchmark's batch.

    python scripts/bench/profile_update.py [--device cuda] [--variant NAME ...] [--profile OUT.txt]

No Ray and no driver: a world-size-1 process group (nccl on CUDA, gloo on CPU), one
``FSDPActor`` built with the settings grpo_dist derives for the workload (bf16 compute on CUDA), fed
the same rows as the bare loop of ``bare_torch.py`` (each step's real prompts, random response tokens of
the workload's response lengths, random advantages, a fixed reference log-prob), packed in both (the
actor with ``use_remove_padding``, as ``python -m grpo_dist.main`` runs; the loop as its ``packed``
variant). It times
``update_policy`` and ``compute_log_prob`` per step and, in the same process, the bare loop. This
separates the actor's own cost from what the multi-process layout adds (run_bench.py measures the
whole step). ``--variant`` switches one setting at a time to find where a gap comes from:

- ``default``: what ``python -m grpo_dist.main`` uses;
- ``sync_every_micro_batch``: FSDP2's gradient reduce-scatter after every micro-batch (the actor
  defers it to the last micro-batch of a mini-batch when it runs on one rank);
- ``no_reshard``: ``reshard_after_forward=False`` (parameters stay gathered between forward and backward);
- ``fused_adamw``: the actor's AdamW with ``fused=True`` (CUDA);
- ``foreach_adamw``: the actor's AdamW with ``foreach=True`` (torch picks the per-tensor loop on CPU);
- ``no_entropy``: the update's forward skips the entropy metric.

``--profile OUT.txt`` writes torch.profiler's operator table of one measured ``update_policy`` per variant.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_common as common  # noqa: E402

VARIANTS = ("default", "sync_every_micro_batch", "no_reshard", "fused_adamw", "foreach_adamw", "no_entropy")


def build_actor(w: dict, variant: str):
    import torch

    from grpo_dist.training.actor import FSDPActor
    from grpo_dist.training.settings import ActorSettings

    cuda = w["device"] == "cuda"
    n = w["batch_size"] * w["n"]
    settings = ActorSettings(
        ppo_mini_batch_size_per_gpu=n, ppo_micro_batch_size_per_gpu=w["micro_batch"], ppo_epochs=1,
        use_kl_loss=True, kl_loss_coef=w["kl_coef"], kl_loss_type="low_var_kl", lr=w["lr"], grad_clip=1.0,
        param_dtype="bfloat16" if common.is_bf16(w) else "float32", reshard_after_forward=variant != "no_reshard",
        total_training_steps=w["steps"], use_remove_padding=True,  # packed, as python -m grpo_dist.main runs
    )
    actor = FSDPActor(w["model_dir"], settings, rank=0, world_size=1, device="cuda" if cuda else "cpu")
    if variant == "sync_every_micro_batch":
        actor.defer_grad_sync = False
    if variant == "fused_adamw" and cuda:
        params = [p for p in actor.model.parameters() if p.requires_grad]
        actor.optimizer = torch.optim.AdamW(params, lr=w["lr"], betas=(0.9, 0.999), weight_decay=0.01, fused=True)
    if variant == "foreach_adamw":
        params = [p for p in actor.model.parameters() if p.requires_grad]
        actor.optimizer = torch.optim.AdamW(params, lr=w["lr"], betas=(0.9, 0.999), weight_decay=0.01, foreach=True)
    return actor


@contextlib.contextmanager
def entropy_off(variant: str):
    """For ``no_entropy``: the update's forward skips the entropy metric (zeros instead), for this variant only."""
    import torch

    import grpo_dist.training.objective as actor_mod

    orig = actor_mod.forward_logprobs

    def no_entropy(*a, **k):
        k["compute_entropy"] = False
        logp, _ = orig(*a, **k)
        return logp, torch.zeros_like(logp)

    if variant == "no_entropy":
        actor_mod.forward_logprobs = no_entropy
    try:
        yield
    finally:
        actor_mod.forward_logprobs = orig


def step_batch(w: dict, k: int, ds, tok, vocab: int, gen):
    import torch

    from bare_torch import _batch

    idx = w["step_prompts"][k]
    ids, mask, pos, R = _batch(w, [ds[i]["prompt_ids"] for i in idx], tok.pad_token_id, vocab, gen, k)
    N = ids.shape[0]
    resp_mask = mask[:, -R:].clone()
    return {
        "input_ids": ids, "attention_mask": mask, "position_ids": pos, "responses": ids[:, -R:].clone(),
        "response_mask": resp_mask, "advantages": torch.randn(N, 1, generator=gen).expand(N, R).clone(),
        "ref_log_prob": -torch.rand(N, R, generator=gen) * 3,
    }


def run_variant(w: dict, variant: str, profile: Path | None) -> dict:
    import torch
    from transformers import AutoConfig

    cuda = w["device"] == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    tok, ds = common.load_prompt_dataset(w)
    vocab = AutoConfig.from_pretrained(w["model_dir"]).vocab_size
    actor = build_actor(w, variant)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for k in range(w["steps"]):
        data = step_batch(w, k, ds, tok, vocab, gen)
        sync()
        t = time.perf_counter()
        actor.compute_log_prob(data, micro_batch_size=w["micro_batch"])
        sync()
        fwd = time.perf_counter() - t
        prof = None
        if profile is not None and k == w["steps"] - 1:
            from torch.profiler import ProfilerActivity, profile as tprofile

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            prof = tprofile(activities=acts)
            prof.__enter__()
        t = time.perf_counter()
        actor.update_policy(data)
        sync()
        upd = time.perf_counter() - t
        if prof is not None:
            prof.__exit__(None, None, None)
            key = "cuda_time_total" if cuda else "cpu_time_total"
            with open(profile, "a") as f:
                f.write(f"\n===== variant {variant}: update_policy {upd:.3f} s\n")
                f.write(prof.key_averages().table(sort_by=key, row_limit=30))
                f.write("\n-- by CPU time --\n")
                f.write(prof.key_averages().table(sort_by="cpu_time_total", row_limit=20))
        rows.append({"step": k + 1, "update_s": upd, "forward_s": fwd, "warmup": k < w["warmup_steps"]})
    del actor
    if cuda:
        torch.cuda.empty_cache()
    return {"steps": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--workload", default=None, help="workload name (default: large on cpu, gpu on cuda)")
    ap.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                    help="compute precision of both loops (auto: bf16 on CUDA, fp32 on the CPU)")
    ap.add_argument("--steps", type=int, default=4, help="steps per variant (the first is warm-up)")
    ap.add_argument("--variant", action="append", choices=VARIANTS, help="variants to run (default: all)")
    ap.add_argument("--profile", default=None, help="append torch.profiler tables to this file")
    ap.add_argument("--out", default="outputs/bench/profile_update")
    args = ap.parse_args(argv)

    import torch

    from bare_torch import run as bare_run
    from grpo_dist.distributed.process_group import free_port, init_process_group

    name = args.workload or ("gpu" if args.device == "cuda" else "large")
    w = next(x for x in common.workloads(False, args.device, "hf", args.precision, names=[name]) if x["name"] == name)
    w.setdefault("bare_variant", "packed")  # the loop grpo_dist's packed forwards are compared with
    w["steps"] = args.steps
    w = common.prepare(w, Path(args.out).resolve())
    if args.device == "cuda":
        torch.cuda.set_device(0)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    init_process_group(backend="nccl" if args.device == "cuda" else "gloo", rank=0, world_size=1,
                       master_addr="127.0.0.1", master_port=free_port())
    profile = Path(args.profile) if args.profile else None
    if profile is not None:
        profile.write_text("")
    results = {"bare": bare_run(w)}
    for v in args.variant or VARIANTS:
        with entropy_off(v):
            results[v] = run_variant(w, v, profile)

    def med(rows, key):
        vals = [r[key] for r in rows if not r["warmup"]]
        return statistics.median(vals) if vals else float("nan")

    bare_upd, bare_fwd = med(results["bare"]["steps"], "update_s"), med(results["bare"]["steps"], "forward_s")
    print(f"workload {name} on {args.device} ({w['precision']}): {w['batch_size'] * w['n']} sequences, micro-batch {w['micro_batch']}")
    print("| program | update (s) | vs bare | no-grad forward (s) | vs bare |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| bare torch loop | {bare_upd:.3f} | 1.00 | {bare_fwd:.3f} | 1.00 |")
    for v in args.variant or VARIANTS:
        u, f = med(results[v]["steps"], "update_s"), med(results[v]["steps"], "forward_s")
        print(f"| FSDPActor, {v} | {u:.3f} | {bare_upd / u:.2f} | {f:.3f} | {bare_fwd / f:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
