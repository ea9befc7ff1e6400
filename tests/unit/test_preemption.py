"""SIGTERM with a grace period: save at the step boundary when it fits, else stop at once saying where
the newest checkpoint is; a failing save names the folder and the OS error and leaves the others."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from grpo_dist.trainer import checkpoint
from grpo_dist.trainer.stop import Interrupted, StopRequested, StopSignal


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def installed():
    """A StopSignal factory whose handlers are installed in this (the main) thread and removed after."""
    made = []

    def make(*args, **kwargs) -> StopSignal:
        s = StopSignal(*args, **kwargs)
        s.install()
        made.append(s)
        return s

    yield make
    for s in made:
        s.uninstall()


def run_steps(stop: StopSignal, clock: Clock, step_s: list[float], save_s: float | None = None) -> None:
    stop.training()
    for k, seconds in enumerate(step_s, start=1):
        stop.step_begins(k)
        clock.t += seconds
        stop.step_work_done()
        if save_s is not None:
            stop.saved(f"/ckpt/global_step_{k}", save_s)


def test_signal_during_start_up_stops_at_once(installed):
    stop = installed(300, "/runs/x")
    with pytest.raises(Interrupted) as err:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
    assert str(err.value) == ("stopped on SIGTERM during start-up; no checkpoint was taken; this run has no checkpoint "
                              "in /runs/x yet: a rerun starts from the beginning")


class RaisesInAFinalizer:
    """Its finalizer sends SIGTERM: the handler's exception is raised inside ``__del__``, where Python cannot
    raise it (as in the logging module's fork handlers while Ray starts processes)."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)


def test_a_stop_raised_where_python_ignores_exceptions_is_raised_again_without_a_traceback(installed, capsys):
    import sys

    before = sys.unraisablehook
    stop = installed(300, "/runs/x")
    with pytest.raises(Interrupted) as err:
        obj = RaisesInAFinalizer()
        del obj  # the signal's exception lands in the finalizer: ignored by Python, then raised again
        time.sleep(5)  # the redelivery raises before this ends
    assert str(err.value).startswith("stopped on SIGTERM during start-up")
    assert "Exception ignored" not in capsys.readouterr().err
    stop.uninstall()
    assert sys.unraisablehook is before  # given back


def test_step_boundary_within_the_grace_period_is_waited_for(installed):
    clock = Clock()
    stop = installed(300, "/runs/x", clock=clock)  # margin: min(30, 300 / 10) = 30 s
    run_steps(stop, clock, [40.0, 60.0], save_s=20.0)
    stop.step_begins(3)
    clock.t += 10.0
    stop._handle(signal.SIGTERM, None)  # 50 s of the step left + 20 s save = 70 s < 270 s: wait for it
    assert stop.requested == "SIGTERM" and stop.seconds_to_checkpoint() == pytest.approx(70.0)
    assert stop.deadline_armed and stop._timer.interval == pytest.approx(270)  # the grace period's deadline
    stop.saved("/ckpt/global_step_3", 15.0)
    assert not stop.deadline_armed  # saved: the deadline no longer matters
    with pytest.raises(StopRequested, match="stopped on SIGTERM after step 3; saved /ckpt/global_step_3"):
        stop.raise_if_requested(3, "/ckpt/global_step_3")


def test_step_that_cannot_end_and_save_in_time_stops_at_once_naming_the_newest_checkpoint(installed):
    clock = Clock()
    stop = installed(120, "/runs/x", clock=clock)  # budget 120 - 12 = 108 s
    run_steps(stop, clock, [100.0, 90.0], save_s=30.0)
    stop.step_begins(3)
    clock.t += 5.0
    with pytest.raises(Interrupted) as err:
        stop._handle(signal.SIGTERM, None)  # 95 s of the step left + 30 s save = 125 s > 108 s
    assert str(err.value) == (
        "stopped on SIGTERM during step 3: finishing the step and saving a checkpoint would take about 125s, more "
        "than trainer.preemption_grace_s=120 allows; no checkpoint was taken; the newest checkpoint is "
        "/ckpt/global_step_2: rerun the same command to resume from it")


def test_grace_period_that_runs_out_stops_with_a_message(installed):
    stop = installed(0.5, "/runs/x", margin_s=0.3)
    stop.training()
    stop.step_begins(1)  # nothing measured yet: the run tries, and the deadline still holds
    stop._handle(signal.SIGTERM, None)
    with pytest.raises(Interrupted, match=r"stopped on SIGTERM during step 1: trainer.preemption_grace_s=0.5 ran out "
                                          r"before the step and its checkpoint were done; no checkpoint was taken"):
        time.sleep(5)


def test_second_signal_and_no_limit(installed):
    clock = Clock()
    unlimited = installed(0, "/runs/x", clock=clock)
    run_steps(unlimited, clock, [10_000.0], save_s=5_000.0)
    unlimited.step_begins(2)
    unlimited._handle(signal.SIGTERM, None)  # 0 = no limit: always finish the step and save
    assert unlimited.requested and not unlimited.deadline_armed
    with pytest.raises(Interrupted, match="stopped on a second SIGTERM during step 2; no checkpoint was taken; "
                                          "the newest checkpoint is /ckpt/global_step_1"):
        unlimited._handle(signal.SIGTERM, None)


def test_signal_while_a_worker_call_is_pending_names_it_and_its_deadline_at_once(installed, capfd):
    """A SIGTERM whose stop waits for the step boundary says at once what the run waits for and until
    when: a frozen worker otherwise left the run silent for minutes after the signal."""
    from grpo_dist.distributed.waiting import Waiting

    stop = installed(300, "/runs/x")
    run_steps(stop, Clock(), [10.0], save_s=5.0)
    stop.step_begins(2)
    with Waiting(lambda: "rollout worker rank 0", "wake_up", time.monotonic() + 52.4):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # the handler runs in this thread between two bytecodes
        assert stop.requested == "SIGTERM"
    out = capfd.readouterr().out
    line = next((l for l in out.splitlines() if "SIGTERM received" in l), "")
    assert re.fullmatch(r"grpo_dist: SIGTERM received during step 2: stopping after the step and its checkpoint "
                        r"\(by \d\d:\d\d:\d\d, within trainer.preemption_grace_s=300\); now waiting for rollout "
                        r"worker rank 0's wake_up \(deadline \d\d:\d\d:\d\d, in 5[12] s\)", line), out
    # no limit, no worker call pending: said too
    unlimited = StopSignal(0, "/runs/y")  # not installed: its handler is called directly
    run_steps(unlimited, Clock(), [10.0])
    unlimited.step_begins(2)
    unlimited._handle(signal.SIGTERM, None)
    assert ("stopping after the step and its checkpoint (no time limit: trainer.preemption_grace_s=0); now not "
            "waiting for a worker") in capfd.readouterr().out


def test_handler_is_restored_and_sigalrm_left_alone():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGALRM), signal.getitimer(signal.ITIMER_REAL)
    s = StopSignal(10)
    s.install()
    assert signal.getsignal(signal.SIGTERM) == s._handle
    s.uninstall()
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGALRM)) == before[:2]
    assert (signal.getitimer(signal.ITIMER_REAL)[0] > 0) == (before[2][0] > 0)


# ---- a save that the disk refuses ---------------------------------------------------------------------
def trainer_at_step(root: Path, step: int, workers) -> "GRPOTrainer":  # noqa: F821
    """The driver's save path with stand-in workers (orchestration only: what save() does around them)."""
    from grpo_dist.trainer.driver import GRPOTrainer
    from grpo_dist.trainer.summary import RunSummary

    t = GRPOTrainer.__new__(GRPOTrainer)
    t.plan = SimpleNamespace(checkpoint_root=str(root), max_ckpt_to_keep=None, export_hf_every_checkpoint=False,
                             fully_async=None)
    t.global_step, t.total_steps, t.workers, t.iterative = step, 10, workers, None
    t.policy_version = step
    t.engines = SimpleNamespace(save=lambda tmp: None, state=lambda: {})  # nothing generated ahead
    t.sampler = SimpleNamespace(state_dict=lambda: {"epoch": 0})
    t.kl_ctrl = SimpleNamespace(value=0.0)
    t.summary, t.stop = RunSummary(out_dir=str(root)), StopSignal(0, str(root))
    return t


def test_signal_after_the_save_decision_still_saves_the_step_it_stops_after(tmp_path):
    """A SIGTERM that lands after the loop decided not to save (while the step's row is logged) used to end
    the run naming no checkpoint (or an older one); the boundary check now writes the step's checkpoint."""
    workers = DiskWorkers()
    t = trainer_at_step(tmp_path, 3, workers)
    t.stop.training()
    t.stop.at_step_boundary(3, None, t.save)  # no signal: nothing saved, the run goes on
    assert not list(tmp_path.glob("global_step_*"))
    t.stop._handle(signal.SIGTERM, None)  # grace 0: no deadline, the step boundary is waited for
    with pytest.raises(StopRequested) as err:
        t.stop.at_step_boundary(3, None, t.save)
    assert str(err.value).startswith(f"stopped on SIGTERM after step 3; saved {tmp_path / 'global_step_3'}")
    assert checkpoint.latest_checkpoint(tmp_path) == tmp_path / "global_step_3"
    # the loop's own save of the step is not repeated
    t.global_step = 4
    first = t.save()
    mtime = (tmp_path / "global_step_4" / "actor" / "shard.bin").stat().st_mtime_ns
    with pytest.raises(StopRequested, match="after step 4; saved .*global_step_4"):
        t.stop.at_step_boundary(4, first, t.save)
    assert (tmp_path / "global_step_4" / "actor" / "shard.bin").stat().st_mtime_ns == mtime


class DiskWorkers:
    """Writes a shard like the actor's workers do; ``fail`` makes the write raise what a full disk raises."""

    def __init__(self) -> None:
        self.fail: BaseException | None = None

    def save(self, directory: Path, *, export_hf: bool) -> None:
        if self.fail is not None:
            raise self.fail
        (directory / "actor").mkdir()
        (directory / "actor" / "shard.bin").write_bytes(b"w" * 32)


@pytest.mark.parametrize("where", ["worker", "driver"])
def test_save_that_fails_names_the_folder_and_leaves_the_previous_checkpoints(tmp_path, monkeypatch, where):
    from grpo_dist.distributed.worker_group import WorkerError
    from grpo_dist.trainer.summary import CheckpointSaveError

    workers = DiskWorkers()
    t = trainer_at_step(tmp_path, 1, workers)
    first = t.save()
    assert first == str(tmp_path / "global_step_1")
    t.global_step = 2
    if where == "worker":
        workers.fail = WorkerError("actor worker rank 0 failed during save_checkpoint: OSError: [Errno 28] No space "
                                   "left on device", cause=OSError(28, "No space left on device"))
    else:
        def full_disk(*args, **kwargs):
            raise OSError(28, "No space left on device", str(tmp_path / ".global_step_2.tmp" / "manifest.json"))

        monkeypatch.setattr(checkpoint, "write_manifest", full_disk)
    with pytest.raises(CheckpointSaveError) as err:
        t.save()
    msg = str(err.value)
    assert f"could not save the checkpoint of step 2 under {tmp_path / '.global_step_2.tmp'}" in msg
    assert "No space left on device" in msg
    assert f"the previous checkpoints are intact (newest: {first})" in msg
    assert "rerun the same command to resume" in msg
    # nothing a resume reads has changed: the step-1 checkpoint verifies and is the one chosen
    assert not (tmp_path / ".global_step_2.tmp").exists() and not (tmp_path / "global_step_2").exists()
    resume = checkpoint.choose_resume(SimpleNamespace(default_local_dir=str(tmp_path), resume_mode="auto",
                                                      resume_from_path=None))
    assert resume.path == tmp_path / "global_step_1"


@pytest.mark.parametrize("free_mib", [1.2, 10_000])
def test_torch_writer_failing_on_a_full_disk_is_a_save_failure_naming_the_space_left(tmp_path, monkeypatch, free_mib):
    """torch's zip writer reports a full disk as a RuntimeError, not an OSError (seen on a disk with 1 MiB
    left): the run still ends with the save-failure message, saying how much space was left when little."""
    from collections import namedtuple

    from grpo_dist.distributed.worker_group import WorkerError
    from grpo_dist.trainer.summary import CheckpointSaveError

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: usage(2**40, 2**40, int(free_mib * 2**20)))
    workers = DiskWorkers()
    text = "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"
    workers.fail = WorkerError(f"actor worker rank 0 failed during save_checkpoint: RuntimeError: {text}",
                               cause=RuntimeError(text))
    with pytest.raises(CheckpointSaveError) as err:
        trainer_at_step(tmp_path, 1, workers).save()
    msg = str(err.value)
    assert "unexpected pos 704 vs 598" in msg and "no earlier checkpoint of this run exists" in msg
    assert ("(the disk holding it has 1.2 MiB free)" in msg) == (free_mib < 64)
    assert not (tmp_path / ".global_step_1.tmp").exists()


def test_any_worker_error_while_the_disk_is_full_is_a_save_failure(tmp_path, monkeypatch):
    from collections import namedtuple

    from grpo_dist.distributed.worker_group import WorkerError
    from grpo_dist.trainer.summary import CheckpointSaveError

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: usage(2**40, 2**40, 0))
    workers = DiskWorkers()
    workers.fail = WorkerError("actor worker rank 0 failed during save_checkpoint: ValueError: short write",
                               cause=ValueError("short write"))
    with pytest.raises(CheckpointSaveError, match=r"short write \(the disk holding it has 0.0 MiB free\)"):
        trainer_at_step(tmp_path, 1, workers).save()
    # a lost worker is not the disk's fault, whatever the space left
    workers.fail = WorkerError("actor worker rank 0 failed during save_checkpoint: ActorDiedError", kind="lost")
    with pytest.raises(WorkerError, match="ActorDiedError"):
        trainer_at_step(tmp_path, 1, workers).save()


def test_a_worker_error_that_is_not_the_disk_is_not_called_a_save_failure(tmp_path):
    from grpo_dist.distributed.worker_group import WorkerError

    workers = DiskWorkers()
    workers.fail = WorkerError("actor worker rank 0 failed during save_checkpoint: ActorDiedError", kind="lost")
    with pytest.raises(WorkerError, match="ActorDiedError"):
        trainer_at_step(tmp_path, 1, workers).save()
