"""The role table's declarative half: which roles a run has, where each runs, and what share of a device.

One :class:`RoleSpec` row per kind of worker (actor, reference, critic, reward model, rollout, reward
scorer): its name, the predicate that says whether a configuration needs it, the one line ``--check``
prints about it, the Ray worker process it lives in, its share of a rank's device and its device pool.
Both users of the table iterate these rows and keep no role list of their own:

- ``--check`` (:func:`grpo_dist.config.plan.build_plan`) prints the placement from them, without Ray;
- the driver (:mod:`grpo_dist.trainer.roles`) adds to each row how its workers are built (the Ray
  class, constructor and ``init_model`` arguments, set-up calls) and places and starts them.

Why the table is split in two: ``config/`` sits below ``workers/`` and ``trainer/`` in the package's
layers (``tests/unit/test_layering.py``), so ``--check`` may not import the driver's rows, whose building
parts name the worker classes and Ray's worker groups. The part both need — names, predicates, pools,
shares, descriptions, and what is checkpointed — is plain configuration arithmetic and lives here;
:mod:`grpo_dist.trainer.roles` looks up its building part by the row's name, and a row here without a
building part there fails at import.

Rows made per run. The ``reward_model`` row is a template: :func:`role_rows` makes one row of it per
model source of the run (:mod:`grpo_dist.config.reward_sources`), named after the source's role
(``reward_model``, or ``reward_model.<name>`` for a named source), with its pool and whether it is
checkpointed (iterative RL trains it) decided for that source. A second reward model is one more row.

Pools. ``global`` is the training ranks: ``trainer.nnodes x trainer.n_gpus_per_node`` bundles, one
per data-parallel rank (on CPU, a rank is a process with a bundle of one CPU). A role may instead have
a pool of its own: a reward model with ``enable_resource_pool=true`` (verl's ``reward_model.*`` keys,
or its entry of ``reward.sources``) gets ``nnodes x n_gpus_per_node`` bundles, its own ranks and its
own torch.distributed group, instead of a share of every training rank's device; the pool is named
after its role. With ``actor_rollout_ref.hybrid_engine=false`` (or verl's v1 ``separate_async`` mode) the rollout
engines have a pool of their own, ``rollout`` (``rollout.nnodes x rollout.n_gpus_per_node``; v1:
``actor_rollout_ref.rollout.nnodes x n_gpus_per_node``), and the training ranks' devices hold the model roles
alone.

Device shares. In each pool, each rank's Ray worker processes split the rank's device: a process
whose roles name a ``device_share`` takes the sum of those; the processes whose roles name none split
what is left equally. With no share named anywhere (the rows below) that is ``1 / processes``: the
training rank's model process (actor, reference, critic and a colocated reward model share one) and
its rollout engine take half each, and a reward model on its own pool takes its whole device.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from grpo_dist.config.reward_sources import IMPLICIT_MODEL, model_sources
from grpo_dist.config.schema import GRPOConfig
from grpo_dist.config.validate import (critic_enabled, needs_reference, rollout_pool_keys, rollout_pool_size,
                                       separate_rollout)

GLOBAL = "global"
"""The training ranks' pool (``trainer.nnodes x trainer.n_gpus_per_node``)."""
ROLLOUT_POOL = "rollout"
"""The rollout engines' own pool (:func:`separate_rollout`; sized by :func:`rollout_pool_size`)."""
MODELS = "models"
"""The ``process`` of the roles that hold an FSDP2 model: one process per rank holds them all."""


# ---- the predicates -----------------------------------------------------------------------------
def _always(cfg: GRPOConfig) -> bool:
    return True


def needs_reward_model(cfg: GRPOConfig) -> bool:
    """Whether the run scores with a learned reward model (a model source: either spelling of verl's
    switch, or a model entry of ``reward.sources``)."""
    return bool(model_sources(cfg))


def reward_model_trained(cfg: GRPOConfig) -> bool:
    """Whether a reward model is trained during the run (iterative RL): it is then checkpointed."""
    return any(s.trained for s in model_sources(cfg))


def rollout_pool_ranks(cfg: GRPOConfig) -> int:
    """The rollout's own ranks (:func:`rollout_pool_size`); 0 when the rollout shares the training ranks."""
    if not separate_rollout(cfg):
        return 0
    nnodes, per_node = rollout_pool_size(cfg)
    return nnodes * per_node


def _rollout_pool(cfg: GRPOConfig) -> str:
    return ROLLOUT_POOL if separate_rollout(cfg) else GLOBAL


def reference_is_reset(cfg: GRPOConfig) -> bool:
    """Whether iterative RL resets the reference to the policy: its weights are then checkpointed."""
    return reward_model_trained(cfg) and cfg.reward_model.iterative.reset_reference and needs_reference(cfg)


# ---- the pools ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pool:
    """A set of ranks: ``nnodes`` nodes x ``per_node`` bundles (one device each; on CPU one rank process)."""

    name: str
    nnodes: int
    per_node: int
    keys: str
    """The section whose ``nnodes`` / ``n_gpus_per_node`` size the pool, for messages."""

    @property
    def world_size(self) -> int:
        return self.nnodes * self.per_node


def pool(cfg: GRPOConfig, name: str) -> Pool:
    """The pool ``name`` of this configuration: :data:`GLOBAL`, or the role name of a reward model with
    devices of its own."""
    t = cfg.trainer
    if name == GLOBAL:
        return Pool(GLOBAL, t.nnodes, t.n_gpus_per_node, "trainer")
    if name == ROLLOUT_POOL and separate_rollout(cfg):
        return Pool(ROLLOUT_POOL, *rollout_pool_size(cfg), rollout_pool_keys(cfg))
    for s in model_sources(cfg):
        if s.own_pool and s.role == name:
            return Pool(name, s.nnodes, s.n_gpus_per_node, s.pool_keys)
    raise KeyError(f"no device pool named {name!r}")


# ---- the rows -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RoleSpec:
    """One row of the role table (the declarative half; see the module docstring).

    Attributes:
        name: the role's name in messages, metrics, checkpoints (``global_step_N/<name>/``).
        description: what the role does, one line, for ``--check``.
        enabled: whether the run needs this role.
        per_rank: one worker per rank of its pool, in the rank's bundle (else one worker that Ray
            places anywhere, with no device).
        process: roles (``per_rank`` ones, of one pool) with the same name here live in one Ray worker
            process per rank; None: the role's own process.
        device_share: the fraction of a rank's device its process takes (summed over the roles of a
            shared process); None: an equal part of what the processes that name one leave.
        pool: :data:`GLOBAL`, another pool's name, or a function of the configuration naming one.
        checkpoint: saved with every checkpoint and restored on resume; a function of the
            configuration for roles that need it only in some runs (:meth:`saves`).
        template: the row of :data:`ROLE_SPECS` a row made for this run came from (:func:`role_rows`);
            None: the row is one of them. Its workers are built as the template's.
    """

    name: str
    description: str
    enabled: Callable[[GRPOConfig], bool] = _always
    per_rank: bool = True
    process: str | None = None
    device_share: float | None = None
    pool: str | Callable[[GRPOConfig], str] = GLOBAL
    checkpoint: bool | Callable[[GRPOConfig], bool] = False
    template: str | None = None

    @property
    def kind(self) -> str:
        """The :data:`ROLE_SPECS` row whose way of building workers this row takes."""
        return self.template or self.name

    def saves(self, cfg: GRPOConfig) -> bool:
        """Whether this run's checkpoints hold this role."""
        return self.checkpoint(cfg) if callable(self.checkpoint) else bool(self.checkpoint)

    def pool_of(self, cfg: GRPOConfig) -> str:
        """The name of the pool this role's workers run on in this configuration."""
        return self.pool(cfg) if callable(self.pool) else self.pool


ROLE_SPECS: tuple[RoleSpec, ...] = (
    RoleSpec("actor", "the policy under FSDP2: log-probs and the update", process=MODELS, checkpoint=True),
    RoleSpec("reference", "the frozen initial policy under FSDP2: reference log-probs for the KL term",
             enabled=needs_reference, process=MODELS, checkpoint=reference_is_reset),
    RoleSpec("critic", "the value model under FSDP2: values and the value-loss update", enabled=critic_enabled,
             process=MODELS, checkpoint=True),
    RoleSpec(IMPLICIT_MODEL, "the learned reward model under FSDP2: scores (and its update in iterative RL)",
             enabled=needs_reward_model, process=MODELS),
    RoleSpec("rollout", "the generation engine: responses and their sampling log-probs", pool=_rollout_pool),
    RoleSpec("reward", "1 scoring worker ({num_workers} scoring process(es)), placed by Ray on any node, no device",
             per_rank=False),
)
"""Every role, in start-up order (a role's workers are created before the next role's); the
``reward_model`` row is the template of each reward model's row (:func:`role_rows`)."""


def role_rows(cfg: GRPOConfig, specs: tuple[RoleSpec, ...] = ROLE_SPECS) -> list[RoleSpec]:
    """The rows of this configuration: ``specs`` with the ``reward_model`` row made into one row per model
    source (module docstring), each with its pool and whether it is checkpointed."""
    rows: list[RoleSpec] = []
    for row in specs:
        if row.name != IMPLICIT_MODEL:
            rows.append(row)
            continue
        for s in model_sources(cfg):
            what = (f"the learned {'process' if s.is_process else 'outcome'} reward model of source {s.name!r} under "
                    "FSDP2: scores" + (" and its update (iterative RL)" if s.trained else ""))
            rows.append(replace(row, name=s.role, description=row.description if s.name == IMPLICIT_MODEL else what,
                                enabled=_always, pool=s.role if s.own_pool else GLOBAL, checkpoint=s.trained,
                                template=None if s.role == row.name else row.name))
    return rows


def describe(spec: RoleSpec, cfg: GRPOConfig) -> str:
    """The row's one line for this configuration."""
    return spec.description.format(num_workers=cfg.reward_model.num_workers)


def active_specs(cfg: GRPOConfig, specs: tuple[RoleSpec, ...] = ROLE_SPECS) -> list[RoleSpec]:
    """The rows this configuration needs (:func:`role_rows`, enabled)."""
    return [r for r in role_rows(cfg, specs) if r.enabled(cfg)]


def rank_processes(roles: list) -> list[tuple[str | None, list]]:
    """The Ray worker processes of one rank, in start-up order, as ``(process, roles)``: one entry per
    ``process`` name with the ``per_rank`` roles it holds, and ``(None, [role])`` for each ``per_rank``
    role in a process of its own. ``roles`` are rows of one pool (anything with ``per_rank`` and
    ``process``)."""
    shared: dict[str, list] = {}
    out: list[tuple[str | None, list]] = []
    for r in roles:
        if not r.per_rank:
            continue
        if r.process is None:
            out.append((None, [r]))
        elif r.process in shared:
            shared[r.process].append(r)
        else:
            shared[r.process] = [r]
            out.append((r.process, shared[r.process]))
    return out


def device_shares(processes: list[tuple[str | None, list]]) -> list[float]:
    """Each process's share of its rank's device (module docstring): the sum of its roles'
    ``device_share`` where they name one, else an equal part of the rest. ``ValueError`` when the
    named shares pass the whole device, or leave nothing for the processes that name none."""
    named = [None if all(r.device_share is None for r in members) else
             sum(r.device_share for r in members if r.device_share is not None) for _, members in processes]
    taken = sum(s for s in named if s is not None)
    rest = [i for i, s in enumerate(named) if s is None]
    if taken > 1.0 + 1e-9 or (rest and taken >= 1.0):
        names = ", ".join("+".join(r.name for r in m) for _, m in processes)
        raise ValueError(f"the device shares of one rank's processes ({names}) take {taken:g} of its device, "
                         "leaving nothing for the others")
    equal = (1.0 - taken) / len(rest) if rest else 0.0
    return [equal if s is None else s for s in named]


def placement(cfg: GRPOConfig, rows: list, pool_of: Callable[[object], str] | None = None) -> list[tuple[Pool, list]]:
    """The ``per_rank`` ones of ``rows`` (active rows: :class:`RoleSpec` or anything with ``per_rank``
    and ``pool_of``, or with ``pool_of`` given: the pool's name of a row) grouped by pool, the training
    ranks' pool first, the others in the order their first row comes."""
    by_pool: dict[str, list] = {GLOBAL: []}
    for r in rows:
        if r.per_rank:
            by_pool.setdefault(pool_of(r) if pool_of is not None else r.pool_of(cfg), []).append(r)
    return [(pool(cfg, name), members) for name, members in by_pool.items() if members]


def bundles(cfg: GRPOConfig) -> int:
    """The bundles (devices; on CPU rank processes) a run places over all its pools."""
    return sum(p.world_size for p, _ in placement(cfg, active_specs(cfg)))

