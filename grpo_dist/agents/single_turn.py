"""``single_turn_agent``: one prompt, one sampled response (verl's ``SingleTurnAgentLoop``).

The prompt is the row's ``prompt_ids`` when it has them (the dataset's tokenisation, so the asynchronous
path samples from exactly the prompt the synchronous path samples from), else the chat template over the
row's ``raw_prompt``.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from grpo_dist.agents.base import AgentLoopBase, AgentLoopOutput, register
from grpo_dist.agents.settings import AgentSettings
from grpo_dist.data.dataset import tokenize_prompt


def check_prompt_length(loop: str, prompt_ids: list[int], settings: AgentSettings) -> None:
    """``ValueError`` when the rendered prompt is longer than ``prompt_length`` (the batch's prompt width)."""
    if len(prompt_ids) > settings.prompt_length:
        raise ValueError(f"{loop}: the prompt is {len(prompt_ids)} tokens (chat template and tool schemas "
                         f"included), more than rollout.prompt_length={settings.prompt_length}; raise "
                         "data.max_prompt_length or filter such rows (data.filter_overlong_prompts)")


def require_settings(loop: str, kwargs: dict[str, Any]) -> AgentSettings:
    """The run's ``AgentSettings`` a built-in loop was constructed with; ``ValueError`` when absent."""
    settings = kwargs.get("settings")
    if not isinstance(settings, AgentSettings):
        raise ValueError(f"{loop}: constructed without settings=AgentSettings(...) (the runner passes the run's "
                         f"agent settings), got {type(settings).__name__}")
    return settings


@register("single_turn_agent")
class SingleTurnAgentLoop(AgentLoopBase):
    """One generate call with ``max_tokens = response_length``; every response token is the model's (mask 1)."""

    def __init__(self, trainer_config: Any, server_manager: Any, tokenizer: Any, processor: Any = None,
                 **kwargs: Any) -> None:
        super().__init__(trainer_config, server_manager, tokenizer, processor, **kwargs)
        self.settings = require_settings("single_turn_agent", kwargs)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        if kwargs.get("prompt_ids") is not None:
            prompt_ids = [int(t) for t in kwargs["prompt_ids"]]
        elif kwargs.get("raw_prompt") is not None:
            prompt_ids = tokenize_prompt(self.tokenizer, list(kwargs["raw_prompt"]),
                                         self.settings.apply_chat_template_kwargs)
        else:
            raise ValueError("single_turn_agent: the row has neither prompt_ids nor raw_prompt")
        check_prompt_length("single_turn_agent", prompt_ids, self.settings)
        params = {**sampling_params, "max_tokens": self.settings.response_length}
        out = await self.server_manager.generate(f"{uuid4().hex}-0", prompt_ids=prompt_ids, sampling_params=params)
        ids = list(out.token_ids)[: self.settings.response_length]
        logprobs = None
        if sampling_params.get("logprobs"):
            if out.log_probs is None or len(out.log_probs) != len(out.token_ids):
                raise ValueError(f"single_turn_agent: the server returned {len(out.token_ids)} tokens with "
                                 f"{'no' if out.log_probs is None else len(out.log_probs)} log-probs; "
                                 "logprobs=True needs one per token")
            logprobs = [float(x) for x in out.log_probs[: len(ids)]]
        return AgentLoopOutput(prompt_ids=prompt_ids, response_ids=ids, response_mask=[1] * len(ids),
                               response_logprobs=logprobs, num_turns=2,
                               finished_by_eos=out.stop_reason == "stop" and len(ids) == len(out.token_ids))
