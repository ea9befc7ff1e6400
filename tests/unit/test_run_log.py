"""A quiet console: the libraries' logs and the workers' output go to the run's log file
(``<trainer.default_local_dir>/logs/run.log``), ``trainer.log_level`` / ``GRPO_DIST_LOG_LEVEL`` bring them
back to the console, and a failed worker's message points at the file.

The end-to-end check (the default job's console against an allow-list of grpo_dist's own lines) is in
tests/e2e/test_default_job.py."""

from __future__ import annotations

import logging
import os
import subprocess
import types
import sys
import warnings
from pathlib import Path

import pytest
import ray

from grpo_dist.config.loader import compose, to_typed
from grpo_dist.config.spec import resolve
from grpo_dist.config.validate import validate_config
from grpo_dist.distributed import worker_group
from grpo_dist.distributed.worker_group import RayStartError, WorkerError
from grpo_dist.trainer.run import run, worker_failure_message
from grpo_dist.utils import run_log
from grpo_dist.utils.run_log import DriverLogs, log_level, log_path
from tests.unit.test_command_line import restore_logging  # noqa: F401  (autouse: the runs configure logging)
from tests.unit.test_run_messages import no_ray_side_effects, one_message, tiny_cfg  # noqa: F401

REPO = Path(__file__).resolve().parents[2]


# ---- the level: trainer.log_level, or GRPO_DIST_LOG_LEVEL when set --------------------------------------
def test_the_level_is_quiet_by_default_and_the_environment_variable_wins(monkeypatch):
    monkeypatch.delenv(run_log.ENV_LEVEL, raising=False)
    cfg = to_typed(compose([]), [])
    assert cfg.trainer.log_level == "quiet" and log_level(cfg.trainer.log_level) == "quiet"
    assert log_level("INFO") == "info"
    monkeypatch.setenv(run_log.ENV_LEVEL, "debug")
    assert log_level("quiet") == "debug"
    monkeypatch.setenv(run_log.ENV_LEVEL, "")  # set but empty: the key decides
    assert log_level("warning") == "warning"


@pytest.mark.parametrize("env, override, named", [
    (None, "trainer.log_level=loud", "trainer.log_level = 'loud' is not valid"),
    ("loud", "trainer.log_level=info", "GRPO_DIST_LOG_LEVEL = 'loud' is not valid"),
])
def test_a_bad_level_is_one_message_naming_where_it_was_given(env, override, named, monkeypatch):
    if env is None:
        monkeypatch.delenv(run_log.ENV_LEVEL, raising=False)
    else:
        monkeypatch.setenv(run_log.ENV_LEVEL, env)
    cfg = to_typed(compose([override]), [override])
    with pytest.raises(ValueError) as err:
        validate_config(cfg, check_paths=False)
    assert str(err.value).startswith(named) and "quiet, warning, info, debug" in str(err.value)


# ---- the driver's side ------------------------------------------------------------------------------
def test_quiet_keeps_own_lines_on_the_console_and_sends_library_records_to_the_file(tmp_path, capsys):
    root = logging.getLogger()
    console = logging.StreamHandler(sys.stdout)  # as Hydra's job_logging sets it up: INFO on stdout
    # the run's console handler alone (a handler an earlier test left on the root may hold a closed stream)
    earlier, root.handlers = root.handlers, [console]
    root.setLevel(logging.INFO)
    ray_like = logging.getLogger("raylike")  # a library printing through a handler of its own, as Ray's logger does
    own_handler = logging.StreamHandler(sys.stderr)
    ray_like.addHandler(own_handler)
    ray_like.propagate = False

    logs = DriverLogs("quiet").start()
    try:
        logging.getLogger("raylike").warning("Token authentication is enabled for this cluster")
        logging.getLogger("matplotlib.font_manager").info("generated new fontManager")
        logging.getLogger("grpo_dist.data.dataset").info("dropped 3 of 40 prompts")
        assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"  # the weights' load/save bars
        path = logs.open_file(tmp_path, "run started, pid 1: python -m grpo_dist.main")
        warnings.warn("a library's FutureWarning", FutureWarning, stacklevel=1)
        logging.getLogger("raylike").error("a library's error after the file is open")
        out, err = capsys.readouterr()
    finally:
        logs.close()
        root.removeHandler(console)
        left, root.handlers = root.handlers, earlier
    assert path == tmp_path / "logs" / "run.log" == log_path(tmp_path)
    assert out == "dropped 3 of 40 prompts\n" and err == ""
    text = path.read_text()
    assert text.startswith("==== ") and "run started, pid 1: python -m grpo_dist.main" in text.splitlines()[0]
    for line in ("Token authentication is enabled", "generated new fontManager",  # kept until the file opened
                 "dropped 3 of 40 prompts", "a library's FutureWarning", "a library's error after the file is open"):
        assert line in text, line
    # closed: the library logger prints as before, the console handler passes everything again
    assert ray_like.handlers == [own_handler] and ray_like.propagate is False
    assert console.filters == [] and left == []


def test_a_rerun_appends_to_the_file_after_a_header(tmp_path):
    for n in (1, 2):
        logs = DriverLogs("quiet").start()
        try:
            logs.open_file(tmp_path, f"run {n}")
            logging.getLogger("otherlib").warning("record of run %d", n)
        finally:
            logs.close()
    lines = log_path(tmp_path).read_text().splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("==== ")]
    assert len(heads) == 2 and lines[heads[0]].endswith("run 1") and lines[heads[1]].endswith("run 2")
    assert "record of run 1" in lines[heads[0] + 1] and "record of run 2" in lines[heads[1] + 1]


@pytest.mark.parametrize("level, shown", [("warning", ["a warning"]), ("info", ["an info", "a warning"]),
                                          ("debug", ["a debug", "an info", "a warning"])])
def test_a_level_brings_library_records_back_to_the_console(level, shown, tmp_path, capsys):
    root = logging.getLogger()
    console = logging.StreamHandler(sys.stdout)
    root.addHandler(console)
    root.setLevel(logging.INFO)
    logs = DriverLogs(level).start()
    try:
        lib = logging.getLogger("somelib.part")
        lib.debug("a debug")
        lib.info("an info")
        lib.warning("a warning")
        assert logs.open_file(tmp_path, "run") is None  # no log file outside quiet mode
    finally:
        logs.close()
        root.removeHandler(console)
    assert capsys.readouterr().out.splitlines() == shown
    assert root.level == logging.INFO and not (tmp_path / "logs").exists()


# ---- the workers' side ------------------------------------------------------------------------------
def test_a_worker_process_writes_everything_to_the_file_even_when_it_dies(tmp_path):
    """Ray runs the hook in each worker process before anything of the run: Python's prints, C-level
    writes to fds 1 and 2, and the traceback of the error that ends the process all land in the file."""
    log = tmp_path / "logs" / "run.log"
    log.parent.mkdir()
    code = ("from grpo_dist.utils.run_log import worker_output_to_run_log\n"
            "worker_output_to_run_log()\n"
            "import os, sys\n"
            "print('a print from python')\n"
            "os.write(1, b'[W1125 utils.cpp:68] Warning: NUMA binding (a C-level write)\\n')\n"
            "import logging; logging.getLogger('vllm').warning('libtcmalloc is not found in LD_PRELOAD')\n"
            "raise RuntimeError('the worker dies here')\n")
    env = dict(os.environ, PYTHONPATH=str(REPO), **{run_log.ENV_FILE: str(log)})
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == "" and proc.stderr == ""
    text = log.read_text()
    for line in ("a print from python", "NUMA binding (a C-level write)", "libtcmalloc is not found",
                 "Traceback (most recent call last)", "RuntimeError: the worker dies here"):
        assert line in text, (line, text)
    assert text.startswith("---- worker process ")


def test_a_worker_that_cannot_open_the_file_keeps_its_output(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), **{run_log.ENV_FILE: str(tmp_path / "missing" / "run.log")})
    code = "from grpo_dist.utils.run_log import worker_output_to_run_log as f; f(); print('still here')"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "still here\n"


@pytest.mark.parametrize("address", [None, "10.0.0.1:6379"])
def test_ray_gets_the_hook_and_forwards_nothing_in_quiet_mode(address, monkeypatch, no_ray_side_effects):  # noqa: F811
    seen = []
    monkeypatch.setattr(ray, "init", lambda **kw: seen.append(kw))
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    from grpo_dist.distributed import ray_watchdog

    monkeypatch.setattr(ray_watchdog, "start", lambda: None)
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    monkeypatch.delenv("TRANSFORMERS_VERBOSITY", raising=False)
    common = dict(address=address, num_cpus=None, include_dashboard=False, min_cpus=1)
    worker_group.init_ray(**common, log_level="quiet", worker_log="/out/logs/run.log")
    worker_group.init_ray(**common, log_level="info", worker_log=None)
    worker_group.init_ray(**common)  # as before the log level existed
    quiet, info, default = seen
    assert quiet["log_to_driver"] is False
    assert quiet["runtime_env"]["worker_process_setup_hook"] == run_log.WORKER_HOOK
    assert quiet["runtime_env"]["env_vars"][run_log.ENV_FILE] == "/out/logs/run.log"
    assert quiet["runtime_env"]["env_vars"]["VLLM_LOGGING_LEVEL"] == "INFO"  # the file holds vLLM's INFO lines
    assert info["log_to_driver"] is True and "worker_process_setup_hook" not in info.get("runtime_env", {})
    assert default["log_to_driver"] is True
    if address is None:
        assert info["runtime_env"]["env_vars"]["VLLM_LOGGING_LEVEL"] == "INFO"
        assert default["runtime_env"]["env_vars"]["VLLM_LOGGING_LEVEL"] == "WARNING"
        assert default["runtime_env"]["env_vars"]["TRANSFORMERS_VERBOSITY"] == "error"


def test_the_users_library_levels_win_in_the_workers(monkeypatch):
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "ERROR")
    env = run_log.worker_env_vars("quiet", "/x/run.log")
    assert env["VLLM_LOGGING_LEVEL"] == "ERROR" and env[run_log.ENV_FILE] == "/x/run.log"


# ---- messages ---------------------------------------------------------------------------------------
def test_a_failed_worker_points_at_the_runs_log_file(tmp_path):
    log = tmp_path / "logs" / "run.log"
    raised = worker_failure_message(WorkerError("rollout worker rank 0 failed during generate: ValueError: x"),
                                    tmp_path, log_file=log)
    assert f"the worker's own is in {log}" in raised and "/tmp/ray" not in raised
    lost = worker_failure_message(WorkerError("actor worker rank 1 failed", kind="lost"), tmp_path, log_file=log)
    assert f"(killed for memory, a crash, a lost node; what it wrote last is in {log}); this run has no checkpoint" in lost
    # with the workers' output on the console (a log level), Ray's logs are still where the traceback is
    assert "/tmp/ray/session_latest/logs" in worker_failure_message(WorkerError("boom"), tmp_path)


def test_a_run_names_its_log_file_once_and_hands_it_to_ray(tiny_model_dir, reverse_data, tmp_path, monkeypatch,
                                                           capsys):
    monkeypatch.delenv(run_log.ENV_LEVEL, raising=False)
    got = []

    def stop_here(**kwargs):
        got.append(kwargs)
        raise RayStartError("could not start a local Ray instance: stopped here by the test")

    monkeypatch.setattr(worker_group, "init_ray", stop_here)
    out = tmp_path / "o"
    code = run(resolve(tiny_cfg(tiny_model_dir, reverse_data, out)))
    captured = capsys.readouterr()
    one_message(captured.err, 1, code, "stopped here by the test")
    log = out / "logs" / "run.log"
    said = [line for line in captured.out.splitlines() if str(log) in line]
    assert said == [f"grpo_dist: the workers' output and the libraries' logs go to {log} "
                    "(trainer.log_level=info or GRPO_DIST_LOG_LEVEL=info shows them here)"]
    assert got[0]["worker_log"] == str(log) and got[0]["log_level"] == "quiet"
    assert log.read_text().startswith("==== ")

    monkeypatch.setenv(run_log.ENV_LEVEL, "info")
    code = run(resolve(tiny_cfg(tiny_model_dir, reverse_data, tmp_path / "o2")))
    captured = capsys.readouterr()
    assert "logs go to" not in captured.out and not (tmp_path / "o2" / "logs").exists()
    assert got[1]["worker_log"] is None and got[1]["log_level"] == "info"


def test_a_failed_call_keeps_rays_report_with_the_workers_traceback():
    """Ray does not print an exception raised in a worker method in the worker's output: its traceback travels
    to the driver inside the error, and the run writes it into the log file the message names."""
    class Actor:
        @staticmethod
        def options(**opts):
            return types.SimpleNamespace(remote=lambda **kw: object())

    group = worker_group.WorkerGroup("reward", Actor, None, None, init_kwargs={}, num_cpus=1)
    remote = ray.exceptions.RayTaskError(
        "compute", 'Traceback (most recent call last):\n  File "rewards.py", line 7, in score\nKeyError: \'x\'',
        KeyError("x"), proctitle="ray::RewardWorker", pid=41, ip="127.0.0.1").as_instanceof_cause()
    err = group._failed(0, remote, "compute", {}, None)
    assert err.kind == "raised" and "reward worker, compute" in err.detail
    assert 'File "rewards.py", line 7, in score' in err.detail and "pid=41" in err.detail


def test_a_failed_worker_leaves_its_report_in_the_file_the_message_names(tiny_model_dir, reverse_data, tmp_path,
                                                                          monkeypatch, capsys):
    from grpo_dist.trainer import driver

    monkeypatch.delenv(run_log.ENV_LEVEL, raising=False)

    class Trainer:
        def __init__(self, *args, **kwargs):
            pass

        def start_workers(self, workers=None):
            pass

        def fit(self, resume):
            raise WorkerError("rollout worker rank 0 failed during generate: ValueError: bad sampling params",
                              detail='ray::RolloutWorker.generate() (pid=77)\n  File "engine.py", line 9, in generate\n'
                                     "ValueError: bad sampling params")

        def close(self):
            pass

    monkeypatch.setattr(worker_group, "init_ray", lambda **kw: False)
    monkeypatch.setattr(worker_group, "cluster_gpus", lambda: 0)
    monkeypatch.setattr(driver, "GRPOTrainer", Trainer)
    from grpo_dist.trainer import roles

    monkeypatch.setattr(roles, "create_workers", lambda *args: None)  # no Ray here: the stand-in trainer has none
    out = tmp_path / "o"
    code = run(resolve(tiny_cfg(tiny_model_dir, reverse_data, out)))
    log = out / "logs" / "run.log"
    one_message(capsys.readouterr().err, 1, code, "bad sampling params", f"the worker's own is in {log}")
    text = log.read_text()
    assert "the run stops: rollout worker rank 0 failed during generate" in text
    assert 'File "engine.py", line 9, in generate' in text


def test_the_kept_report_loses_rays_terminal_colours(tmp_path):
    logs = DriverLogs("quiet").start()
    try:
        logs.open_file(tmp_path, "run")
        logs.keep("the run stops: reward worker failed", "\x1b[36mray::RewardWorker.compute()\x1b[39m (pid=5)")
    finally:
        logs.close()
    assert log_path(tmp_path).read_text().splitlines()[-1] == "ray::RewardWorker.compute() (pid=5)"
