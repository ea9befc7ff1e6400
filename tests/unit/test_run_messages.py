"""What a user reads when a run cannot go on: one message each, and the rerun hint only where a rerun helps.

The worker failures are built from Ray's own exception classes (what ``ray.get`` raises); the runs go
through ``grpo_dist.trainer.run.run`` with the tiny model up to the point where Ray would start.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import ray

from grpo_dist.config.loader import compose, to_typed
from grpo_dist.config.spec import resolve
from grpo_dist.distributed import worker_group
from grpo_dist.distributed.worker_group import RayStartError, WorkerError, classify
from grpo_dist.rewards.manager import RewardError
from grpo_dist.trainer import checkpoint
from grpo_dist.trainer.run import run, worker_failure_message
from grpo_dist.training.errors import UnsafeCheckpointError

RERUN = "rerun the same command to resume"


def task_error(cause: BaseException) -> BaseException:
    """What ``ray.get`` raises when a worker method raised ``cause``."""
    err = ray.exceptions.RayTaskError("compute", "Traceback ...", cause, proctitle="ray::RewardWorker", pid=1,
                                      ip="10.0.0.3")
    return err.as_instanceof_cause()


# ---- classifying a failed call --------------------------------------------------------------------
def test_dead_worker_is_lost_and_an_exception_in_it_is_raised_with_its_cause():
    assert classify(ray.exceptions.ActorDiedError()) == ("lost", None)
    assert classify(ray.exceptions.NodeDiedError("node gone")) == ("lost", None)
    assert classify(ray.exceptions.OutOfMemoryError("killed")) == ("lost", None)
    # a constructor that raised (an engine that cannot load its model) is not a lost worker
    assert classify(ray.exceptions.RayActorError(actor_init_failed=True))[0] == "raised"
    bad = RewardError("reward function f failed on sample 3 of the batch: returned a str ('high'), not a number")
    kind, cause = classify(task_error(bad))
    assert kind == "raised" and cause is bad


# ---- a worker that does not answer: frozen, gone, or on a node that cannot be checked -----------------
def test_process_state_tells_stopped_from_running_from_gone():
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.3)
        assert worker_group.process_state(child.pid) in ("S", "R")
        child.send_signal(signal.SIGSTOP)
        time.sleep(0.3)
        assert worker_group.process_state(child.pid) == "T"
    finally:
        child.kill()
        child.wait()
    assert worker_group.process_state(child.pid) is None


def group_with(monkeypatch, seen: dict[int, tuple[str, str]], ranks=(0,), role="rollout"):
    """A group of stand-in handles whose processes ``probe`` sees as ``seen[index]``."""
    from grpo_dist.distributed.worker_group import CallDeadlines, WorkerGroup

    g = WorkerGroup.__new__(WorkerGroup)
    g.role, g.single, g.ranks, g.workers = role, False, list(ranks), list(range(len(ranks)))
    g.dispatch, g.process_roles = None, [role]
    g.deadlines = CallDeadlines(1800, 10, 60)
    g.deadlines.record("wake_up", 2.0)
    g.deadlines.record("wake_up", 0.2)
    monkeypatch.setattr(worker_group, "probe", lambda handle: seen[handle])
    return g


WHERE = "node 127.0.0.1 (Ray node 3f2a9c1d0e4b), pid 1234"


def test_a_missed_deadline_names_a_stopped_process_as_frozen_not_dead(monkeypatch, tmp_path):
    g = group_with(monkeypatch, {0: ("alive", f"{worker_group._STATES['S']}; node 127.0.0.1, pid 77"),
                                 1: ("alive", f"{worker_group._STATES['T']}; {WHERE}")}, ranks=(0, 1))
    err = g._not_answering([0, 1], "wake_up", 60.0)
    assert err.kind == "frozen" and err.rerun_helps
    msg = str(err)
    # the stopped rank is named first, the other one waiting on it after
    assert msg.startswith(f"rollout worker rank 1 is frozen: its process is alive but did not answer wake_up within "
                          f"60s (stopped by a signal: state T; {WHERE}); rank 0 did not answer either (alive: "
                          "sleeping"), msg
    assert "trainer.worker_call_timeout_min_s=60" in msg and "died" not in msg
    publish_checkpoint(tmp_path, 1)
    text = worker_failure_message(err, tmp_path)
    assert RERUN in text and "died" not in text


def test_a_missed_deadline_on_another_node_is_not_called_dead_and_a_gone_process_is_lost(monkeypatch):
    remote = group_with(monkeypatch, {0: ("unknown", "node 10.0.0.3 (Ray node 9a), pid 5: on another node, whether "
                                              "its process is alive cannot be checked from here")})
    err = remote._not_answering([0], "wake_up", 60.0)
    assert err.kind == "frozen" and str(err).startswith("rollout worker rank 0 did not answer wake_up within 60s")
    assert "cannot be checked from here" in str(err)
    gone = group_with(monkeypatch, {0: ("gone", f"its process has exited; {WHERE}")})
    err = gone._not_answering([0], "wake_up", 60.0)
    assert err.kind == "lost" and "its process has exited" in str(err)


def test_rays_keepalive_giving_up_on_a_live_process_is_frozen_not_dead(monkeypatch, tmp_path):
    """Ray reports an actor it cannot reach (a stopped process) as ``ActorUnavailableError``, a kind of
    ``RayActorError``: while its process is alive, that is a frozen worker, not a dead one."""
    unavailable = ray.exceptions.ActorUnavailableError("the keepalive timed out", None)
    g = group_with(monkeypatch, {0: ("alive", f"{worker_group._STATES['T']}; {WHERE}")})
    err = g._failed(0, unavailable, "wake_up", {}, None)
    assert err.kind == "frozen", str(err)
    assert str(err).startswith("rollout worker rank 0 is frozen: its process is alive but did not answer wake_up "
                               "(Ray reports it unavailable) (stopped by a signal: state T")
    assert "died" not in worker_failure_message(err, tmp_path)
    gone = group_with(monkeypatch, {0: ("gone", f"its process has exited; {WHERE}")})
    assert gone._failed(0, unavailable, "wake_up", {}, None).kind == "lost"


@pytest.mark.parametrize("exc, helps", [
    (WorkerError("actor worker rank 1 failed during update_policy: ActorDiedError", kind="lost"), True),
    (WorkerError("rollout worker rank(s) [0] did not finish generate within 1800s", kind="frozen"), True),
    (WorkerError("reward worker failed during compute: RewardError: ...", cause=RewardError("x")), False),
    (WorkerError("actor worker rank 0 failed during load_checkpoint: ...", cause=UnsafeCheckpointError("x")), False),
    (WorkerError("actor worker rank 0 failed during update_policy: ValueError: ...", cause=ValueError("x")), False),
    (WorkerError("actor worker rank 0 failed during save_checkpoint: OSError", cause=OSError(28, "No space")), True),
])
def test_rerun_hint_only_where_a_rerun_helps(tmp_path, exc, helps):
    publish_checkpoint(tmp_path, 2)
    msg = worker_failure_message(exc, tmp_path)
    assert msg.startswith(str(exc))
    assert (RERUN in msg) is helps, msg
    assert exc.rerun_helps is (exc.kind != "raised")
    if helps:  # what the rerun will do: resume from the newest checkpoint on disk, named
        assert f"resume from step 2 ({tmp_path / 'global_step_2'})" in msg, msg


def publish_checkpoint(out, step: int):
    tmp = checkpoint.tmp_dir(out, step)
    (tmp / "actor").mkdir()
    (tmp / "actor" / "shard.bin").write_bytes(b"w" * 64)
    return checkpoint.publish(out, tmp, step, {"global_step": step}, None)


def test_the_rerun_hint_says_what_a_rerun_will_do(tmp_path):
    """Where no checkpoint exists, a rerun starts over, and the message says so instead of promising a
    resume; a damaged newest checkpoint is passed over as resume would; resume_mode=disable starts over."""
    from grpo_dist.config.launch import ResumeSettings

    lost = WorkerError("actor worker rank 1 failed during update_policy: ActorDiedError", kind="lost")
    msg = worker_failure_message(lost, tmp_path)
    assert RERUN not in msg and f"no checkpoint in {tmp_path} yet: rerun the same command to start from the " \
        "beginning" in msg, msg
    publish_checkpoint(tmp_path, 1)
    (publish_checkpoint(tmp_path, 3) / "actor" / "shard.bin").write_bytes(b"w")  # damaged: sizes differ
    msg = worker_failure_message(lost, tmp_path)
    assert f"resume from step 1 ({tmp_path / 'global_step_1'}), the newest checkpoint that verifies" in msg, msg
    fresh = worker_failure_message(lost, ResumeSettings(str(tmp_path), "disable", None))
    assert RERUN not in fresh and "start from the beginning (trainer.resume_mode=disable" in fresh, fresh


def test_rays_advice_is_left_out_of_a_dead_workers_message(tmp_path):
    ray_text = ray.exceptions.ActorDiedError().__str__().splitlines()[0]
    advice = (" Some common causes include: (1) the process was killed by the OOM killer due to high memory usage, "
              "(2) ray stop --force was called, or (3) the worker crashed unexpectedly due to SIGSEGV or another "
              "unexpected error. If the process was killed by the kernel OOM killer (verifiable by checking for OOM "
              "in dmesg of the OOMing node), consider enabling resource isolation via --enable-resource-isolation "
              "to prevent node deaths by resource contention and significant loss of progress by uninformed kernel "
              "OOM killing.")
    exc = WorkerError(f"actor worker rank 0 failed during update_policy: ActorDiedError: {ray_text}{advice}; its "
                      "process also held the reference", kind="lost")
    msg = worker_failure_message(exc, tmp_path)
    assert "resource isolation" not in msg and "common causes" not in msg, msg
    assert msg.startswith(f"actor worker rank 0 failed during update_policy: ActorDiedError: {ray_text}; its "
                          "process also held the reference\n"), msg


def test_what_to_fix_is_named_for_code_and_data_faults(tmp_path):
    reward = worker_failure_message(WorkerError("...", cause=RewardError("x")), tmp_path)
    assert "custom_reward_function.path" in reward and "reward_model.on_error=zero" in reward
    unsafe = worker_failure_message(WorkerError("...", cause=UnsafeCheckpointError("x")), tmp_path)
    assert "never unpickles" in unsafe and "trainer.resume_mode=disable" in unsafe
    frozen = worker_failure_message(WorkerError("...", kind="frozen"), tmp_path)
    assert "trainer.worker_call_timeout_s" in frozen
    starting = worker_failure_message(WorkerError("boom", kind="lost"), tmp_path, starting=True)
    assert starting.startswith("could not start the workers: boom")


# ---- Ray that does not start ------------------------------------------------------------------------
@pytest.fixture
def no_ray_side_effects(monkeypatch):
    """init_ray changes the process's environment and one Ray constant: undo both after the test."""
    from ray._private import ray_constants

    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", ray_constants.ENABLE_RAY_CLUSTER)
    monkeypatch.delenv(worker_group._CLUSTER_SWITCH, raising=False)
    monkeypatch.setenv("RAY_worker_niceness", "0")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "shutdown", lambda: None)


def test_a_local_ray_that_fails_to_start_is_one_message(monkeypatch, no_ray_side_effects):
    seen = {}

    def failing_init(**kwargs):
        seen.update(kwargs)
        raise RuntimeError("Failed to start the GCS server\nmore detail")

    monkeypatch.setattr(ray, "init", failing_init)
    with pytest.raises(RayStartError) as err:
        worker_group.init_ray(address=None, num_cpus=None, include_dashboard=False, min_cpus=1)
    msg = str(err.value)
    assert msg.startswith("could not start a local Ray instance: RuntimeError: more detail")
    assert "/tmp" in msg and "ray_kwargs.ray_init.address" in msg
    # a local instance serves this machine only: its servers bind to the loopback interface
    assert seen["address"] == "local" and os.environ[worker_group._CLUSTER_SWITCH] == "0"
    from ray._private import ray_constants, services

    assert ray_constants.ENABLE_RAY_CLUSTER is False
    assert services.get_node_ip_address() in ("127.0.0.1", "::1")


@pytest.mark.parametrize("dashboard", [False, True])
def test_a_local_ray_without_dashboard_starts_no_dashboard_process(monkeypatch, no_ray_side_effects, dashboard):
    """include_dashboard=false: Ray's start finds "no dashboard" (no process, no address) instead of starting
    its head process and waiting for it; Ray is left as it was afterwards, and with the dashboard asked
    for it starts as Ray starts it."""
    from ray._private import services

    original, seen = services.start_api_server, {}

    def fake_init(**kwargs):
        seen["include_dashboard"] = kwargs["include_dashboard"]
        started = services.start_api_server
        seen["dashboard"] = started if dashboard else started(kwargs["include_dashboard"], False, "127.0.0.1", "gcs", "id")

    monkeypatch.setattr(ray, "init", fake_init)
    monkeypatch.setattr("grpo_dist.distributed.ray_watchdog.start", lambda: None)
    assert worker_group.init_ray(address=None, num_cpus=None, include_dashboard=dashboard, min_cpus=1) is True
    assert seen["include_dashboard"] is dashboard
    assert seen["dashboard"] == (original if dashboard else (None, None))
    assert services.start_api_server is original


def test_an_unreachable_cluster_is_one_message_and_keeps_the_cluster_binding(monkeypatch, no_ray_side_effects):
    def failing_init(**kwargs):
        raise ConnectionError("Could not find any running Ray instance")

    monkeypatch.setattr(ray, "init", failing_init)
    monkeypatch.setattr(worker_group, "_unreachable", lambda address, timeout_s: None)  # Ray's own refusal
    with pytest.raises(RayStartError, match=r"could not connect to the Ray cluster at 10\.0\.0\.1:6379 "
                                            r"\(ray_kwargs\.ray_init\.address or RAY_ADDRESS\): ConnectionError"):
        worker_group.init_ray(address="10.0.0.1:6379", num_cpus=None, include_dashboard=False, min_cpus=1)
    assert worker_group._CLUSTER_SWITCH not in os.environ  # attaching leaves the cluster's binding alone


def test_an_address_nothing_answers_at_is_given_up_in_bounded_time_with_one_message(monkeypatch, no_ray_side_effects):
    # Ray retries such an address for many minutes; the driver gives up after ATTACH_PROBE_S, before ray.init.
    import socket
    import time

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def must_not_init(**kwargs):
        raise AssertionError("ray.init was called for an address nothing answers at")

    monkeypatch.setattr(ray, "init", must_not_init)
    monkeypatch.setattr(worker_group, "ATTACH_PROBE_S", 2.0)
    t0 = time.monotonic()
    with pytest.raises(RayStartError) as info:
        worker_group.init_ray(address=f"127.0.0.1:{port}", num_cpus=None, include_dashboard=False, min_cpus=1)
    assert time.monotonic() - t0 < 10.0
    msg = str(info.value)
    assert msg.startswith(f"could not connect to the Ray cluster at 127.0.0.1:{port} (ray_kwargs.ray_init.address "
                          f"or RAY_ADDRESS): nothing answered at 127.0.0.1:{port} within 2 s (ConnectionRefusedError")
    assert "\n" not in msg and f"ray status --address 127.0.0.1:{port}" in msg


def test_the_address_probe_passes_a_listening_port_and_leaves_other_forms_to_ray():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert worker_group._unreachable(f"127.0.0.1:{port}", 1.0) is None
        assert worker_group._unreachable(f"ray://127.0.0.1:{port}", 1.0) is None
    for address in ("auto", "local", "not-an-address"):
        assert worker_group._unreachable(address, 1.0) is None


# ---- whole runs up to where Ray would start -----------------------------------------------------------
def tiny_cfg(model, data, out, *extra):
    overrides = [f"actor_rollout_ref.model.path={model}", f"data.train_files={data['train']}",
                 f"data.val_files={data['test']}", "data.train_batch_size=4", "data.max_response_length=8",
                 "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                 "actor_rollout_ref.rollout.name=hf", "trainer.n_gpus_per_node=1", "trainer.device=cpu",
                 f"trainer.default_local_dir={out}", *extra]
    return to_typed(compose(overrides), overrides)


def one_message(err: str, code: int, got: int, *needles: str) -> str:
    assert got == code, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("grpo_dist: error: ")]
    assert len(lines) == 1, err
    tail = err[err.index(lines[0]):]
    for n in needles:
        assert n in tail, f"{n!r} not in {tail!r}"
    return tail


def test_run_reports_ray_start_failure_and_releases_the_lock(tiny_model_dir, reverse_data, tmp_path, monkeypatch,
                                                             capsys):
    def failing(**kwargs):
        raise RayStartError("could not start a local Ray instance: RuntimeError: no space left")

    monkeypatch.setattr(worker_group, "init_ray", failing)
    before = signal.getsignal(signal.SIGTERM)
    code = run(resolve(tiny_cfg(tiny_model_dir, reverse_data, tmp_path / "o")))
    one_message(capsys.readouterr().err, 1, code, "could not start a local Ray instance", "no space left")
    assert not (tmp_path / "o" / ".grpo_dist.lock").exists()
    assert signal.getsignal(signal.SIGTERM) is before  # the run's handler is gone with the run


def test_sigterm_during_start_up_is_one_message_and_exit_143(tiny_model_dir, reverse_data, tmp_path, monkeypatch,
                                                            capsys):
    def slow_start(**kwargs):  # Ray taking its time to start, when the scheduler's SIGTERM comes
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
        raise AssertionError("the signal did not stop the start-up")

    monkeypatch.setattr(worker_group, "init_ray", slow_start)
    t0 = time.monotonic()
    code = run(resolve(tiny_cfg(tiny_model_dir, reverse_data, tmp_path / "o")))
    assert time.monotonic() - t0 < 25
    one_message(capsys.readouterr().err, 143, code, "stopped on SIGTERM during start-up; no checkpoint was taken",
                f"this run has no checkpoint in {tmp_path / 'o'} yet")


def test_sigterm_after_ray_took_the_handler_is_still_the_runs(tiny_model_dir, reverse_data, tmp_path, monkeypatch,
                                                              capsys):
    """ray.init installs its own SIGTERM handler (a stack dump, then exit): the run takes it back."""
    rays_handler_ran = []

    def init_like_ray(**kwargs):
        signal.signal(signal.SIGTERM, lambda *a: rays_handler_ran.append(True))
        return False

    def signal_then_wait():  # the next start-up step, when the scheduler's SIGTERM comes
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
        raise AssertionError("the signal did not stop the start-up")

    monkeypatch.setattr(worker_group, "init_ray", init_like_ray)
    monkeypatch.setattr(worker_group, "cluster_gpus", signal_then_wait)
    code = run(resolve(tiny_cfg(tiny_model_dir, reverse_data, tmp_path / "o")))
    one_message(capsys.readouterr().err, 143, code, "stopped on SIGTERM during start-up")
    assert not rays_handler_ran


def test_damaged_checkpoint_is_reported_before_ray_starts(tiny_model_dir, reverse_data, tmp_path, monkeypatch,
                                                          capsys):
    out = tmp_path / "o"
    for step in (1, 2):
        tmp = checkpoint.tmp_dir(out, step)
        (tmp / "actor").mkdir()
        (tmp / "actor" / "shard.bin").write_bytes(b"w" * 64)
        checkpoint.publish(out, tmp, step, {"global_step": step}, None)
    (out / "global_step_2" / "actor" / "shard.bin").write_bytes(b"w")
    said_before_ray = {}

    def record_then_fail(**kwargs):
        said_before_ray.update(captured=capsys.readouterr())
        raise RayStartError("could not start a local Ray instance: stop here")

    monkeypatch.setattr(worker_group, "init_ray", record_then_fail)
    run(resolve(tiny_cfg(tiny_model_dir, reverse_data, out)))
    early = said_before_ray["captured"]
    assert f"skipping the damaged checkpoint {out / 'global_step_2'}: actor/shard.bin has 1 bytes" in early.err
    assert f"resuming from {out / 'global_step_1'} (step 1)" in early.out


def test_checkpoint_without_manifest_stops_the_run_before_ray_starts(tiny_model_dir, reverse_data, tmp_path,
                                                                     monkeypatch, capsys):
    """A folder that cannot be verified (written by hand or by a version without manifests) is neither
    resumed from nor skipped silently: one message naming it and the ways on, exit 2, nothing started."""
    out = tmp_path / "o"
    for step in (1, 2):
        tmp = checkpoint.tmp_dir(out, step)
        (tmp / "actor").mkdir()
        (tmp / "actor" / "shard.bin").write_bytes(b"w" * 64)
        checkpoint.publish(out, tmp, step, {"global_step": step}, None)
    (out / "global_step_2" / checkpoint.MANIFEST_FILE).unlink()
    monkeypatch.setattr(worker_group, "init_ray", lambda **kw: pytest.fail("Ray was started"))
    code = run(resolve(tiny_cfg(tiny_model_dir, reverse_data, out)))
    one_message(capsys.readouterr().err, 2, code, f"{out / 'global_step_2'}, cannot be verified: it has no manifest.json",
                f"trainer.resume_mode=resume_path trainer.resume_from_path={out / 'global_step_2'}",
                f"move it out of trainer.default_local_dir={out}")


def test_damaged_resume_path_is_refused_before_ray_starts(tiny_model_dir, reverse_data, tmp_path, monkeypatch,
                                                          capsys):
    out = tmp_path / "o"
    tmp = checkpoint.tmp_dir(out, 3)
    (tmp / "actor").mkdir()
    (tmp / "actor" / "shard.bin").write_bytes(b"w" * 64)
    ckpt = checkpoint.publish(out, tmp, 3, {"global_step": 3}, None)
    (ckpt / checkpoint.STATE_FILE).unlink()
    monkeypatch.setattr(worker_group, "init_ray", lambda **kw: pytest.fail("Ray was started"))
    code = run(resolve(tiny_cfg(tiny_model_dir, reverse_data, out, "trainer.resume_mode=resume_path",
                        f"trainer.resume_from_path={ckpt}")))
    one_message(capsys.readouterr().err, 2, code, f"trainer.resume_from_path={ckpt} is damaged",
                "trainer_state.json is missing")


def test_sigterm_inside_rays_wait_is_the_stop_message(tiny_model_dir, reverse_data, tmp_path, monkeypatch, capsys):
    """The handler's exception raised inside Ray's C code comes out as a SystemError chained to it
    (``<cyfunction CoreWorker.wait> returned a result with an exception set``): still one message, 143."""
    def wait_like_ray():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
        except BaseException as exc:
            raise SystemError("<cyfunction CoreWorker.wait> returned a result with an exception set") from exc
        raise AssertionError("the signal did not stop the start-up")

    monkeypatch.setattr(worker_group, "init_ray", lambda **kw: False)
    monkeypatch.setattr(worker_group, "cluster_gpus", wait_like_ray)
    code = run(resolve(tiny_cfg(tiny_model_dir, reverse_data, tmp_path / "o")))
    one_message(capsys.readouterr().err, 143, code, "stopped on SIGTERM during start-up; no checkpoint was taken",
                f"this run has no checkpoint in {tmp_path / 'o'} yet: rerun the same command to start from the beginning")


def test_ctrl_c_names_what_a_rerun_does(tiny_model_dir, reverse_data, tmp_path, monkeypatch, capsys):
    from grpo_dist.trainer import driver

    out = tmp_path / "o"
    publish_checkpoint(out, 1)

    class Trainer:
        def __init__(self, *args, stop, **kwargs):
            self.stop = stop

        def start_workers(self, workers=None):
            pass

        def fit(self, resume):
            self.stop.training()
            self.stop.step_begins(2)
            raise KeyboardInterrupt

        def close(self):
            pass

    monkeypatch.setattr(worker_group, "init_ray", lambda **kw: False)
    monkeypatch.setattr(worker_group, "cluster_gpus", lambda: 0)
    monkeypatch.setattr(driver, "GRPOTrainer", Trainer)
    monkeypatch.setattr("grpo_dist.trainer.roles.create_workers", lambda *args: None)  # no Ray here
    code = run(resolve(tiny_cfg(tiny_model_dir, reverse_data, out)))
    one_message(capsys.readouterr().err, 130, code, "interrupted by SIGINT (Ctrl-C) during step 2; no checkpoint was "
                f"taken; rerun the same command to resume from step 1 ({out / 'global_step_1'})")


def test_the_default_deadlines_name_a_frozen_worker_within_two_minutes(monkeypatch):
    """The deadlines a run builds from its configuration's defaults: a worker that stops answering a
    fast call (the embedded task's take a fraction of a second; the first, a few seconds of warm-up) is
    named as frozen a minute after the call started, so within two minutes with the rest of the step
    (the e2e test sets shorter deadlines through the same keys). Time is simulated: the group's wait
    for a result advances a clock."""
    from types import SimpleNamespace

    from grpo_dist.trainer.roles import Workers
    from tests.configs import cfg_of

    cfg = cfg_of()
    workers = Workers(SimpleNamespace(spec=resolve(cfg), device="cpu"))
    clock = [1000.0]
    answers = {"s": 0.0}  # how long the next call takes; None: the worker is frozen

    class Method:
        def remote(self, *args, **kwargs):
            return object()

    class Handle:
        def __getattr__(self, name):
            return Method()

    def wait(refs, num_returns, timeout):
        if answers["s"] is None or answers["s"] > timeout:
            clock[0] += max(timeout, 0.01)  # as time does, past the deadline
            return [], refs
        clock[0] += answers["s"]
        return refs[:1], refs[1:]

    monkeypatch.setattr(worker_group, "ray", SimpleNamespace(wait=wait, get=lambda ref: None))
    monkeypatch.setattr(worker_group, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    g = group_with(monkeypatch, {}, role="rollout")
    monkeypatch.setattr(worker_group, "probe", lambda handle: ("alive", "stopped by a signal: state T; pid 9"))
    g.workers, g.deadlines = [Handle()], workers._deadlines()
    for s in (3.0, 0.4, 0.3):  # step 1 (warm-up), steps 2 and 3
        answers["s"] = s
        g.call("generate")
    answers["s"] = None
    start = clock[0]
    with pytest.raises(WorkerError) as ei:
        g.call("generate")
    assert ei.value.kind == "frozen" and 60.0 <= clock[0] - start < 61.0  # a minute after the call
    assert "within 60s" in str(ei.value) and "trainer.worker_call_timeout_min_s=60" in str(ei.value)
    # the first call of a method may load a model: it gets the long deadline
    answers["s"] = None
    start = clock[0]
    with pytest.raises(WorkerError):
        g.call("update_policy")
    assert 1800.0 <= clock[0] - start < 1801.0 and cfg.trainer.worker_call_timeout_s == 1800.0


def test_a_reward_function_returning_text_names_the_sample_and_what_to_fix(monkeypatch, tmp_path):
    """A user-code fault met during training (the reliability tests' text_unless_exact, loaded by path as
    users do): the reward worker's error, through Ray to the driver's message, names the function, the
    sample and the value, and says what to fix instead of suggesting a rerun (which would meet the same
    value again). The same path through a real run, with the exit code and the message printed last:
    tests/e2e/test_reliability_e2e.py's test_reward_function_that_raises_stops_naming_the_sample."""
    from pathlib import Path

    from grpo_dist.rewards.manager import CustomRewardFn, RewardScorer

    faulty = Path(__file__).resolve().parents[1] / "e2e" / "reward_faulty.py"
    fn = CustomRewardFn(str(faulty), "text_unless_exact")
    with RewardScorer(fn, num_workers=1, timeout_s=10, on_error="raise") as scorer:
        assert scorer.score_batch(["grpo_dist/reverse"], ["321"], ["321"], [{"index": 0}])[0] == [1.0]
        with pytest.raises(RewardError) as ei:
            scorer.score_batch(["grpo_dist/reverse"] * 2, ["321", "12"], ["321"] * 2, [{"index": 4}, {"index": 5}])
    g = group_with(monkeypatch, {}, role="reward")
    err = g._failed(0, task_error(ei.value), "compute", {}, None)
    tail = worker_failure_message(err, tmp_path)
    for needle in ("reward function text_unless_exact", "of the batch (data_source='grpo_dist/reverse')",
                   "returned a str", "not a number", "row index", "response '", "custom_reward_function.path",
                   "sample 1 of the batch", "returned a str ('0.0'), not a number (row index 5, response '12')"):
        assert needle in tail, f"{needle!r} not in {tail!r}"
    assert "rerun the same command" not in tail, tail
