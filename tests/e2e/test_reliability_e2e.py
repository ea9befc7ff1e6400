"""Faults a user will meet: each gets one clear message (or is counted), never a traceback wall."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_dist.trainer import checkpoint
from tests.e2e.helpers import ROOT, base_args, read_metrics, run_main, start_main, worker_process
from tests.shared_ray import LOCAL_RAY
from tests.unit.test_startup_checks import good_row

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent
# A lighter stack for the fault tests: one rank, Hugging Face rollout, no reference model.
LIGHT = ["trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.actor.use_kl_loss=false",
         "trainer.val_before_train=false", "trainer.test_freq=-1"]


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:  # exited meanwhile
        return []


def assert_one_message(proc: subprocess.CompletedProcess, *needles: str, code: int | None = None) -> str:
    err = proc.stderr
    assert proc.returncode != 0 and (code is None or proc.returncode == code), (proc.returncode, err[-3000:])
    assert "Traceback" not in err, err[-3000:]
    line = next((l for l in err.splitlines() if l.startswith("grpo_dist: ")), "")
    assert line, err[-3000:]
    tail = err[err.index(line):]
    for n in needles:
        assert n in tail, f"{n!r} not in: {tail}"
    # the message ends the output: no worker's log line (Ray forwards them late) comes after it
    after = [l for l in tail.splitlines()[1:] if l.strip() and not l.startswith("  ")]
    assert not after, f"printed after the message: {after}"
    return tail


def write_parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


# --------------------------------------------------------------- checks before any model is loaded
def test_missing_column_names_the_file_and_the_column(tiny_model_dir, reverse_data, tmp_path):
    """The command line's exit code and message for a data file found wrong at start-up, once Ray and the
    workers' processes have started. The other faults of the same kind take the same path to the same
    message, in process (tests/unit/test_startup_checks.py: an empty file, a malformed prompt, an overlong
    prompt, a response longer than the model's context, a tokenizer larger than the model, GPUs the cluster
    lacks; an unwritable output folder, in a process of its own)."""
    rows = [good_row(i) for i in range(4)]
    for r in rows:
        del r["data_source"]
    f = write_parquet(tmp_path / "nocol.parquet", rows)
    proc = run_main(base_args(tiny_model_dir, reverse_data, tmp_path / "o1", 1) + [f"data.train_files={f}"])
    assert_one_message(proc, "nocol.parquet", "data_source", code=2)


def test_output_directory_of_a_running_run_is_refused(tiny_model_dir, reverse_data, tmp_path):
    """A second run on a directory another live run holds stops before starting anything and leaves the
    other run's files alone."""
    import socket

    out = tmp_path / "o"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        lock = out / ".grpo_dist.lock"
        lock.write_text(json.dumps({"host": socket.gethostname(), "pid": holder.pid, "started": "earlier"}))
        (out / "metrics.jsonl").write_text('{"step": 1}\n')
        proc = run_main(base_args(tiny_model_dir, reverse_data, out, 1) + LIGHT)
        assert_one_message(proc, f"is in use by another grpo_dist run (pid {holder.pid}", code=2)
        assert lock.exists() and (out / "metrics.jsonl").read_text() == '{"step": 1}\n'
        assert not (out / "config.yaml").exists()
    finally:
        holder.kill()


def test_wrong_reward_function_name_is_named_before_workers_start(tiny_model_dir, reverse_data, tmp_path):
    args = base_args(tiny_model_dir, reverse_data, tmp_path / "o", 1) + LIGHT + [
        f"custom_reward_function.path={HERE / 'reward_faulty.py'}", "custom_reward_function.name=no_such_function"]
    t0 = time.time()
    proc = run_main(args)
    # (a function that fails when tried once before the run: tests/unit/test_startup_checks.py, in process)
    assert_one_message(proc, "no_such_function", "always_raises", code=2)  # the functions the file has
    assert "rerun" not in proc.stderr, "a rerun cannot fix a wrong name"
    assert time.time() - t0 < 60 and not (tmp_path / "o" / "placement.json").exists(), "no worker was started"


# --------------------------------------------------------------- faults during training
def test_reward_function_that_raises_stops_naming_the_sample(tiny_model_dir, reverse_data, tmp_path):
    """(A function that returns text instead of a number: the same path from the reward worker to the
    driver's message, in process: tests/unit/test_run_messages.py's
    test_a_reward_function_returning_text_names_the_sample_and_what_to_fix.)"""
    args = base_args(tiny_model_dir, reverse_data, tmp_path / "o", 2) + LIGHT + [
        f"custom_reward_function.path={HERE / 'reward_faulty.py'}", "custom_reward_function.name=raises_unless_exact"]
    proc = run_main(args)
    tail = assert_one_message(proc, "reward", "raises_unless_exact", "ZeroDivisionError", "grpo_dist/reverse",
                              f"{HERE / 'reward_faulty.py'}:", "(in raises_unless_exact)", code=1)
    assert "rerun the same command" not in tail and "reward_model.on_error=zero" in tail, tail
    # the run's log file keeps Ray's whole report of the failed call, the traceback in the worker included
    log = (tmp_path / "o" / "logs" / "run.log").read_text()
    assert "the run stops: reward worker failed" in log, log[-3000:]
    report = log[log.index("the run stops: reward worker failed"):]
    assert "ray::RewardWorker.compute() (pid=" in report and 'grpo_dist/workers/reward.py", line ' in report, report
    assert "RewardError: reward function raises_unless_exact" in report, report


def test_reward_faults_scored_zero_and_counted(tiny_model_dir, reverse_data, tmp_path):
    out = tmp_path / "o"
    args = base_args(tiny_model_dir, reverse_data, out, 1) + LIGHT + [
        f"custom_reward_function.path={HERE / 'reward_faulty.py'}", "custom_reward_function.name=mixed_faults",
        "reward_model.on_error=zero", "reward_model.timeout_s=2", "reward_model.num_workers=2",
        "data.shuffle=false"]
    proc = run_main(args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # row 0 hangs: the trial call before the run says so, and the run goes on (on_error=zero)
    assert "grpo_dist: warning: reward function mixed_faults" in proc.stderr and "timed out after 2 s" in proc.stderr
    assert re.search(r"reward errors +\d+ of \d+ scores failed", proc.stdout), proc.stdout[-2000:]
    m = read_metrics(out)[1]
    # prompts 0..3 (indices 0,1,2,3), 4 responses each: one hangs, one raises, one returns NaN per group of 4
    assert m["reward/num_timeouts"] == 4
    assert m["reward/num_errors"] == 8
    assert m["critic/score/min"] == 0.0


def test_repeated_nonfinite_updates_stop_after_saving(tiny_model_dir, reverse_data, tmp_path):
    out = tmp_path / "o"
    args = base_args(tiny_model_dir, reverse_data, out, 8) + LIGHT + [
        f"custom_reward_function.path={HERE / 'reward_faulty.py'}", "custom_reward_function.name=huge_when_odd",
        "algorithm.norm_adv_by_std_in_grpo=false", "trainer.max_consecutive_nonfinite_steps=2"]
    proc = run_main(args)
    tail = assert_one_message(proc, "2 steps in a row", "non-finite", "optim.lr", code=1)
    saved = [p for p in out.glob("global_step_*")]
    assert saved and str(saved[0]) in tail
    m = read_metrics(out)
    assert any(r.get("actor/grad_norm_nonfinite_count", 0) > 0 for r in m.values())


def test_dynamic_sampling_that_keeps_no_group_is_one_message(tiny_model_dir, reverse_data, tmp_path):
    """DAPO's filter_groups with a reward that never differs within a group exhausts
    max_num_gen_batches: one message saying what to change, no traceback, no rerun hint (a rerun would
    meet the same data)."""
    args = base_args(tiny_model_dir, reverse_data, tmp_path / "o", 1) + LIGHT + [
        f"custom_reward_function.path={HERE / 'reward_faulty.py'}", "custom_reward_function.name=constant",
        "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc",
        "algorithm.filter_groups.max_num_gen_batches=1"]
    proc = run_main(args)
    tail = assert_one_message(proc, "dynamic sampling kept 0 of the 4 prompts", "max_num_gen_batches",
                              "on_exhausted=train", code=1)
    assert "rerun the same command" not in tail, tail


def test_sigterm_at_any_moment_of_start_up_is_one_message_and_143(tiny_model_dir, reverse_data, tmp_path):
    """A SIGTERM while Python loads, while Ray starts, and while the driver waits for the workers to start
    (a signal inside Ray's own wait once ended in a SystemError traceback): exit code 143 and one message
    each time, saying what a rerun does."""
    args = base_args(tiny_model_dir, reverse_data, tmp_path / "o", 40) + LIGHT

    def ray_started(root: psutil.Process) -> bool:
        return any(p.name() in ("raylet", "gcs_server") for p in root.children(recursive=True))

    def workers_starting(root: psutil.Process) -> bool:
        return any(any(c.startswith("ray::") and "IDLE" not in c for c in _cmdline(p))
                   for p in root.children(recursive=True))

    def loading(root: psutil.Process) -> bool:  # Python loads the modules (main's first lines have run)
        return time.time() - root.create_time() > 1.0

    moments = {"loading": loading, "ray": ray_started, "workers": workers_starting}
    for name, ready in moments.items():
        # its own Ray instance, started under the driver (the moment "ray" is seen among its children)
        proc = subprocess.Popen([sys.executable, "-m", "grpo_dist.main", *args], cwd=ROOT,
                                env=dict(os.environ, PYTHONUNBUFFERED="1", **LOCAL_RAY), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.time() + 240
            root = psutil.Process(proc.pid)
            while time.time() < deadline and proc.poll() is None:
                try:
                    if ready(root):
                        break
                except psutil.Error:
                    pass
                time.sleep(0.2)
            assert proc.poll() is None, (name, proc.communicate()[1][-3000:])
            time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 143, (name, err[-3000:])
        tail = assert_one_message(subprocess.CompletedProcess(args, 143, "", err), "stopped on SIGTERM during start-up")
        assert "rerun the same command to start" in tail, (name, tail)
        assert not (tmp_path / "o" / ".grpo_dist.lock").exists(), name  # the run let go of its folder


# the weights cross the pools by broadcast (verl's nccl checkpoint engine; gloo here): a death on either side of it
# is named as any other
SPLIT_POOLS = ["actor_rollout_ref.hybrid_engine=false", "trainer.n_gpus_per_node=1", "rollout.nnodes=1",
               "rollout.n_gpus_per_node=1", "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"]


@pytest.mark.parametrize("layout, victim", [("colocated", "ray::ModelWorker"), ("separate", "ray::RolloutWorker"),
                                            ("separate", "ray::ModelWorker")])
def test_dead_worker_stops_the_run_naming_it(tiny_model_dir, reverse_data, tmp_path, layout, victim):
    """A killed worker stops the run within two minutes with one message naming it and saying the same
    command resumes: the actor's process in the colocated layout; under one-step-off-policy
    (``hybrid_engine=false``, the weights broadcast across the pools) the rollout pool's engine, where the driver
    is waiting on a generation started during the previous step when it dies, and the trainer pool's rank, while
    the rollout pool generates ahead. That the resume is exact (from the newest checkpoint) is
    tested on the run whose model worker (actor, reference, critic) is killed, tests/e2e/test_ppo_e2e.py,
    and on a one-step-off checkpoint in tests/e2e/test_one_step_off_e2e.py."""
    out = tmp_path / "o"
    args = base_args(tiny_model_dir, reverse_data, out, 40) + [
        "trainer.save_freq=1", "trainer.val_before_train=false", "trainer.test_freq=-1"]
    if layout == "separate":
        args += SPLIT_POOLS
    proc = start_main(args)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not (out / "global_step_2").exists():
            time.sleep(0.5)
            assert proc.poll() is None, proc.communicate()[1][-3000:]
        worker_process(out, victim).send_signal(signal.SIGKILL)
        t_kill = time.time()
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert time.time() - t_kill < 120
    assert proc.returncode == 1
    msg = next((line for line in err.splitlines() if line.startswith("grpo_dist: error:")), "")
    if victim == "ray::ModelWorker":
        # the process holds the rank's actor and reference: the call that saw it die names its role, and the other
        named = re.search(r"(actor|reference) worker rank \d failed during \w+: ActorDiedError", msg)
        assert named and ("actor worker" in msg or "also held the actor" in msg), err[-6000:]
    else:
        assert re.search(r"rollout worker rank 0 failed during \w+: ActorDiedError", msg), err[-6000:]
    assert "Traceback" not in err and "rerun the same command" in err, err[-6000:]
    assert err.rstrip().endswith("that verifies"), err[-3000:]  # the message is the last thing printed
    assert f"what it wrote last is in {out / 'logs' / 'run.log'}" in err, err[-3000:]  # the workers' output


LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def listening_addresses(root: psutil.Process) -> dict[str, set[str]]:
    """The addresses the processes under ``root`` (this run's Ray: GCS, raylet, workers, agents)
    listen on, by process name."""
    seen: dict[str, set[str]] = {}
    for p in root.children(recursive=True):
        try:
            conns = p.net_connections(kind="inet")
            name = p.name()
        except psutil.Error:  # exited meanwhile
            continue
        for c in conns:
            if c.status == psutil.CONN_LISTEN:
                seen.setdefault(name, set()).add(c.laddr.ip)
    return seen


def test_sigterm_saves_at_the_step_boundary_and_exits(tiny_model_dir, reverse_data, tmp_path):
    """What Slurm and Kubernetes send before killing a job: the run finishes its step, saves, and exits
    with one message and code 143; the checkpoint is the step it names.

    The same run shows that a locally started Ray serves this machine only: while it trains, every
    socket its processes listen on is on the loopback interface."""
    out = tmp_path / "o"
    args = base_args(tiny_model_dir, reverse_data, out, 40) + LIGHT + ["trainer.save_freq=-1"]
    proc = subprocess.Popen([sys.executable, "-m", "grpo_dist.main", *args], cwd=ROOT,
                            env=dict(os.environ, PYTHONUNBUFFERED="1", **LOCAL_RAY), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not ((out / "metrics.jsonl").exists() and read_metrics(out).get(1)):
            time.sleep(0.3)
            assert proc.poll() is None, proc.communicate()[1][-3000:]
        listening = listening_addresses(psutil.Process(proc.pid))
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err[-3000:]
    tail = assert_one_message(subprocess.CompletedProcess(args, proc.returncode, "", err), "stopped on SIGTERM after step")
    step = int(tail.split("after step ")[1].split(";")[0])
    assert (out / f"global_step_{step}").is_dir() and max(read_metrics(out)) == step
    assert "rerun the same command to resume" in tail
    assert {"gcs_server", "raylet"} <= set(listening), listening  # the check saw Ray's servers
    exposed = {name: ips - LOOPBACK for name, ips in listening.items() if ips - LOOPBACK}
    assert not exposed, f"Ray processes listen beyond the loopback interface: {exposed}"


class Run:
    """``python -m grpo_dist.main`` in the background, its output lines read as they come (with the time
    each arrived)."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.out_dir = Path(next(a.split("=", 1)[1] for a in args if a.startswith("trainer.default_local_dir=")))
        self.proc = start_main(args, env)
        self.out: list[tuple[float, str]] = []
        self.err: list[tuple[float, str]] = []
        self.readers = [threading.Thread(target=self._read, args=(pipe, lines), daemon=True)
                        for pipe, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for r in self.readers:
            r.start()
        self.stopped: psutil.Process | None = None

    @staticmethod
    def _read(pipe, lines: list) -> None:
        for line in pipe:
            lines.append((time.time(), line.rstrip("\n")))

    def stdout(self) -> str:
        return "\n".join(l for _, l in self.out)

    def stderr(self) -> str:
        return "\n".join(l for _, l in self.err)

    def wait_for(self, what: str, ready, timeout: float = 600) -> None:
        end = time.time() + timeout
        while not ready():
            assert self.proc.poll() is None, f"the run ended before {what}: {self.stderr()[-3000:]}"
            assert time.time() < end, f"no {what} within {timeout}s: {self.stderr()[-3000:]}"
            time.sleep(0.1)

    def freeze(self, title: str) -> psutil.Process:
        """SIGSTOP this run's (not another's) worker process whose title is ``title``."""
        self.stopped = worker_process(self.out_dir, title)
        self.stopped.send_signal(signal.SIGSTOP)
        return self.stopped

    def finish(self, timeout: float) -> None:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.stopped is not None and self.stopped.is_running():
                self.stopped.send_signal(signal.SIGCONT)
                self.stopped.kill()
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            for r in self.readers:
                r.join(timeout=10)

    def message(self) -> str:
        """The run's failure message (checked: one message, the last thing printed, no traceback)."""
        return assert_one_message(subprocess.CompletedProcess([], self.proc.returncode, "", self.stderr() + "\n"))


# short worker-call deadlines set through their keys: a frozen worker is named within seconds, not the
# default minute (that the defaults name one within two minutes: tests/unit/test_run_messages.py)
SHORT_DEADLINES = ["trainer.worker_call_timeout_min_s=15", "trainer.worker_call_timeout_factor=2"]


def later_call_deadline(msg: str) -> int:
    """The deadline a frozen-worker message names (``within N s``), checked against the rule it states:
    max(worker_call_timeout_min_s=15, worker_call_timeout_factor=2 x the slowest such call so far)."""
    within = int(re.search(r"did not answer \w+ within (\d+)s", msg).group(1))
    slowest = float(re.search(r"trainer.worker_call_timeout_min_s=15, trainer.worker_call_timeout_factor=2 x the "
                              r"slowest \w+ so far, ([\d.]+)s\)", msg).group(1))
    assert abs(within - max(15.0, 2 * slowest)) <= 1, (within, slowest, msg)  # both rounded in the message
    return within


def test_frozen_workers_are_named_within_the_deadline_and_a_rerun_resumes(embedded_model, tmp_path):
    """The default job (the embedded task, whose worker calls take a fraction of a second) with short
    call deadlines (trainer.worker_call_timeout_min_s=15): a rollout worker stopped with SIGSTOP after
    step 1 is named as frozen, alive and stopped (not dead), within its deadline; a SIGTERM sent
    meanwhile says at once what the run waits for and until when. Nothing is lost: the newest
    checkpoint verifies, and the same command resumes from it; in that rerun a frozen actor rank (its
    ``ray::ModelWorker`` process, which holds the reference too) is named within its deadline as well."""
    out = tmp_path / "o"
    args = ["trainer.total_training_steps=40", "trainer.save_freq=1", "trainer.val_before_train=false",
            "trainer.test_freq=-1", "trainer.progress_bar=false", f"trainer.default_local_dir={out}", *SHORT_DEADLINES]
    env = {"GRPO_DIST_CACHE": str(embedded_model.parent)}
    sleep_s = 8

    # ---- 1. the rollout worker freezes after step 1
    run = Run(args, env)
    try:
        run.wait_for("checkpoint of step 1", lambda: (out / "global_step_1").is_dir())
        victim = run.freeze("ray::RolloutWorker")
        t_stop = time.time()
        time.sleep(sleep_s)  # by now the driver waits for the frozen worker (a step's other work takes seconds)
        assert run.proc.poll() is None, run.stderr()[-3000:]
        t_term = time.time()
        run.proc.send_signal(signal.SIGTERM)
        run.wait_for("a line on SIGTERM", lambda: any("SIGTERM received" in l for _, l in run.out), timeout=60)
        t_said, said = next((t, l) for t, l in run.out if "SIGTERM received" in l)
        run.finish(timeout=300)
    finally:
        if run.proc.poll() is None:
            run.finish(timeout=1)
    assert t_said - t_term < 5, (t_said - t_term, said)  # at once, not at the step's end
    assert re.search(r"during step \d+: stopping after the step and its checkpoint \(by \d\d:\d\d:\d\d, within "
                     r"trainer.preemption_grace_s=300\); now waiting for rollout worker rank 0's \w+ \(deadline "
                     r"\d\d:\d\d:\d\d, in \d+ s\)", said), said
    assert run.proc.returncode == 1, run.stderr()[-3000:]
    msg = run.message()
    deadline = later_call_deadline(msg)
    # the later-call deadline, counted from the call (which started after the freeze, give or take a moment)
    assert int(said.rsplit("in ", 1)[1].split()[0]) <= deadline - sleep_s + 5, (deadline, said)
    named = max(t for t, l in run.err if l.startswith("grpo_dist: error:"))
    assert named - t_stop < deadline + 30, (named - t_stop, deadline)
    assert re.match(r"grpo_dist: error: rollout worker rank 0 is frozen: its process is alive but did not answer "
                    rf"\w+ within {deadline}s \(stopped by a signal: state T; node 127.0.0.1 \(Ray node \w+\), pid "
                    rf"{victim.pid}\)", msg), msg
    assert "trainer.worker_call_timeout_min_s=15" in msg and "rerun the same command to resume" in msg
    assert "died" not in msg, msg

    # ---- 2. nothing was lost: the newest checkpoint verifies, and the same command resumes from it
    newest = checkpoint.latest_checkpoint(out)
    assert newest is not None and checkpoint.problem_with(newest) is None
    step = int(newest.name.split("_")[-1])
    assert step >= 1 and max(read_metrics(out)) == step
    rerun = Run(args, env)
    try:
        rerun.wait_for(f"step {step + 1} of the rerun", lambda: (out / f"global_step_{step + 1}").is_dir())
        assert f"grpo_dist: resumed from {newest} (step {step})" in rerun.stdout()

        # ---- 3. an actor rank freezes
        victim = rerun.freeze("ray::ModelWorker")
        t_stop = time.time()
        rerun.finish(timeout=300)
    finally:
        if rerun.proc.poll() is None:
            rerun.finish(timeout=1)
    assert rerun.proc.returncode == 1, rerun.stderr()[-3000:]
    msg = rerun.message()
    deadline = later_call_deadline(msg)
    named = max(t for t, l in rerun.err if l.startswith("grpo_dist: error:"))
    assert named - t_stop < deadline + 30, (named - t_stop, deadline)
    assert re.match(r"grpo_dist: error: (actor|reference) worker rank 0 is frozen: its process is alive but did not "
                    rf"answer \w+ within {deadline}s \(stopped by a signal: state T; .*pid {victim.pid}\)", msg), msg
    assert "actor worker" in msg or "also held the actor" in msg, msg
    # the resumed run logged each step once, continuing from the checkpoint
    rows = [json.loads(l)["step"] for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows == sorted(set(rows)) and step + 1 in rows, rows


def test_no_secret_reaches_logs_configs_or_checkpoints(full_run):
    out, proc = full_run
    secret = os.environ["WANDB_API_KEY"]
    assert secret not in proc.stdout and secret not in proc.stderr
    for f in out.rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f
    assert (out / "config.yaml").exists()
