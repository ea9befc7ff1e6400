"""verl's profiler keys: ``<role>.profiler.*`` and ``global_profiler.*``.

No profiler is built into grpo_dist (its step timings are the ``timing_s/*`` metrics, and
``scripts/bench/profile_update.py`` profiles an update with torch's profiler). The switches
(``<role>.profiler.enable``, ``global_profiler.tool``) are accepted only off; every other key is a
setting of a profiler that does not run, so it has no effect at any value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from grpo_dist.config.fields import F, NoOp, Refused, S

PROFILER_OFF = NoOp("a setting of verl's profiler, which does not run here (its switches are accepted only off)")
ENABLE_REFUSED = Refused(
    "profiling a role is not built here; step timings are logged as timing_s/* (and per worker as "
    "timing_s/*/worker), and scripts/bench/profile_update.py profiles an update with torch.profiler"
)


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
    contents: List[str] = F([], "torch.profiler: what to record (cpu, cuda, memory, shapes, stack)")
    discrete: bool = F(False, "torch.profiler: one trace per stage")
    schedule: TorchScheduleConfig = S(TorchScheduleConfig, "torch.profiler's schedule")
    profile_token_start: Optional[int] = F(None, "rollout: first generated token to profile")
    profile_token_end: Optional[int] = F(None, "rollout: last generated token to profile")


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
    npu: NpuToolConfig = S(NpuToolConfig, "Ascend NPU profiler")
    nsys: NsysToolConfig = S(NsysToolConfig, "NVIDIA Nsight Systems")
    torch: TorchToolConfig = S(TorchToolConfig, "torch.profiler")
    torch_memory: TorchMemoryToolConfig = S(TorchMemoryToolConfig, "CUDA memory snapshots")
    precision_debugger: PrecisionDebuggerConfig = S(PrecisionDebuggerConfig, "msprobe precision debugger")


@dataclass
class ProfilerConfig:
    """``<role>.profiler``: verl's per-role profiler."""

    tool: Optional[str] = F(None, "profiler of this role: nsys | torch | npu | torch_memory (verl: global_profiler.tool)")
    enable: bool = F(False, "profile this role", ENABLE_REFUSED)
    all_ranks: bool = F(False, "profile every rank of the role")
    ranks: List[int] = F([], "ranks to profile")
    save_path: Optional[str] = F(None, "folder of the traces (verl: global_profiler.save_path)")
    tool_config: ToolConfig = S(ToolConfig, "per-tool settings")
    finish_hook_all_ranks: bool = F(False, "run the finish hook on every rank")
    finish_hook_cmd: Optional[str] = F(None, "command run when profiling ends")
    finish_hook_ranks: List[int] = F([], "ranks that run the finish hook")
    relocate_results: bool = F(False, "move the traces after profiling")


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

    tool: Optional[str] = F(None, "profiler: nsys | torch | npu | torch_memory; null = none", Refused(
        "profilers are not built here; step timings are logged as timing_s/*, and "
        "scripts/bench/profile_update.py profiles an update with torch.profiler"))
    steps: Any = F(None, "training steps to profile")
    profile_continuous_steps: bool = F(False, "profile consecutive steps as one range")
    save_path: str = F("outputs/profile", "folder of the traces")
    global_tool_config: GlobalToolConfig = S(GlobalToolConfig, "per-tool settings")
    finish_hook_all_ranks: bool = F(False, "run the finish hook on every rank")
    finish_hook_cmd: Optional[str] = F(None, "command run when profiling ends")
    finish_hook_ranks: List[int] = F([], "ranks that run the finish hook")
    relocate_results: bool = F(False, "move the traces after profiling")


def profiler_section(role: str) -> Any:
    """The ``profiler`` section of ``role``; its keys have no effect (the profiler cannot be on)."""
    return S(ProfilerConfig, f"verl's profiler of the {role} (not built here: accepted only off)", PROFILER_OFF)


def global_profiler_section() -> Any:
    return S(GlobalProfilerConfig, "verl's run-wide profiler (not built here: accepted only off)", PROFILER_OFF)
