"""End to end through `python -m grpo_dist.main`: real Ray, real vLLM (CPU), real FSDP2 (gloo)."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch
from safetensors.torch import load_file

from tests.e2e.conftest import EXTERNAL_LIB_LOG, RESUME_ARGS, epoch_data
from tests.e2e.helpers import base_args, read_metrics, run_main

pytestmark = pytest.mark.slow

REQUIRED = [
    "actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/kl_loss", "actor/entropy", "actor/grad_norm",
    "actor/lr", "critic/score/mean", "critic/score/max", "critic/score/min", "critic/advantages/mean",
    "response_length/mean", "response_length/max", "response_length/clip_ratio", "prompt_length/mean",
    "timing_s/gen", "timing_s/reward", "timing_s/old_log_prob", "timing_s/ref", "timing_s/adv",
    "timing_s/update_actor", "timing_s/update_weights", "timing_s/step", "perf/throughput",
    "perf/time_per_step", "training/global_step",
]
VAL = "val-core/grpo_dist/reverse/acc/mean@1"
VAL_REWARD = "val-aux/grpo_dist/reverse/reward/mean@1"


def test_grpo_trains_end_to_end(full_run, tiny_model_dir):
    out, proc = full_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    m = read_metrics(out)
    assert sorted(m) == [0, 1, 2, 3, 4]
    for step in (1, 2, 3, 4):
        r = m[step]
        missing = [k for k in REQUIRED if k not in r]
        assert not missing, f"step {step} lacks {missing}"
        for k in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"):
            assert r[k] is not None and math.isfinite(r[k]), (k, r[k])
        assert r["training/global_step"] == step
    # the dense test reward gives groups with reward variance, so the policy gradient is at work
    assert any(m[s]["critic/score/max"] > m[s]["critic/score/min"] for s in (1, 2, 3, 4))
    assert any(abs(m[s]["actor/pg_loss"]) > 0 for s in (1, 2, 3, 4))
    # validation before training and every test_freq steps
    assert VAL in m[0] and VAL in m[2] and VAL in m[4]

    # checkpoints at save_freq; the policy changed: the final export differs from the initial weights
    assert (out / "global_step_2" / "trainer_state.json").exists()
    final = load_file(str(out / "global_step_4" / "huggingface" / "model.safetensors"))
    init = load_file(str(tiny_model_dir / "model.safetensors"))
    assert set(final) == set(init)
    assert any(not torch.equal(final[k], init[k]) for k in init)
    # what the user sees: the summary and the report
    assert "training finished" in proc.stdout
    assert (out / "report" / "summary.png").exists()


def test_rollout_log_probs_match_the_actors(full_run):
    """With calculate_log_probs, vLLM's probabilities of the sampled tokens are compared with the actor's
    old-log-prob forward (same weights, float32 on both sides): they agree to float rounding."""
    out, proc = full_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = read_metrics(out)
    for step in (1, 2, 3, 4):
        r = m[step]
        assert 0 <= r["training/rollout_probs_diff_mean"] <= r["training/rollout_probs_diff_max"] < 1e-3, (step, r)
        assert r["training/rollout_probs_diff_std"] >= 0


WORKER_PHASES = ("gen", "old_log_prob", "ref", "update_actor", "update_weights")


def test_metrics_time_the_workers_the_weight_sync_and_the_rows(full_run):
    """The benchmark's hooks: each phase's busy time inside the workers (within the driver's time of the
    phase), the weight sync's parts (within the sync) and a wall-clock stamp on every row."""
    out, proc = full_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = read_metrics(out)
    eps = 1e-3
    for step in (1, 2, 3, 4):
        r = m[step]
        for p in WORKER_PHASES:  # 2 mini-batches: the update is off-policy, so old_log_prob runs
            assert 0 < r[f"timing_s/{p}/worker"] <= r[f"timing_s/{p}"] + eps, (step, p)
        parts = [r[f"timing_s/update_weights/{k}"] for k in ("gather", "transfer", "load")]
        assert min(parts) >= 0 and sum(parts) <= r["timing_s/update_weights"] + eps, (step, parts)
        gather, _, load = parts
        assert gather + load <= r["timing_s/update_weights/worker"] + eps
    stamps = [m[step]["time/unix"] for step in sorted(m)]
    assert all(a < b for a, b in zip(stamps, stamps[1:])), stamps
    assert time.time() - 3600 < stamps[0] and stamps[-1] <= time.time()


def test_startup_json_splits_the_start_up_of_every_process(full_run):
    """The run folder's startup.json: the driver's phases and each worker process's (2 ranks: a model
    process and a rollout process each, and the reward worker), all after the driver's start and before
    the first step; the table reads it (docs/benchmarks.md, "Start-up")."""
    from grpo_dist.utils import startup

    out, proc = full_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    data, step = startup.read(out)
    driver = [name for name, _, _ in startup.phases(data["driver"])]
    # the workers' processes are created (and import their libraries) before the driver loads the
    # tokenizer and reads the data
    assert driver == ["imports", "configuration", "model and data files", "checks", "output folder", "ray's client",
                      "ray started", "workers created", "tokenizer loaded", "checks and data", "driver's modules",
                      "workers started"]
    assert sorted(data["processes"]) == ["models rank 0", "models rank 1", "reward", "rollout rank 0",
                                         "rollout rank 1"]
    ttfs = startup.time_to_first_step(data)
    first_row = read_metrics(out)[1]["time/unix"]
    assert 0 < ttfs < first_row - data["driver"]["start"]
    for name, recorded in data["processes"].items():
        phases = startup.phases(recorded)
        assert phases and all(s >= 0 for _, s, _ in phases), (name, phases)
        assert data["driver"]["start"] <= recorded["start"] and phases[-1][2] <= data["driver"]["start"] + ttfs
    assert [n for n, _, _ in startup.phases(data["processes"]["rollout rank 0"])][-2:] == ["vllm imported",
                                                                                          "engine built"]
    assert "actor: model built" in [n for n, _, _ in startup.phases(data["processes"]["models rank 1"])]
    assert step["step"] > 0 and f"| first step | step (all phases) | {step['step']:.2f} |" in startup.table(data, step)


def test_verls_external_lib_is_imported_by_the_driver_and_every_model_and_rollout_process(full_run):
    """``actor_rollout_ref.model.external_lib`` (a module registering model classes, in verl): the driver imports it
    before it reads the model, and every process that builds a model or an engine before building it (each rank's
    model process and rollout process); the reward worker builds neither. The module logs its importers' pids."""
    from grpo_dist.utils import startup

    out, proc = full_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    data, _ = startup.read(out)
    imported = [int(pid) for pid in (out.parent / EXTERNAL_LIB_LOG).read_text().split()]
    builders = {name: p["pid"] for name, p in data["processes"].items() if not name.startswith("reward")}
    assert sorted(builders) == ["models rank 0", "models rank 1", "rollout rank 0", "rollout rank 1"]
    assert sorted(imported) == sorted([data["driver"]["pid"], *builders.values()]), (imported, builders)


def generations(out) -> dict[int, list[dict]]:
    rows = [json.loads(line) for line in (out / "val_generations.jsonl").read_text().splitlines()]
    by_step: dict[int, list[dict]] = {}
    for r in rows:
        by_step.setdefault(r["step"], []).append(r)
    return by_step


def test_validation_samples_are_logged_and_hydras_files_written(full_run):
    """log_val_generations=3: three samples at every validation, always the same inputs (verl's
    fixed-seed choice), with the response and its score; the run's folder also holds Hydra's files."""
    out, proc = full_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    gens = generations(out)
    assert sorted(gens) == [0, 2, 4]
    inputs = [[r["input"] for r in gens[s]] for s in (0, 2, 4)]
    assert all(len(x) == 3 for x in inputs) and inputs[0] == inputs[1] == inputs[2]
    m = read_metrics(out)
    for s in (0, 2, 4):
        assert all(r["input"] and 0.0 <= r["score"] <= 1.0 for r in gens[s])
        assert min(r["score"] for r in gens[s]) >= 0 and m[s][VAL] is not None
    assert "validation generations at step 4" in proc.stdout + proc.stderr  # the console's table
    assert (out / ".hydra" / "config.yaml").exists() and (out / ".hydra" / "overrides.yaml").exists()


def test_every_step_and_validation_is_dumped_with_the_reward_functions_extra_values(full_run):
    """rollout_data_dir / validation_data_dir (verl's dumps): <step>.jsonl with one object per response in
    groups of n, verl's fields and the test reward's extra value (``hits``); the scores are the ones the metrics
    were computed from, and the validation's samples logged as a table are among the dumped ones."""
    out, proc = full_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = read_metrics(out)

    def dumped(folder, step):
        return [json.loads(line) for line in (folder / f"{step}.jsonl").read_text().splitlines()]

    assert sorted(p.name for p in (out / "rollouts").iterdir()) == ["1.jsonl", "2.jsonl", "3.jsonl", "4.jsonl"]
    for step in (1, 2, 3, 4):
        rows = dumped(out / "rollouts", step)
        assert len(rows) == 16 and all(set(r) == {"input", "output", "gts", "score", "step", "acc", "hits"} for r in rows)
        assert all(r["step"] == step and r["score"] == pytest.approx(r["hits"] / len(r["gts"])) for r in rows)
        assert all(len({r["input"] for r in rows[g * 4:(g + 1) * 4]}) == 1 for g in range(4))  # n=4 per prompt
        scores = [r["score"] for r in rows]
        assert sum(scores) / 16 == pytest.approx(m[step]["critic/score/mean"], abs=1e-5)
        assert (min(scores), max(scores)) == pytest.approx((m[step]["critic/score/min"], m[step]["critic/score/max"]))
    val = out.parent / "val"
    assert sorted(p.name for p in val.iterdir()) == ["0.jsonl", "2.jsonl", "4.jsonl"]
    for step in (0, 2, 4):
        rows = dumped(val, step)  # verl's validation metrics of the test reward's values: acc core, the others aux
        assert sum(r["acc"] for r in rows) / len(rows) == pytest.approx(m[step][VAL], abs=1e-5)
        assert sum(r["score"] for r in rows) / len(rows) == pytest.approx(m[step][VAL_REWARD], abs=1e-5)
        assert sum(r["hits"] for r in rows) / len(rows) == pytest.approx(m[step]["val-aux/grpo_dist/reverse/hits/mean@1"])
        dumped_pairs = {(r["input"], r["output"]) for r in rows}
        assert all((g["input"], g["output"]) in dumped_pairs for g in generations(out)[step])


@pytest.fixture(scope="module")
def val_only_run(full_run, tiny_model_dir, reverse_data, tmp_path_factory):
    """trainer.val_only on the full run's last checkpoint, in a folder of its own."""
    full_out, _ = full_run
    out = tmp_path_factory.mktemp("val_only") / "run"
    data = epoch_data(reverse_data, full_out.parent)
    t0 = time.time()
    proc = run_main(base_args(tiny_model_dir, data, out, steps=4) + RESUME_ARGS + [
        "trainer.val_only=true", "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={full_out / 'global_step_4'}", "trainer.log_val_generations=3"])
    return out, proc, time.time() - t0


def test_val_only_validates_the_checkpoint_and_stops(full_run, val_only_run):
    """verl's val_only: the resumed policy is validated and nothing is trained or saved. Greedy validation
    of the same weights gives the full run's own step-4 score and the same logged responses."""
    full_out, _ = full_run
    out, proc, seconds = val_only_run
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "validation finished (trainer.val_only), at step 4" in proc.stdout
    m = read_metrics(out)
    assert sorted(m) == [4] and "actor/pg_loss" not in m[4]
    assert m[4][VAL] == read_metrics(full_out)[4][VAL]
    assert not list(out.glob("global_step_*"))
    assert generations(out)[4] == generations(full_out)[4]
    print(f"val_only run: {seconds:.0f} s")


def test_profiled_steps_leave_one_trace_per_process_of_the_profiled_rank(full_run):
    """verl's profiler keys (conftest's ``PROFILED``): torch's profiler ran in rank 1's model process (actor and
    reference) and rollout process for steps 2-3, one trace each, with every call of the steps marked."""
    out, proc = full_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    traces = out.parent / "profile"
    assert sorted(p.name for p in traces.iterdir()) == ["models_rank1_step2-3.json", "rollout_rank1_step2-3.json"]
    assert f"grpo_dist: profiler: torch.profiler in the actor, rollout workers at steps [2, 3]" in proc.stdout

    def names(path):
        return [e.get("name") for e in json.loads(path.read_text())["traceEvents"]]

    models, rollout = names(traces / "models_rank1_step2-3.json"), names(traces / "rollout_rank1_step2-3.json")
    # two steps: one update each; the validation after step 2 generates inside the window too
    assert models.count("actor.update_policy") == 2 and "reference.compute_ref_log_prob" in models
    assert "aten::mm" in models or "aten::addmm" in models
    assert rollout.count("rollout.generate") >= 3 and "rollout.load_bucket" in rollout
