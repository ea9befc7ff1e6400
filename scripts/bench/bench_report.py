"""Turn the raw results of the benchmark runs into medians, efficiencies, targets and markdown tables.

Pure functions of plain dicts (no torch, no subprocesses), so they are unit-tested on made-up numbers.

Raw results, per workload, are lists of runs (one per repetition) of four programs:

- ``grpo_dist``: ``{"metrics": [metrics.jsonl rows], "monitor": TreeMonitor.result()}``
- ``trl``: ``{"steps": [{"step", "seconds", "gen_tokens", "gen_s", "nograd_forward_s", "warmup"}], "monitor"}``
- ``vllm``: ``{"plain": [{"step", "seconds", "gen_tokens", "warmup"}], "as_grpo_dist": [...], "monitor"}``
- ``torch``: ``{"steps": [{"step", "update_s", "forward_s", "tokens", "tokens_computed", "warmup"}], "monitor"}``:
  the naive padded loop; ``torch:<variant>`` the bare loop's other variants (``packed``, ``packed_fused``:
  grpo_dist's forward without FSDP or Ray), with ``"also": {"padded": [steps]}`` for what the packed
  process timed padded, alternating with packed on the same batches;
- ``grpo_dist:<variant>``: grpo_dist again with another log-prob computation (the real-vocabulary
  workload: ``plain``, ``fused``; ``grpo_dist`` itself is the default, ``chunked``).

Every number in the tables is the median over the measured (non-warm-up) steps of all repetitions.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import is_bf16, train_flops  # noqa: E402

#: grpo_dist's phases (timing_s/<phase>), in step order.
PHASES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights")
#: Phases done by Ray workers, whose busy time inside the workers is logged as timing_s/<phase>/worker.
WORKER_PHASES = ("gen", "old_log_prob", "ref", "update_actor", "update_weights")
#: The weight sync's parts, timing_s/update_weights/<part>, and their labels in the phase table.
SYNC_PARTS = ("gather", "transfer", "load")
SYNC_LABEL = {
    "gather": "gather: actor ranks gather and pack the weight buckets (in the workers)",
    "transfer": "transfer: ray.put or CUDA IPC handles, and the Ray calls around them",
    "load": "load: rollout engines load the buckets (in the workers)",
}

COMPARE_COLUMNS = ("workload", "program", "wall time / step (s)", "generated tokens / step", "generated tokens/s",
                   "speed-up vs TRL", "foreign load (cores)")
PHASE_COLUMNS = ("phase", "grpo_dist (s)", "worker busy (s)", "share of step", "bare library (s)", "efficiency",
                 "target", "result")
TARGET_COLUMNS = ("target", "measured", "threshold", "result", "gap")

#: (key, label, kind, threshold): kind "min" passes when measured >= threshold, "max" when <=. Measured on
#: the generation-heavy workload in float32 (TARGET_WORKLOAD).
TARGETS = (
    ("speedup_vs_trl", "step throughput vs TRL (generated tokens/s ratio), float32", "min", 1.6),
    ("rollout_efficiency", "rollout vs bare vLLM LLM.generate, same requests (tokens/s ratio)", "min", 0.90),
    ("old_log_prob_efficiency", "old_log_prob vs the bare no-grad forward doing the same work (per token)", "min", 0.90),
    ("ref_efficiency", "ref vs the bare no-grad forward doing the same work (per token)", "min", 0.90),
    ("update_efficiency", "update vs the bare fwd/bwd/AdamW loop doing the same work (per token)", "min", 0.90),
    ("packing_saving_gap", "padding fraction minus the time packing saves (bare loop, padded vs packed)", "max", 0.05),
)
TARGET_WORKLOAD = "gen_heavy"
#: The bare loop's variant that does grpo_dist's default work (packed forwards, chunked log-probs).
SAME_WORK_VARIANT = "packed"
TOKEN_COLUMNS = ("phase", "program", "time (s)", "tokens computed", "tokens that count", "computed / count",
                 "efficiency vs bare (same work)")
REAL_VOCAB_COLUMNS = ("program", "log-probs", "update (s)", "no-grad forward (s)", "peak RSS of the process (GiB)",
                      "tokens computed per update")


def median(xs) -> float | None:
    vals = [float(x) for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


# ------------------------------------------------------------------------------------------------ steps
def grpo_steps(run: dict, warmup_steps: int, responses_per_step: int) -> list[dict]:
    """Per measured step: phase times, workers' busy times, weight-sync parts, generated tokens, wall
    time between metrics lines, overheads.

    The wall time between lines comes from the rows' ``time/unix`` (when the trainer logged them);
    runs without it fall back to when the monitor saw each line appear in metrics.jsonl.
    """
    stamps = {int(r["step"]): r["time/unix"] for r in run["metrics"] if r.get("time/unix") is not None}
    logged = stamps or {int(k): v for k, v in run.get("monitor", {}).get("step_arrivals", {}).items()}
    out = []
    for row in run["metrics"]:
        k = int(row["step"])
        if k <= warmup_steps or row.get("timing_s/step") is None:
            continue
        d: dict[str, Any] = {"step": k, "step_s": row["timing_s/step"]}
        for p in PHASES:
            d[p] = row.get(f"timing_s/{p}")
        d["worker"] = {p: row.get(f"timing_s/{p}/worker") for p in WORKER_PHASES}
        d["sync"] = {part: row.get(f"timing_s/update_weights/{part}") for part in SYNC_PARTS}
        d["gen_tokens"] = row["response_length/mean"] * responses_per_step if "response_length/mean" in row else None
        d["in_step_overhead_s"] = d["step_s"] - sum(d[p] for p in PHASES if d[p] is not None)
        d["wall_s"] = d["between_s"] = None
        if k in logged and k - 1 in logged:
            extra = (row.get("timing_s/save_checkpoint") or 0.0) + (row.get("timing_s/testing") or 0.0)
            d["wall_s"] = logged[k] - logged[k - 1] - extra
            d["between_s"] = d["wall_s"] - d["step_s"]
        d["max_memory_gb_actor"] = row.get("perf/max_memory_gb/actor")
        d["update_tokens_computed"] = row.get("perf/update_tokens_computed")
        d["update_tokens_real"] = row.get("perf/update_tokens_real")
        d["seq_len"] = None
        if "prompt_length/mean" in row and "response_length/mean" in row:
            d["seq_len"] = row["prompt_length/mean"] + row["response_length/mean"]
        out.append(d)
    return out


def measured(rows: list[dict]) -> list[dict]:
    return [r for r in rows if not r.get("warmup")]


# ------------------------------------------------------------------------------------------------ summary
def summarise_workload(w: dict, runs: dict[str, list[dict]]) -> dict:
    """Medians of each program on one workload, the efficiencies and the targets' inputs."""
    s: dict[str, Any] = {"name": w["name"]}
    per_step = w["batch_size"] * w["n"]

    steps = [d for run in runs.get("grpo_dist", []) for d in grpo_steps(run, w["warmup_steps"], per_step)]
    if steps:
        g: dict[str, Any] = {"steps": len(steps), "reps": len(runs["grpo_dist"])}
        g["step_s"] = median(d["step_s"] for d in steps)
        for p in PHASES:
            g[p] = median(d[p] for d in steps)
        g["worker"] = {p: median(d["worker"][p] for d in steps) for p in WORKER_PHASES}
        g["sync"] = {part: median(d["sync"][part] for d in steps) for part in SYNC_PARTS}
        g["in_step_overhead_s"] = median(d["in_step_overhead_s"] for d in steps)
        g["between_s"] = median(d["between_s"] for d in steps)
        g["wall_s"] = median(d["wall_s"] if d["wall_s"] is not None else d["step_s"] for d in steps)
        g["gen_tokens"] = median(d["gen_tokens"] for d in steps)
        g["gen_tok_s"] = median(_ratio(d["gen_tokens"], d["wall_s"] or d["step_s"]) for d in steps)
        g["rollout_tok_s"] = median(_ratio(d["gen_tokens"], d["gen"]) for d in steps)
        g["weight_sync_share"] = median(_ratio(d["update_weights"], d["step_s"]) for d in steps)
        g["driver_overhead_share"] = median(
            _ratio(d["in_step_overhead_s"] + (d["between_s"] or 0.0), d["wall_s"] or d["step_s"]) for d in steps)
        g["shares"] = {p: median(_ratio(d[p], d["step_s"]) for d in steps) for p in PHASES}
        g["max_memory_gb_actor"] = max((d["max_memory_gb_actor"] or 0.0) for d in steps)
        g["update_tokens_computed"] = median(d["update_tokens_computed"] for d in steps)
        g["update_tokens_real"] = median(d["update_tokens_real"] for d in steps)
        g["foreign_load"] = median(r["monitor"].get("foreign_load_cores") for r in runs["grpo_dist"])
        g["peak_rss_gib"] = _max_peaks(runs["grpo_dist"])
        g["peak_tree_rss_gib"] = max(r["monitor"].get("peak_tree_rss_gib", 0.0) for r in runs["grpo_dist"])
        g["cpu_s"] = {k: median(r["monitor"].get("cpu_s", {}).get(k) for r in runs["grpo_dist"])
                      for k in sorted({k for r in runs["grpo_dist"] for k in r["monitor"].get("cpu_s", {})})}
        g["run_s"] = median(r["monitor"].get("wall_s") for r in runs["grpo_dist"])
        seq = median(d["seq_len"] for d in steps)
        if seq is not None and w.get("matmul_params") and w.get("attn_width"):
            # every response of the step at the mean prompt + response length (the attention term, which
            # grows with S^2, is then slightly under-counted when lengths vary)
            g["update_flops"] = train_flops(w["matmul_params"], w["attn_width"], [seq] * per_step)
            g["update_tflops_s"] = _ratio(g["update_flops"], g["update_actor"] and g["update_actor"] * 1e12)
        s["grpo_dist"] = g

    trl_steps = [d for run in runs.get("trl", []) for d in measured(run["steps"])]
    if trl_steps:
        t = {"steps": len(trl_steps), "reps": len(runs["trl"])}
        t["wall_s"] = median(d["seconds"] for d in trl_steps)
        t["gen_tokens"] = median(d["gen_tokens"] for d in trl_steps)
        t["gen_tok_s"] = median(_ratio(d["gen_tokens"], d["seconds"]) for d in trl_steps)
        t["gen_s"] = median(d.get("gen_s") for d in trl_steps)
        t["nograd_forward_s"] = median(d.get("nograd_forward_s") for d in trl_steps)
        for key in ("nograd_computed_tokens", "nograd_real_tokens", "grad_computed_tokens", "grad_real_tokens",
                    "gen_tokens_computed"):
            t[key] = median(d.get(key) for d in trl_steps)
        t["update_s"] = median(d["seconds"] - (d.get("gen_s") or 0.0) - (d.get("nograd_forward_s") or 0.0)
                               for d in trl_steps if d.get("gen_s") is not None)
        t["foreign_load"] = median(r["monitor"].get("foreign_load_cores") for r in runs["trl"])
        t["peak_rss_gib"] = max(r["monitor"].get("peak_tree_rss_gib", 0.0) for r in runs["trl"])
        t["version"] = runs["trl"][0].get("trl_version")
        t["max_memory_gib"] = max((r.get("max_memory_gib") or 0.0 for r in runs["trl"]), default=None)
        s["trl"] = t

    if runs.get("vllm"):
        v: dict[str, Any] = {"reps": len(runs["vllm"])}
        for variant in ("plain", "as_grpo_dist"):
            rows = [d for run in runs["vllm"] for d in measured(run[variant])]
            v[f"{variant}_s"] = median(d["seconds"] for d in rows)
            v[f"{variant}_tok_s"] = median(_ratio(d["gen_tokens"], d["seconds"]) for d in rows)
            v[f"{variant}_tokens"] = median(d["gen_tokens"] for d in rows)
        v["foreign_load"] = median(r["monitor"].get("foreign_load_cores") for r in runs["vllm"])
        v["peak_rss_gib"] = max(r["monitor"].get("peak_tree_rss_gib", 0.0) for r in runs["vllm"])
        s["vllm"] = v

    s["torch_variants"] = {}
    for key, val in runs.items():
        if (key == "torch" or key.startswith("torch:")) and val:
            s["torch_variants"][key.partition(":")[2] or "naive"] = _bare_summary(val)
            # variants a process also timed, alternating with its own on the same batches (bare_torch.py)
            for name in sorted({n for run in val for n in run.get("also", {})}):
                s["torch_variants"].setdefault(name, _bare_summary(
                    [{"steps": run["also"][name], "monitor": {}} for run in val if name in run.get("also", {})]))
    s["grpo_variants"] = {}
    for key, val in runs.items():
        if key.startswith("grpo_dist:") and val:
            s["grpo_variants"][key.partition(":")[2]] = _grpo_variant_summary(w, val)
    if runs.get("torch"):
        rows = [d for run in runs["torch"] for d in measured(run["steps"])]
        s["torch"] = {
            "reps": len(runs["torch"]),
            "update_s": median(d["update_s"] for d in rows),
            "update_tflops_s": median(_ratio(d.get("train_flops"), d["update_s"] * 1e12) for d in rows),
            "max_memory_gib": max((r.get("max_memory_gib") or 0.0 for r in runs["torch"]), default=None),
            "forward_s": median(d["forward_s"] for d in rows),
            "response_tokens": median(d["response_tokens"] for d in rows),
            "foreign_load": median(r["monitor"].get("foreign_load_cores") for r in runs["torch"]),
            "peak_rss_gib": max(r["monitor"].get("peak_tree_rss_gib", 0.0) for r in runs["torch"]),
        }

    g, t, v, b = s.get("grpo_dist"), s.get("trl"), s.get("vllm"), s.get("torch")
    s["speedup_vs_trl"] = _ratio(g["gen_tok_s"], t["gen_tok_s"]) if g and t else None
    s["step_time_ratio_vs_trl"] = _ratio(t["wall_s"], g["wall_s"]) if g and t else None
    # the target: against the bare engine sent grpo_dist's requests (same prompts and seeds, hence the same
    # sampled responses and decoding steps); vLLM's plain unseeded requests sample other lengths
    s["rollout_efficiency"] = _ratio(g["rollout_tok_s"], v["as_grpo_dist_tok_s"]) if g and v else None
    s["rollout_efficiency_plain"] = _ratio(g["rollout_tok_s"], v["plain_tok_s"]) if g and v else None
    # the bare loop doing grpo_dist's work (packed), else the naive loop; per real token when both counted
    same = s["torch_variants"].get(SAME_WORK_VARIANT) or s["torch_variants"].get("naive")
    s["bare_same_work"] = SAME_WORK_VARIANT if SAME_WORK_VARIANT in s["torch_variants"] else ("naive" if same else None)
    g_tok = g.get("update_tokens_real") if g else None
    s["update_efficiency"] = _per_token(same and same["update_s"], same and same["tokens"], g and g["update_actor"], g_tok)
    s["old_log_prob_efficiency"] = _per_token(same and same["forward_s"], same and same["tokens"], g and g["old_log_prob"], g_tok)
    s["ref_efficiency"] = _per_token(same and same["forward_s"], same and same["tokens"], g and g["ref"], g_tok)
    naive = s["torch_variants"].get("naive")
    s["update_speedup_vs_naive_loop"] = _per_token(naive and naive["update_s"], naive and naive["tokens"],
                                                   g and g["update_actor"], g_tok)
    pad, packed = s["torch_variants"].get("padded"), s["torch_variants"].get("packed")
    s["padding_fraction"] = s["packing_saving"] = s["packing_saving_gap"] = None
    if pad and packed and pad.get("tokens_computed"):
        s["padding_fraction"] = 1.0 - pad["tokens"] / pad["tokens_computed"]
        s["packing_saving"] = 1.0 - packed["update_s"] / pad["update_s"]
        s["packing_saving_forward"] = 1.0 - packed["forward_s"] / pad["forward_s"]
        s["packing_saving_gap"] = s["padding_fraction"] - s["packing_saving"]
    peak = w.get("gpu_peak_flops")
    s["device"] = w.get("device", "cpu")
    s["rollout_baseline"] = "HF generate" if w.get("rollout") == "hf" else "LLM.generate"
    s["update_mfu"] = _ratio(g.get("update_tflops_s"), peak / 1e12) if g and peak else None
    s["bare_update_mfu"] = _ratio(b.get("update_tflops_s"), peak / 1e12) if b and peak else None
    s["weight_sync_share"] = g["weight_sync_share"] if g else None
    s["driver_overhead_share"] = g["driver_overhead_share"] if g else None
    return s


def _per_token(bare_s, bare_tokens, g_s, g_tokens) -> float | None:
    """Efficiency ``bare time / grpo_dist time``, per real token when both token counts are known (equal
    when the bare loop trained on grpo_dist's sampled lengths; otherwise each sampled its own)."""
    if not bare_s or not g_s:
        return None
    if bare_tokens and g_tokens:
        return (bare_s / bare_tokens) / (g_s / g_tokens)
    return bare_s / g_s


def _bare_summary(runs: list[dict]) -> dict:
    rows = [d for run in runs for d in measured(run["steps"])]
    return {
        "update_s": median(d["update_s"] for d in rows),
        "forward_s": median(d["forward_s"] for d in rows),
        "tokens": median(d.get("tokens") for d in rows),
        "tokens_computed": median(d.get("tokens_computed") for d in rows),
        "response_tokens": median(d.get("response_tokens") for d in rows),
        "peak_rss_gib": max(r["monitor"].get("peak_tree_rss_gib", 0.0) for r in runs) or None,
    }


def _grpo_variant_summary(w: dict, runs: list[dict]) -> dict:
    steps = [d for run in runs for d in grpo_steps(run, w["warmup_steps"], w["batch_size"] * w["n"])]
    return {
        "update_actor": median(d["update_actor"] for d in steps),
        "ref": median(d["ref"] for d in steps),
        "step_s": median(d["step_s"] for d in steps),
        "update_tokens_computed": median(d.get("update_tokens_computed") for d in steps),
        "max_memory_gb_actor": max((d["max_memory_gb_actor"] or 0.0) for d in steps) if steps else None,
        "actor_peak_rss_gib": max(r["monitor"].get("peak_rss_gib", {}).get("ModelWorker", 0.0) for r in runs),
    }


def _max_peaks(runs: list[dict]) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in runs:
        for k, v in r["monitor"].get("peak_rss_gib", {}).items():
            out[k] = max(out.get(k, 0.0), v)
    return out


def evaluate_targets(s: dict) -> list[dict]:
    """One row per target: measured value, pass/fail (None when not measured) and the gap."""
    rows = []
    for key, label, kind, threshold in TARGETS:
        m = s.get(key)
        if m is None:
            rows.append({"key": key, "label": label, "kind": kind, "threshold": threshold, "measured": None,
                         "passed": None, "gap": "not measured"})
            continue
        passed = m >= threshold if kind == "min" else m <= threshold
        if passed:
            gap = ""
        elif kind == "min":
            if m <= 0:
                gap = "no throughput"
            elif threshold / m >= 1.5:
                gap = f"{threshold / m:.2f}x short"
            else:
                gap = f"{100 * (1 - m / threshold):.1f} % below"
        else:
            gap = f"{(m - threshold) * 100:.1f} pp over"
        rows.append({"key": key, "label": label, "kind": kind, "threshold": threshold, "measured": m,
                     "passed": passed, "gap": gap})
    return rows


def trl_breakdown(s: dict) -> str:
    """One sentence: where TRL's step goes, and the best speed-up grpo_dist could reach if every phase
    but its update were free (the update is the same torch work in both)."""
    g, t = s.get("grpo_dist"), s.get("trl")
    if not t or t.get("gen_s") is None:
        return ""
    rest = t["wall_s"] - t["gen_s"] - (t.get("nograd_forward_s") or 0.0)
    text = (f"{s['name']}: TRL's step = generate {t['gen_s']:.3f} s ({100 * t['gen_s'] / t['wall_s']:.0f} %) + "
            f"no-grad forwards {t.get('nograd_forward_s') or 0.0:.3f} s + update and the rest {rest:.3f} s.")
    if g and g.get("update_actor"):
        text += (f" Speed-up bound if everything but grpo_dist's update_actor took no time: "
                 f"{t['wall_s'] / g['update_actor']:.2f}x.")
    return text


def dominant_phases(s: dict, top: int = 3) -> list[tuple[str, float]]:
    g = s.get("grpo_dist")
    if not g:
        return []
    shares = [(p, v) for p, v in g["shares"].items() if v is not None]
    return sorted(shares, key=lambda x: -x[1])[:top]


# ------------------------------------------------------------------------------------------------ markdown
def _f(x: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def table(columns, rows) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(" --- " for _ in columns) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def compare_table(summaries: list[dict]) -> str:
    rows = []
    for s in summaries:
        g, t = s.get("grpo_dist"), s.get("trl")
        if g:
            rows.append([s["name"], "grpo_dist", _f(g["wall_s"]), _f(g["gen_tokens"], "{:.0f}"),
                         _f(g["gen_tok_s"], "{:.1f}"), _f(s["speedup_vs_trl"], "{:.2f}x"), _f(g["foreign_load"], "{:.2f}")])
        if t:
            rows.append([s["name"], f"TRL {t.get('version') or ''} GRPOTrainer".replace("  ", " "), _f(t["wall_s"]),
                         _f(t["gen_tokens"], "{:.0f}"), _f(t["gen_tok_s"], "{:.1f}"), "1.00x", _f(t["foreign_load"], "{:.2f}")])
        elif g:
            rows.append([s["name"], "TRL GRPOTrainer", "skipped (trl not installed)", "-", "-", "-", "-"])
    return table(COMPARE_COLUMNS, rows)


def phase_table(s: dict, with_targets: bool) -> str:
    g, v = s.get("grpo_dist"), s.get("vllm")
    b = (s.get("torch_variants") or {}).get(s.get("bare_same_work") or "naive") or s.get("torch")
    if not g:
        return "(grpo_dist did not run)"
    tgt = {r["key"]: r for r in evaluate_targets(s)} if with_targets else {}

    def res(key: str) -> tuple[str, str]:
        if not with_targets or key not in tgt:
            return "", ""
        r = tgt[key]
        sign = ">=" if r["kind"] == "min" else "<="
        thr = f"{sign} {r['threshold']:.2f}" if r["kind"] == "min" else f"{sign} {r['threshold'] * 100:.0f} %"
        verdict = "n/a" if r["passed"] is None else ("PASS" if r["passed"] else f"FAIL ({r['gap']})")
        return thr, verdict

    bare_gen = None
    if v and v.get("plain_tok_s") and g.get("gen_tokens"):
        bare_gen = g["gen_tokens"] / v["plain_tok_s"]  # bare vLLM time for the same number of tokens
    bare_gen_req = None
    if v and v.get("as_grpo_dist_tok_s") and g.get("gen_tokens"):
        bare_gen_req = g["gen_tokens"] / v["as_grpo_dist_tok_s"]
    sh, wk, sync = g["shares"], g["worker"], g["sync"]
    rows = [
        [f"rollout (timing_s/gen) vs {s.get('rollout_baseline', 'LLM.generate')} (same prompts and seeds)",
         _f(g["gen"]), _f(wk["gen"]), _pct(sh["gen"]), _f(bare_gen_req), _f(s["rollout_efficiency"]),
         *res("rollout_efficiency")],
        ["  same, bare with vLLM's plain requests (unseeded, detokenised)", "", "", "", _f(bare_gen),
         _f(s["rollout_efficiency_plain"]), "", ""],
        ["reward", _f(g["reward"]), "", _pct(sh["reward"]), "", "", "", ""],
        ["old_log_prob vs no-grad forward", _f(g["old_log_prob"]), _f(wk["old_log_prob"]), _pct(sh["old_log_prob"]),
         _f(b and b["forward_s"]), _f(s["old_log_prob_efficiency"]),
         *(res("old_log_prob_efficiency") if g["old_log_prob"] is not None else ("", "skipped (on-policy)"))],
        ["ref vs no-grad forward", _f(g["ref"]), _f(wk["ref"]), _pct(sh["ref"]), _f(b and b["forward_s"]),
         _f(s["ref_efficiency"]), *res("ref_efficiency")],
        ["adv", _f(g["adv"]), "", _pct(sh["adv"]), "", "", "", ""],
        ["update_actor vs torch fwd/bwd/AdamW loop", _f(g["update_actor"]), _f(wk["update_actor"]),
         _pct(sh["update_actor"]), _f(b and b["update_s"]), _f(s["update_efficiency"]), *res("update_efficiency")],
        ["weight sync (update_weights)", _f(g["update_weights"]), _f(wk["update_weights"]), _pct(sh["update_weights"]),
         "", "", *res("weight_sync_share")],
        *[[f"  {SYNC_LABEL[part]}", _f(sync[part]), "", _pct(_ratio(sync[part], g["step_s"])), "", "", "", ""]
          for part in SYNC_PARTS],
        ["driver overhead inside the step (step - sum of phases)", _f(g["in_step_overhead_s"]), "",
         _pct(_ratio(g["in_step_overhead_s"], g["step_s"])), "", "", "", ""],
        ["driver overhead between steps (metrics, logging, next batch)", _f(g["between_s"]), "",
         _pct(_ratio(g["between_s"], g["wall_s"])), "", "", "", ""],
        ["driver overhead, total", _f(_sum(g["in_step_overhead_s"], g["between_s"])), "",
         _pct(s["driver_overhead_share"]), "", "", *res("driver_overhead_share")],
        ["step (timing_s/step)", _f(g["step_s"]), "", "100 %", "", "", "", ""],
    ]
    return table(PHASE_COLUMNS, rows)


def token_table(s: dict) -> str:
    """Per phase and program: time, tokens computed vs tokens that count, and the efficiency against the
    bare library doing the same work (grpo_dist's rows only)."""
    g, t, v = s.get("grpo_dist") or {}, s.get("trl") or {}, s.get("vllm") or {}
    bares = s.get("torch_variants") or {}

    def ratio_cell(computed, real):
        return _f(_ratio(computed, real), "{:.2f}")

    def tok(x):
        return _f(x, "{:.0f}")

    rows = []
    if g:
        rows.append(["generation", "grpo_dist (vLLM)", _f(g.get("gen")), tok(g.get("gen_tokens")), tok(g.get("gen_tokens")),
                     "1.00", _f(s.get("rollout_efficiency"))])
    if v:  # the same requests as grpo_dist's (its seeds), which the efficiency beside grpo_dist's row is against
        same = "as_grpo_dist" if v.get("as_grpo_dist_s") is not None else "plain"
        label = " (same requests)" if same == "as_grpo_dist" else ""
        rows.append(["generation", f"bare {s.get('rollout_baseline', 'LLM.generate')}{label}", _f(v.get(f"{same}_s")),
                     tok(v.get(f"{same}_tokens")), tok(v.get(f"{same}_tokens")), "1.00", ""])
    if t:
        rows.append(["generation", "TRL (Hugging Face generate)", _f(t.get("gen_s")), tok(t.get("gen_tokens_computed")),
                     tok(t.get("gen_tokens")), ratio_cell(t.get("gen_tokens_computed"), t.get("gen_tokens")), ""])
    for phase, key, bare_key, eff in (("no-grad forward (ref)", "ref", "forward_s", "ref_efficiency"),
                                      ("update (fwd/bwd/AdamW)", "update_actor", "update_s", "update_efficiency")):
        if g:
            rows.append([phase, "grpo_dist", _f(g.get(key)), tok(g.get("update_tokens_computed")),
                         tok(g.get("update_tokens_real")),
                         ratio_cell(g.get("update_tokens_computed"), g.get("update_tokens_real")), _f(s.get(eff))])
        for name, b in bares.items():
            rows.append([phase, f"bare torch loop, {name}" + (" (same work)" if name == s.get("bare_same_work") else ""),
                         _f(b.get(bare_key)), tok(b.get("tokens_computed")), tok(b.get("tokens")),
                         ratio_cell(b.get("tokens_computed"), b.get("tokens")), ""])
        if t:
            kind = "nograd" if key == "ref" else "grad"
            rows.append([phase, "TRL", _f(t.get("nograd_forward_s") if key == "ref" else t.get("update_s")),
                         tok(t.get(f"{kind}_computed_tokens")), tok(t.get(f"{kind}_real_tokens")),
                         ratio_cell(t.get(f"{kind}_computed_tokens"), t.get(f"{kind}_real_tokens")), ""])
    if not rows:
        return "(nothing measured)"
    return table(TOKEN_COLUMNS, rows)


def packing_line(s: dict) -> str:
    """One sentence: the padded path's padding fraction and the time packing saves (bare loop)."""
    if s.get("padding_fraction") is None:
        return ""
    return (f"{s['name']}: the padded forward's tokens are {100 * s['padding_fraction']:.0f} % padding; packing saves "
            f"{100 * s['packing_saving']:.0f} % of the update's time and {100 * s['packing_saving_forward']:.0f} % of the "
            f"no-grad forward's (bare loop, padded vs packed, same rows and micro-batches).")


def real_vocab_table(s: dict) -> str:
    """grpo_dist's log-prob variants and the bare loop's, on a real vocabulary: time and peak memory."""
    rows = []
    g = s.get("grpo_dist")
    variants = dict(s.get("grpo_variants") or {})
    if g:
        variants = {"chunked": {"update_actor": g["update_actor"], "ref": g["ref"],
                                "actor_peak_rss_gib": (g.get("peak_rss_gib") or {}).get("ModelWorker"),
                                "update_tokens_computed": g.get("update_tokens_computed")}, **variants}
    labels = {"plain": "one chunk of all positions", "chunked": "chunked (default)", "fused": "fused with the output layer"}
    for name, d in variants.items():
        rows.append(["grpo_dist (model worker)", labels.get(name, name), _f(d.get("update_actor")), _f(d.get("ref")),
                     _f(d.get("actor_peak_rss_gib"), "{:.2f}"), _f(d.get("update_tokens_computed"), "{:.0f}")])
    blabels = {"naive": "padded, full log_softmax", "padded": "padded, chunked", "packed": "packed, chunked",
               "packed_fused": "packed, fused"}
    for name, b in (s.get("torch_variants") or {}).items():
        rows.append(["bare torch loop", blabels.get(name, name), _f(b.get("update_s")), _f(b.get("forward_s")),
                     _f(b.get("peak_rss_gib"), "{:.2f}"), _f(b.get("tokens_computed"), "{:.0f}")])
    return table(REAL_VOCAB_COLUMNS, rows) if rows else "(nothing measured)"


def _sum(a: float | None, b: float | None) -> float | None:
    if a is None:
        return None
    return a + (b or 0.0)


def target_table(s: dict) -> str:
    rows = []
    for r in evaluate_targets(s):
        sign = ">=" if r["kind"] == "min" else "<="
        if r["kind"] == "min":
            meas, thr = _f(r["measured"], "{:.3f}"), f"{sign} {r['threshold']:.2f}"
        else:
            meas, thr = _pct(r["measured"]), f"{sign} {r['threshold'] * 100:.0f} %"
        verdict = "n/a" if r["passed"] is None else ("PASS" if r["passed"] else "FAIL")
        rows.append([r["label"], meas, thr, verdict, r["gap"]])
    return table(TARGET_COLUMNS, rows)


def memory_table(summaries: list[dict]) -> str:
    roles: list[str] = []
    for s in summaries:
        for k in (s.get("grpo_dist") or {}).get("peak_rss_gib", {}):
            if k not in roles:
                roles.append(k)
    roles = _order_roles(roles)
    names = [s["name"] for s in summaries]
    cols = ("process", *[f"peak RSS (GiB), {n}" for n in names])
    rows = []
    for role in roles:
        rows.append([ROLE_LABEL.get(role, role), *[_f((s.get("grpo_dist") or {}).get("peak_rss_gib", {}).get(role), "{:.2f}")
                                              for s in summaries]])
    rows.append(["grpo_dist, all processes summed (peak)",
                 *[_f((s.get("grpo_dist") or {}).get("peak_tree_rss_gib"), "{:.2f}") for s in summaries]])
    rows.append(["grpo_dist actor, perf/max_memory_gb/actor",
                 *[_f((s.get("grpo_dist") or {}).get("max_memory_gb_actor"), "{:.2f}") for s in summaries]])
    rows.append(["TRL GRPOTrainer process", *[_f((s.get("trl") or {}).get("peak_rss_gib"), "{:.2f}") for s in summaries]])
    if any(s.get("device") == "cuda" for s in summaries):
        rows.append(["TRL GRPOTrainer, GPU memory (max allocated)",
                     *[_f((s.get("trl") or {}).get("max_memory_gib"), "{:.2f}") for s in summaries]])
        rows.append(["bare torch loop, GPU memory (max allocated)",
                     *[_f((s.get("torch") or {}).get("max_memory_gib"), "{:.2f}") for s in summaries]])
    rows.append(["bare rollout process (vLLM or HF generate)", *[_f((s.get("vllm") or {}).get("peak_rss_gib"), "{:.2f}") for s in summaries]])
    rows.append(["bare torch loop process", *[_f((s.get("torch") or {}).get("peak_rss_gib"), "{:.2f}") for s in summaries]])
    return table(cols, rows)


ROLE_ORDER = ("main process", "ModelWorker", "RolloutWorker", "RewardWorker")
ROLE_LABEL = {"main process": "grpo_dist driver (python -m grpo_dist.main)"}


def _order_roles(roles) -> list[str]:
    return [r for r in ROLE_ORDER if r in roles] + sorted(r for r in roles if r not in ROLE_ORDER)


def mfu_table(summaries: list[dict]) -> str:
    """Achieved TFLOP/s and MFU of the update phase (GPU workloads only; empty string when none)."""
    rows = []
    for s in summaries:
        if s.get("device") != "cuda":
            continue
        g, b = s.get("grpo_dist") or {}, s.get("torch") or {}
        rows.append([s["name"], "grpo_dist update_actor (FSDP2, 1 rank)", _f(g.get("update_actor")),
                     _f(g.get("update_tflops_s"), "{:.1f}"), _pct(s.get("update_mfu"))])
        rows.append([s["name"], "bare torch loop (autocast bf16, fused AdamW)", _f(b.get("update_s")),
                     _f(b.get("update_tflops_s"), "{:.1f}"), _pct(s.get("bare_update_mfu"))])
    if not rows:
        return ""
    return table(("workload", "program", "update (s)", "model TFLOP/s", "MFU"), rows)


def cpu_table(summaries: list[dict]) -> str:
    """CPU seconds of each grpo_dist process over a whole run (start-up included)."""
    roles: list[str] = []
    for s in summaries:
        roles += [k for k in (s.get("grpo_dist") or {}).get("cpu_s", {}) if k not in roles]
    cols = ("process", *[f"CPU s per run, {s['name']}" for s in summaries])
    rows = [[ROLE_LABEL.get(r, r), *[_f((s.get("grpo_dist") or {}).get("cpu_s", {}).get(r), "{:.1f}") for s in summaries]]
            for r in _order_roles(roles)]
    rows.append(["wall time of the run (s)", *[_f((s.get("grpo_dist") or {}).get("run_s"), "{:.1f}") for s in summaries]])
    return table(cols, rows)


def settings_table(workloads: list[dict]) -> str:
    cols = ("setting", *[w["name"] for w in workloads])
    def row(label, fn):
        return [label, *[fn(w) for w in workloads]]
    rows = [
        row("model", lambda w: f"{w.get('model_desc', w['model'])}, {w.get('num_params', 0) / 1e6:.1f} M params"),
        row("prompts x rollout.n per step", lambda w: f"{w['batch_size']} x {w['n']} = {w['batch_size'] * w['n']}"),
        row("max response length", lambda w: str(w["response_length"])),
        row("sampling", lambda w: f"T={w['temperature']}, top_p={w['top_p']}, top_k={w['top_k']}"),
        row("micro-batch (update, old log-prob, ref)", lambda w: str(w["micro_batch"])),
        row("updates per step", lambda w: "1 (ppo_mini_batch_size = train_batch_size, ppo_epochs 1)"),
        row("KL loss", lambda w: f"on, low_var_kl (k3), coef {w['kl_coef']}"),
        row("lr / grad clip", lambda w: f"{w['lr']} / 1.0"),
        row("response lengths", lambda w: ((f"geometric, each token EOS with p = 1/{w['mean_response']}, capped at "
                                            f"{w['response_length']}") if w.get("mean_response") else "as the model samples")
            + ("; the bare torch loop trains on the lengths grpo_dist sampled (bare vLLM sent its seeds)"
               if w.get("rollout", "vllm") == "vllm" else "")),
        row("gradient checkpointing", lambda w: "on" if w["gradient_checkpointing"] else "off"),
        row("grpo_dist forwards", lambda w: "packed (use_remove_padding, the default)"
            + (f"; log-prob variants {', '.join(w['grpo_variants'])}" if w.get("grpo_variants") else "")),
        row("bare torch loop variants", lambda w: ", ".join(w.get("bare_variants") or ["naive"])),
        row("ranks / device", lambda w: f"1 (trainer.n_gpus_per_node=1) / {w.get('gpu_name') or w.get('device', 'cpu')}"),
        row("rollout engine", lambda w: "vLLM" if w.get("rollout", "vllm") == "vllm" else "Hugging Face generate"),
        row("compute dtype", lambda w: "bf16 (float32 master weights)" if is_bf16(w) else "float32"),
        row("steps per run (warm-up + measured)", lambda w: f"{w['warmup_steps']} + {w['steps'] - w['warmup_steps']}"),
    ]
    return table(cols, rows)


def render(workloads: list[dict], summaries: list[dict], machine: dict, command: str, reps: int,
           notes: list[str] = ()) -> str:
    """The whole report (markdown), as printed by run_bench.py."""
    out = ["## Settings", "", f"Command: `{command}`", "",
           "Machine: " + ", ".join(f"{k} {v}" for k, v in machine.items()), "",
           f"Repetitions: {reps} per program and workload, alternating grpo_dist / TRL; numbers are medians over "
           "the measured steps of all repetitions. 'foreign load' = cores used by other processes meanwhile.",
           *[f"{n}" for n in notes], "",
           settings_table(workloads), "", "## grpo_dist vs TRL", "", compare_table(summaries), ""]
    for s in summaries:
        line = trl_breakdown(s)
        if line:
            out += [line, ""]
    target_name = TARGET_WORKLOAD if any(s["name"] == TARGET_WORKLOAD for s in summaries) else None
    for s in summaries:
        out += [f"## Phases, {s['name']} workload", "", phase_table(s, with_targets=s["name"] == target_name), ""]
        dom = dominant_phases(s)
        if dom:
            out += ["Largest phases: " + ", ".join(f"{p} {100 * v:.0f} %" for p, v in dom), ""]
        out += [f"### Tokens computed and tokens that count, {s['name']} workload", "", token_table(s), ""]
        line = packing_line(s)
        if line:
            out += [line, ""]
        if s.get("grpo_variants") or s["name"] == "real_vocab":
            out += [f"### Log-probs over the vocabulary: plain, chunked, fused ({s['name']} workload)", "",
                    real_vocab_table(s), ""]
    mfu = mfu_table(summaries)
    if mfu:
        out += ["## Update phase: model FLOPs utilisation", "", mfu, "",
                "Model FLOPs = 3 x (2 x matmul weights x tokens + 2 x layers x heads x head_dim x S^2 per sequence), "
                "padding not counted; MFU = model FLOPs / update time / the GPU's dense bf16 peak.", ""]
    out += ["## Peak memory (RSS sampled every 0.25 s from outside)", "", memory_table(summaries), "",
            "## CPU time of the grpo_dist processes", "", cpu_table(summaries), ""]
    if target_name:
        s = next(s for s in summaries if s["name"] == target_name)
        out += [f"## Targets ({target_name} workload)", "", target_table(s), ""]
    else:
        out += ["## Targets", "", f"(the targets are defined on the {TARGET_WORKLOAD} CPU workload; values for the "
                f"{summaries[0]['name']} workload, for information)", "", target_table(summaries[0]), ""]
    return "\n".join(out)
