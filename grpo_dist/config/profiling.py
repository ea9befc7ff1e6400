"""Which worker processes run torch's profiler, in which steps, recording what (verl's profiler keys).

verl's keys, read here once into a :class:`ProfilePlan`:

- ``global_profiler.tool`` (``torch``; a role's ``profiler.tool`` overrides it), ``global_profiler.steps``
  (the training steps profiled, from 1), ``profile_continuous_steps`` and ``save_path``;
- per role (``actor_rollout_ref.{actor,ref,rollout}.profiler``, ``critic.profiler``,
  ``reward_model.profiler``): ``enable``, ``all_ranks`` / ``ranks`` (neither: rank 0), ``save_path``, and
  ``tool_config.torch.{contents, discrete}``. The rollout's switch and ranks follow the actor's unless set
  (as in verl's configuration).

What a trace holds. Profiling is per worker process (the roles of a rank's model process share it): with
``discrete=false`` one trace per profiled step (consecutive steps in one with ``profile_continuous_steps``)
holds every call the driver sent that process from the step's start to the next step's start, each call
marked with its role and method; with ``discrete=true`` each call of a profiled step is a trace of its own.
Traces are Chrome trace files (``chrome://tracing``, Perfetto, TensorBoard) under ``save_path``
(:mod:`grpo_dist.utils.profiling` names them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from grpo_dist.config.fields import ConfigError
from grpo_dist.config.states import get

__all__ = ["CONTENTS", "ProcessProfile", "ProfilePlan", "RoleProfile", "profile_plan"]

CONTENTS = ("cpu", "cuda", "memory", "shapes", "stack")
"""What ``tool_config.torch.contents`` may list (``[]``: all of them; cpu is always recorded)."""


@dataclass(frozen=True)
class RoleProfile:
    """One role's profiler settings."""

    ranks: tuple[int, ...] | None
    """The ranks profiled (None: every rank)."""
    contents: tuple[str, ...]
    discrete: bool
    save_path: str

    def profiles(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks


@dataclass(frozen=True)
class ProcessProfile:
    """What one worker process records: sent with every ``profile_begin`` call."""

    name: str
    """The process in file names: ``<process>_rank<r>`` (``models_rank0``, ``rollout_rank1``)."""
    save_path: str
    contents: tuple[str, ...]
    discrete: bool
    device: str


@dataclass(frozen=True)
class ProfilePlan:
    """The run's profiling: the steps and, by role name, each profiled role's settings."""

    steps: tuple[int, ...]
    continuous: bool
    roles: dict[str, RoleProfile]

    def role(self, name: str) -> RoleProfile | None:
        """``name``'s settings (a named reward model, ``reward_model.<name>``, takes ``reward_model``'s)."""
        return self.roles.get(name) or self.roles.get(name.split(".")[0])

    def process(self, name: str, roles: list[str], rank: int, device: str) -> ProcessProfile | None:
        """What rank ``rank`` of the process named ``name`` holding ``roles`` records; None: nothing (none of its
        roles profiles that rank). Roles sharing a process share its trace: the contents are joined, and the
        trace is per call (discrete) if any of them asks for that."""
        mine = [p for p in (self.role(r) for r in roles) if p is not None and p.profiles(rank)]
        if not mine:
            return None
        contents = tuple(sorted({c for p in mine for c in p.contents}))
        slug = re.sub(r"[^0-9A-Za-z]+", "_", name).strip("_")  # "models (reward_model pool)": models_reward_model_pool
        return ProcessProfile(f"{slug}_rank{rank}", mine[0].save_path, contents, any(p.discrete for p in mine), device)

    def line(self) -> str:
        """What the run says at start-up (after ``profiler: ``)."""
        whole = "one trace per run of consecutive steps" if self.continuous else "one trace per step"
        modes: dict[str, list[str]] = {}
        for role, p in self.roles.items():
            modes.setdefault("one trace per call" if p.discrete else whole, []).append(role)
        how = "; ".join(f"{', '.join(roles)}: {mode}" for mode, roles in modes.items()) if len(modes) > 1 else next(iter(modes))
        paths = sorted({p.save_path for p in self.roles.values()})
        return (f"torch.profiler in the {', '.join(self.roles)} workers at steps {list(self.steps)} "
                f"({how} per process), traces in {', '.join(paths)}")


_SECTIONS = {"actor": "actor_rollout_ref.actor", "reference": "actor_rollout_ref.ref",
             "rollout": "actor_rollout_ref.rollout", "critic": "critic", "reward_model": "reward_model"}
"""The section holding each role's ``profiler`` keys, by role name."""


def _steps(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    values = [value] if isinstance(value, int) and not isinstance(value, bool) else value
    try:
        steps = [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 1]
        ok = len(steps) == len(values)
    except TypeError:
        ok = False
    if not ok:
        raise ConfigError(f"global_profiler.steps = {value!r} is not valid: give the training steps to profile as a "
                          "list of step numbers from 1, e.g. [1,2,5], or null for none")
    return tuple(sorted(set(steps)))


def _contents(key: str, value: Any) -> tuple[str, ...]:
    given = tuple(str(v) for v in (value or ()))
    unknown = [c for c in given if c not in CONTENTS]
    if unknown:
        raise ConfigError(f"{key} = {list(given)} is not valid: {unknown} not among {list(CONTENTS)} ([] records "
                          "all of them)")
    return given or CONTENTS


def profile_plan(cfg: Any) -> ProfilePlan | None:
    """The run's :class:`ProfilePlan`; None when nothing is profiled (no tool, no step, or no role enabled).
    ``ConfigError`` for steps or contents that are not valid, a role's tool other than torch, or discrete traces
    asked for together with continuous steps."""
    g = cfg.global_profiler
    steps, continuous, default_path = _steps(g.steps), bool(g.profile_continuous_steps), g.save_path
    roles: dict[str, RoleProfile] = {}
    for role, section in _SECTIONS.items():
        key = f"{section}.profiler"
        p = get(cfg, key)
        tool = p.tool if p.tool is not None else g.tool
        if not p.enable or tool is None:
            continue
        if tool != "torch":  # (a tool other than these is refused with the key's state)
            raise ConfigError(f"{key}.tool = {tool!r} is not supported here: only torch's profiler is built")
        t = p.tool_config.torch
        contents = _contents(f"{key}.tool_config.torch.contents", t.contents)
        if t.discrete and continuous:
            raise ConfigError(f"{key}.tool_config.torch.discrete = true is not valid with "
                              "global_profiler.profile_continuous_steps = true: consecutive steps in one trace "
                              "need one trace per step (discrete = false); set one of them false")
        ranks = None if p.all_ranks else (tuple(int(r) for r in p.ranks) or (0,))
        roles[role] = RoleProfile(ranks, contents, bool(t.discrete), str(p.save_path or default_path))
    if not steps or not roles:
        return None
    return ProfilePlan(steps, continuous, roles)
