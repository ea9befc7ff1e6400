"""A discrete-event simulator of synchronous colocated, one-step-off-policy and fully asynchronous GRPO
training at cluster scale, driven by measured phase times.

    python scripts/bench/async_sim.py published [--seed 0]
    python scripts/bench/async_sim.py calibrate --metrics RUN_DIR/metrics.jsonl --devices N --samples-per-step S

``published`` simulates verl's DAPO Qwen2.5-Math-7B setup (512 prompts x 16 responses per step, responses
up to 28K tokens) at the GPU counts verl published (32, 64, 128), prints the simulated step times next to
verl's measured ones with their ratio, then projects 8, 64 and 512 GPUs. ``calibrate`` fits the per-token
decode time, the update time per token and the weight-sync time from a grpo_dist run's ``metrics.jsonl``
(``timing_s/gen``, ``timing_s/update_actor``, ``timing_s/update_weights``, ``response_length/mean|max``,
``prompt_length/mean``) and projects that workload to 8, 64 and 512 devices.

The model (every function below is pure; time in seconds, lengths in tokens):

- response lengths: lognormal with the given mean and shape ``sigma``, rounded, clipped to
  ``[1, max_len]`` (the clip is the long tail's wall); ``sigma=0`` gives constant lengths;
- rollout: each of ``R`` devices serves ``slots`` sequences at once (one data-parallel engine replica per
  device); a response of length L holds a slot for ``prefill_s + L * decode_s_per_token`` (decode speed per
  sequence is taken as independent of how full the device is: the batch-size effect is folded into
  ``slots``). Free slots take the next sample in order (greedy list scheduling);
- training on ``T`` devices: one update over ``tokens`` (prompt + response) takes
  ``tokens * train_s_per_token / T + allreduce_s * 2 (T - 1) / T`` (data parallel; the gradient
  all-reduce is a ring whose time tends to ``allreduce_s`` as T grows); where the old log-probs are
  recomputed by the trainer (synchronous and one-step-off, as in verl) the compute part is multiplied by
  ``1 + logprob_fraction``;
- weight sync to ``R`` rollout devices: ``sync_s * (1 + sync_log_growth * log2(R))`` (a tree broadcast);
- synchronous colocated: all N devices generate the whole batch, then all N train on it, then reshard
  (one sync); every step waits for its longest response;
- one-step-off: batch k+1 is generated on R devices while batch k trains on T = N - R devices; a step is
  ``max(gen_{k+1}, train_k) + sync``; every sample is one weight version old;
- fully async: rollouts stream into a queue; the trainer takes ``require_batches * mini_batch`` samples
  per local update and syncs weights every ``trigger_parameter_sync_step`` updates (K samples per sync
  window). At weight version v the rollout may have started at most ``floor(K (v + 1 + staleness))``
  samples in all, so a sample's age (trainer version when consumed - version that started it) never
  exceeds ``ceil(staleness)`` without partial rollout. At a sync the rollout stops starting samples; without
  partial rollout the sync waits for the in-flight ones to finish, with it they are paused for the sync and
  resume under the new weights (their age then counts from the version that started them, and is not bounded
  by the rule above);
- reported per mode: step time (time per K = batch samples, after a warm-up window), samples/s, trainer idle
  share (1 - update compute time / wall time), rollout idle share (1 - busy slot time / (slots x wall
  time)), mean and max sample age in weight versions.

What is not modelled: prefix caching, KV-cache pressure changing decode speed, tensor/pipeline
parallelism, reward and reference phases (counted into the update when measured so), stragglers.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import statistics
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

VERL_FULLY_ASYNC_URL = "https://verl.readthedocs.io/en/latest/advance/fully_async.html"
VERL_ONE_STEP_OFF_URL = "https://verl.readthedocs.io/en/latest/advance/one_step_off.html"


@dataclass(frozen=True)
class Workload:
    """One training step's data: ``samples`` responses (prompts x n) with lengths ~ lognormal(mean, sigma)
    clipped to ``max_len``; ``prompt_len`` tokens of prompt each."""

    samples: int
    mean_len: float
    sigma: float
    max_len: int
    prompt_len: int = 0


@dataclass(frozen=True)
class Hardware:
    """Per-device costs (see the module docstring for the formulas that use them)."""

    decode_s_per_token: float
    prefill_s: float
    slots: int
    train_s_per_token: float
    allreduce_s: float = 0.0
    sync_s: float = 0.0
    sync_log_growth: float = 0.0
    logprob_fraction: float = 0.0


@dataclass(frozen=True)
class AsyncConfig:
    """verl's ``async_training`` knobs; ``mini_batch`` is in samples (ppo_mini_batch_size x n)."""

    mini_batch: int
    require_batches: int = 1
    trigger_parameter_sync_step: int = 1
    staleness_threshold: float = 0.0
    partial_rollout: bool = False


@dataclass(frozen=True)
class ModeResult:
    mode: str
    devices: str
    step_s: float
    samples_per_s: float
    trainer_idle: float
    rollout_idle: float
    age_mean: float
    age_max: int


def draw_lengths(w: Workload, count: int, seed: int) -> np.ndarray:
    """``count`` response lengths [count] (int): lognormal with mean ``w.mean_len`` and shape ``w.sigma``
    (mu = ln(mean) - sigma^2 / 2), rounded and clipped to [1, max_len]."""
    if w.mean_len <= 0 or w.sigma < 0 or w.max_len < 1:
        raise ValueError(f"workload needs mean_len > 0, sigma >= 0, max_len >= 1; got {w}")
    rng = np.random.default_rng(seed)
    mu = math.log(w.mean_len) - w.sigma ** 2 / 2
    raw = rng.lognormal(mu, w.sigma, size=count) if w.sigma > 0 else np.full(count, w.mean_len)
    return np.clip(np.rint(raw), 1, w.max_len).astype(np.int64)


def gen_makespan(lengths: np.ndarray, devices: int, hw: Hardware) -> tuple[float, float]:
    """(wall time, busy slot-seconds) to generate ``lengths`` on ``devices x hw.slots`` slots, greedy in order."""
    free = [0.0] * (devices * hw.slots)
    busy = 0.0
    for n_tok in lengths:
        dur = hw.prefill_s + float(n_tok) * hw.decode_s_per_token
        heapq.heappush(free, heapq.heappop(free) + dur)
        busy += dur
    return max(free), busy


def update_s(tokens: float, devices: int, hw: Hardware, recompute_logprob: bool) -> tuple[float, float]:
    """(wall time, compute part) of one update over ``tokens`` on ``devices`` data-parallel ranks."""
    compute = tokens * hw.train_s_per_token / devices * (1 + (hw.logprob_fraction if recompute_logprob else 0))
    return compute + hw.allreduce_s * 2 * (devices - 1) / devices, compute


def sync_cost(rollout_devices: int, hw: Hardware) -> float:
    """Weight sync to ``rollout_devices``: ``sync_s * (1 + sync_log_growth * log2(R))``."""
    return hw.sync_s * (1 + hw.sync_log_growth * math.log2(max(rollout_devices, 1)))


def _check_devices(*counts: int) -> None:
    if any(c < 1 for c in counts):
        raise ValueError(f"device counts must be >= 1, got {counts}")


def simulate_sync(w: Workload, hw: Hardware, rollout_devices: int, trainer_devices: int | None = None,
                  steps: int = 4, seed: int = 0) -> ModeResult:
    """Synchronous training: generate the batch, then train on it, then sync. ``trainer_devices=None`` is
    colocated (the same devices do both); otherwise the pools are separate but still take turns."""
    colocated = trainer_devices is None
    t_dev = rollout_devices if colocated else trainer_devices
    _check_devices(rollout_devices, t_dev)
    lengths = draw_lengths(w, w.samples * steps, seed).reshape(steps, w.samples)
    total = compute = busy = 0.0
    for batch in lengths:
        gen, b = gen_makespan(batch, rollout_devices, hw)
        upd, c = update_s(float(batch.sum() + w.prompt_len * w.samples), t_dev, hw, recompute_logprob=True)
        total += gen + upd + sync_cost(rollout_devices, hw)
        compute, busy = compute + c, busy + b
    step = total / steps
    return ModeResult("sync colocated" if colocated else "sync split",
                      f"{rollout_devices}" if colocated else f"{rollout_devices}:{t_dev}", step,
                      w.samples / step, 1 - compute / total, 1 - busy / (rollout_devices * hw.slots * total), 0.0, 0)


def simulate_one_step_off(w: Workload, hw: Hardware, rollout_devices: int, trainer_devices: int,
                          steps: int = 4, seed: int = 0) -> ModeResult:
    """One-step-off-policy: step k = max(gen of batch k+1, train of batch k) + sync (steady state)."""
    _check_devices(rollout_devices, trainer_devices)
    lengths = draw_lengths(w, w.samples * (steps + 1), seed).reshape(steps + 1, w.samples)
    total = compute = busy = 0.0
    for k in range(steps):
        upd, c = update_s(float(lengths[k].sum() + w.prompt_len * w.samples), trainer_devices, hw, True)
        gen, b = gen_makespan(lengths[k + 1], rollout_devices, hw)
        total += max(gen, upd) + sync_cost(rollout_devices, hw)
        compute, busy = compute + c, busy + b
    step = total / steps
    return ModeResult("one-step-off", f"{rollout_devices}:{trainer_devices}", step, w.samples / step,
                      1 - compute / total, 1 - busy / (rollout_devices * hw.slots * total), 1.0, 1)


def simulate_fully_async(w: Workload, hw: Hardware, cfg: AsyncConfig, rollout_devices: int, trainer_devices: int,
                         windows: int = 5, seed: int = 0, record_ages: list[int] | None = None) -> ModeResult:
    """Fully async streaming (see the module docstring). Runs ``windows`` sync windows of K samples and
    measures from the end of the first. ``record_ages`` (if given) receives every consumed sample's age."""
    _check_devices(rollout_devices, trainer_devices)
    per_update = cfg.require_batches * cfg.mini_batch
    k_window = per_update * cfg.trigger_parameter_sync_step
    if per_update < 1 or cfg.trigger_parameter_sync_step < 1 or cfg.staleness_threshold < 0:
        raise ValueError(f"async config needs mini_batch, require_batches, trigger_parameter_sync_step >= 1 "
                         f"and staleness_threshold >= 0; got {cfg}")
    lengths = draw_lengths(w, int(k_window * (windows + 1 + cfg.staleness_threshold)) + 1, seed)
    n_slots = rollout_devices * hw.slots
    sync_s = sync_cost(rollout_devices, hw)
    t = 0.0
    version = started = updates = 0
    in_flight: list[tuple[float, int, int]] = []  # (finish time, sample index, start version)
    queue: deque[tuple[int, int]] = deque()  # (sample index, start version)
    ages: list[int] = []
    busy = compute = 0.0
    mark_t = mark_busy = mark_compute = None
    mark_ages = 0

    def fill(now: float) -> None:
        nonlocal started, busy
        budget = math.floor(k_window * (version + 1 + cfg.staleness_threshold))
        while len(in_flight) < n_slots and started < min(budget, len(lengths)):
            dur = hw.prefill_s + float(lengths[started]) * hw.decode_s_per_token
            heapq.heappush(in_flight, (now + dur, started, version))
            busy += dur
            started += 1

    def advance_until(ready) -> None:
        """Complete rollouts in time order (starting new ones) until ``ready()`` holds."""
        nonlocal t
        while not ready():
            if not in_flight:
                raise RuntimeError("rollout stalled: the staleness budget admits no sample")  # model bug guard
            t_fin, idx, v0 = heapq.heappop(in_flight)
            t = max(t, t_fin)
            queue.append((idx, v0))
            fill(t)

    fill(t)
    for window in range(windows):
        for _ in range(cfg.trigger_parameter_sync_step):
            advance_until(lambda: len(queue) >= per_update)
            batch = [queue.popleft() for _ in range(per_update)]
            ages.extend(version - v0 for _, v0 in batch)
            tokens = float(sum(int(lengths[i]) for i, _ in batch) + w.prompt_len * per_update)
            upd, c = update_s(tokens, trainer_devices, hw, recompute_logprob=False)
            compute += c
            t_done = t + upd
            advance_until(lambda: not in_flight or in_flight[0][0] > t_done)  # rollout runs during the update
            t = t_done
            updates += 1
        # sync: stop starting; drain (no partial rollout) or pause in-flight samples (partial rollout)
        if cfg.partial_rollout:
            paused = [(f - t, i, v0) for f, i, v0 in in_flight]  # remaining time; busy time is unchanged
            t += sync_s
            in_flight = [(t + r, i, v0) for r, i, v0 in paused]
            heapq.heapify(in_flight)
        else:
            while in_flight:
                t_fin, idx, v0 = heapq.heappop(in_flight)
                t = max(t, t_fin)
                queue.append((idx, v0))
            t += sync_s
        version += 1
        fill(t)
        if window == 0:
            mark_t, mark_busy, mark_compute, mark_ages = t, busy, compute, len(ages)
    span = t - mark_t
    steady_ages = ages[mark_ages:]
    if record_ages is not None:
        record_ages.extend(ages)
    step = span / (windows - 1)
    return ModeResult("fully async" + (" +partial" if cfg.partial_rollout else ""),
                      f"{rollout_devices}:{trainer_devices}", step, k_window / step,
                      1 - (compute - mark_compute) / span,
                      max(0.0, 1 - (busy - mark_busy) / (n_slots * span)),
                      float(np.mean(steady_ages)), int(max(ages)))


# --- published setup: verl DAPO Qwen2.5-Math-7B ---------------------------------------------------------

# verl fully async recipe, "Asynchronous Training on 7B Model" (H20, DAPO, 512 prompts x 16, max 28K):
# GPUs -> (colocated sync step s, fully async step s, fully async split, speed-up over 400 steps)
VERL_FULLY_ASYNC = {32: (790.10, 294.77, "16:16", 2.66), 64: (365.28, 189.26, "32:32", 1.92),
                    128: (356.30, 150.63, "64:64", 2.35)}
# verl one-step-off recipe (16 H20, 4 rollout : 12 train, FSDP2, max 20K): colocated 749 s/step,
# one-step-off 520 s/step; total time 19h18m vs 15h34m (+23%)
VERL_ONE_STEP_OFF = {16: (749.0, 520.0, "4:12")}

DAPO_7B = Workload(samples=512 * 16, mean_len=3500, sigma=0.9, max_len=28 * 1024, prompt_len=200)
DAPO_7B_ONE_STEP_OFF = replace(DAPO_7B, max_len=20 * 1024)
# Assumed H20 costs for a 7B model, chosen so that colocated 128 GPUs lands near verl's gen 178 s and
# update+old_log_prob 168 s (one full-length 28K response at ~6 ms/token sets the generation floor).
H20_7B = Hardware(decode_s_per_token=0.0055, prefill_s=0.5, slots=128, train_s_per_token=0.00028,
                  allreduce_s=6.0, sync_s=2.0, sync_log_growth=0.1, logprob_fraction=0.45)
DAPO_ASYNC = AsyncConfig(mini_batch=32 * 16, require_batches=4, trigger_parameter_sync_step=4,
                         staleness_threshold=0.5, partial_rollout=True)


def project(w: Workload, hw: Hardware, cfg: AsyncConfig, gpus: int, seed: int) -> list[ModeResult]:
    """The three modes on ``gpus`` devices; the split modes give half the devices to rollout."""
    r = max(gpus // 2, 1)
    t = max(gpus - r, 1)
    return [simulate_sync(w, hw, gpus, seed=seed), simulate_one_step_off(w, hw, r, t, seed=seed),
            simulate_fully_async(w, hw, cfg, r, t, seed=seed)]


def _table(rows: list[ModeResult]) -> str:
    head = f"{'mode':<22}{'gpus':>8}{'step s':>10}{'samples/s':>11}{'trainer idle':>14}{'rollout idle':>14}" \
           f"{'age mean':>10}{'age max':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.mode:<22}{r.devices:>8}{r.step_s:>10.1f}{r.samples_per_s:>11.2f}{r.trainer_idle:>14.0%}"
                     f"{r.rollout_idle:>14.0%}{r.age_mean:>10.2f}{r.age_max:>9d}")
    return "\n".join(lines)


def published(seed: int) -> str:
    out = [f"verl DAPO Qwen2.5-Math-7B, simulated vs published ({VERL_FULLY_ASYNC_URL})",
           f"{'gpus':>5}{'mode':>14}{'published s':>13}{'simulated s':>13}{'sim/pub':>9}{'pub speed-up':>14}"
           f"{'sim speed-up':>14}"]
    for gpus, (sync_pub, async_pub, split, speedup) in VERL_FULLY_ASYNC.items():
        r, t = (int(x) for x in split.split(":"))
        s = simulate_sync(DAPO_7B, H20_7B, gpus, seed=seed)
        a = simulate_fully_async(DAPO_7B, H20_7B, DAPO_ASYNC, r, t, seed=seed)
        out.append(f"{gpus:>5}{'sync':>14}{sync_pub:>13.1f}{s.step_s:>13.1f}{s.step_s / sync_pub:>9.2f}")
        out.append(f"{gpus:>5}{'fully async':>14}{async_pub:>13.1f}{a.step_s:>13.1f}{a.step_s / async_pub:>9.2f}"
                   f"{speedup:>13.2f}x{s.step_s / a.step_s:>13.2f}x")
    out.append(f"\none-step-off ({VERL_ONE_STEP_OFF_URL}), max response 20K")
    for gpus, (sync_pub, off_pub, split) in VERL_ONE_STEP_OFF.items():
        r, t = (int(x) for x in split.split(":"))
        s = simulate_sync(DAPO_7B_ONE_STEP_OFF, H20_7B, gpus, seed=seed)
        o = simulate_one_step_off(DAPO_7B_ONE_STEP_OFF, H20_7B, r, t, seed=seed)
        out.append(f"{gpus:>5}{'sync':>14}{sync_pub:>13.1f}{s.step_s:>13.1f}{s.step_s / sync_pub:>9.2f}")
        out.append(f"{gpus:>5}{'one-step-off':>14}{off_pub:>13.1f}{o.step_s:>13.1f}{o.step_s / off_pub:>9.2f}"
                   f"{sync_pub / off_pub:>13.2f}x{s.step_s / o.step_s:>13.2f}x")
    out.append("\nprojection (rollout:trainer split 1:1 for the split modes)")
    rows = [r for g in (8, 64, 512) for r in project(DAPO_7B, H20_7B, DAPO_ASYNC, g, seed)]
    out.append(_table(rows))
    return "\n".join(out)


# --- calibration from a grpo_dist run -------------------------------------------------------------------

def read_phase_times(path: Path) -> dict[str, float]:
    """Median over the steps after the first of the phase times and lengths the model needs."""
    keys = ["timing_s/gen", "timing_s/update_actor", "timing_s/update_weights", "response_length/mean",
            "response_length/max", "prompt_length/mean"]
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = rows[1:] if len(rows) > 1 else rows
    out = {}
    for k in keys:
        vals = [r[k] for r in rows if k in r]
        if vals:
            out[k] = statistics.median(vals)
    missing = [k for k in keys[:5] if k not in out]
    if missing:
        raise ValueError(f"{path} lacks {missing}; expected a grpo_dist metrics.jsonl with timing_s/* rows")
    return out


def fit_hardware(phases: dict[str, float], devices: int, samples: int) -> tuple[Workload, Hardware]:
    """Fit from one run: decode_s_per_token = gen / max response length (the longest response bounds a
    step whose samples fit in the slots); train_s_per_token = update_actor x devices / step tokens;
    sync_s = update_weights. Slots = samples per device (the run's concurrency)."""
    if devices < 1 or samples < 1:
        raise ValueError(f"--devices and --samples-per-step must be >= 1, got {devices}, {samples}")
    mean_len, max_len = phases["response_length/mean"], int(phases["response_length/max"])
    prompt = int(phases.get("prompt_length/mean", 0))
    tokens = samples * (mean_len + prompt)
    hw = Hardware(decode_s_per_token=phases["timing_s/gen"] / max(max_len, 1), prefill_s=0.0,
                  slots=math.ceil(samples / devices),
                  train_s_per_token=phases["timing_s/update_actor"] * devices / tokens,
                  sync_s=phases["timing_s/update_weights"])
    # sigma from the max/mean ratio: the max of n lognormal draws is about exp(mu + sigma * sqrt(2 ln n))
    z = math.sqrt(2 * math.log(max(samples, 2)))
    ratio = max(max_len / mean_len, 1.0)
    sigma = max(0.0, z - math.sqrt(max(z * z - 2 * math.log(ratio), 0.0)))
    return Workload(samples, mean_len, sigma, max(max_len, 1), prompt), hw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("published")
    p.add_argument("--seed", type=int, default=0)
    c = sub.add_parser("calibrate")
    c.add_argument("--metrics", type=Path, required=True)
    c.add_argument("--devices", type=int, required=True)
    c.add_argument("--samples-per-step", type=int, required=True)
    c.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.cmd == "published":
        print(published(args.seed))
        return
    w, hw = fit_hardware(read_phase_times(args.metrics), args.devices, args.samples_per_step)
    print(f"fitted: {w}\n        {hw}")
    cfg = AsyncConfig(mini_batch=max(w.samples // 4, 1), require_batches=1, trigger_parameter_sync_step=4,
                      staleness_threshold=0.5, partial_rollout=True)
    print(_table(project(w, hw, cfg, args.devices, args.seed)))
    big = replace(w, samples=512 * 16)
    cfg_big = replace(cfg, mini_batch=big.samples // 4)
    print("\nprojection of this workload at 512 prompts x 16 per step")
    print(_table([r for g in (8, 64, 512) for r in project(big, hw, cfg_big, g, args.seed)]))


if __name__ == "__main__":
    main()
