"""The agent-loop API, with verl's names and shapes (``verl.experimental.agent_loop``).

An agent loop is one trajectory as a coroutine: it gets the row's fields as keywords, calls the
asynchronous rollout server (token ids in, sampled token ids and log-probs out) as often as it needs,
and returns one :class:`AgentLoopOutput`. Loops are registered by name (``@register("tool_agent")``) and
rows choose one with their ``agent_name``; a user's loops come from verl's YAML list::

    - name: my_agent
      _target_: my_package.my_module.MyAgentLoop
      some_kwarg: 3            # further keys are passed to the loop's constructor

The server a loop calls (``server_manager``) has one method::

    async def generate(request_id: str, *, prompt_ids: list[int], sampling_params: dict) -> TokenOutput

with verl's ``sampling_params`` (``temperature, top_p, top_k, do_sample, logprobs, seed, max_tokens``); it
samples one response. The turns of one trajectory share a request-id prefix (``<trajectory id>-<turn>``),
so the server can keep a trajectory on one replica.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from omegaconf import DictConfig, OmegaConf

from grpo_dist.rollout.base import TokenOutput
from grpo_dist.utils.imports import import_attr


class Server(Protocol):
    """What an agent loop calls: one sampled response per request (see the module doc)."""

    async def generate(self, request_id: str, *, prompt_ids: list[int],
                       sampling_params: dict[str, Any]) -> TokenOutput: ...


@dataclass
class AgentLoopOutput:
    """One trajectory (verl's ``AgentLoopOutput``, plus ``finished_by_eos``).

    Attributes:
        prompt_ids: ``[P]`` the prompt's token ids (the chat template over the row's messages, tools included).
        response_ids: ``[T]`` everything after the prompt: the model's tokens exactly as sampled and the
            tool / template tokens between its turns, in order.
        response_mask: ``[T]`` 1 on a token the model sampled, 0 on a tool or template token.
        response_logprobs: ``[T]`` the sampling log-prob of each model token, 0.0 on mask-0 tokens; None when
            the rollout did not ask for log-probs.
        num_turns: verl's count: the prompt's user turn + the model turns + the tool-response turns.
        metrics: numbers of this trajectory (e.g. ``tool_calls``, ``tool_wall_s``), averaged by the caller.
        extra_fields: anything else a loop passes on (e.g. ``tool_rewards``).
        finished_by_eos: True when the last model turn ended on EOS / a stop token and the response was not
            cut by the budget; False when it was cut (``max_tokens``, context length, budget).
    """

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None = None
    num_turns: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    extra_fields: dict[str, Any] = field(default_factory=dict)
    finished_by_eos: bool = True

    def __post_init__(self) -> None:
        if len(self.response_mask) != len(self.response_ids):
            raise ValueError(f"AgentLoopOutput: response_mask has {len(self.response_mask)} entries but "
                             f"response_ids has {len(self.response_ids)}; they must be one per response token")
        if self.response_logprobs is not None and len(self.response_logprobs) != len(self.response_ids):
            raise ValueError(f"AgentLoopOutput: response_logprobs has {len(self.response_logprobs)} entries but "
                             f"response_ids has {len(self.response_ids)}; give one per response token or None")
        if any(m not in (0, 1) for m in self.response_mask):
            raise ValueError("AgentLoopOutput: response_mask values must be 0 (tool/template token) or 1 (model "
                             f"token), got {sorted(set(self.response_mask) - {0, 1})}")
        if self.num_turns < 0:
            raise ValueError(f"AgentLoopOutput: num_turns must be >= 0, got {self.num_turns}")


@dataclass(frozen=True)
class TrainerConfigRef:
    """The run's configuration as a loop's constructor gets it (verl passes an object with ``.config``)."""

    config: Any


class AgentLoopBase(ABC):
    """A trajectory's coroutine (verl's ``AgentLoopBase``). One instance per trajectory.

    Args:
        trainer_config: an object with ``.config``: the run's configuration (a mapping or a DictConfig);
            ``self.config`` is it as an OmegaConf DictConfig (``self.config.actor_rollout_ref.rollout...``).
        server_manager: the rollout server (see :class:`Server`).
        tokenizer: the policy's Hugging Face tokenizer.
        processor: the multimodal processor, or None.
        **kwargs: the loop's keys from the agent-loop YAML, and ``settings`` (the run's
            :class:`~grpo_dist.agents.settings.AgentSettings`) from the runner.
    """

    _class_initialized: bool = False

    def __init__(self, trainer_config: Any, server_manager: Server, tokenizer: Any, processor: Any = None,
                 **kwargs: Any) -> None:
        config = trainer_config.config
        self.config: DictConfig = config if isinstance(config, DictConfig) else OmegaConf.create(config or {})
        type(self).init_class(self.config, tokenizer, processor, **kwargs)
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.processor = processor

    @classmethod
    def init_class(cls, config: DictConfig, tokenizer: Any, processor: Any = None, **kwargs: Any) -> None:
        """Work shared by all instances of the class in this process (verl's hook), done once per class;
        subclasses override it and check ``cls.__dict__.get("_class_initialized")`` as this one does."""
        if cls.__dict__.get("_class_initialized"):
            return
        cls._class_initialized = True

    @abstractmethod
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """One trajectory. ``sampling_params``: verl's dict (see the module doc); ``kwargs``: the row's fields
        (``raw_prompt``, ``prompt_ids``, ``extra_info``, ``tools_kwargs``, ...)."""


@dataclass(frozen=True)
class AgentLoopEntry:
    """A registered loop: its class and the keywords its constructor gets (from the agent-loop YAML)."""

    cls: type[AgentLoopBase]
    kwargs: dict[str, Any] = field(default_factory=dict)


_REGISTRY: dict[str, AgentLoopEntry] = {}


def register(name: str):
    """Class decorator: the loop is chosen by rows whose ``agent_name`` is ``name``."""

    def decorator(cls: type) -> type:
        if not (isinstance(cls, type) and issubclass(cls, AgentLoopBase)):
            raise ValueError(f"register({name!r}): {cls!r} is not an AgentLoopBase subclass")
        _REGISTRY[name] = AgentLoopEntry(cls)
        return cls

    return decorator


def _builtin() -> None:
    # the built-in loops register themselves when their modules are imported
    importlib.import_module("grpo_dist.agents.single_turn")
    importlib.import_module("grpo_dist.agents.tool_agent")


def get_agent_loop_entry(name: str) -> AgentLoopEntry:
    """The registered loop ``name`` with its constructor keywords; ``ValueError`` naming the valid names."""
    _builtin()
    if name not in _REGISTRY:
        raise ValueError(f"unknown agent loop {name!r}; registered agent loops: {', '.join(sorted(_REGISTRY))} "
                         "(add one with @register(name) or rollout.agent.agent_loop_config_path)")
    return _REGISTRY[name]


def get_agent_loop_class(name: str) -> type[AgentLoopBase]:
    """The class registered as ``name``; ``ValueError`` naming the valid names."""
    return get_agent_loop_entry(name).cls


def registered_agent_loops() -> list[str]:
    """The names a row's ``agent_name`` may take, sorted."""
    _builtin()
    return sorted(_REGISTRY)


def _import_target(target: str) -> type:
    cls = import_attr(target, what="_target_")
    if not (isinstance(cls, type) and issubclass(cls, AgentLoopBase)):
        raise ValueError(f"{target} is not an AgentLoopBase subclass (subclass grpo_dist.agents.base.AgentLoopBase "
                         "and define async run(sampling_params, **kwargs) -> AgentLoopOutput)")
    return cls


def load_agent_loop_config(path: str | Path) -> dict[str, AgentLoopEntry]:
    """Register the loops of verl's agent-loop YAML (a list of ``name``, ``_target_``, constructor keys).

    Returns:
        the file's loops by name (also registered, so rows can name them).

    Raises:
        ValueError: one message naming the file, the entry and what is wrong (no such file, not a YAML list,
            an entry without ``name`` or ``_target_``, a class that does not import or is not a loop).
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise ValueError(f"agent loop config {path}: no such file")
    try:
        data = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except Exception as exc:
        raise ValueError(f"agent loop config {path}: not valid YAML: {type(exc).__name__}: {exc}") from None
    if not isinstance(data, list):
        raise ValueError(f"agent loop config {path}: expected a YAML list of entries "
                         "(- name: ..., _target_: module.Class), got a {type(data).__name__}")
    entries: dict[str, AgentLoopEntry] = {}
    for index, entry in enumerate(data):
        where = f"agent loop config {path}: entry [{index}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected a mapping with name and _target_, got {entry!r}")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: missing name (the agent_name rows use to pick the loop)")
        where = f"{where} ({name})"
        if "_target_" not in entry:
            raise ValueError(f"{where}: missing _target_ (module.Class of an AgentLoopBase subclass)")
        try:
            cls = _import_target(entry["_target_"])
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        kwargs = {k: v for k, v in entry.items() if k not in ("name", "_target_")}
        entries[name] = AgentLoopEntry(cls, kwargs)
    _REGISTRY.update(entries)
    return entries
