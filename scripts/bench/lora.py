"""Full fine-tuning against LoRA on a real model: what an update, the reference, the weight sync and the
memory cost, and what held-out accuracy each reaches.

Every configuration runs the SmolLM2-135M-Instruct recipe (conf/recipes/larger_smollm2_135m_cpu.yaml: the same
data, group size, batch and seed) in float32 through the normal entry point, ``python -m grpo_dist.main``, in
a fresh folder, with the KL loss on (so the reference runs: the base model's own copy under full
fine-tuning, the policy with its adapters off under LoRA) and validation before the first step and after
the last. Configurations:

- ``full``: full fine-tuning at ``--lr-full`` (default the recipe's 1e-5);
- ``lora16``, ``lora64``: peft LoRA of rank 16 / 64 on all linear layers (every one but the output layer),
  alpha ``--alpha``, at ``--lr-lora`` (default 1e-4: ten times the full learning rate, the rule of thumb of
  "LoRA Without Regret", Thinking Machines 2025, which TRL's LoRA guide follows); ``--merge`` picks the
  weight sync (``false``: the adapters alone into vLLM's LoRA slots; ``true``: the merged weights).

From each run's ``metrics.jsonl`` the table takes, per step (the median over the steps after the first, or
the only step): ``timing_s/update_actor``, ``timing_s/ref``, ``timing_s/update_weights`` and
``perf/weight_sync_bytes``; the peak of ``perf/max_memory_gb/<role>`` over the run (each rank's process
memory, all the models it holds); and ``val-core/<source>/acc/mean@1`` before the first step and after
the last.

    PYTHONPATH=$PWD .venv/bin/python scripts/bench/lora.py                          # 30 steps, all three
    PYTHONPATH=$PWD .venv/bin/python scripts/bench/lora.py --steps 1 --configs lora16 --val-samples 8  # smoke
    PYTHONPATH=$PWD .venv/bin/python scripts/bench/lora.py --render /tmp/lora_bench/results.json

The table (markdown) is printed and written to ``OUT/report.md``, the raw rows to ``OUT/results.json``.
See docs/lora.md for the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

RECIPE = "recipes/larger_smollm2_135m_cpu"
CONFIGS = {"full": 0, "lora16": 16, "lora64": 64}
"""Configuration name -> LoRA rank (0: full fine-tuning)."""

STEP_KEYS = ("timing_s/step", "timing_s/gen", "timing_s/update_actor", "timing_s/ref", "timing_s/update_weights",
             "perf/weight_sync_bytes")


def overrides(rank: int, args: argparse.Namespace, out: Path) -> list[str]:
    """The command line of one configuration: the recipe, float32, the KL loss on, validation before and
    after, ``rank`` > 0 for LoRA on all linear layers."""
    cmd = [
        "--config-name", RECIPE,
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.actor.fsdp_config.dtype=float32",
        "actor_rollout_ref.actor.fsdp_config.model_dtype=float32",
        "actor_rollout_ref.actor.use_kl_loss=true",
        f"actor_rollout_ref.actor.optim.lr={args.lr_lora if rank else args.lr_full}",
        f"trainer.total_training_steps={args.steps}",
        "trainer.val_before_train=true",
        f"trainer.test_freq={args.steps}",
        "trainer.resume_mode=disable",
        "trainer.logger=[console,file]",
        "trainer.progress_bar=false",
        f"trainer.default_local_dir={out}",
        f"hydra.run.dir={out}",
    ]
    if args.val_samples > 0:
        cmd.append(f"data.val_max_samples={args.val_samples}")
    if rank:
        cmd += [f"actor_rollout_ref.model.lora_rank={rank}", f"actor_rollout_ref.model.lora_alpha={args.alpha}",
                "actor_rollout_ref.model.target_modules=all-linear",
                f"actor_rollout_ref.model.lora.merge={args.merge}"]
    return cmd + list(args.extra)


def read_metrics(out: Path) -> list[dict]:
    """The rows of a run's ``metrics.jsonl`` (one per training step, validation metrics merged in)."""
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarise(rows: list[dict]) -> dict:
    """One run's cells: per-step medians of :data:`STEP_KEYS` (steps after the first when there are more
    than one: the first includes one-off work), the peak memory per role, accuracy before and after."""
    steps = [r for r in rows if "timing_s/step" in r]
    timed = steps[1:] if len(steps) > 1 else steps
    out: dict = {"steps": len(steps)}
    for key in STEP_KEYS:
        values = [r[key] for r in timed if isinstance(r.get(key), (int, float))]
        out[key] = statistics.median(values) if values else None
    memory: dict[str, float] = {}
    for r in rows:
        for k, v in r.items():
            if k.startswith("perf/max_memory_gb/") and isinstance(v, (int, float)):
                role = k.rsplit("/", 1)[1]
                memory[role] = max(memory.get(role, 0.0), float(v))
    out["max_memory_gb"] = memory
    val = [r for r in rows if any(k.startswith("val-core/") for k in r)]
    acc = [{k: v for k, v in r.items() if k.startswith("val-core/") and "/acc/" in k} for r in val]
    out["acc_before"] = _mean(acc[0]) if acc else None
    out["acc_after"] = _mean(acc[-1]) if len(acc) > 1 else None
    return out


def _mean(values: dict) -> float | None:
    return sum(values.values()) / len(values) if values else None


def run_one(name: str, args: argparse.Namespace, out_root: Path) -> dict:
    """Run configuration ``name`` in ``out_root/name``; its cells, command and wall time."""
    out = out_root / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cmd = [sys.executable, "-m", "grpo_dist.main", *overrides(CONFIGS[name], args, out)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONUNBUFFERED="1", RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)  # a fresh local Ray instance for every run
    t0 = time.perf_counter()
    with open(out / "stdout.txt", "w") as log:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not (out / "metrics.jsonl").exists():
        tail = "\n".join((out / "stdout.txt").read_text(errors="replace").splitlines()[-30:])
        raise SystemExit(f"{name}: exit {proc.returncode}: {shlex.join(cmd)}\n--- {out / 'stdout.txt'} (tail) ---\n{tail}")
    for ckpt in out.glob("global_step_*"):  # the recipe's final checkpoint: not measured here
        shutil.rmtree(ckpt, ignore_errors=True)
    return {"config": name, "rank": CONFIGS[name], "command": shlex.join(cmd), "wall_s": wall,
            **summarise(read_metrics(out))}


def _cell(value: float | None, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def table(results: list[dict]) -> str:
    """The markdown table of the runs (one row per configuration)."""
    lines = ["| config | lr | steps | step (s) | gen (s) | update_actor (s) | ref (s) | update_weights (s) | sync (MB) | "
             "peak memory per rank (GB) | acc before | acc after |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        sync = r["perf/weight_sync_bytes"]
        memory = ", ".join(f"{role} {gb:.2f}" for role, gb in sorted(r["max_memory_gb"].items()))
        lines.append(
            f"| {r['config']} | {r.get('lr', '')} | {r['steps']} | {_cell(r.get('timing_s/step'), '.2f')} | "
            f"{_cell(r.get('timing_s/gen'), '.2f')} | {_cell(r['timing_s/update_actor'], '.2f')} | "
            f"{_cell(r['timing_s/ref'], '.2f')} | {_cell(r['timing_s/update_weights'], '.2f')} | "
            f"{_cell(None if sync is None else sync / 1e6, '.1f')} | {memory} | "
            f"{_cell(r['acc_before'], '.3f')} | {_cell(r['acc_after'], '.3f')} |")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """The script's flags."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="full,lora16,lora64", help="comma-separated: " + ", ".join(CONFIGS))
    ap.add_argument("--steps", type=int, default=30, help="training steps of each run (the recipe's 30)")
    ap.add_argument("--lr-full", type=float, default=1e-5, help="learning rate of full fine-tuning")
    ap.add_argument("--lr-lora", type=float, default=1e-4, help="learning rate of the LoRA runs")
    ap.add_argument("--alpha", type=int, default=32, help="LoRA alpha (the update is scaled by alpha / rank)")
    ap.add_argument("--merge", choices=("true", "false"), default="false",
                    help="LoRA weight sync: false sends the adapters alone (verl's default), true the merged weights")
    ap.add_argument("--val-samples", type=int, default=-1, help="held-out rows to validate on (-1: all 256)")
    ap.add_argument("--out", default=None, help="folder for the runs (default: a temporary one)")
    ap.add_argument("--render", metavar="RESULTS_JSON", help="print the table of an earlier results.json, running nothing")
    ap.add_argument("extra", nargs="*", help="more key=value overrides for every run")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.render:
        print(table(json.loads(Path(args.render).read_text())))
        return 0
    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in names if c not in CONFIGS]
    if unknown or not names:
        ap.error(f"unknown or no configuration(s) {unknown}; valid: {', '.join(CONFIGS)}")
    if args.steps < 1:
        ap.error(f"--steps must be >= 1, got {args.steps}")
    out = Path(args.out or tempfile.mkdtemp(prefix="lora_bench_"))
    results = []
    for name in names:
        r = run_one(name, args, out)
        r["lr"] = args.lr_lora if CONFIGS[name] else args.lr_full
        r["merge"] = args.merge == "true" if CONFIGS[name] else None
        results.append(r)
        print(f"{name}: {r['wall_s']:.0f} s", flush=True)
    report = table(results)
    print(report)
    (out / "report.md").write_text(report + "\n")
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"\nraw data: {out}/results.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
