"""The newcomer's first command, shortened: `python -m grpo_dist.main` with no model or data given
builds the embedded task and base model (no downloads) and GRPO visibly improves held-out accuracy,
on a quiet console: only grpo_dist's own lines, the libraries' and workers' output in the run's log file."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from tests.e2e.helpers import read_metrics, run_main
from tests.shared_ray import LOCAL_RAY

pytestmark = pytest.mark.slow
VAL = "val-core/grpo_dist/reverse/acc/mean@1"

#: Every line grpo_dist itself writes to the console of the default job: its start-up lines, notes and
#: warnings, the progress bar (tqdm's frames, split at their carriage returns), a line per validation.
OWN_LINES = [re.compile(p) for p in (r"grpo_dist: \S.*", r"GRPO: .*", r"step \d+: val-core/\S+=[-.\d]+( \S+=[-.\d]+)*")]
#: ... and the summary: a blank line, its head, its indented lines.
SUMMARY_HEAD = "grpo_dist: training finished"
SUMMARY_LINE = re.compile(r"  \S.*")


def not_our_lines(stdout: str, stderr: str) -> list[str]:
    """The console lines (stdout and stderr) that are none of grpo_dist's own: library and worker noise."""
    out_lines = stdout.splitlines()
    head = out_lines.index(SUMMARY_HEAD) if SUMMARY_HEAD in out_lines else len(out_lines)
    before = out_lines[:head] + [frame for line in stderr.splitlines() for frame in line.split("\r") if frame]
    summary = out_lines[head + 1:]
    stray = [line for line in before if not any(p.fullmatch(line) for p in OWN_LINES)]
    if head < len(out_lines) and out_lines[head - 1] == "":  # the blank line printed before the summary
        stray.remove("")
    return stray + [line for line in summary if not SUMMARY_LINE.fullmatch(line)]


def keep_the_build(cache: Path) -> None:
    """The embedded base model a fresh-cache run built, kept as the machine's cached copy where the machine has
    none yet (a fresh CI machine): its build is deterministic (the weights are byte for byte the same), so the
    later tests' ``embedded_model`` is this model, not a second minute of both cores building it again."""
    from grpo_dist import tasks
    from grpo_dist.tasks.reverse import VERSION

    name = f"tiny-reverse-{VERSION}"
    built, machine = cache / name, Path(tasks.cache_root()) / name
    if machine.exists() or not (built / "grpo_dist_task.json").exists():
        return
    machine.parent.mkdir(parents=True, exist_ok=True)
    tmp = machine.with_name(f"{name}.tmp-{os.getpid()}")
    shutil.copytree(built, tmp)
    try:
        os.replace(tmp, machine)  # whole or not at all (a build that got there first stays)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


def test_default_job_short_version_learns(tmp_path):
    out = tmp_path / "run"
    # as on a fresh machine: no model cache, no matplotlib font cache; the default log level
    proc = run_main(["trainer.total_training_steps=10", "trainer.test_freq=10", f"trainer.default_local_dir={out}"],
                    env={"GRPO_DIST_CACHE": str(tmp_path / "cache"), "MPLCONFIGDIR": str(tmp_path / "mpl"),
                         "GRPO_DIST_LOG_LEVEL": "", **LOCAL_RAY})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "building the embedded base model" in proc.stdout
    keep_the_build(tmp_path / "cache")
    # the memory-driven defaults say what they chose: the whole mini-batch fits, no recomputation; the
    # CPU KV cache sized from the step (256 sequences of 88 tokens)
    assert "grpo_dist: actor: micro-batch auto: the whole mini-batch" in proc.stdout, proc.stdout[-3000:]
    assert "gradient checkpointing auto: off" in proc.stdout
    assert "grpo_dist: rollout: KV cache 0.25 GiB per engine (auto: 256 sequences x 88 tokens" in proc.stdout
    m = read_metrics(out)
    before, after = m[0][VAL], m[10][VAL]
    # measured on the 2-core CI machines: 0.10-0.12 -> 0.41 in 10 steps (docs/quickstart.md)
    assert after > before + 0.1, (before, after)
    # every step logs the share of groups that taught nothing (all responses scored alike); a learning run keeps
    # it well below the warning's 95 % (0.34-0.81 measured over the 60 steps of the full job)
    ratios = [m[k]["training/zero_advantage_group_ratio"] for k in range(1, 11)]
    assert all(0 < r < 0.95 for r in ratios), ratios
    assert "taught the policy nothing" not in proc.stdout
    assert "GRPO:" in proc.stderr  # the progress bar
    assert "training finished" in proc.stdout and f"{VAL}" in proc.stdout
    for name in ("summary", "reward", "val_accuracy", "kl", "entropy", "response_length", "timing"):
        assert (out / "report" / f"{name}.png").exists()
    # a quiet console: grpo_dist's own lines only, nothing after the summary, the log file named once ...
    assert not_our_lines(proc.stdout, proc.stderr) == [], proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.rstrip().splitlines()[-1].startswith("  metrics, report ")
    log = out / "logs" / "run.log"
    assert proc.stdout.count(str(log)) == 1
    # ... and the workers' output and the libraries' logs in that file: vLLM's records (its own format:
    # "INFO 11-25 20:33:28 [file.py:line]"), written by the worker processes, after the run's header
    text = log.read_text()
    assert text.startswith("==== ") and "---- worker process" in text
    assert re.search(r"(INFO|WARNING) \d\d-\d\d \d\d:\d\d:\d\d \[\w+\.py:\d+\]", text), text[-3000:]
