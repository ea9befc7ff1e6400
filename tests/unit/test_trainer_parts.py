"""Driver-side pieces: the Batch container, checkpoint folders, the metrics file, the report."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest
import torch

from grpo_dist.batch import Batch
from grpo_dist.trainer import checkpoint
from grpo_dist.trainer.tracking import Tracker


def make_batch(n=6):
    return Batch.from_dict(
        {"x": torch.arange(n * 2).view(n, 2), "m": torch.ones(n, 3)},
        {"uid": [f"u{i}" for i in range(n)]},
        {"temperature": 1.0},
    )


def test_batch_split_chunk_concat_roundtrip():
    b = make_batch(6)
    parts = b.split(4)
    assert [len(p) for p in parts] == [4, 2]
    again = Batch.concat(parts)
    assert torch.equal(again["x"], b["x"]) and list(again["uid"]) == list(b["uid"])
    assert [list(c["uid"]) for c in b.chunk(3)] == [["u0", "u1"], ["u2", "u3"], ["u4", "u5"]]
    with pytest.raises(AssertionError):
        b.chunk(4)


def test_batch_reorder_select_repeat_union():
    b = make_batch(3)
    r = b.reorder([2, 0, 1])
    assert r["x"][:, 0].tolist() == [4, 0, 2] and list(r["uid"]) == ["u2", "u0", "u1"]
    s = b.select("x", "uid")
    assert "m" not in s and "x" in s and "uid" in s
    rep = b.repeat_interleave(2)
    assert list(rep["uid"]) == ["u0", "u0", "u1", "u1", "u2", "u2"]
    other = Batch.from_dict({"y": torch.zeros(3)}, {"tag": ["a", "b", "c"]})
    u = b.union(other)
    assert "y" in u and list(u["tag"]) == ["a", "b", "c"] and u.meta["temperature"] == 1.0
    b["extra"] = ["p", "q", "r"]
    assert isinstance(b.non_tensors["extra"], np.ndarray)


def test_checkpoint_publish_is_atomic_and_prunes(tmp_path):
    root = tmp_path / "ckpts"
    for step in (1, 2, 3):
        tmp = checkpoint.tmp_dir(root, step)
        (tmp / "actor").mkdir()
        checkpoint.publish(root, tmp, step, {"global_step": step}, max_keep=2)
    names = sorted(p.name for p in checkpoint.complete_checkpoints(root))
    assert names == ["global_step_2", "global_step_3"]
    assert (root / checkpoint.LATEST_FILE).read_text() == "3"
    # a run killed while saving leaves only a temporary folder: never picked up, cleaned on start
    half = checkpoint.tmp_dir(root, 4)
    (half / "actor").mkdir()
    assert checkpoint.latest_checkpoint(root).name == "global_step_3"
    checkpoint.clean_stale_tmp(root)
    assert not half.exists()
    assert checkpoint.read_state(root / "global_step_3")["global_step"] == 3


def test_metrics_file_drops_steps_after_resume_point(tmp_path):
    tr = Tracker(["file"], out_dir=tmp_path, project="p", experiment="e", config={})
    for s in (1, 2, 3):
        tr.log({"actor/pg_loss": s * 1.0, "bad": "text", "nan": float("nan")}, step=s)
    tr.close()
    tr = Tracker(["file"], out_dir=tmp_path, project="p", experiment="e", config={}, resume_step=2)
    tr.log({"actor/pg_loss": 30.0}, step=3)
    tr.close()
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[-1]["actor/pg_loss"] == 30.0 and rows[0]["nan"] is None and "bad" not in rows[0]
    # every row carries the wall-clock time it was logged at
    assert rows[0]["time/unix"] <= rows[1]["time/unix"] <= rows[2]["time/unix"] <= time.time()
    # a fresh run (nothing to resume from) in the same folder starts the file anew
    Tracker(["file"], out_dir=tmp_path, project="p", experiment="e", config={}).close()
    assert (tmp_path / "metrics.jsonl").read_text() == ""


def test_report_draws_pngs(tmp_path):
    from grpo_dist.report import main as report_main

    with open(tmp_path / "metrics.jsonl", "w") as f:
        for s in range(1, 6):
            f.write(json.dumps({"step": s, "critic/score/mean": s / 10, "timing_s/gen": 0.5,
                                "val-core/x/acc/mean@1": s / 5, "actor/entropy": 1.0}) + "\n")
    assert report_main([str(tmp_path)]) == 0
    for name in ("summary", "reward", "val_accuracy", "kl", "entropy", "response_length", "timing"):
        assert (tmp_path / "report" / f"{name}.png").stat().st_size > 1000
    assert report_main([str(tmp_path / "nope")]) == 1


#: Every timing metric a step, a validation and a checkpoint log (grpo_dist.trainer.driver).
TIMING_KEYS = [
    "timing_s/step", "timing_s/gen", "timing_s/gen/worker", "timing_s/reward", "timing_s/old_log_prob",
    "timing_s/old_log_prob/worker", "timing_s/ref", "timing_s/ref/worker", "timing_s/adv", "timing_s/update_actor",
    "timing_s/update_actor/worker", "timing_s/update_weights", "timing_s/update_weights/gather",
    "timing_s/update_weights/transfer", "timing_s/update_weights/load", "timing_s/update_weights/worker",
    "timing_s/testing", "timing_s/save_checkpoint",
]


def test_report_stacks_phases_and_draws_their_breakdown_apart(tmp_path):
    """The phases of a step are stacked in the order they run (new phases after them), with the step's
    total as a line; the workers' busy time and the weight-sync parts get a panel of their own."""
    from grpo_dist.report import split_timing, write_report

    timing = split_timing(["critic/score/mean", "timing_s/new_phase", *reversed(TIMING_KEYS)])
    assert timing.phases == [
        "timing_s/gen", "timing_s/reward", "timing_s/old_log_prob", "timing_s/ref", "timing_s/adv",
        "timing_s/update_actor", "timing_s/update_weights", "timing_s/testing", "timing_s/save_checkpoint",
        "timing_s/new_phase",
    ]
    assert timing.breakdown == [
        "timing_s/gen/worker", "timing_s/old_log_prob/worker", "timing_s/ref/worker", "timing_s/update_actor/worker",
        "timing_s/update_weights/gather", "timing_s/update_weights/load", "timing_s/update_weights/transfer",
        "timing_s/update_weights/worker",
    ]
    assert timing.total == "timing_s/step"
    assert split_timing(["timing_s/gen"]).total is None

    with open(tmp_path / "metrics.jsonl", "w") as f:
        for s in range(1, 5):
            row = {"step": s, **{k: 0.1 * (i + 1) for i, k in enumerate(TIMING_KEYS)}}
            if s % 2:  # validation and checkpoints on some steps only
                del row["timing_s/testing"], row["timing_s/save_checkpoint"]
            f.write(json.dumps(row) + "\n")
    written = write_report(tmp_path)
    names = sorted(p.name for p in written)
    assert "timing.png" in names and "timing_breakdown.png" in names and "summary.png" in names
    assert all(p.stat().st_size > 1000 for p in written)
    assert "agents.png" not in names  # single-turn rollouts: no panel of turns and tool calls


def test_report_plots_turns_and_tool_calls_of_agent_runs(tmp_path):
    from grpo_dist.report import write_report

    with open(tmp_path / "metrics.jsonl", "w") as f:
        for s in range(1, 4):
            f.write(json.dumps({"step": s, "num_turns/mean": 2 + s / 2, "agent/tool_calls/mean": s / 3,
                                "critic/score/mean": 0.1 * s}) + "\n")
    names = sorted(p.name for p in write_report(tmp_path))
    assert "agents.png" in names and (tmp_path / "report" / "agents.png").stat().st_size > 1000


@pytest.mark.parametrize("native_bf16", [True, False])
def test_cpu_half_precision_warning(native_bf16, monkeypatch):
    """bfloat16 compute on a CPU without native bf16 is emulated and slower than float32: say so once
    at start-up, naming the keys; float32 (the CPU default) and GPUs never warn."""
    import torch

    from grpo_dist.config.loader import compose, to_typed
    from grpo_dist.config.preflight import cpu_half_precision_warning

    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: native_bf16)

    def cfg(*overrides):
        return to_typed(compose(list(overrides)), list(overrides))

    assert cpu_half_precision_warning(cfg(), "cpu") is None
    bf16 = cfg("actor_rollout_ref.actor.fsdp_config.dtype=bfloat16", "actor_rollout_ref.rollout.dtype=bfloat16")
    assert cpu_half_precision_warning(bf16, "cuda") is None
    msg = cpu_half_precision_warning(bf16, "cpu")
    if native_bf16:
        assert msg is None
    else:
        assert "no native bfloat16" in msg and "actor_rollout_ref.actor.fsdp_config.dtype=float32" in msg
    # the rollout engine alone in bf16 counts too
    only_rollout = cfg("actor_rollout_ref.rollout.dtype=bfloat16")
    assert (cpu_half_precision_warning(only_rollout, "cpu") is None) == native_bf16



REPORT_UNDER_THE_RUNS_LOGGING = """
import sys
from grpo_dist.config import hydra_cli as hc
from grpo_dist.config.loader import compose, to_typed

overrides = ["trainer.default_local_dir=" + sys.argv[1]]
job = hc.prepare_job(compose(overrides, return_hydra_config=True), overrides, num=None, sweep_dir=None, to_typed=to_typed)

def task(cfg, write_files):
    from grpo_dist.report import write_report
    write_report(sys.argv[1])
    print("drawn", flush=True)
    return 0

sys.exit(hc.run_job(job, task))
"""


def test_drawing_the_report_prints_no_matplotlib_log_lines(tmp_path):
    """The report is drawn after the run's summary, under the job's logging (Hydra's job_logging: the root
    logger at INFO on the console): matplotlib's first use builds its font cache and logged
    '[matplotlib.font_manager][INFO] - generated new fontManager' after the summary. A fresh
    MPLCONFIGDIR makes it build the cache here as on a new machine."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with open(run_dir / "metrics.jsonl", "w") as f:
        for s in range(1, 4):
            f.write(json.dumps({"step": s, "critic/score/mean": s / 10, "timing_s/gen": 0.5}) + "\n")
    env = {**os.environ, "MPLCONFIGDIR": str(tmp_path / "mplconfig"), "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, "-c", REPORT_UNDER_THE_RUNS_LOGGING, str(run_dir)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "drawn" in proc.stdout and (run_dir / "report" / "summary.png").stat().st_size > 1000
    assert (tmp_path / "mplconfig").is_dir()  # the font cache was built in this run
    out = proc.stdout + proc.stderr
    assert "matplotlib" not in out and "fontManager" not in out, out


def test_the_report_drawn_beside_the_shutdown_says_a_failure_in_one_line_or_not_at_all(tmp_path, capsys):
    """The run draws its report on a thread while its workers shut down: the PNGs are there once it is waited
    for; a report that cannot be drawn is one line after the summary, and nothing after a failed run's
    message (which stays the last thing printed)."""
    from grpo_dist.trainer.run import _ReportDrawing

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "critic/score/mean": 0.5, "timing_s/gen": 0.5}) + "\n")
    _ReportDrawing(run_dir).finish()
    assert (run_dir / "report" / "summary.png").stat().st_size > 1000 and capsys.readouterr().err == ""
    _ReportDrawing(tmp_path / "no_run").finish()
    assert capsys.readouterr().err.startswith("grpo_dist: could not draw the report: ")
    _ReportDrawing(tmp_path / "no_run").finish(say=False)
    assert capsys.readouterr().err == ""
