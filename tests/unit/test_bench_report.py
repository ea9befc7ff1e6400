"""The benchmark's arithmetic (scripts/bench/bench_report.py, bench_procmon.classify): medians over measured
steps, phase efficiencies, workers' busy times and weight-sync parts, driver overhead from the rows' time/unix
(or metrics arrival times), target verdicts, tables."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench"
sys.path.insert(0, str(BENCH))

import bench_procmon as procmon  # noqa: E402
import bench_report as report  # noqa: E402

W = dict(name="large", batch_size=2, n=4, warmup_steps=1, steps=3)


def grpo_row(step: int, *, gen: float, update: float, extra: float = 0.0, resp_len: float = 128.0) -> dict:
    phases = dict(gen=gen, reward=0.1, old_log_prob=1.0, ref=1.0, adv=0.01, update_actor=update, update_weights=0.2)
    row = {"step": step, "response_length/mean": resp_len, "perf/max_memory_gb/actor": 1.5}
    row.update({f"timing_s/{k}": v for k, v in phases.items()})
    row["timing_s/step"] = sum(phases.values()) + extra
    # inside the workers: 90 % of each worker phase; weight sync 0.2 = gather 0.1 + transfer 0.01 + load 0.08
    # (+ 0.01 elsewhere), its worker time 0.18 = gather + load
    row.update({f"timing_s/{k}/worker": 0.9 * phases[k] for k in report.WORKER_PHASES})
    row.update({"timing_s/update_weights/gather": 0.1, "timing_s/update_weights/transfer": 0.01,
                "timing_s/update_weights/load": 0.08})
    return row


def make_runs() -> dict:
    # step 1 is warm-up; steps 2 and 3 measured. Metrics lines arrive 0.3 s after each step ends.
    rows = [grpo_row(1, gen=9.0, update=9.0), grpo_row(2, gen=2.0, update=4.0, extra=0.05),
            grpo_row(3, gen=2.0, update=4.0, extra=0.05)]
    rows[-1]["timing_s/save_checkpoint"] = 1.0
    t1 = 20.0
    t2 = t1 + rows[1]["timing_s/step"] + 0.3
    t3 = t2 + rows[2]["timing_s/step"] + 0.3 + 1.0  # the last line also waits for the checkpoint
    mon = {"step_arrivals": {"1": t1, "2": t2, "3": t3}, "foreign_load_cores": 0.1,
           "peak_rss_gib": {"ModelWorker": 1.0, "RolloutWorker": 2.0}, "peak_tree_rss_gib": 5.0}
    grpo = {"metrics": rows, "monitor": mon}
    trl = {"steps": [{"step": 1, "seconds": 50.0, "gen_tokens": 1024, "warmup": True},
                     {"step": 2, "seconds": 16.0, "gen_tokens": 1024, "gen_s": 8.0, "nograd_forward_s": 1.0, "warmup": False},
                     {"step": 3, "seconds": 16.0, "gen_tokens": 1024, "gen_s": 8.0, "nograd_forward_s": 1.0, "warmup": False}],
           "monitor": {"foreign_load_cores": 0.0, "peak_tree_rss_gib": 1.2}, "trl_version": "1.16.0"}
    vllm = {"plain": [{"step": 1, "seconds": 9.0, "gen_tokens": 1024, "warmup": True},
                      {"step": 2, "seconds": 2.0, "gen_tokens": 1024, "warmup": False},
                      {"step": 3, "seconds": 2.0, "gen_tokens": 1024, "warmup": False}],
            "as_grpo_dist": [{"step": 1, "seconds": 9.0, "gen_tokens": 1024, "warmup": True},
                             {"step": 2, "seconds": 1.6, "gen_tokens": 1024, "warmup": False},
                             {"step": 3, "seconds": 1.6, "gen_tokens": 1024, "warmup": False}],
            "monitor": {"foreign_load_cores": 0.0, "peak_tree_rss_gib": 2.0}}
    torch_ = {"steps": [{"step": 2, "update_s": 3.6, "forward_s": 0.9, "response_tokens": 128, "warmup": False}],
              "monitor": {"foreign_load_cores": 0.0, "peak_tree_rss_gib": 0.8}}
    return {"grpo_dist": [grpo], "trl": [trl], "vllm": [vllm], "torch": [torch_]}


def test_grpo_steps_skip_warmup_and_measure_driver_overhead():
    runs = make_runs()
    steps = report.grpo_steps(runs["grpo_dist"][0], warmup_steps=1, responses_per_step=8)
    assert [d["step"] for d in steps] == [2, 3]
    for d in steps:
        assert d["in_step_overhead_s"] == pytest.approx(0.05)
        # the checkpoint time is taken out of the last interval
        assert d["between_s"] == pytest.approx(0.3)
        assert d["wall_s"] == pytest.approx(d["step_s"] + 0.3)
        assert d["gen_tokens"] == pytest.approx(128 * 8)


def test_grpo_steps_prefer_the_rows_unix_time_over_the_monitor():
    run = make_runs()["grpo_dist"][0]
    t = 1_700_000_000.0
    for row in run["metrics"]:
        t += row["timing_s/step"] + 0.5 + (row.get("timing_s/save_checkpoint") or 0.0)
        row["time/unix"] = t  # 0.5 s between steps by the trainer's clock (the monitor says 0.3 s)
    for d in report.grpo_steps(run, warmup_steps=1, responses_per_step=8):
        assert d["between_s"] == pytest.approx(0.5)
        assert d["wall_s"] == pytest.approx(d["step_s"] + 0.5)
    # a run logged without time/unix falls back to the monitor's arrival times
    run = make_runs()["grpo_dist"][0]
    assert report.grpo_steps(run, warmup_steps=1, responses_per_step=8)[0]["between_s"] == pytest.approx(0.3)


def test_summary_efficiencies_and_ratios():
    s = report.summarise_workload(W, make_runs())
    g = s["grpo_dist"]
    step = 2.0 + 0.1 + 1.0 + 1.0 + 0.01 + 4.0 + 0.2 + 0.05
    assert g["step_s"] == pytest.approx(step)
    assert g["wall_s"] == pytest.approx(step + 0.3)
    # rollout: 1024 tokens in 2.0 s against bare vLLM's 1024 in 1.6 s sent the same requests (the
    # target's baseline); its plain requests took 2.0 s
    assert s["rollout_efficiency"] == pytest.approx(1.6 / 2.0)
    assert s["rollout_efficiency_plain"] == pytest.approx(1.0)
    assert s["update_efficiency"] == pytest.approx(3.6 / 4.0)
    assert s["old_log_prob_efficiency"] == pytest.approx(0.9)
    assert s["weight_sync_share"] == pytest.approx(0.2 / step)
    assert s["driver_overhead_share"] == pytest.approx(0.35 / (step + 0.3))
    assert s["speedup_vs_trl"] == pytest.approx((1024 / (step + 0.3)) / (1024 / 16.0))
    assert g["peak_rss_gib"] == {"ModelWorker": 1.0, "RolloutWorker": 2.0}
    assert g["worker"]["gen"] == pytest.approx(1.8) and g["worker"]["update_actor"] == pytest.approx(3.6)
    assert g["sync"] == pytest.approx({"gather": 0.1, "transfer": 0.01, "load": 0.08})


def test_targets_pass_fail_and_gap():
    s = report.summarise_workload(W, make_runs())
    rows = {r["key"]: r for r in report.evaluate_targets(s)}
    assert set(rows) == {"speedup_vs_trl", "rollout_efficiency", "old_log_prob_efficiency", "ref_efficiency",
                         "update_efficiency", "packing_saving_gap"}
    assert rows["speedup_vs_trl"]["passed"] is True  # ~1.9x >= 1.6x
    assert rows["rollout_efficiency"]["gap"] == "11.1 % below"  # 0.8 against 0.9
    assert rows["rollout_efficiency"]["passed"] is False
    assert rows["update_efficiency"]["passed"] is True  # 3.6 / 4.0 = 0.9 >= 0.9
    assert rows["packing_saving_gap"]["passed"] is None  # no padded / packed bare variants in these runs
    slow = report.evaluate_targets({"speedup_vs_trl": 0.8})
    sp = next(r for r in slow if r["key"] == "speedup_vs_trl")
    assert sp["passed"] is False and sp["gap"] == "2.00x short"
    over = report.evaluate_targets({"packing_saving_gap": 0.08})
    gap = next(r for r in over if r["key"] == "packing_saving_gap")
    assert gap["passed"] is False and gap["gap"] == "3.0 pp over"
    missing = next(r for r in over if r["key"] == "speedup_vs_trl")
    assert missing["passed"] is None and missing["measured"] is None


def bare(update_s: float, forward_s: float, tokens: int, computed: int) -> dict:
    return {"steps": [{"step": 2, "update_s": update_s, "forward_s": forward_s, "tokens": tokens,
                       "tokens_computed": computed, "response_tokens": 50, "warmup": False}],
            "monitor": {"foreign_load_cores": 0.0, "peak_tree_rss_gib": 1.0}}


def variant_runs() -> dict:
    """A generation-heavy shape of results: bare loop variants (40 % of the padded path is padding, packing
    saves 36 % of the update and 38 % of the forward), grpo_dist's token counts, TRL's."""
    runs = make_runs()
    runs["torch"] = [bare(6.0, 1.5, 600, 1200)]
    runs["torch:packed"] = [bare(3.2, 0.806, 600, 600)]
    runs["torch:packed"][0]["also"] = {"padded": bare(5.0, 1.3, 600, 1000)["steps"]}  # timed in the same process
    runs["torch:packed_fused"] = [bare(3.0, 0.8, 600, 600)]
    for row in runs["grpo_dist"][0]["metrics"]:
        row["perf/update_tokens_computed"] = 1200.0
        row["perf/update_tokens_real"] = 1200.0
    for row in runs["trl"][0]["steps"]:
        row.update(nograd_computed_tokens=2000, nograd_real_tokens=1200, grad_computed_tokens=2000,
                   grad_real_tokens=1200, gen_tokens_computed=1600)
    return runs


def test_same_work_efficiency_per_token_and_packing_saving():
    """The bare loop doing grpo_dist's work (packed) is the reference, per real token: grpo_dist ran on
    1200 real tokens in 4.0 s, the bare packed loop on 600 in 3.2 s: (3.2/600) / (4.0/1200) = 1.6."""
    s = report.summarise_workload(W, variant_runs())
    assert s["bare_same_work"] == "packed"
    assert s["update_efficiency"] == pytest.approx(1.6)
    assert s["ref_efficiency"] == pytest.approx((0.806 / 600) / (1.0 / 1200))
    assert s["update_speedup_vs_naive_loop"] == pytest.approx((6.0 / 600) / (4.0 / 1200))
    assert s["padding_fraction"] == pytest.approx(0.4)
    assert s["packing_saving"] == pytest.approx(0.36)
    assert s["packing_saving_gap"] == pytest.approx(0.04)
    rows = {r["key"]: r for r in report.evaluate_targets(s)}
    assert rows["packing_saving_gap"]["passed"] is True  # 4 pp short of the padding fraction: within 5
    assert "40 % padding; packing saves 36 % of the update's time and 38 % of the" in report.packing_line(s)
    t = s["trl"]
    assert t["update_s"] == pytest.approx(16.0 - 8.0 - 1.0)


def test_token_table_lists_every_program_per_phase():
    s = report.summarise_workload(W, variant_runs())
    text = report.token_table(s)
    assert "| " + " | ".join(report.TOKEN_COLUMNS) + " |" in text
    assert "| update (fwd/bwd/AdamW) | grpo_dist | 4.000 | 1200 | 1200 | 1.00 | 1.600 |" in text
    assert "| update (fwd/bwd/AdamW) | bare torch loop, packed (same work) | 3.200 | 600 | 600 | 1.00 |  |" in text
    assert "| update (fwd/bwd/AdamW) | bare torch loop, naive | 6.000 | 1200 | 600 | 2.00 |  |" in text
    assert "| no-grad forward (ref) | TRL | 1.000 | 2000 | 1200 | 1.67 |  |" in text
    assert "| generation | TRL (Hugging Face generate) | 8.000 | 1600 | 1024 | 1.56 |  |" in text
    # the bare engine's row is the one sent grpo_dist's requests, which the rollout's efficiency is against
    assert "| generation | bare LLM.generate (same requests) | 1.600 | 1024 | 1024 | 1.00 |  |" in text


def test_real_vocab_table_has_grpo_and_bare_variants():
    runs = variant_runs()
    w = dict(W, name="real_vocab")
    run = runs["grpo_dist"][0]
    fused = {"metrics": [dict(r, **{"timing_s/update_actor": r["timing_s/update_actor"] / 2}) for r in run["metrics"]],
             "monitor": dict(run["monitor"], peak_rss_gib={"ModelWorker": 0.5})}
    runs["grpo_dist:fused"] = [fused]
    s = report.summarise_workload(w, runs)
    text = report.real_vocab_table(s)
    assert "| grpo_dist (model worker) | chunked (default) | 4.000 | 1.000 | 1.00 | 1200 |" in text
    assert "| grpo_dist (model worker) | fused with the output layer | 2.000 | 1.000 | 0.50 | 1200 |" in text
    assert "| bare torch loop | packed, fused | 3.000 | 0.800 | 1.00 | 600 |" in text
    rendered = report.render([dict(w, model="m", num_params=1, response_length=128, temperature=1.0, top_p=1.0,
                                   top_k=-1, micro_batch=8, kl_coef=0.001, lr=1e-6, gradient_checkpointing=False)],
                             [s], {"cores": 2}, "cmd", reps=1)
    assert "### Log-probs over the vocabulary: plain, chunked, fused (real_vocab workload)" in rendered


def test_render_has_the_tables_and_columns():
    s = report.summarise_workload(W, make_runs())
    w = dict(W, model="large", num_params=22_700_000, response_length=128, temperature=1.0, top_p=1.0, top_k=20,
             micro_batch=8, kl_coef=0.001, lr=1e-6, gradient_checkpointing=False)
    text = report.render([w], [s], {"cores": 2}, "python scripts/bench/run_bench.py", reps=1)
    for columns in (report.COMPARE_COLUMNS, report.PHASE_COLUMNS, report.TARGET_COLUMNS):
        assert "| " + " | ".join(columns) + " |" in text
    assert "## Targets (gen_heavy workload)" not in text and "defined on the gen_heavy CPU workload" in text
    assert "FAIL" in text and "PASS" in text
    assert "| ModelWorker | 1.00 |" in text
    # worker busy time next to the driver-side time; the weight sync's parts as indented rows
    assert "| update_actor vs torch fwd/bwd/AdamW loop | 4.000 | 3.600 | " in text
    assert "| weight sync (update_weights) | 0.200 | 0.180 | " in text
    for part, seconds in (("gather", "0.100"), ("transfer", "0.010"), ("load", "0.080")):
        assert f"|   {report.SYNC_LABEL[part]} | {seconds} |  | " in text
    assert "| reward | 0.100 |  | " in text


def test_runs_without_worker_times_render_dashes():
    runs = make_runs()
    for row in runs["grpo_dist"][0]["metrics"]:
        for k in [k for k in row if k.endswith("/worker") or k.startswith("timing_s/update_weights/")]:
            del row[k]
    table = report.phase_table(report.summarise_workload(W, runs), with_targets=False)
    assert "| weight sync (update_weights) | 0.200 | - | " in table
    assert f"|   {report.SYNC_LABEL['load']} | - |  | " in table


def test_trl_missing_is_reported_as_skipped():
    runs = make_runs()
    runs["trl"] = []
    s = report.summarise_workload(W, runs)
    assert s["speedup_vs_trl"] is None
    assert "skipped (trl not installed)" in report.compare_table([s])


@pytest.mark.parametrize("cmdline, role", [
    ("ray::ModelWorker", "ModelWorker"),
    ("ray::ModelWorker.call", "ModelWorker"),
    ("ray::RolloutWorker.__init__", "RolloutWorker"),
    ("ray::RewardWorker.score", "RewardWorker"),
    ("ray::IDLE", "Ray idle workers"),
    ("python .../ray/_private/workers/default_worker.py --runtime-env-hash=1", "Ray idle workers"),
    (".../ray/core/src/ray/raylet/raylet --raylet_socket_name=x", "Ray daemons"),
    ("ray::DashboardAgent", "Ray daemons"),
    ("python -c from multiprocessing.forkserver import main", "other"),
])
def test_classify_process_titles(cmdline, role):
    assert procmon.classify(cmdline, is_root=False) == role
    assert procmon.classify(cmdline, is_root=True) == "main process"
