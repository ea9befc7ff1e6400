"""The command line: ``--check`` (the plan, nothing started) and Hydra's own flags and ``hydra.*`` keys.

The run itself is replaced by a recorder (these are orchestration tests of the command line): it sees
the typed configuration, the working directory, the environment and the logging set-up the job was
given, and writes what the real run writes first (its ``.hydra/`` files, once it owns its folder).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from grpo_dist.main import main

ROOT = Path(__file__).resolve().parents[2]


class Recorder:
    def __init__(self, rcs=None):
        self.calls: list[dict] = []
        self.rcs = list(rcs or [])

    def __call__(self, spec, on_start=None):
        """Stands in for ``grpo_dist.trainer.run.run``: records the configuration the job's run specification
        was resolved from (a test may look inside the spec; the package may not)."""
        if on_start is not None:
            on_start()
        self.calls.append(dict(cfg=spec._cfg, cwd=os.getcwd(), env=dict(os.environ),
                               root_level=logging.getLogger().level,
                               handlers=[type(h).__name__ for h in logging.getLogger().handlers]))
        logging.getLogger("grpo_dist.test").info("job %s ran", len(self.calls))
        return self.rcs.pop(0) if self.rcs else 0


@pytest.fixture(autouse=True)
def restore_logging():
    """The jobs configure Python logging (Hydra's job_logging) in this process; undo it afterwards."""
    loggers = [logging.getLogger()] + [logging.getLogger(n) for n in list(logging.root.manager.loggerDict)]
    saved = [(lg, list(lg.handlers), lg.level, lg.propagate, getattr(lg, "disabled", False)) for lg in loggers]
    yield
    for lg, handlers, level, propagate, disabled in saved:
        lg.handlers[:], lg.level, lg.propagate, lg.disabled = handlers, level, propagate, disabled
    for name in list(logging.root.manager.loggerDict):
        lg = logging.getLogger(name)
        if all(lg is not s[0] for s in saved):
            lg.handlers.clear()


@pytest.fixture
def recorder(monkeypatch):
    import grpo_dist.trainer.run as run_module

    rec = Recorder()
    monkeypatch.setattr(run_module, "run", rec)
    return rec


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def err_of(capsys) -> str:
    return capsys.readouterr().err


# ------------------------------------------------------------------------------------------ --check
def write_rows(path: Path, n: int) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"q{i}"}], "data_source": "x",
                                "reward_model": {"ground_truth": "a"}}) + "\n")
    return path


def test_check_prints_the_plan_without_starting_anything(tmp_path):
    """Sizes worked out by hand: 2 nodes x 4 GPUs = 8 ranks; 16 prompts x n=4 = 64 responses; mini-batches
    of 8 prompts = 2 per step, 8 x 4 / 8 = 4 responses per rank each, micro-batches of 2 -> 2; 40 rows
    // 16 = 2 steps per epoch x 3 epochs = 6 steps; tensor parallel 2: 8 / 2 = 4 engines, 16 / 4 = 4 prompts each."""
    train = write_rows(tmp_path / "train.jsonl", 40)
    out = tmp_path / "never_created"
    args = [f"data.train_files={train}", "data.val_files=null", "trainer.nnodes=2", "trainer.n_gpus_per_node=4",
            "trainer.device=cuda", "data.train_batch_size=16", "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "trainer.total_training_steps=null", "trainer.total_epochs=3", "data.max_prompt_length=10",
            "data.max_response_length=6", "actor_rollout_ref.rollout.agent.num_workers=4",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=2", f"trainer.default_local_dir={out}",
            "trainer.rollout_data_dir=dumps"]
    # the real entry point, reporting at exit which heavy libraries it had imported
    probe = ("import atexit, sys\n"
             "atexit.register(lambda: print('LOADED', sorted(m for m in ('ray', 'vllm', 'transformers') if m in sys.modules)))\n"
             "from grpo_dist.main import main\n"
             "sys.exit(main(sys.argv[1:]))\n")
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-c", probe, "--check", *args], capture_output=True, text=True,
                          cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    took = time.time() - t0
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "LOADED []" in text  # neither Ray nor an engine nor a model library was even imported
    assert "the configuration is valid" in text
    assert "2 node(s) x 4 GPU(s) = 8 data-parallel rank(s)" in text
    assert "node 0: ranks 0-3: actor, reference, rollout" in text and "node 1: ranks 4-7" in text
    assert "reward: 1 scoring worker" in text
    assert "tensor parallel 2: 4 engine(s), each over 2 consecutive ranks" in text and "4 prompt(s) x n=4 per engine" in text
    assert "40 training prompt(s)" in text and "2 step(s) per epoch" in text
    assert "6 = trainer.total_epochs 3 x 2 step(s) per epoch" in text
    assert "16 prompt(s) x rollout.n 4 = 64 responses" in text
    assert "2 mini-batch(es) x ppo_epochs 1 = 2 optimizer step(s)" in text
    assert "4 response(s) per rank per mini-batch, 2 micro-batch(es) of 2" in text
    assert "10 + 6 = 16 per response, 1,024 per step" in text
    assert "actor_rollout_ref.rollout.agent.num_workers=4" in text  # a no-op here, and said so
    assert f"every response of each training step written to {tmp_path / 'dumps'}/<step>.jsonl" in text
    assert not out.exists() and not (tmp_path / "multirun").exists() and not (tmp_path / "outputs").exists()
    assert not (tmp_path / "dumps").exists()
    assert took < 30, f"--check took {took:.1f}s"  # about 5 s on an idle 2-core machine


def test_check_exits_2_with_one_message(capsys):
    assert main(["--check", "actor_rollout_ref.actor.ppo_mini_batch_size=5"]) == 2
    err = err_of(capsys)
    assert err.startswith("grpo_dist: configuration error:") and "ppo_mini_batch_size" in err and "Traceback" not in err


def test_check_config_skips_the_files(capsys):
    args = ["actor_rollout_ref.model.path=/nowhere/model", "data.train_files=/nowhere/train.parquet"]
    assert main(["--check", *args]) == 2 and "/nowhere/model" in err_of(capsys)
    assert main(["--check=config", *args]) == 0
    assert "rows not counted here (--check=config)" in capsys.readouterr().out


def test_check_lists_the_sweep_jobs(capsys, in_tmp):
    assert main(["--check", "-m", "trainer.seed=1,2", "actor_rollout_ref.rollout.n=4,8"]) == 0
    out = capsys.readouterr().out
    heads = [line for line in out.splitlines() if line.startswith("grpo_dist --check")]
    assert [h.split(": ")[1] for h in heads] == [
        "sweep job #0", "sweep job #1", "sweep job #2", "sweep job #3"]
    assert "trainer.seed=2 actor_rollout_ref.rollout.n=4" in heads[2]
    assert not (in_tmp / "multirun").exists()


# ------------------------------------------------------------------------------------------ single run
def test_plain_run_writes_hydras_files_into_the_output_directory(recorder, in_tmp):
    assert main(["trainer.default_local_dir=out", "trainer.seed=5"]) == 0
    (call,) = recorder.calls
    out = in_tmp / "out"
    assert call["cfg"].trainer.default_local_dir == str(out) and call["cfg"].trainer.seed == 5
    assert call["cwd"] == str(in_tmp)  # hydra.job.chdir is false by default (Hydra >= 1.2)
    assert yaml.safe_load((out / ".hydra" / "overrides.yaml").read_text()) == ["trainer.default_local_dir=out", "trainer.seed=5"]
    assert yaml.safe_load((out / ".hydra" / "config.yaml").read_text())["trainer"]["seed"] == 5
    assert "run" in yaml.safe_load((out / ".hydra" / "hydra.yaml").read_text())["hydra"]
    assert "job 1 ran" in (out / "main.log").read_text()  # Hydra's job logging: <hydra.job.name>.log
    assert not (in_tmp / "outputs").exists()


def test_hydra_run_dir_is_the_output_directory_unless_default_local_dir_is_set(recorder, in_tmp):
    assert main(["hydra.run.dir=runs/a"]) == 0
    assert recorder.calls[-1]["cfg"].trainer.default_local_dir == str(in_tmp / "runs" / "a")
    assert (in_tmp / "runs" / "a" / ".hydra" / "config.yaml").exists()
    assert main(["hydra.run.dir=runs/b", "trainer.default_local_dir=ckpt"]) == 0
    assert recorder.calls[-1]["cfg"].trainer.default_local_dir == str(in_tmp / "ckpt")
    assert (in_tmp / "runs" / "b" / ".hydra" / "config.yaml").exists() and not (in_tmp / "ckpt").exists()


def test_hydra_job_chdir_env_and_verbose(recorder, in_tmp):
    train = write_rows(in_tmp / "train.jsonl", 40)
    assert main(["hydra.run.dir=job", "hydra.job.chdir=true", "trainer.default_local_dir=ckpt",
                 "data.train_files=train.jsonl", "data.val_files=null", "+hydra.job.env_set.GRPO_TEST_FLAG=on",
                 "hydra.verbose=true"]) == 0
    (call,) = recorder.calls
    job = in_tmp / "job"
    assert call["cwd"] == str(job)
    assert call["cfg"].trainer.default_local_dir == str(job / "ckpt")  # relative: inside the job's folder
    assert call["cfg"].data.train_files == str(train)  # data paths stay where the command was typed
    assert call["env"].get("GRPO_TEST_FLAG") == "on" and "GRPO_TEST_FLAG" not in os.environ
    assert call["root_level"] == logging.DEBUG
    assert os.getcwd() == str(in_tmp)


def test_a_job_called_in_process_gives_the_root_logger_back(recorder, in_tmp):
    """A notebook or a sweep driver of one's own calls ``main`` and goes on: afterwards its logging is its own
    again, and no handler writes into the finished job's log (which may then be moved or deleted)."""
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    assert main(["trainer.default_local_dir=out", "hydra.verbose=true"]) == 0
    assert recorder.calls[0]["root_level"] == logging.DEBUG and "FileHandler" in recorder.calls[0]["handlers"]
    assert root.handlers == before and root.level == level
    size = (in_tmp / "out" / "main.log").stat().st_size
    logging.getLogger("grpo_dist.test").warning("after the job")
    assert (in_tmp / "out" / "main.log").stat().st_size == size


def test_job_logging_disabled_writes_no_log(recorder, in_tmp):
    assert main(["trainer.default_local_dir=out", "hydra/job_logging=disabled"]) == 0
    assert (in_tmp / "out" / ".hydra").is_dir() and not (in_tmp / "out" / "main.log").exists()
    assert main(["trainer.default_local_dir=out2", "hydra.output_subdir=null"]) == 0
    assert not (in_tmp / "out2" / ".hydra").exists()


# ------------------------------------------------------------------------------------------ sweeps
def test_multirun_runs_every_combination_in_its_own_folder(recorder, in_tmp):
    assert main(["-m", "hydra.sweep.dir=sweep", "trainer.seed=1,2", "actor_rollout_ref.rollout.n=range(4,9,4)"]) == 0
    got = [(c["cfg"].trainer.seed, c["cfg"].actor_rollout_ref.rollout.n, c["cfg"].trainer.default_local_dir)
           for c in recorder.calls]
    sweep = in_tmp / "sweep"
    assert got == [(1, 4, str(sweep / "0")), (1, 8, str(sweep / "1")), (2, 4, str(sweep / "2")), (2, 8, str(sweep / "3"))]
    assert yaml.safe_load((sweep / "2" / ".hydra" / "overrides.yaml").read_text()) == [
        "trainer.seed=2", "actor_rollout_ref.rollout.n=4"]
    assert yaml.safe_load((sweep / "multirun.yaml").read_text())["hydra"]["sweep"]["dir"] == str(sweep)
    assert yaml.safe_load((sweep / "3" / ".hydra" / "hydra.yaml").read_text())["hydra"]["job"]["num"] == 3


def test_multirun_default_sweep_dir_and_subdir(recorder, in_tmp):
    assert main(["--multirun", "trainer.seed=3,4", "hydra.sweep.subdir=seed${trainer.seed}"]) == 0
    dirs = [Path(c["cfg"].trainer.default_local_dir) for c in recorder.calls]
    assert [d.name for d in dirs] == ["seed3", "seed4"]
    assert dirs[0].parent == dirs[1].parent and dirs[0].parent.parent.parent == in_tmp / "multirun"


def test_sweeper_params_and_hydra_mode(recorder, in_tmp):
    assert main(["hydra.mode=MULTIRUN", "hydra.sweep.dir=s", "+hydra.sweeper.params.trainer.seed=7,8"]) == 0
    assert [c["cfg"].trainer.seed for c in recorder.calls] == [7, 8]


def test_a_sweep_is_validated_whole_before_its_first_job(recorder, in_tmp, capsys):
    assert main(["-m", "hydra.sweep.dir=s", "actor_rollout_ref.actor.ppo_mini_batch_size=16,5"]) == 2
    err = err_of(capsys)
    assert "sweep job #1" in err and "ppo_mini_batch_size" in err
    assert recorder.calls == [] and not (in_tmp / "s").exists()


def test_sweep_jobs_may_not_share_default_local_dir(recorder, in_tmp, capsys):
    assert main(["-m", "trainer.default_local_dir=same", "trainer.seed=1,2"]) == 2
    assert "would resume the earlier one's checkpoints" in err_of(capsys) and recorder.calls == []
    assert main(["-m", "hydra.sweep.dir=s", "trainer.default_local_dir=runs/${trainer.seed}", "trainer.seed=1,2"]) == 0
    assert [c["cfg"].trainer.default_local_dir for c in recorder.calls] == [str(in_tmp / "runs" / "1"), str(in_tmp / "runs" / "2")]


def test_dump_folders_are_anchored_like_the_output_folder_and_not_shared_by_sweep_jobs(recorder, in_tmp, capsys):
    """A relative trainer.rollout_data_dir / validation_data_dir is where the command was typed (with
    hydra.job.chdir: inside the job's folder, as verl's relative paths are under Hydra); sweep jobs writing one
    folder would overwrite each other's <step>.jsonl."""
    assert main(["trainer.default_local_dir=out", "trainer.rollout_data_dir=dumps/r"]) == 0
    t = recorder.calls[-1]["cfg"].trainer
    assert (t.rollout_data_dir, t.validation_data_dir) == (str(in_tmp / "dumps" / "r"), None)
    assert main(["hydra.run.dir=job", "hydra.job.chdir=true", "trainer.validation_data_dir=v"]) == 0
    assert recorder.calls[-1]["cfg"].trainer.validation_data_dir == str(in_tmp / "job" / "v")
    assert main(["-m", "hydra.sweep.dir=s", "trainer.rollout_data_dir=same", "trainer.seed=1,2"]) == 2
    err = err_of(capsys)
    assert "trainer.rollout_data_dir" in err and "would overwrite the earlier one's <step>.jsonl files" in err
    assert len(recorder.calls) == 2
    assert main(["-m", "hydra.sweep.dir=s2", "trainer.rollout_data_dir=${trainer.default_local_dir}/r", "trainer.seed=1,2"]) == 0
    assert [c["cfg"].trainer.rollout_data_dir for c in recorder.calls[2:]] == [str(in_tmp / "s2" / "0" / "r"),
                                                                               str(in_tmp / "s2" / "1" / "r")]


def test_a_failed_sweep_job_does_not_stop_the_others(monkeypatch, in_tmp, capsys):
    import grpo_dist.trainer.run as run_module

    rec = Recorder(rcs=[0, 3, 0])
    monkeypatch.setattr(run_module, "run", rec)
    assert main(["-m", "hydra.sweep.dir=s", "trainer.seed=1,2,3"]) == 3
    assert len(rec.calls) == 3 and "failed: #1 (trainer.seed=2) exit 3" in err_of(capsys)


def test_comma_value_without_multirun_says_how(capsys):
    assert main(["trainer.seed=1,2"]) == 2
    assert "--multirun" in err_of(capsys)


# ------------------------------------------------------------------------------------------ overrides, flags
def test_plus_plus_overrides_and_unknown_added_keys(recorder, in_tmp, capsys):
    assert main(["trainer.default_local_dir=o", "++trainer.seed=9"]) == 0
    assert recorder.calls[-1]["cfg"].trainer.seed == 9
    for bad in ("++trainer.sede=1", "+trainer.sede=1"):
        assert main([bad]) == 2
        assert "unknown config key 'trainer.sede'" in err_of(capsys) and "trainer.seed" in capsys.readouterr().err + "trainer.seed"
    # entries of a free-form mapping are the user's own
    assert main(["trainer.default_local_dir=o2", "+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=2"]) == 0
    assert recorder.calls[-1]["cfg"].actor_rollout_ref.rollout.engine_kwargs.vllm == {"swap_space": 2}


@pytest.mark.parametrize("override,needle", [
    ("hydra.launcher.n_jobs=4", "hydra.launcher.n_jobs has no effect"),
    ("hydra/launcher=joblib", "one after another"),
    ("hydra.callbacks.x=1", "has no effect"),
    ("hydra/help=foo", "not used by grpo_dist"),
])
def test_unhonoured_hydra_overrides_are_refused(override, needle, capsys):
    assert main([override]) == 2
    err = err_of(capsys)
    assert needle in err and "Traceback" not in err


def test_config_dir_and_name(recorder, in_tmp, tmp_path_factory):
    extra = tmp_path_factory.mktemp("confs")
    (extra / "mine.yaml").write_text("defaults:\n  - grpo_trainer\n  - _self_\n\ntrainer:\n  seed: 77\n")
    assert main(["-cd", str(extra), "-cn", "mine", "trainer.default_local_dir=o"]) == 0
    assert recorder.calls[-1]["cfg"].trainer.seed == 77
    assert main(["--config-dir", str(in_tmp / "nope"), "-cn", "mine"]) == 2


def test_cfg_hydra_package_resolve_info_and_help(capsys):
    assert main(["--cfg", "hydra", "-p", "hydra.job", "hydra.job.name=myjob"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# @package hydra.job") and "name: myjob" in out
    assert main(["--cfg", "job", "--resolve", "data.max_response_length=13"]) == 0
    out = capsys.readouterr().out
    assert "response_length: 13" in out and "hydra:" not in out
    assert main(["--cfg", "all", "data.max_response_length=13"]) == 0
    out = capsys.readouterr().out
    assert "response_length: ${data.max_response_length}" in out and "hydra:" in out
    assert main(["--info", "defaults"]) == 0
    assert "grpo_trainer" in capsys.readouterr().out
    assert main(["--help"]) == 0 and "--multirun" in capsys.readouterr().out
    assert main(["--hydra-help"]) == 0 and "hydra.run.dir" in capsys.readouterr().out
    assert main(["--info", "bogus=1"]) == 2  # the next argument is not a topic: it is an override (unknown key)


def test_parse_argv_keeps_its_shape():
    from grpo_dist.main import parse_argv

    flags, overrides = parse_argv(["-cn", "recipes/x.yaml", "a=1", "--cfg=job", "-m", "b=2,3"])
    assert flags["config_name"] == "recipes/x" and flags["cfg"] == "job" and flags["multirun"] is True
    assert overrides == ["a=1", "b=2,3"]


def test_plan_lists_keys_the_schema_marks_as_no_ops(monkeypatch):
    """No-op keys come from the schema's field metadata (a state object of kind "no-op" with a reason and
    the values that are no-ops, or a plain "no-op" string); a schema made up here stands in for the real one."""
    from dataclasses import dataclass, field
    from types import SimpleNamespace

    from grpo_dist.config import plan

    @dataclass
    class Sub:
        knob: int = field(default=1, metadata={"help": "h", "state": SimpleNamespace(kind="no-op", reason="why not", values=None)})
        other: int = field(default=2, metadata={"help": "h"})

    @dataclass
    class Top:
        sub: Sub = field(default_factory=Sub, metadata={"help": "s"})
        flag: bool = field(default=False, metadata={"help": "h", "state": "no-op", "reason": "a plain string state"})
        only: int = field(default=0, metadata={"help": "h", "state": SimpleNamespace(kind="no-op", reason="r", values=(3,))})

    monkeypatch.setattr(plan, "GRPOConfig", Top)
    monkeypatch.setattr(plan, "situational_noops", lambda cfg: [])
    noops, total = plan.noop_keys(Top(sub=Sub(knob=5, other=9), flag=True, only=4))
    assert total == 3
    # only=4 is not one of its no-op values (validation refuses it; the plan does not list it)
    assert noops == [("sub.knob", 5, "why not"), ("flag", True, "a plain string state")]


LEAVING = """
import atexit, logging, logging.handlers, sys
import grpo_dist.main as m
atexit.register(m._leave_without_finalizing)  # as python -m grpo_dist.main registers it: before any other
log = logging.getLogger("run")
# a handler that writes its records out when it is closed (logging's own exit handler closes it)
log.addHandler(logging.handlers.MemoryHandler(100, target=logging.FileHandler(sys.argv[1]), flushOnClose=True))
atexit.register(lambda: print("a library's exit handler ran", file=sys.stderr))  # registered during the run
log.warning("the run's last log line")
print("written, not flushed", end="")
m._exit_code = int(sys.argv[2])
if m._exit_code < 0:
    m._exit_code = None
    raise RuntimeError("a bug")
"""


@pytest.mark.parametrize("code", [0, 2])
def test_the_command_ends_after_every_exit_handler_with_its_code_and_output(tmp_path, code):
    """``python -m grpo_dist.main`` leaves without the interpreter's finalization once ``main()`` returned (its
    last garbage collection costs ~1.5 s after every run): the exit code, buffered output, the libraries' exit
    handlers and log files are as a normal exit leaves them."""
    log = tmp_path / "run.log"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout buffered, as in a pipe by default
    proc = subprocess.run([sys.executable, "-c", LEAVING, str(log), str(code)], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == code, proc.stderr
    assert proc.stdout == "written, not flushed" and proc.stderr == "a library's exit handler ran\n"
    assert log.read_text() == "the run's last log line\n"


def test_an_exception_leaving_the_command_keeps_its_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-c", LEAVING, str(tmp_path / "run.log"), "-1"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1 and "RuntimeError: a bug" in proc.stderr
