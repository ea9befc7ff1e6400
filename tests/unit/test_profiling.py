"""verl's profiler keys: the plan read from them, the traces a worker process writes, and when the driver begins
and ends them (the real run: tests/e2e/conftest.py's ``full_run`` profiles steps 2-3 of rank 1)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from grpo_dist.config.profiling import CONTENTS, ProcessProfile, profile_plan
from grpo_dist.trainer.profiling import StepProfiler
from grpo_dist.utils.profiling import ProcessProfiler
from grpo_dist.workers.common import timed
from tests.configs import cfg_of, refused

ON = ("global_profiler.tool=torch", "global_profiler.steps=[3,1,2]", "actor_rollout_ref.actor.profiler.enable=true")


# ---- the plan -------------------------------------------------------------------------------------------
def test_nothing_is_profiled_without_a_tool_a_step_or_a_role():
    assert profile_plan(cfg_of()) is None
    assert profile_plan(cfg_of(*ON[1:])) is None  # no tool
    assert profile_plan(cfg_of(ON[0], ON[2])) is None  # no step
    assert profile_plan(cfg_of(*ON[:2])) is None  # no role enabled


def test_the_rollout_follows_the_actors_switch_and_ranks_unless_set_as_in_verl():
    p = profile_plan(cfg_of(*ON, "actor_rollout_ref.actor.profiler.ranks=[1]"))
    assert p.steps == (1, 2, 3) and not p.continuous
    assert sorted(p.roles) == ["actor", "rollout"]
    assert p.roles["actor"].ranks == p.roles["rollout"].ranks == (1,)
    assert sorted(profile_plan(cfg_of(*ON, "actor_rollout_ref.rollout.profiler.enable=false")).roles) == ["actor"]
    alone = profile_plan(cfg_of(*ON[:2], "actor_rollout_ref.rollout.profiler.enable=true"))
    assert sorted(alone.roles) == ["rollout"]


def test_ranks_contents_and_paths():
    p = profile_plan(cfg_of(*ON, "actor_rollout_ref.ref.profiler.enable=true", "actor_rollout_ref.ref.profiler.all_ranks=true",
                            "actor_rollout_ref.ref.profiler.tool_config.torch.contents=[shapes]",
                            "actor_rollout_ref.ref.profiler.save_path=/tmp/ref_traces",
                            "actor_rollout_ref.rollout.profiler.enable=false"))
    actor, ref = p.roles["actor"], p.roles["reference"]
    assert actor.ranks == (0,) and actor.profiles(0) and not actor.profiles(1)  # verl: rank 0 when none is named
    assert ref.ranks is None and ref.profiles(7)
    assert actor.contents == CONTENTS and ref.contents == ("shapes",)  # [] records everything
    assert actor.save_path == "outputs/profile" and ref.save_path == "/tmp/ref_traces"
    # the roles of one process share its trace: contents joined, the first role's folder
    both = p.process("models", ["actor", "reference"], 0, "cpu")
    assert both == ProcessProfile("models_rank0", "outputs/profile", CONTENTS, False, "cpu")
    assert p.process("models", ["actor", "reference"], 1, "cpu").contents == ("shapes",)
    assert p.process("rollout", ["rollout"], 0, "cpu") is None
    assert p.process("models (reward_model pool)", ["reward_model"], 0, "cpu") is None
    assert "at steps [1, 2, 3]" in p.line() and "one trace per step" in p.line()
    # a named reward model (reward_model.<name>) on its own pool takes reward_model's settings
    rm = profile_plan(cfg_of(*ON[:2], "reward_model.profiler.enable=true"))
    assert rm.process("models (reward_model pool)", ["reward_model.judge"], 0, "cpu").name == \
        "models_reward_model_pool_rank0"


@pytest.mark.parametrize("overrides,needles", [
    (("global_profiler.steps=[0,2]",), ["global_profiler.steps", "[0, 2]", "from 1"]),
    (("global_profiler.steps=last",), ["global_profiler.steps", "'last'"]),
    (("actor_rollout_ref.actor.profiler.tool_config.torch.contents=[cpu,gpu]",), ["contents", "['gpu']", "stack"]),
    (("global_profiler.profile_continuous_steps=true", "actor_rollout_ref.actor.profiler.tool_config.torch.discrete=true"),
     ["discrete", "profile_continuous_steps", "one trace per step"]),
    (("actor_rollout_ref.actor.profiler.tool=nsys",), ["actor_rollout_ref.actor.profiler.tool", "'nsys'", "torch"]),
    (("global_profiler.finish_hook_cmd=upload",), ["global_profiler.finish_hook_cmd", "save_path"]),
])
def test_settings_that_cannot_be_taken_are_one_message(overrides, needles):
    msg = refused(*ON, *overrides)
    for needle in needles:
        assert needle in msg, (needle, msg)


# ---- a worker process's traces --------------------------------------------------------------------------
class Shell:
    role = "actor"

    @timed
    def update_policy(self, x: torch.Tensor) -> float:
        return float((x @ x).sum())


def events(path) -> set[str]:
    return {e.get("name") for e in json.loads(path.read_text())["traceEvents"]}


def settings(tmp_path, discrete=False) -> ProcessProfile:
    return ProcessProfile("models_rank0", str(tmp_path), ("cpu",), discrete, "cpu")


def test_a_steps_trace_holds_each_call_marked_with_its_role_and_method(tmp_path, monkeypatch):
    import grpo_dist.utils.profiling as profiling

    process = ProcessProfiler()
    monkeypatch.setattr(profiling, "PROCESS", process)
    shell, x = Shell(), torch.ones(8, 8)
    shell.update_policy(x)  # before: not recorded
    process.begin(2, settings(tmp_path))
    out = shell.update_policy(x)
    assert out.value == 8 * 8 * 8 and out.busy_s > 0  # the result and its time as without the profiler
    shell.update_policy(x)
    assert process.end(3) == [str(tmp_path / "models_rank0_step2-3.json")]
    names = events(tmp_path / "models_rank0_step2-3.json")
    assert "actor.update_policy" in names and "aten::mm" in names
    process.begin(5, settings(tmp_path))
    assert process.end(5) == [str(tmp_path / "models_rank0_step5.json")]
    shell.update_policy(x)  # after: nothing written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models_rank0_step2-3.json", "models_rank0_step5.json"]


def test_discrete_traces_are_one_file_per_call(tmp_path, monkeypatch):
    import grpo_dist.utils.profiling as profiling

    process = ProcessProfiler()
    monkeypatch.setattr(profiling, "PROCESS", process)
    shell, x = Shell(), torch.ones(4, 4)
    process.begin(4, settings(tmp_path, discrete=True))
    shell.update_policy(x)
    shell.update_policy(x)
    written = process.end(4)
    assert written == [str(tmp_path / "step4" / "models_rank0_actor.update_policy.json"),
                       str(tmp_path / "step4" / "models_rank0_actor.update_policy_2.json")]
    assert all("aten::mm" in events(tmp_path / "step4" / p) for p in ("models_rank0_actor.update_policy.json",
                                                                       "models_rank0_actor.update_policy_2.json"))


# ---- the driver's side ----------------------------------------------------------------------------------
class Actor:
    """A Ray actor's handle, recording the calls sent to it."""

    def __init__(self, log: list, name: str) -> None:
        self.profile_begin = SimpleNamespace(remote=lambda step, s: log.append((name, "begin", step)) or [])
        self.profile_end = SimpleNamespace(remote=lambda step: log.append((name, "end", step)) or [f"{name}{step}"])


def driven(steps: list[int], *overrides: str, ranks=(0, 1), last: int | None = None) -> tuple[list, list]:
    plan = profile_plan(cfg_of(*ON[:2], "actor_rollout_ref.actor.profiler.enable=true", *overrides))
    log: list = []
    models = SimpleNamespace(role="models", ranks=list(ranks), workers=[Actor(log, f"m{r}") for r in ranks])
    reward = SimpleNamespace(role="reward", ranks=[0], workers=[Actor(log, "reward")])
    profiler = StepProfiler(plan, [(models, ["actor", "reference"]), (reward, ["reward"])], "cpu")
    profiler.get = lambda refs, timeout: refs
    for step in steps:
        profiler.step_begins(step)
    return log, profiler.finish()


def test_traces_begin_and_end_at_step_starts_and_the_last_at_the_end_of_the_run():
    log, written = driven([1, 2, 3, 4], "actor_rollout_ref.actor.profiler.all_ranks=true")
    assert log == [("m0", "begin", 1), ("m1", "begin", 1), ("m0", "end", 1), ("m1", "end", 1),
                   ("m0", "begin", 2), ("m1", "begin", 2), ("m0", "end", 2), ("m1", "end", 2),
                   ("m0", "begin", 3), ("m1", "begin", 3), ("m0", "end", 3), ("m1", "end", 3)]
    assert written == ["m01", "m11", "m02", "m12", "m03", "m13"]
    log, _ = driven([1, 2], "global_profiler.steps=[2]")  # the run ends inside a profiled step: ended at the end
    assert log == [("m0", "begin", 2), ("m0", "end", 2)]


def test_consecutive_steps_make_one_trace_with_profile_continuous_steps():
    log, _ = driven([1, 2, 3, 4, 5, 6], "global_profiler.steps=[1,2,3,5]",
                    "global_profiler.profile_continuous_steps=true")
    assert log == [("m0", "begin", 1), ("m0", "end", 3), ("m0", "begin", 5), ("m0", "end", 5)]
    resumed, _ = driven([3, 4], "global_profiler.steps=[1,2,3,5]", "global_profiler.profile_continuous_steps=true")
    assert resumed == [("m0", "begin", 3), ("m0", "end", 3)]  # a resumed run begins its trace at its first step


def test_a_trace_that_could_not_be_written_is_one_warning(capsys):
    plan = profile_plan(cfg_of(*ON))
    log: list = []
    group = SimpleNamespace(role="rollout", ranks=[0], workers=[Actor(log, "r")])
    profiler = StepProfiler(plan, [(group, ["rollout"])], "cpu")

    def get(refs, timeout):
        raise RuntimeError("disk full\nmore lines")

    profiler.get = get
    profiler.step_begins(1)
    assert profiler.finish() == []
    assert capsys.readouterr().out == ("grpo_dist: warning: profiler: not every trace was written "
                                       "(RuntimeError: disk full)\n")


def test_check_prints_what_will_be_profiled():
    from grpo_dist.config.plan import build_plan

    lines = build_plan(cfg_of(*ON), count_rows=False).lines()
    assert any("profiler: torch.profiler in the actor, rollout workers at steps [1, 2, 3]" in line
               for line in lines), lines
    assert not any("profiler" in line for line in build_plan(cfg_of(), count_rows=False).lines())
