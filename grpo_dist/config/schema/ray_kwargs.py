"""``ray_kwargs.*``: how Ray is started or joined (``ray_init``, the workers' runtime environment)
and the timeline file."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from grpo_dist.config.fields import F, S
from grpo_dist.config.sections.features import RuntimeEnvConfig


@dataclass
class RayInitConfig:
    address: Optional[str] = F(None, "Ray cluster to attach to (or RAY_ADDRESS); null = start a local one")
    num_cpus: Optional[int] = F(None, "CPUs of the local Ray instance; null = all")
    include_dashboard: bool = F(False, "start Ray's dashboard (bound to 127.0.0.1) for a local instance")
    runtime_env: RuntimeEnvConfig = S(RuntimeEnvConfig, "Ray's runtime environment of the workers (ray.init(runtime_env=...))")


@dataclass
class RayKwargsConfig:
    ray_init: RayInitConfig = S(RayInitConfig, "ray.init arguments")
    timeline_json_file: Optional[str] = F(None, "write Ray's timeline of the run (chrome://tracing JSON) here at the end")
