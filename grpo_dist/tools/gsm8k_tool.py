"""verl's ``Gsm8kTool``: the model submits its answer and gets back how it scores against the row's
ground truth (the project's GSM8K scorer, ``grpo_dist.rewards.scorers.gsm8k_score``).

Tool config entry (verl's, with the module name changed or left as ``verl.tools.gsm8k_tool.Gsm8kTool``)::

    - class_name: grpo_dist.tools.gsm8k_tool.Gsm8kTool
      config: {type: native}
      tool_schema:
        type: function
        function:
          name: calc_gsm8k_reward
          description: A tool for calculating the reward of gsm8k. (1.0 if parsed answer is correct, 0.0 if parsed answer is incorrect or not correctly parsed)
          parameters:
            type: object
            properties:
              answer: {type: string, description: The model's answer to the GSM8K math problem, must be a digits}
            required: [answer]

The row gives the ground truth in ``extra_info.tools_kwargs.calc_gsm8k_reward.create_kwargs.ground_truth``.
As in verl, ``execute`` answers ``Current parsed answer=... reward=...`` and its step reward is 0.0 when the
score improved on the instance's previous one and -0.05 otherwise (a penalty for resubmitting without
getting better); ``calc_reward`` is the score of the last answer.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from grpo_dist.rewards.scorers import gsm8k_score
from grpo_dist.tools.base_tool import BaseTool
from grpo_dist.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

NO_IMPROVEMENT_PENALTY = -0.05


class Gsm8kTool(BaseTool):
    """Scores the model's GSM8K answer against the instance's ground truth."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None):
        super().__init__(config, tool_schema)
        self._instances: dict[str, dict[str, Any]] = {}

    async def create(self, instance_id: str | None = None, ground_truth: Any = None, **kwargs) -> tuple[str, ToolResponse]:
        if instance_id is None:
            instance_id = str(uuid4())
        if ground_truth is None:
            ground_truth = (kwargs.get("create_kwargs") or {}).get("ground_truth")
        self._instances[instance_id] = {"response": "", "ground_truth": ground_truth, "reward": 0.0}
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        answer = parameters.get("answer", "")
        answer = answer if isinstance(answer, str) else str(answer)
        self._instances[instance_id]["response"] = answer if answer.startswith("#### ") else "#### " + answer
        reward = await self.calc_reward(instance_id)
        step_reward = 0.0 if reward > self._instances[instance_id]["reward"] else NO_IMPROVEMENT_PENALTY
        self._instances[instance_id]["reward"] = reward
        return ToolResponse(text=f"Current parsed {answer=} {reward=}"), step_reward, {}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        state = self._instances[instance_id]
        return gsm8k_score(state["response"], state["ground_truth"], format_score=0.0, score=1.0)

    async def release(self, instance_id: str, **kwargs) -> None:
        self._instances.pop(instance_id, None)
