"""Start-up checks a new user meets before any worker loads a model: which data key holds an unreadable
file, a custom reward function tried once on a training row, a full disk told apart from a permission problem.

The runs go through ``grpo_dist.trainer.run.run`` with the tiny model, a stand-in for Ray and stand-in
workers (:class:`StandInWorkers`), up to where the workers would load their models."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

from grpo_dist.distributed import worker_group
from tests.unit.test_command_line import restore_logging  # noqa: F401  (autouse: the jobs configure logging)
from tests.unit.test_run_messages import one_message, tiny_cfg

REPO = Path(__file__).resolve().parents[2]


class StandInWorkers:
    """The run's workers, as the driver creates them once Ray (a stand-in too) has started: their processes
    would import their libraries while the driver checks the model, reads the data and tries the reward
    function. Loading their models (``start``) stops the run here, as a worker that failed to start."""

    def __init__(self) -> None:
        self.created = self.loaded = self.closed = 0
        self.events: list[str] = []
        self.total_steps = None

    def create(self, *args, **kwargs) -> StandInWorkers:
        self.created += 1
        self.events.append("workers created")
        return self

    def start(self, total_steps=None, reward_decoder=None) -> None:
        from grpo_dist.distributed.worker_group import WorkerError

        self.loaded += 1
        self.events.append("models loading")
        self.total_steps, self.reward_decoder = total_steps, reward_decoder
        raise WorkerError("stopped here by the test")

    def close(self) -> None:
        self.closed += 1


@pytest.fixture
def no_ray(monkeypatch):
    """Ray must not start in these tests: a stand-in starts (init_ray: not started here) and stand-in workers
    (:class:`StandInWorkers`) are created; a run whose checks pass stops where the workers load their models."""
    from grpo_dist.trainer import roles

    workers = StandInWorkers()
    monkeypatch.setattr(worker_group, "init_ray", lambda **kwargs: False)
    monkeypatch.setattr(worker_group, "cluster_gpus", lambda: 0.0)
    monkeypatch.setattr(roles, "create_workers", workers.create)
    return workers


# ---- an unreadable data file names its key ----------------------------------------------------------
@pytest.mark.parametrize("key", ["data.train_files", "data.val_files"])
def test_unreadable_parquet_names_the_key_and_the_file(key, tiny_model_dir, reverse_data, tmp_path, no_ray, capsys):
    bad = tmp_path / "broken.parquet"
    bad.write_bytes(b"PAR1 this is not parquet PAR1")
    code = run_cfg(tiny_cfg(tiny_model_dir, reverse_data, tmp_path / "o", f"{key}={bad}"))
    tail = one_message(capsys.readouterr().err, 2, code, f"{key}: {bad}: not a readable parquet file")
    other = "data.val_files" if key == "data.train_files" else "data.train_files"
    assert other not in tail


def nothing_after(tail: str) -> None:
    """The message is the last thing printed: no line (a worker's, a library's) after it."""
    after = [t for t in tail.splitlines()[1:] if t.strip() and not t.startswith("  ")]
    assert not after, f"printed after the message: {after}"


def test_an_empty_training_file_is_one_message(tiny_model_dir, reverse_data, tmp_path, ray_must_not_start, capsys):
    """(The command line's exit code and message for a data file found wrong at start-up:
    tests/e2e/test_reliability_e2e.py's test_missing_column_names_the_file_and_the_column.)"""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code = run_cfg(tiny_cfg(tiny_model_dir, reverse_data, tmp_path / "o", f"data.train_files={empty}"))
    tail = one_message(capsys.readouterr().err, 2, code, "empty.jsonl")
    nothing_after(tail)


# ---- data and model faults a start meets: one message each, exit code 2, no model loaded ----------------------------
# (The command line's form of these, exit code and all, once: tests/e2e/test_reliability_e2e.py's
# test_missing_column_names_the_file_and_the_column.)
def good_row(i: int, content: str = "reverse 123") -> dict:
    return {"data_source": "grpo_dist/reverse", "prompt": [{"role": "user", "content": content}],
            "reward_model": {"style": "rule", "ground_truth": "321"}, "extra_info": {"index": i}}


def test_a_malformed_prompt_names_the_file_the_row_and_the_column(tiny_model_dir, reverse_data, tmp_path,
                                                                   ray_must_not_start, capsys):
    import json

    from grpo_dist.data.rows import load_rows

    rows = [good_row(i) for i in range(8)]
    rows[5]["prompt"] = 42
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code = run_cfg(tiny_cfg(tiny_model_dir, reverse_data, tmp_path / "o", f"data.train_files={bad}"))
    one_message(capsys.readouterr().err, 2, code, "bad.jsonl", "row 5", "prompt")
    # the option that skips bad rows and counts them instead goes past the data check
    assert len(load_rows(str(bad), skip_bad_rows=True)) == 7


def test_an_overlong_prompt_with_truncation_error_names_the_row_and_the_keys(tiny_model_dir, reverse_data, tmp_path,
                                                                             ray_must_not_start, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [good_row(i) for i in range(8)]
    rows[3] = good_row(3, "reverse " + "7" * 200)
    long = tmp_path / "long.parquet"
    pq.write_table(pa.Table.from_pylist(rows), long)
    code = run_cfg(tiny_cfg(tiny_model_dir, reverse_data, tmp_path / "o", f"data.train_files={long}"))
    one_message(capsys.readouterr().err, 2, code, "long.parquet", "row 3", "data.max_prompt_length", "data.truncation")


def test_a_response_longer_than_the_models_context_is_refused(tiny_model_dir, reverse_data, tmp_path, no_ray,
                                                              capsys):
    code = run_cfg(tiny_cfg(tiny_model_dir, reverse_data, tmp_path / "o", "data.max_response_length=1000"))
    one_message(capsys.readouterr().err, 2, code, "max_response_length", "max_position_embeddings")
    assert no_ray.loaded == 0 and no_ray.closed == no_ray.created


def test_an_engine_context_longer_than_the_models_is_refused(tiny_model_dir, reverse_data, tmp_path, no_ray, capsys):
    """vLLM refuses rollout.max_model_len above the model's max_position_embeddings, inside a worker."""
    code = run_cfg(tiny_cfg(tiny_model_dir, reverse_data, tmp_path / "o", "actor_rollout_ref.rollout.max_model_len=4096",
                            "actor_rollout_ref.rollout.name=vllm"))
    one_message(capsys.readouterr().err, 2, code, "rollout.max_model_len = 4096", "max_position_embeddings")
    assert no_ray.loaded == 0


@pytest.mark.parametrize("rope", [{"rope_type": "yarn", "factor": 4.0}, {"type": "dynamic", "factor": 2.0}])
def test_a_context_stretched_by_rope_scaling_is_left_to_vllm(rope, tiny_model_dir, monkeypatch):
    """With RoPE scaling vLLM derives a longer context than max_position_embeddings: the check stands aside."""
    from types import SimpleNamespace

    import transformers

    from grpo_dist.config import preflight

    config = SimpleNamespace(max_position_embeddings=256, rope_scaling=rope, vocab_size=10**6)
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", lambda *a, **k: config)
    cfg = tiny_cfg(tiny_model_dir, {"train": "x", "test": "x"}, "o", "actor_rollout_ref.rollout.max_model_len=4096",
                   "actor_rollout_ref.rollout.name=vllm")
    preflight.check_model_fits(cfg, str(tiny_model_dir), [0] * 10)
    config.rope_scaling = None
    with pytest.raises(ValueError, match="max_model_len = 4096 is longer than the model's context"):
        preflight.check_model_fits(cfg, str(tiny_model_dir), [0] * 10)


def test_a_tokenizer_that_does_not_fit_the_model_is_refused(tiny_model_dir, reverse_data, tmp_path,
                                                            ray_must_not_start, capsys):
    from grpo_dist.utils.tiny_model import build_tiny_model

    other = build_tiny_model(tmp_path / "other")  # full printable-ASCII vocabulary: larger than the model's
    code = run_cfg(tiny_cfg(tiny_model_dir, reverse_data, tmp_path / "o", f"data.tokenizer={other}"))
    one_message(capsys.readouterr().err, 2, code, "tokenizer", "vocab_size")


def test_ranks_asking_for_gpus_the_cluster_lacks_are_refused(tiny_model_dir, reverse_data, tmp_path, no_ray, capsys):
    """(The cluster's GPUs are counted once Ray has started: the stand-in reports none, as on this machine.)"""
    code = run_cfg(tiny_cfg(tiny_model_dir, reverse_data, tmp_path / "o", "trainer.device=cuda"))
    one_message(capsys.readouterr().err, 2, code, "trainer.device", "no GPUs")
    assert no_ray.loaded == 0 and no_ray.closed == no_ray.created


def test_the_workers_import_while_the_driver_reads_the_data(tiny_model_dir, reverse_data, tmp_path, no_ray,
                                                             monkeypatch, capsys):
    """The workers' processes are created (and import their libraries) before the driver loads the tokenizer
    and reads the data; the number of steps, which the data decides, reaches them when they load their models."""
    from transformers import AutoTokenizer

    from grpo_dist.data.dataset import PromptDataset

    tokenizer, read = AutoTokenizer.from_pretrained, PromptDataset.from_files

    def loading_tokenizer(*args, **kwargs):
        no_ray.events.append("tokenizer")
        return tokenizer(*args, **kwargs)

    def reading(*args, **kwargs):
        no_ray.events.append(f"data {kwargs['key']}")
        return read(*args, **kwargs)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", loading_tokenizer)
    monkeypatch.setattr(PromptDataset, "from_files", reading)
    code = run_cfg(tiny_cfg(tiny_model_dir, reverse_data, tmp_path / "o", "trainer.total_training_steps=3"))
    one_message(capsys.readouterr().err, 1, code, "stopped here by the test")
    assert no_ray.events == ["workers created", "tokenizer", "data data.train_files", "data data.val_files",
                             "models loading"]
    assert no_ray.total_steps == 3 and no_ray.closed == 1
    assert no_ray.reward_decoder["tokenizer_json"]  # the reward worker's decoder, from the tokenizer the driver loaded


def run_cfg(cfg) -> int:
    from grpo_dist.config.spec import resolve
    from grpo_dist.trainer.run import run

    return run(resolve(cfg))


# ---- the custom reward function, tried once before any worker loads a model ------------------------------------------
REWARDS = '''import os
import time


def raises(data_source, solution_str, ground_truth, extra_info=None):
    table = {"other": 1.0}
    return table[solution_str]


def returns_text(data_source, solution_str, ground_truth, extra_info=None):
    return "1.0"


def sleeps(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep(30)
    return 1.0


def changes_its_process(data_source, solution_str, ground_truth, extra_info=None):
    os.environ["GRPO_DIST_TEST_TRIAL_MARK"] = "set"
    with open(os.path.join(os.path.dirname(__file__), "calls.txt"), "a") as f:
        f.write(f"{data_source} {solution_str!r} {ground_truth!r} {extra_info['index']}\\n")
    return float(solution_str == ground_truth)
'''


@pytest.fixture
def rewards_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(REWARDS)
    return path


def reward_cfg(tiny_model_dir, reverse_data, out, path, name, *extra):
    return tiny_cfg(tiny_model_dir, reverse_data, out, f"custom_reward_function.path={path}",
                    f"custom_reward_function.name={name}", "data.shuffle=false", *extra)


@pytest.fixture
def ray_must_not_start(no_ray):
    """A fault the checks find stops the run before any worker loads a model, and the workers created meanwhile
    (their processes were importing their libraries) are stopped."""
    yield no_ray
    # once per run the test starts (a test may start several), each set of workers stopped
    assert no_ray.created >= 1 and no_ray.loaded == 0 and no_ray.closed == no_ray.created, vars(no_ray)


def test_a_reward_that_raises_stops_the_start_naming_its_file_and_line(tiny_model_dir, reverse_data, tmp_path,
                                                                       rewards_file, ray_must_not_start, capsys):
    line = next(i for i, text in enumerate(REWARDS.splitlines(), start=1) if "return table[" in text)
    code = run_cfg(reward_cfg(tiny_model_dir, reverse_data, tmp_path / "o", rewards_file, "raises"))
    tail = one_message(capsys.readouterr().err, 2, code,
                       f"reward function raises from {rewards_file} failed when tried once before the run",
                       f"raised KeyError: '", f"at {rewards_file}:{line} (in raises)",
                       "fix it (custom_reward_function.path / .name)", "reward_model.on_error=zero")
    assert "rerun" not in tail
    assert not (tmp_path / "o" / ".grpo_dist.lock").exists()


def test_a_reward_that_returns_text_stops_the_start(tiny_model_dir, reverse_data, tmp_path, rewards_file,
                                                    ray_must_not_start, capsys):
    code = run_cfg(reward_cfg(tiny_model_dir, reverse_data, tmp_path / "o", rewards_file, "returns_text"))
    one_message(capsys.readouterr().err, 2, code, "returns_text", "returned a str ('1.0'), not a number")


def test_broken_reward_function_is_named_before_workers_start(tiny_model_dir, reverse_data, tmp_path,
                                                              ray_must_not_start, capsys):
    """A function that fails on every sample (the reliability tests' file, loaded by path as users do)
    is tried once on the first training row and named, with its file and line, before any worker loads a model;
    with on_error=zero it is a warning (the run goes on: tests/e2e/test_reliability_e2e.py's
    test_reward_faults_scored_zero_and_counted). The command line's exit code and message for a
    reward function found wrong at start-up: test_wrong_reward_function_name_is_named_before_workers_start."""
    faulty = REPO / "tests" / "e2e" / "reward_faulty.py"
    line = next(i for i, t in enumerate(faulty.read_text().splitlines(), 1) if 'raise ZeroDivisionError("this' in t)
    for name, needles in [("always_raises", ["raised ZeroDivisionError: this reward function is broken",
                                             f"at {faulty}:{line} (in always_raises)"]),
                          ("returns_string", ["returned a str ('1.0'), not a number"])]:
        t0 = time.time()
        out = tmp_path / name
        code = run_cfg(reward_cfg(tiny_model_dir, reverse_data, out, faulty, name))
        tail = one_message(capsys.readouterr().err, 2, code,
                           f"reward function {name} from {faulty} failed when tried once before the run", *needles,
                           "custom_reward_function.path")
        # the message ends the output
        after = [t for t in tail.splitlines()[1:] if t.strip() and not t.startswith("  ")]
        assert not after, f"printed after the message: {after}"
        assert time.time() - t0 < 60 and not (out / "placement.json").exists(), "no worker was started"


def test_a_reward_slower_than_its_limit_is_stopped_and_named(tiny_model_dir, reverse_data, tmp_path, rewards_file,
                                                             ray_must_not_start, capsys):
    t0 = time.monotonic()
    code = run_cfg(reward_cfg(tiny_model_dir, reverse_data, tmp_path / "o", rewards_file, "sleeps",
                              "reward_model.timeout_s=1"))
    assert time.monotonic() - t0 < 20
    one_message(capsys.readouterr().err, 2, code, "timed out after 1 s", "raise reward_model.timeout_s")


def test_with_on_error_zero_a_failing_reward_is_a_warning_and_the_run_starts(tiny_model_dir, reverse_data, tmp_path,
                                                                            rewards_file, no_ray, capsys):
    code = run_cfg(reward_cfg(tiny_model_dir, reverse_data, tmp_path / "o", rewards_file, "raises",
                              "reward_model.on_error=zero"))
    err = capsys.readouterr().err
    one_message(err, 1, code, "stopped here by the test")  # it went on to start Ray
    assert "grpo_dist: warning: reward function raises from" in err and "reward/num_errors" in err


def test_the_trial_call_gets_the_first_row_and_leaves_the_driver_alone(tiny_model_dir, reverse_data, tmp_path,
                                                                        rewards_file, no_ray, capsys, monkeypatch):
    """One call, in a process of its own: the row's data_source, its ground truth as the response, its
    extra_info; what the function does to its process (here its environment) stays there."""
    import pyarrow.parquet as pq

    monkeypatch.delenv("GRPO_DIST_TEST_TRIAL_MARK", raising=False)
    code = run_cfg(reward_cfg(tiny_model_dir, reverse_data, tmp_path / "o", rewards_file, "changes_its_process"))
    one_message(capsys.readouterr().err, 1, code, "stopped here by the test")
    first = pq.read_table(reverse_data["train"]).slice(0, 1).to_pylist()[0]
    truth = first["reward_model"]["ground_truth"]
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert calls == [f"{first['data_source']} {truth!r} {truth!r} {first['extra_info']['index']}"]
    assert "GRPO_DIST_TEST_TRIAL_MARK" not in os.environ


# ---- a full disk at start-up ---------------------------------------------------------------------------
def main_args(tiny_model_dir, reverse_data, out, *extra):
    return [f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={reverse_data['train']}",
            f"data.val_files={reverse_data['test']}", "data.train_batch_size=4", "data.max_response_length=8",
            "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.rollout.name=hf", "trainer.n_gpus_per_node=1", "trainer.device=cpu",
            f"trainer.default_local_dir={out}", *extra]


def disk_full_on(monkeypatch, what: str, errnum: int = errno.ENOSPC):
    """The start's write of ``what`` fails as on a full disk: the run's ``config.yaml``, or Hydra's
    ``.hydra/`` files (after the folder and its first file were written)."""
    from grpo_dist.config import hydra_cli
    from grpo_dist.trainer import run as run_module

    def fail(path):
        raise OSError(errnum, os.strerror(errnum), str(path))

    if what == "config.yaml":
        monkeypatch.setattr(run_module, "save_config", lambda cfg, out_dir: fail(out_dir / "config.yaml"))
    else:
        def partly(job):
            sub = os.path.join(job.output_dir, ".hydra")
            os.makedirs(sub, exist_ok=True)
            with open(os.path.join(sub, "config.yaml"), "w") as f:
                f.write("data:\n")
            fail(os.path.join(sub, "hydra.yaml"))

        monkeypatch.setattr(hydra_cli, "write_hydra_files", partly)


@pytest.mark.parametrize("name", ["config.yaml", ".hydra"])
def test_a_full_disk_at_start_says_so_and_leaves_nothing_behind(name, tiny_model_dir, reverse_data, tmp_path,
                                                                 monkeypatch, ray_must_not_start, capsys):
    from grpo_dist.main import main

    out = tmp_path / "runs" / "o"
    disk_full_on(monkeypatch, name)
    code = main(main_args(tiny_model_dir, reverse_data, out))
    tail = one_message(capsys.readouterr().err, 2, code, f"cannot write to trainer.default_local_dir={out}: the disk is "
                       "full (No space left on device, ", " free, writing ", f"{out}/{name}",
                       "free space on that disk, or point trainer.default_local_dir at a directory on another one")
    assert "give a directory this user can create and write" not in tail
    assert not (tmp_path / "runs").exists(), sorted(str(p) for p in tmp_path.rglob("*"))


def test_a_full_quota_is_named_and_an_earlier_runs_files_stay(tiny_model_dir, reverse_data, tmp_path, monkeypatch,
                                                              ray_must_not_start, capsys):
    from grpo_dist.main import main

    out = tmp_path / "o"
    (out / ".hydra").mkdir(parents=True)
    earlier = {out / "config.yaml": "earlier: 1\n", out / "main.log": "earlier log\n",
               out / ".hydra" / "config.yaml": "earlier: 2\n", out / "metrics.jsonl": '{"step": 1}\n'}
    for path, text in earlier.items():
        path.write_text(text)
    disk_full_on(monkeypatch, ".hydra", errno.EDQUOT)
    code = main(main_args(tiny_model_dir, reverse_data, out))
    one_message(capsys.readouterr().err, 2, code, "this user's disk quota is used up")
    # the earlier run's log and metrics are untouched (its config.yaml files were rewritten by this start)
    assert [(out / n).read_text() for n in ("main.log", "metrics.jsonl")] == ["earlier log\n", '{"step": 1}\n']
    assert sorted(p.name for p in out.iterdir()) == [".hydra", "config.yaml", "main.log", "metrics.jsonl"]


def test_a_folder_this_user_cannot_write_still_asks_for_another(tiny_model_dir, reverse_data, tmp_path):
    """Run as a user runs it, in a process of its own (in-process, a stream an earlier test closed was
    written to after the message, in the full suite only)."""
    import subprocess
    import sys

    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    proc = subprocess.run([sys.executable, "-m", "grpo_dist.main", *main_args(tiny_model_dir, reverse_data, blocker / "out")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))})
    tail = one_message(proc.stderr, 2, proc.returncode, f"cannot write to trainer.default_local_dir={blocker / 'out'}",
                       "give a directory this user can create and write")
    assert "full" not in tail
    nothing_after(tail)


def test_a_start_refused_for_its_data_leaves_no_output_folder(tiny_model_dir, reverse_data, tmp_path,
                                                              ray_must_not_start, capsys):
    from grpo_dist.main import main

    bad = tmp_path / "broken.parquet"
    bad.write_bytes(b"PAR1 not parquet PAR1")
    code = main(main_args(tiny_model_dir, reverse_data, tmp_path / "o", f"data.val_files={bad}"))
    one_message(capsys.readouterr().err, 2, code, "data.val_files")
    assert not (tmp_path / "o").exists()


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    from pathlib import Path

    from grpo_dist.utils.disk import write_text_atomic

    target = tmp_path / "config.yaml"
    target.write_text("earlier\n")
    real = Path.write_text

    def half_then_full(self, text, *a, **k):
        real(self, text[:3])
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_text", half_then_full)
    with pytest.raises(OSError):
        write_text_atomic(target, "new: 1\n")
    monkeypatch.undo()
    assert target.read_text() == "earlier\n" and [p.name for p in tmp_path.iterdir()] == ["config.yaml"]
    write_text_atomic(target, "new: 1\n")
    assert target.read_text() == "new: 1\n"


def test_what_the_driver_loads_before_ray_starts_leaves_out_the_training_loops_libraries():
    """Up to Ray's start the driver loads the configuration, the run's plan, the role table and Ray's client,
    not the batch container (tensordict, which loads torch's compiler stack: seconds) nor transformers (the
    workers' settings need it once Ray has started): the loop's libraries load while the workers' processes start."""
    import subprocess
    import sys

    code = ("import sys, grpo_dist.main, grpo_dist.trainer.run, grpo_dist.config.launch, grpo_dist.config.driver_plan, grpo_dist.trainer.roles, "
            "grpo_dist.trainer.checkpoint, grpo_dist.trainer.tracking, grpo_dist.rewards.custom, "
            "grpo_dist.distributed.worker_group; "
            "print(sorted(m for m in ('tensordict', 'transformers', 'grpo_dist.batch') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout


def test_a_dump_folder_this_user_cannot_write_stops_the_start_naming_its_key(tiny_model_dir, reverse_data, tmp_path,
                                                                             no_ray, capsys):
    """trainer.rollout_data_dir under a file: the run stops before Ray and any worker start, one message naming the
    key, instead of failing at the first step's dump."""
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    code = run_cfg(tiny_cfg(tiny_model_dir, reverse_data, tmp_path / "o", f"trainer.rollout_data_dir={blocker / 'dumps'}"))
    tail = one_message(capsys.readouterr().err, 2, code, f"cannot write to trainer.rollout_data_dir={blocker / 'dumps'}",
                       "give a directory this user can create and write")
    nothing_after(tail)
    assert no_ray.created == 0
