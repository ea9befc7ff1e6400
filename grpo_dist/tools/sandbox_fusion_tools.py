"""verl's ``SandboxFusionTool``: the model runs code and reads its output.

With ``sandbox_fusion_url`` set, the code goes to a Sandbox Fusion server's ``run_code`` API (POST JSON
``{code, language, run_timeout, memory_limit_MB}``; the answer's ``run_result`` holds ``status``,
``stdout``, ``stderr``, ``return_code``). The URL is the endpoint as verl takes it (``.../run_code``); one
without that path gets ``/run_code`` appended. Without it, Python runs in the local sandbox
(``grpo_dist.tools.sandbox``: own process group, time/memory/file/process/output limits), at most
``num_workers`` runs at once.

Config keys (verl's): ``sandbox_fusion_url``, ``num_workers`` (10), ``default_timeout`` (30 s),
``default_language`` (``python``), ``memory_limit_mb`` (1024); ``rate_limit`` and
``enable_global_rate_limit`` are read as verl's and bound concurrency the same way as ``num_workers``
here (the smaller wins). Local only: ``max_output_bytes`` (65536).

The tool's parameters: ``code`` (required), ``timeout`` and ``language`` (optional). The model reads
stdout followed by stderr; a run stopped by a limit ends with a line naming the limit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import urllib.error
import urllib.request
from typing import Any
from uuid import uuid4

from grpo_dist.tools.base_tool import BaseTool
from grpo_dist.tools.sandbox import SandboxLimits, SandboxPool, SandboxResult
from grpo_dist.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

DEFAULT_SCHEMA = {
    "type": "function",
    "function": {
        "name": "code_interpreter",
        "description": "A tool for executing code.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The code to execute."}},
            "required": ["code"],
        },
    },
}


def run_code_endpoint(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/run_code") else url + "/run_code"


def _remote_result(reply: dict) -> SandboxResult:
    """A Sandbox Fusion ``run_code`` reply as a ``SandboxResult``."""
    compile_result = reply.get("compile_result") or {}
    run = reply.get("run_result") or {}
    if compile_result and (compile_result.get("status") not in (None, "Finished")
                           or compile_result.get("return_code") not in (None, 0)):
        return SandboxResult(stdout=compile_result.get("stdout") or "", stderr=compile_result.get("stderr") or "",
                             exit_code=compile_result.get("return_code"))
    if not run:
        message = reply.get("message") or reply.get("status") or "no run_result"
        return SandboxResult(stdout="", stderr=f"sandbox error: {message}", exit_code=None)
    status = run.get("status")
    stopped = status == "TimeLimitExceeded"
    return SandboxResult(stdout=run.get("stdout") or "", stderr=run.get("stderr") or "",
                         exit_code=run.get("return_code"), stopped=stopped,
                         reason="wall_time" if stopped else None, wall_s=float(run.get("execution_time") or 0.0))


def post_run_code(url: str, code: str, *, language: str = "python", run_timeout: float = 30,
                  memory_limit_mb: int = 1024, stdin: str | None = None, http_timeout: float | None = None) -> SandboxResult:
    """One blocking ``run_code`` request to a Sandbox Fusion server.

    Raises:
        RuntimeError: the server cannot be reached or does not answer with JSON.
    """
    payload = {"code": code, "language": language, "run_timeout": run_timeout, "memory_limit_MB": memory_limit_mb}
    if stdin is not None:
        payload["stdin"] = stdin
    request = urllib.request.Request(run_code_endpoint(url), data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=http_timeout or run_timeout + 30) as resp:
            reply = json.loads(resp.read().decode("utf-8", errors="replace"))
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"Sandbox Fusion at {url} answered HTTP {exc.code}: {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise RuntimeError(f"Sandbox Fusion at {url} cannot be reached: {exc}") from None
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"Sandbox Fusion at {url} did not answer with JSON: {exc}") from None
    return _remote_result(reply)


class SandboxFusionTool(BaseTool):
    """Runs the model's code on a Sandbox Fusion server, or locally in the sandbox."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None = None):
        super().__init__(config, tool_schema or OpenAIFunctionToolSchema.model_validate(DEFAULT_SCHEMA))
        self.sandbox_fusion_url = self.config.get("sandbox_fusion_url") or ""
        self.default_timeout = float(self.config.get("default_timeout", 30))
        self.default_language = self.config.get("default_language", "python")
        self.memory_limit_mb = int(self.config.get("memory_limit_mb", 1024))
        workers = int(self.config.get("num_workers", 10))
        if self.config.get("rate_limit"):
            workers = min(workers, int(self.config["rate_limit"]))
        if workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {workers}")
        self.pool = SandboxPool(workers, SandboxLimits(
            wall_s=self.default_timeout, cpu_s=max(1, math.ceil(self.default_timeout)), memory_mb=self.memory_limit_mb,
            max_output_bytes=int(self.config.get("max_output_bytes", 64 * 1024))))
        self._remote_slots: dict[int, asyncio.Semaphore] = {}
        self._instances: dict[str, dict] = {}

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
        instance_id = instance_id if instance_id is not None else str(uuid4())
        self._instances[instance_id] = {}
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        code = parameters.get("code", "")
        code = code if isinstance(code, str) else str(code)
        timeout = float(parameters.get("timeout") or self.default_timeout)
        language = parameters.get("language") or self.default_language
        result = await self.execute_code(instance_id, code, timeout, language)
        metrics = {"stopped": float(result.stopped), "exit_code": float(result.exit_code or 0), "wall_s": result.wall_s}
        return ToolResponse(text=result.model_text()), 0.0, metrics

    async def execute_code(self, instance_id: str, code: str, timeout: float = 30, language: str = "python") -> SandboxResult:
        """Run ``code``; a local run takes Python only."""
        if self.sandbox_fusion_url:
            loop_id = id(asyncio.get_running_loop())
            if loop_id not in self._remote_slots:
                self._remote_slots = {loop_id: asyncio.Semaphore(self.pool.max_concurrency)}
            async with self._remote_slots[loop_id]:
                return await asyncio.to_thread(post_run_code, self.sandbox_fusion_url, code, language=language,
                                               run_timeout=timeout, memory_limit_mb=self.memory_limit_mb)
        if language != "python":
            return SandboxResult(stdout="", stderr=f"language {language!r} is not supported by the local sandbox "
                                 "(python only; set sandbox_fusion_url for other languages)", exit_code=None)
        # The model may ask for less time than the configured default, never more.
        wall_s = min(timeout, self.default_timeout)
        limits = dataclasses.replace(self.pool.limits, wall_s=wall_s, cpu_s=max(1, math.ceil(wall_s)))
        return await self.pool.run(code, limits=limits)

    async def release(self, instance_id: str, **kwargs) -> None:
        self._instances.pop(instance_id, None)

