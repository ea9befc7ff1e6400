"""verl's profiler keys: ``<role>.profiler.*`` and ``global_profiler.*``.

grpo_dist runs torch's profiler (``global_profiler.tool=torch``) in the worker processes of the roles whose
``profiler.enable`` is on, for the steps in ``global_profiler.steps`` (:mod:`grpo_dist.config.profiling` reads
these keys; :mod:`grpo_dist.utils.profiling` records the traces). The other tools (nsys, npu, torch_memory,
msprobe) are refused; their settings, the schedule over mini-batches, the rollout's token window and the
relocation of engine traces have no effect (every trace is written into ``save_path`` whole); the finish hook
is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from grpo_dist.config.fields import F, Honoured, NoOp, Refused, S

TOOLS = ("torch",)
"""The profilers built here."""
_OTHER_TOOL = NoOp("a setting of a profiler not built here (global_profiler.tool accepts null or torch)")
_WHOLE = NoOp("every mini-batch of a profiled stage is recorded (no schedule over mini-batches)")
_TOKENS = NoOp("a profiled rollout stage is recorded whole (no window of response tokens)")
_RELOCATE = NoOp("every trace is written into save_path itself")
_FINISH_HOOK = Refused("a command run after profiling is not built here; the traces are in "
                       "global_profiler.save_path when the run ends: copy them from there")
_TOOL_REFUSALS = tuple(
    (name, f"only torch's profiler is built here (global_profiler.tool=torch); {why}")
    for name, why in (("nsys", "run the job under nsys yourself for Nsight Systems"),
                      ("npu", "Ascend NPUs are not supported"),
                      ("torch_memory", "CUDA memory snapshots are not built; torch with contents=[memory] "
                                       "records allocations"),
                      ("precision_debugger", "msprobe is not supported")))


def _tool_state() -> Any:
    return Honoured(refuse=_TOOL_REFUSALS)


@dataclass
class NpuToolConfig:
    analysis: bool = F(True, "Ascend NPU profiler: analyse the traces")
    contents: List[str] = F([], "Ascend NPU profiler: what to record")
    discrete: bool = F(False, "Ascend NPU profiler: one trace per stage")
    level: str = F("level0", "Ascend NPU profiler: collection level")
    profile_token_start: Optional[int] = F(None, "rollout: first generated token to profile")
    profile_token_end: Optional[int] = F(None, "rollout: last generated token to profile")


@dataclass
class NsysToolConfig:
    discrete: bool = F(False, "Nsight Systems: one capture range per stage")


@dataclass
class TorchScheduleConfig:
    wait: int = F(0, "torch.profiler schedule: steps to wait")
    warmup: int = F(0, "torch.profiler schedule: warm-up steps")
    active: int = F(0, "torch.profiler schedule: recorded steps")
    repeat: int = F(0, "torch.profiler schedule: cycles")
    skip_first: int = F(0, "torch.profiler schedule: steps skipped first")


@dataclass
class TorchToolConfig:
    contents: List[str] = F([], "torch.profiler: what to record besides cpu: cuda, memory, shapes, stack "
                                "([] = all of them)")
    discrete: bool = F(False, "torch.profiler: one trace per stage (a worker call) instead of one per step")
    schedule: TorchScheduleConfig = S(TorchScheduleConfig, "torch.profiler's schedule over an update's "
                                                           "mini-batches", _WHOLE)
    profile_token_start: Optional[int] = F(None, "rollout: first generated token to profile", _TOKENS)
    profile_token_end: Optional[int] = F(None, "rollout: last generated token to profile", _TOKENS)


@dataclass
class TorchMemoryToolConfig:
    trace_alloc_max_entries: int = F(100000, "memory snapshots: most allocation records kept")
    stack_depth: int = F(32, "memory snapshots: stack frames per record")


@dataclass
class PrecisionDebuggerConfig:
    config_path: Optional[str] = F(None, "msprobe precision debugger: its configuration file")
    stages: Any = F(None, "precision debugger: stages to dump")
    steps: Any = F(None, "precision debugger: steps to dump")
    strict: bool = F(False, "precision debugger: fail on a mismatch")


@dataclass
class ToolConfig:
    npu: NpuToolConfig = S(NpuToolConfig, "Ascend NPU profiler", _OTHER_TOOL)
    nsys: NsysToolConfig = S(NsysToolConfig, "NVIDIA Nsight Systems", _OTHER_TOOL)
    torch: TorchToolConfig = S(TorchToolConfig, "torch.profiler")
    torch_memory: TorchMemoryToolConfig = S(TorchMemoryToolConfig, "CUDA memory snapshots", _OTHER_TOOL)
    precision_debugger: PrecisionDebuggerConfig = S(PrecisionDebuggerConfig, "msprobe precision debugger",
                                                    _OTHER_TOOL)


@dataclass
class ProfilerConfig:
    """``<role>.profiler``: verl's per-role profiler."""

    tool: Optional[str] = F(None, "profiler of this role: null = global_profiler.tool's; torch", _tool_state())
    enable: bool = F(False, "profile this role's worker processes in global_profiler.steps")
    all_ranks: bool = F(False, "profile every rank of the role")
    ranks: List[int] = F([], "ranks to profile ([] and all_ranks=false: rank 0)")
    save_path: Optional[str] = F(None, "folder of the traces (null: global_profiler.save_path)")
    tool_config: ToolConfig = S(ToolConfig, "per-tool settings")
    finish_hook_all_ranks: bool = F(False, "run the finish hook on every rank", _FINISH_HOOK)
    finish_hook_cmd: Optional[str] = F(None, "command run when profiling ends", _FINISH_HOOK)
    finish_hook_ranks: List[int] = F([], "ranks that run the finish hook", _FINISH_HOOK)
    relocate_results: bool = F(False, "move the traces after profiling", _RELOCATE)


@dataclass
class RolloutProfilerConfig(ProfilerConfig):
    """``actor_rollout_ref.rollout.profiler``: as verl's, its switch and ranks follow the actor's unless set."""

    enable: bool = F("${oc.select:actor_rollout_ref.actor.profiler.enable,false}",
                     "profile the rollout's worker processes in global_profiler.steps (default: the actor's)")
    all_ranks: bool = F("${oc.select:actor_rollout_ref.actor.profiler.all_ranks,false}",
                        "profile every rollout rank (default: the actor's)")
    ranks: List[int] = F("${oc.select:actor_rollout_ref.actor.profiler.ranks,[]}",
                         "rollout ranks to profile (default: the actor's; [] and all_ranks=false: rank 0)")


@dataclass
class NsysGlobalConfig:
    discrete: bool = F(False, "Nsight Systems: one capture range per stage")
    controller_nsight_options: Dict[str, Any] = F(
        {"trace": "cuda,nvtx,cublas,ucx", "cuda-memory-usage": "true", "cuda-graph-trace": "graph"},
        "nsys options of the driver process",
    )
    worker_nsight_options: Dict[str, Any] = F(
        {"trace": "cuda,nvtx,cublas,ucx", "cuda-memory-usage": "true", "cuda-graph-trace": "graph",
         "capture-range": "cudaProfilerApi", "capture-range-end": None, "kill": "none"},
        "nsys options of the worker processes",
    )


@dataclass
class TorchMemoryGlobalConfig:
    trace_alloc_max_entries: int = F(100000, "memory snapshots: most allocation records kept")
    stack_depth: int = F(32, "memory snapshots: stack frames per record")
    context: str = F("all", "memory snapshots: what context to record")
    stacks: str = F("all", "memory snapshots: which stacks to record")
    kw_args: Dict[str, Any] = F({}, "memory snapshots: further arguments")


@dataclass
class GlobalToolConfig:
    nsys: NsysGlobalConfig = S(NsysGlobalConfig, "NVIDIA Nsight Systems")
    torch_memory: TorchMemoryGlobalConfig = S(TorchMemoryGlobalConfig, "CUDA memory snapshots")
    precision_debugger: PrecisionDebuggerConfig = S(PrecisionDebuggerConfig, "msprobe precision debugger")


@dataclass
class GlobalProfilerConfig:
    """``global_profiler``: verl's run-wide profiler settings."""

    tool: Optional[str] = F(None, "profiler: null = none; torch (torch.profiler in the worker processes of "
                                  "the roles with profiler.enable)", _tool_state())
    steps: Any = F(None, "training steps to profile (a list of step numbers, from 1); null = none")
    profile_continuous_steps: bool = F(False, "consecutive profiled steps make one trace per process "
                                              "(needs discrete=false)")
    save_path: str = F("outputs/profile", "folder of the traces")
    global_tool_config: GlobalToolConfig = S(GlobalToolConfig, "per-tool settings", _OTHER_TOOL)
    finish_hook_all_ranks: bool = F(False, "run the finish hook on every rank", _FINISH_HOOK)
    finish_hook_cmd: Optional[str] = F(None, "command run when profiling ends", _FINISH_HOOK)
    finish_hook_ranks: List[int] = F([], "ranks that run the finish hook", _FINISH_HOOK)
    relocate_results: bool = F(False, "move the traces after profiling", _RELOCATE)


def profiler_section(role: str) -> Any:
    """The ``profiler`` section of ``role`` (:mod:`grpo_dist.config.profiling` reads it)."""
    return S(ProfilerConfig, f"verl's profiler of the {role}: torch.profiler traces of its worker processes")


def rollout_profiler_section() -> Any:
    return S(RolloutProfilerConfig, "verl's profiler of the rollout: torch.profiler traces of its worker "
                                    "processes (follows the actor's unless set)")


def global_profiler_section() -> Any:
    return S(GlobalProfilerConfig, "verl's run-wide profiler: which tool, which steps, where the traces go")
