"""The run specification: a validated configuration resolved once into one frozen, typed object.

:func:`resolve` is called right after validation (the command line's job, the tests, any other caller)
and is the last place the configuration object is handed around outside ``config/``'s own modules.
Everything after it takes the :class:`RunSpec` or a part of it:

- the facts every part needs, each computed once under one name (the step's shape, the active roles and
  their pools, whether the run has a critic, a reference, a reward model, whether the update is on-policy
  and runs the old-log-prob forward, whether the rollout returns its log-probs, ...);
- the launch plan (:class:`~grpo_dist.config.launch.LaunchPlan`: what start-up reads before Ray);
- methods for what needs facts known only later: the device decided against the Ray cluster and the run's
  number of steps (:meth:`RunSpec.driver_plan`, each role's settings), the resolved model and tokenizer
  folders and the tokenizer itself (the preflight checks, the reward model's re-encoding).

The spec keeps the validated configuration privately (``_cfg``) for these methods, which hand it to the
``config/`` functions that read it; no code outside ``config/`` touches it
(``tests/unit/test_config_reads.py``). ``--check`` prints its plan from the same object
(:meth:`RunSpec.check_plan`).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from grpo_dist.agents.settings import AgentSettings
from grpo_dist.config import agents, engine, facts, memory, preflight, role_settings
from grpo_dist.config.facts import StepShape
from grpo_dist.config.launch import LaunchPlan, launch_plan
from grpo_dist.config.profiling import ProfilePlan, profile_plan
from grpo_dist.config.reward_sources import RewardSource, reward_sources
from grpo_dist.config.roles import Pool, RoleSpec, active_specs, placement
from grpo_dist.config.schema import GRPOConfig
from grpo_dist.config.validate import critic_enabled, needs_reference

__all__ = ["RunSpec", "resolve"]


@dataclass(frozen=True)
class RunSpec:
    """What a run is, resolved from its validated configuration (module docstring)."""

    shape: StepShape
    """Prompts and responses per step, data-parallel ranks, mini-batches."""
    prompts_per_draw: int
    """Prompts drawn from the data at a time (``data.gen_batch_size`` with dynamic sampling)."""
    rows: tuple[RoleSpec, ...]
    """The active rows of the role table, in start-up order (:func:`grpo_dist.config.roles.role_rows`: one
    per reward model)."""
    roles: tuple[str, ...]
    """The active roles' names, in start-up order."""
    role_pools: dict[str, str]
    """The pool each active role runs on, by the role's name."""
    checkpointed: frozenset[str]
    """The active roles this run's checkpoints hold."""
    needs_critic: bool
    needs_reference: bool
    reward_sources: tuple[RewardSource, ...]
    """What scores a response, and with what weight (:mod:`grpo_dist.config.reward_sources`)."""
    on_policy: bool
    """One optimizer step on fresh samples: the old policy is the current one (:func:`facts.on_policy`)."""
    old_log_prob_forward: bool
    """Whether a step runs the actor's old-log-prob forward (:func:`facts.old_log_prob_forward`)."""
    rollout_log_probs: bool
    """Whether the rollout returns its log-probs (:func:`facts.rollout_log_probs`)."""
    rollout_engine: str
    """``actor_rollout_ref.rollout.name`` (vllm | hf)."""
    rollout_tp: int
    """Ranks per rollout engine (``rollout.tensor_model_parallel_size``)."""
    rollout_seed: int
    kv_cache_auto: bool
    """``rollout.kv_cache_gib = auto``: the CPU KV cache is sized from the memory left (said at start-up)."""
    nccl_timeout_s: float
    """The model roles' collective timeout (``actor_rollout_ref.nccl_timeout``)."""
    call_deadlines: tuple[float, float, float]
    """``trainer.worker_call_timeout_s`` / ``_factor`` / ``_min_s``."""
    launch: LaunchPlan
    """What start-up reads before its workers start."""
    profiling: ProfilePlan | None
    """Which worker processes run torch's profiler, in which steps (:mod:`grpo_dist.config.profiling`); None:
    none."""
    _cfg: GRPOConfig = field(repr=False, compare=False)
    """The validated configuration, for the ``config/`` functions the methods below call; nothing outside
    ``config/`` reads it."""

    # ---- the driver's loop and --check -----------------------------------------------------------------
    def driver_plan(self, device: str, train_size: int):
        """The driver's plan (:func:`grpo_dist.config.driver_plan.driver_plan`) for ``train_size`` training
        prompts on ``device`` (cpu | cuda)."""
        from grpo_dist.config.driver_plan import driver_plan

        return driver_plan(self, device, train_size)

    def check_plan(self, *, count_rows: bool = True):
        """What ``--check`` prints (:func:`grpo_dist.config.plan.build_plan`)."""
        from grpo_dist.config.plan import build_plan

        return build_plan(self._cfg, count_rows=count_rows)

    def as_dict(self) -> dict:
        """The resolved configuration as plain data (the run's ``config.yaml``, the trackers' config)."""
        return asdict(self._cfg)

    @functools.cached_property
    def agent_settings(self) -> AgentSettings | None:
        """What the agent loops of an agent-loop rollout read (``rollout.mode=async``); None with
        ``rollout.mode=sync`` (:func:`grpo_dist.config.agents.agent_settings`). Built once, on first use."""
        return agents.agent_settings(self._cfg)

    # ---- the role table ------------------------------------------------------------------------------------
    def placement(self, rows: list) -> list[tuple[Pool, list]]:
        """The ``per_rank`` ones of ``rows`` (active rows with a ``name``) grouped by pool, the training ranks'
        pool first (:func:`grpo_dist.config.roles.placement`)."""
        return placement(self._cfg, rows, pool_of=lambda r: self.role_pools[r.name])

    def actor_settings(self, device: str, total_steps: int):
        return role_settings.actor_settings(self._cfg, device, total_steps)

    def reference_kwargs(self, device: str) -> dict:
        return role_settings.reference_kwargs(self._cfg, device)

    def critic_model_path(self, actor_model_path: str) -> str:
        return role_settings.critic_model_path(self._cfg, actor_model_path)

    def critic_settings(self, device: str, total_steps: int):
        return role_settings.critic_settings(self._cfg, device, total_steps)

    @property
    def needs_reward_model(self) -> bool:
        return any(s.is_model for s in self.reward_sources)

    def reward_source(self, role: str) -> RewardSource:
        """The model source whose role is ``role`` (``reward_model`` or ``reward_model.<name>``)."""
        return next(s for s in self.reward_sources if s.role == role)

    def reward_model_path(self, role: str) -> str:
        return role_settings.reward_model_path(self.reward_source(role))

    def reward_model_reencodes(self, rm_path: str, policy_tokenizer_path: str) -> str | None:
        return role_settings.reward_model_reencodes(self._cfg, rm_path, policy_tokenizer_path)

    def reward_model_settings(self, device: str, role: str, rm_path: str, policy_tokenizer_path: str):
        return role_settings.reward_model_settings(self._cfg, self.reward_source(role), device, rm_path,
                                                   policy_tokenizer_path)

    def reward_worker_kwargs(self, tokenizer_path: str) -> dict:
        return role_settings.reward_worker_kwargs(self._cfg, tokenizer_path)

    def engine_kwargs(self, model_path: str, device: str, kv_gib: float | None = None) -> dict:
        return engine.engine_kwargs(self._cfg, model_path, device, kv_gib)

    def kv_cache_gib(self, model_path: str) -> tuple[float, str]:
        return engine.kv_cache_gib(self._cfg, model_path)

    def reward_decoder(self, tokenizer: Any) -> dict | None:
        from grpo_dist.config.sampling import reward_decoder

        return reward_decoder(self._cfg, tokenizer)

    # ---- the preflight checks ------------------------------------------------------------------------------
    def usable_cores(self) -> int | None:
        return preflight.usable_cores(self._cfg)

    def check_cpu_ranks(self, cores: int | None) -> None:
        preflight.check_cpu_ranks(self._cfg, cores)

    def machine_notes(self, cores: int | None) -> list[str]:
        return preflight.machine_notes(self._cfg, cores)

    def check_cpu_resources(self, model_path: str) -> str | None:
        return memory.check_cpu_resources(self._cfg, model_path)

    def check_model_fits(self, model_path: str, tokenizer: Any) -> None:
        preflight.check_model_fits(self._cfg, model_path, tokenizer)

    def worker_threads(self, device: str, world: int, cluster_cpus: Callable[[], float]) -> int:
        return preflight.worker_threads(self._cfg, device, world, cluster_cpus)

    def whole_sequence_note(self, role: str) -> str:
        return preflight.whole_sequence_note(self._cfg, role)


def resolve(cfg: GRPOConfig) -> RunSpec:
    """The run specification of a validated configuration (``validate_config`` first)."""
    rows = active_specs(cfg)
    r, t = cfg.actor_rollout_ref.rollout, cfg.trainer
    return RunSpec(
        shape=facts.step_shape(cfg),
        prompts_per_draw=facts.prompts_per_draw(cfg),
        rows=tuple(rows),
        roles=tuple(row.name for row in rows),
        role_pools={row.name: row.pool_of(cfg) for row in rows},
        checkpointed=frozenset(row.name for row in rows if row.saves(cfg)),
        needs_critic=critic_enabled(cfg),
        needs_reference=needs_reference(cfg),
        reward_sources=reward_sources(cfg),
        on_policy=facts.on_policy(cfg),
        old_log_prob_forward=facts.old_log_prob_forward(cfg),
        rollout_log_probs=facts.rollout_log_probs(cfg),
        rollout_engine=r.name,
        rollout_tp=r.tensor_model_parallel_size,
        rollout_seed=r.seed,
        kv_cache_auto=r.kv_cache_gib == "auto",
        nccl_timeout_s=float(cfg.actor_rollout_ref.nccl_timeout),
        call_deadlines=(t.worker_call_timeout_s, t.worker_call_timeout_factor, t.worker_call_timeout_min_s),
        launch=launch_plan(cfg),
        profiling=profile_plan(cfg),
        _cfg=cfg,
    )

