"""A failed run's message is printed after Ray and the workers are shut down (their late log lines
come before it), and still printed, once, when shutting down hangs."""

from __future__ import annotations

import sys
import time

import pytest

from grpo_dist.trainer import run as run_mod
from grpo_dist.trainer.run import LastWord


def test_the_message_comes_after_the_cleanup_and_once(capsys):
    word = LastWord()
    word.set("actor worker rank 1 failed during update_policy", 1)
    assert word and word.code == 1
    word.start_clock()
    print("(RolloutWorker pid=1) a late log line", flush=True)  # what Ray forwards while shutting down
    word.say_now()
    word.say_now()
    out = capsys.readouterr()
    assert out.err == "grpo_dist: error: actor worker rank 1 failed during update_policy\n"
    assert "late log line" in out.out


def test_a_hung_shutdown_does_not_hide_the_message(capsys, monkeypatch):
    monkeypatch.setattr(run_mod, "LAST_WORD_WAIT_S", 0.2)
    word = LastWord()
    word.set("stopped on SIGTERM", 143)
    word.start_clock()
    time.sleep(1.0)  # closing the workers takes longer than allowed
    assert capsys.readouterr().err == "grpo_dist: error: stopped on SIGTERM\n"
    word.say_now()  # closing ends after all: nothing more is printed
    assert capsys.readouterr().err == ""


def test_nothing_is_said_when_the_run_did_not_fail(capsys):
    word = LastWord()
    assert not word
    word.start_clock()
    word.say_now()
    assert capsys.readouterr().err == ""


# ---- every error class grpo_dist defines is one message at the run's top level -------------------------------
def grpo_dist_error_classes() -> list[type]:
    """Every exception class defined in the package (found by importing its modules, so a class added later
    is covered without a change here)."""
    import importlib
    import inspect
    import pkgutil

    import grpo_dist

    found = set()
    for mod in pkgutil.walk_packages(grpo_dist.__path__, "grpo_dist."):
        module = importlib.import_module(mod.name)
        found |= {obj for obj in vars(module).values()
                  if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == mod.name}
    return sorted(found, key=lambda c: f"{c.__module__}.{c.__qualname__}")


ERROR_CLASSES = grpo_dist_error_classes()


def documented_code(cls: type) -> int:
    """docs/reliability.md: 143 a stop on SIGTERM, 2 bad input, 1 a failure during training."""
    from grpo_dist.trainer.stop import Interrupted, StopRequested
    from grpo_dist.utils.run_lock import RunLockError

    if issubclass(cls, (Interrupted, StopRequested)):
        return 143
    return 2 if issubclass(cls, (ValueError, RunLockError)) else 1


def test_the_error_classes_are_found():
    names = {c.__name__ for c in ERROR_CLASSES}
    assert {"DynamicSamplingError", "WorkerError", "Interrupted", "DataError", "RewardError"} <= names, names


def one_line(err: str, code: int, got: int, text: str) -> None:
    assert got == code, (got, err)
    assert "Traceback" not in err, err
    said = [line for line in err.splitlines() if line.startswith("grpo_dist: ")]
    assert len(said) == 1 and said[0].startswith("grpo_dist: error: ") and text in err, err


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
def test_every_error_class_is_one_message_through_the_run_and_the_command_line(cls, tiny_model_dir, reverse_data,
                                                                               tmp_path, monkeypatch, capsys):
    """Raised while training (the driver's fit, Ray stubbed out), through ``run`` and through ``main``;
    raised while the command line is composed, through ``main``: one message, no traceback, the documented
    exit code."""
    from grpo_dist import main as main_mod
    from grpo_dist.distributed import worker_group
    from grpo_dist.trainer import driver

    monkeypatch.delenv("GRPO_DIST_DEBUG", raising=False)
    text = f"the {cls.__name__} of this test"

    class Trainer:
        def __init__(self, *args, **kwargs):
            pass

        def start_workers(self, workers=None):
            pass

        def fit(self, resume):
            raise cls(text)

        def close(self):
            print("(worker pid=7) a late log line", file=sys.stderr, flush=True)

    monkeypatch.setattr(worker_group, "init_ray", lambda **kw: False)
    monkeypatch.setattr(worker_group, "cluster_gpus", lambda: 0)
    monkeypatch.setattr(driver, "GRPOTrainer", Trainer)
    monkeypatch.setattr("grpo_dist.trainer.roles.create_workers", lambda *args: None)  # no Ray here
    out = tmp_path / "o"
    code = main_mod.main(tiny_overrides(tiny_model_dir, reverse_data, out))
    err = capsys.readouterr().err
    one_line(err, documented_code(cls), code, text)
    assert err.index("a late log line") < err.index("grpo_dist: error: ")  # said after the clean-up

    def compose_fails(args):
        raise cls(text)

    monkeypatch.setattr(main_mod, "compose_jobs", compose_fails)
    code = main_mod.main(tiny_overrides(tiny_model_dir, reverse_data, out))
    err = capsys.readouterr().err
    assert code == documented_code(cls) and "Traceback" not in err and text in err, (code, err)
    assert len([line for line in err.splitlines() if line.startswith("grpo_dist: ")]) == 1, err


def tiny_overrides(model, data, out) -> list[str]:
    return [f"actor_rollout_ref.model.path={model}", f"data.train_files={data['train']}",
            f"data.val_files={data['test']}", "data.train_batch_size=4", "data.max_response_length=8",
            "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.rollout.name=hf", "trainer.n_gpus_per_node=1", "trainer.device=cpu",
            "trainer.logger=[console]", f"trainer.default_local_dir={out}", f"hydra.run.dir={out}"]
