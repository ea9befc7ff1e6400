"""The tool base class, with verl's methods (``verl.tools.base_tool.BaseTool``).

A tool is stateful per *instance*: the agent loop calls ``create`` (with the row's ``create_kwargs``, e.g.
its ground truth) to open an instance, ``execute`` once per call of the model, ``calc_reward`` when it
wants the tool's reward, and ``release`` to drop the instance. All four are coroutines. ``execute``
returns ``(ToolResponse, reward, metrics)``: the response goes back to the model, the reward is the step
reward verl passes on, the metrics are numbers the run may log.

A verl tool file moves over with ``verl.tools`` changed to ``grpo_dist.tools`` in its imports.
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import uuid4

from grpo_dist.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

logger = logging.getLogger(__name__)


class BaseTool:
    """A tool the model can call. Subclasses override ``execute`` (and ``create``/``calc_reward``/
    ``release`` when they keep state per instance).

    Args:
        config: the entry's ``config`` mapping from the tool config YAML (``type: native``, the tool's own keys).
        tool_schema: the function schema shown to the model; None lets a subclass build its own in
            ``get_openai_tool_schema``.
    """

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None):
        self.config = dict(config or {})
        self.tool_schema = tool_schema or self.get_openai_tool_schema()
        if self.tool_schema is None:
            raise ValueError(f"{type(self).__name__}: no tool_schema given and get_openai_tool_schema() returned None")
        self.name = self.tool_schema.function.name
        logger.debug("tool %s: %s", self.name, self.tool_schema.model_dump(exclude_none=True))

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        """The schema shown to the model (what the chat template's ``tools=`` renders)."""
        return getattr(self, "tool_schema", None)

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
        """Open an instance; ``(instance_id, initial response)``. A new id when none is given."""
        return (instance_id if instance_id is not None else str(uuid4())), ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        """Run one call with the model's arguments; ``(response, step reward, metrics)``."""
        return ToolResponse(text="Updated the tool state."), 0.0, {}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        """The instance's reward so far."""
        return 0.0

    async def release(self, instance_id: str, **kwargs) -> None:
        """Drop the instance's state."""
