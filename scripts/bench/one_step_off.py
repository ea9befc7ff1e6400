"""Synchronous colocated training against one-step-off-policy (``actor_rollout_ref.hybrid_engine=false``) and
fully asynchronous training (``async_training.*``) on this machine, side by side.

    python scripts/bench/one_step_off.py [--steps 10] [--repeats 1] [--seeds] [--test-freq N] [--modes ...] [--out DIR]
                                         [-- extra overrides ...]

Every mode runs ``python -m grpo_dist.main`` with the same task, model, data, seeds, batch and group (the
default job's unless overrides say otherwise), on the same cores: colocated, one training rank whose
processes (actor + reference, and the rollout engine) take turns on the machine's cores; one-step-off, one
training rank and one rollout rank of their own (each with its share of the cores) working at once, the actor
recomputing the old log-probs (``one-step-off``) or taking the engines' (``one-step-off-bypass``, rollout
correction's bypass mode, as verl's one-step-off config sets); fully
asynchronous, the same two ranks, chunks of the step's 32 prompts generated up to 3 ahead of the trainer and
weights synced every 2 steps, a sync waiting for the chunks in flight (``fully-async``) or interrupting them
(``fully-async-partial``, partial rollouts). Each run logs its metrics; the table reads them.

``--workload reverse-long-tail`` is the reverse task with string lengths of a long tail (3 digits plus a
geometric number more, at most 32: mean about 7) and a base model warmed up on them (both built by the
script): a learnable task whose longest responses set a step's generation time.

``--workload long-tail`` makes generation the heavy side: a random model of the embedded task's size and
vocabulary (built by the script; it rarely says EOS, so response lengths have a geometric tail) writing up to
192 tokens on the default job's batch. Its held-out accuracy is that of a random model (about 0): the workload
measures time, not learning.

``--workload gpu`` is the GPU benchmark's model (docs/benchmarks.md: a random Qwen2 of 1024 x 16 layers, ~243 M
parameters) on ``trainer.device=cuda`` with the Hugging Face engine, its responses made long-tailed (each token EOS
with probability 1/48, at most 256 tokens: the longest of a step's 256 responses usually reaches the cap), the
default job's batch, group and mini-batches, bf16 compute over float32 master weights (the CUDA default). It
measures time only: no validation. ``--one-gpu`` runs every mode on one GPU: the runs attach to a Ray head that
this script starts with two GPUs in its accounting and leaves every worker the physical GPU
(``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES``), so the rollout's pool of one GPU and the trainer's are the
same device, sharing it in time; the weights then cross by CUDA IPC as for an engine on the actor's GPU.

- step time: median ``timing_s/step`` over the steps after the first (the first step of one-step-off
  generates its own batch);
- samples/s: responses per step / step time;
- trainer idle share: the part of the step the trainer waited for generation (``timing_s/gen`` colocated,
  ``timing_s/wait_prev_gen`` in the other modes) / step time;
- rollout idle share: 1 - the engines' busy time (``timing_s/gen/worker``) / step time;
- held-out accuracy before and after (greedy, ``val-core/...``), after the same number of samples;
- wall time of the run (start-up, validation and checkpoint included).

``--seeds`` gives every repeat its own seeds (repeat r: ``data.seed=42+r``, the prompts' order, and
``actor_rollout_ref.rollout.seed=r``, the sampling), so the repeats measure the spread between seeds, and a second
table shows, per mode, the held-out accuracy at every validation (``--test-freq``) as the mean over the seeds
and its range: what training on stale samples costs per sample, against the spread of the synchronous runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODES = {
    "colocated": ["actor_rollout_ref.hybrid_engine=true", "trainer.n_gpus_per_node=1"],
    "one-step-off": ["actor_rollout_ref.hybrid_engine=false", "trainer.n_gpus_per_node=1", "rollout.nnodes=1",
                     "rollout.n_gpus_per_node=1"],
    # chunks of 2 x 16 prompts (the default job's step), weights synced every 2 steps, at most
    # floor(1.5 x 2) = 3 chunks ahead of the trainer
    "fully-async": ["actor_rollout_ref.hybrid_engine=false", "trainer.n_gpus_per_node=1", "rollout.nnodes=1",
                    "rollout.n_gpus_per_node=1", "async_training.require_batches=2",
                    "async_training.staleness_threshold=0.5", "async_training.trigger_parameter_sync_step=2",
                    "async_training.partial_rollout=false"],
}
# the same, with partial rollouts (verl's default): a sync interrupts the responses in flight instead of waiting
MODES["fully-async-partial"] = [*MODES["fully-async"][:-1], "async_training.partial_rollout=true"]
# one-step-off with the engines' sampling log-probs as the old log-probs (what verl's one-step-off config sets):
# PPO's ratio is then against the policy that sampled, not the one that trains
MODES["one-step-off-bypass"] = [*MODES["one-step-off"], "algorithm.rollout_correction.bypass_mode=true"]


def run(mode: str, steps: int, out: Path, extra: list[str], test_freq: int | None = None,
        validate: bool = True) -> tuple[dict[int, dict], float]:
    val = [f"trainer.test_freq={test_freq or steps}"] if validate else ["trainer.test_freq=-1",
                                                                         "trainer.val_before_train=false"]
    args = MODES[mode] + [f"trainer.total_training_steps={steps}", *val, "trainer.save_freq=-1",
                          "trainer.progress_bar=false", "trainer.logger=[console,file]",
                          f"trainer.default_local_dir={out}", *extra]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "grpo_dist.main", *args], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{mode} run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows}, wall


def responses_per_step(out: Path) -> int:
    """``data.train_batch_size x rollout.n`` of the run, from the configuration it saved."""
    import yaml

    cfg = yaml.safe_load((out / "config.yaml").read_text())
    return int(cfg["data"]["train_batch_size"]) * int(cfg["actor_rollout_ref"]["rollout"]["n"])


def summarize(m: dict[int, dict], wall: float, responses: int) -> dict[str, float]:
    steps = sorted(s for s in m if s > 1)
    first = m[min(m)]
    val = next((k for k in first if k.startswith("val-core/") and k.endswith("/acc/mean@1")), None)
    step_s = statistics.median(m[s]["timing_s/step"] for s in steps)
    wait = statistics.median(m[s].get("timing_s/wait_prev_gen", m[s].get("timing_s/gen", 0.0)) for s in steps)
    busy = statistics.median(m[s]["timing_s/gen/worker"] for s in steps)
    last = max(m)
    return {"step_s": step_s, "samples_per_s": responses / step_s,
            "trainer_idle": wait / step_s, "rollout_idle": max(0.0, 1 - busy / step_s),
            "acc_before": first.get(val, float("nan")), "acc_after": m[last].get(val, float("nan")), "wall_s": wall,
            "acc": {s: m[s][val] for s in sorted(m) if val in m[s]},
            "phases": {k: statistics.median(m[s][f"timing_s/{k}"] for s in steps if f"timing_s/{k}" in m[s])
                       for k in PHASES if any(f"timing_s/{k}" in m[s] for s in steps)},
            "response_tokens": statistics.median(m[s].get("response_length/mean", float("nan")) for s in steps)}


#: The phases the second table shows: median seconds over the steps after the first that log them (the last
#: step of one-step-off starts no next batch, so it syncs no weights).
PHASES = ("gen", "gen/worker", "wait_prev_gen", "old_log_prob", "ref", "update_actor", "update_weights")


def learning_table(rows: list[tuple[str, int, dict]]) -> list[str]:
    """Per mode, the held-out accuracy at every validated step: mean over the runs [min, max]."""
    modes = list(dict.fromkeys(mode for mode, _, _ in rows))
    steps = sorted(rows[0][2]["acc"])
    lines = ["| mode | runs | " + " | ".join(f"acc @ step {s}" for s in steps) + " |",
             "| --- | ---: | " + " | ".join("---:" for _ in steps) + " |"]
    for mode in modes:
        runs = [r["acc"] for m, _, r in rows if m == mode]
        cells = []
        for s in steps:
            vals = [acc[s] for acc in runs if s in acc]
            cells.append(f"{statistics.mean(vals):.3f} [{min(vals):.3f}, {max(vals):.3f}]")
        lines.append(f"| {mode} | {len(runs)} | " + " | ".join(cells) + " |")
    return lines


def long_tail_overrides(model_dir: Path) -> list[str]:
    """The long-tail workload's overrides: a random model (the embedded task's architecture and tokenizer, seed 0)
    built into ``model_dir``, and 192-token responses."""
    from grpo_dist.tasks.reverse import VOCAB
    from grpo_dist.utils.tiny_model import build_tiny_model

    if not (model_dir / "config.json").exists():
        build_tiny_model(model_dir, vocab=VOCAB, hidden_size=64, num_layers=2, num_heads=1, num_kv_heads=1, head_dim=64,
                         intermediate_size=128, max_position_embeddings=256, seed=0)
    return [f"actor_rollout_ref.model.path={model_dir}", "data.max_response_length=192"]


def reverse_long_tail_overrides(folder: Path) -> list[str]:
    """The learnable long-tail workload's overrides: the reverse task with string lengths of a long tail
    (:func:`grpo_dist.tasks.reverse.long_tail_length`) and a base model warmed up on them, built into ``folder``."""
    from grpo_dist.tasks import reverse

    model = folder / "model"
    if not (model / "grpo_dist_task.json").exists():
        reverse.build_model(model, lengths=reverse.long_tail_length)
    data = reverse.write_data(folder / "data", lengths=reverse.long_tail_length)
    return [f"actor_rollout_ref.model.path={model}", f"data.train_files={data['train']}",
            f"data.val_files={data['test']}", "data.max_response_length=40", "data.max_prompt_length=64"]


def gpu_overrides(folder: Path) -> list[str]:
    """The GPU workload's overrides (see above): the GPU benchmark's model shape, EOS with probability 1/48 per
    token, built into ``folder``."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_common import GPU_SHAPE, build_bench_model

    model = build_bench_model(folder / "gpu_model", GPU_SHAPE, mean_response=48)
    return [f"actor_rollout_ref.model.path={model}", "trainer.device=cuda", "actor_rollout_ref.rollout.name=hf",
            "data.max_response_length=256", "data.max_prompt_length=64", "actor_rollout_ref.rollout.top_k=-1"]


def one_gpu_cluster(folder: Path):
    """A Ray head with two GPUs in its accounting whose workers all see the machine's one GPU (see above): the test
    suite's cluster (tests/shared_ray.py), so a killed benchmark leaves no cluster behind either."""
    sys.path.insert(0, str(ROOT))
    from tests.shared_ray import SharedCluster

    folder.mkdir(parents=True, exist_ok=True)
    return SharedCluster(folder, num_gpus=2, env={"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=1, help="runs per mode, alternating; the table shows each")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    ap.add_argument("--one-gpu", action="store_true", help="every mode on the machine's one GPU (see above)")
    ap.add_argument("--workload", choices=["default", "long-tail", "reverse-long-tail", "gpu"], default="default",
                    help="the default job, or one with long-tailed response lengths (see above)")
    ap.add_argument("--seeds", action="store_true", help="repeat r with data.seed=42+r and rollout.seed=r (see above)")
    ap.add_argument("--test-freq", type=int, default=None, help="validate every N steps (default: at the end)")
    ap.add_argument("extra", nargs="*", help="more overrides for both modes")
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="one_step_off_bench_"))
    extra = list(a.extra)
    if a.workload == "long-tail":
        extra = long_tail_overrides(out / "long_tail_model") + extra
    elif a.workload == "reverse-long-tail":
        extra = reverse_long_tail_overrides(out / "reverse_long_tail") + extra
    elif a.workload == "gpu":
        extra = gpu_overrides(out / "gpu_workload") + extra
    validate = a.workload != "gpu"
    cluster = one_gpu_cluster(out) if a.one_gpu else None
    if cluster:
        os.environ.update(cluster.client_env)
    rows = []
    try:
        for r in range(a.repeats):
            for mode in a.modes:  # alternating, so a change in the machine's load hits both
                seeds = [f"data.seed={42 + r}", f"actor_rollout_ref.rollout.seed={r}"] if a.seeds else []
                m, wall = run(mode, a.steps, out / f"{mode}-{r}", extra + seeds, a.test_freq, validate)
                rows.append((mode, r, summarize(m, wall, responses_per_step(out / f"{mode}-{r}"))))
    finally:
        if cluster:
            cluster.stop()
    print(f"| mode | run | step time (s) | samples/s | trainer idle | rollout idle | held-out acc before -> after | wall (s) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for mode, r, s in rows:
        print(f"| {mode} | {r} | {s['step_s']:.2f} | {s['samples_per_s']:.1f} | {s['trainer_idle']:.0%} | "
              f"{s['rollout_idle']:.0%} | {s['acc_before']:.3f} -> {s['acc_after']:.3f} | {s['wall_s']:.0f} |")
    print()
    print("| mode | run | mean response (tokens) | " + " | ".join(PHASES) + " |")
    print("| --- | ---: | ---: | " + " | ".join("---:" for _ in PHASES) + " |")
    for mode, r, s in rows:
        print(f"| {mode} | {r} | {s['response_tokens']:.0f} | "
              + " | ".join(f"{s['phases'][k]:.2f}" if k in s["phases"] else "" for k in PHASES) + " |")
    if a.seeds or a.test_freq:
        print()
        print("\n".join(learning_table(rows)))


if __name__ == "__main__":
    main()
