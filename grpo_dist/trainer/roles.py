"""The role table's worker-building half: how each row's Ray workers are built, placed and started.

The rows themselves (names, the predicates that enable them, pools, device shares, processes, what is
checkpointed, ``--check``'s descriptions) are :data:`grpo_dist.config.roles.ROLE_SPECS`: ``--check``
reads them too, and ``config/`` may not import the driver (the package's layers; that module's
docstring says more). Here each row gets its building part (:data:`_PARTS`, by the row's name): the
Ray class, the constructor's and ``init_model``'s arguments, the set-up calls. :data:`ROLES` is the
two joined, in the rows' order, and :func:`run_roles` the run's rows joined with theirs; placement,
start-up, shutdown, checkpoints and resume iterate those and nothing else in the driver lists the roles. A new role is one row there, one building part here, one
thin worker shell in :mod:`grpo_dist.workers`, and its training module.

The rows of a run are the spec's (:attr:`~grpo_dist.config.spec.RunSpec.rows`): a row made for the run
from a template (one per reward model, ``reward_model.<name>``) is built as its template is, with its
own name (:func:`run_roles`).

Placement (:meth:`Workers.create`): per pool (the training ranks', ``global``; or a pool of a role's
own, a reward model's with ``enable_resource_pool``), one placement group per node
and one bundle per rank. Roles with ``per_rank`` get one worker per rank of their pool, in the rank's
bundle; the other roles get one worker that Ray places anywhere. Roles with the same ``process``
share one Ray worker process per rank (:class:`~grpo_dist.workers.models.ModelWorker`: every role
that holds an FSDP2 model), and each process takes its share of the rank's device
(:func:`grpo_dist.config.roles.device_shares`: the rows' ``device_share``, else equal parts). Roles
with ``model`` set load an FSDP2 model with ``init_model``; the models of one process share its
torch.distributed process group, whose world size is the pool's (a reward model on its own pool
has a group and FSDP2 shards of its own).
"""

from __future__ import annotations

import functools
import json
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from grpo_dist.config.roles import GLOBAL, MODELS, ROLE_SPECS, RoleSpec, device_shares, rank_processes  # noqa: F401
from grpo_dist.config.spec import RunSpec
from grpo_dist.distributed.worker_group import (
    CallDeadlines,
    ResourcePlan,
    WorkerGroup,
    check_pools_fit,
    cluster_cpus,
    create_placement_groups,
    remove_placement_groups,
)
from grpo_dist.rollout.tp import engine_of as tp_engine_of
from grpo_dist.rollout.tp import init_args as tp_init_args
from grpo_dist.trainer.profiling import StepProfiler
from grpo_dist.utils import startup

#: glibc malloc settings of CPU worker processes: keep freed memory in the process instead of handing
#: it back to the kernel and faulting it in again on the next step (the update allocates and frees
#: its activations every micro-batch). On the 2-core benchmark machine the large workload's update
#: went from 2.47-2.49 s to 2.14-2.25 s and the reference forward from 0.77-0.81 s to 0.67-0.74 s;
#: the price is that a worker's resident memory stays at its peak.
CPU_WORKER_MALLOC_ENV = {
    "MALLOC_TRIM_THRESHOLD_": "4294967295",
    "MALLOC_MMAP_THRESHOLD_": "4294967295",
    "MALLOC_TOP_PAD_": "536870912",
}


@dataclass(frozen=True)
class RoleContext:
    """What the rows need to build their workers' arguments (fixed for a run)."""

    spec: RunSpec
    device: str  # "cpu" | "cuda"
    model_path: str
    tokenizer_path: str
    total_steps: int
    world_size: int
    num_threads: int
    kv_cache_gib: float | None = None
    """The CPU KV cache of each vLLM engine, chosen once for the run (``rollout.kv_cache_gib``)."""
    reward_decoder: dict | None = field(default=None, repr=False)
    """How the reward worker decodes responses without transformers
    (:func:`grpo_dist.rewards.decoding.decoder_spec` of the driver's tokenizer); None: it loads the
    tokenizer with transformers."""


@dataclass(frozen=True)
class Role:
    """One row of the role table: its declarative half (:class:`~grpo_dist.config.roles.RoleSpec`) and
    how its workers are built.

    Attributes:
        spec: the row (name, ``enabled``, ``per_rank``, ``process``, ``device_share``, ``pool``,
            ``checkpoint``), read through the properties below.
        worker: ``"module:QualName"`` of the Ray actor class (imported when its workers are created); for
            a role in a shared ``process``, of the plain shell class, which only that process imports (the
            driver never imports the model shells, nor torch through them).
        init_kwargs: the constructor's keyword arguments for rank ``r`` (``ctx.world_size`` is the
            role's pool's).
        model: ``init_model``'s keyword arguments (besides the process-group address and backend);
            None for roles that hold no FSDP2 model. This names the role's settings builder (a method of
            the run's :class:`~grpo_dist.config.spec.RunSpec`, from :mod:`grpo_dist.config.role_settings`).
        hf_export: folder of the checkpoint that receives a Hugging Face export (``export_hf``) when
            one is asked for; None: the role exports nothing.
        setup: called once every group exists, to start what several of the role's ranks must do at
            once (a tensor-parallel rollout engine's rendezvous); returns the pending calls, which are
            collected together with the models' loading. None: nothing to do.
    """

    spec: RoleSpec
    worker: str
    init_kwargs: Callable[[RoleContext, int], dict]
    model: Callable[[RoleContext], dict] | None = None
    hf_export: str | None = None
    setup: Callable[[RoleContext, WorkerGroup], list] | None = None

    name = property(lambda self: self.spec.name)
    enabled = property(lambda self: self.spec.enabled)
    per_rank = property(lambda self: self.spec.per_rank)
    process = property(lambda self: self.spec.process)
    device_share = property(lambda self: self.spec.device_share)
    checkpoint = property(lambda self: self.spec.checkpoint)

    def saves(self, run: RunSpec) -> bool:
        """Whether this run's checkpoints hold this role."""
        return self.name in run.checkpointed

    def pool_of(self, run: RunSpec) -> str:
        """The pool this role's workers run on in this run."""
        return run.role_pools[self.name]


def _rank_kwargs(ctx: RoleContext, rank: int) -> dict:
    return dict(rank=rank, world_size=ctx.world_size, device=ctx.device, num_threads=ctx.num_threads,
                external_libs=ctx.spec.launch.external_libs)


def startup_lines(compute: str, warning: str | None, device: str, world: int, placement: dict, transport: str,
                  model_notes: dict[str, str] | None = None) -> list[str]:
    """What the run says once its workers are up: ranks, nodes, device, the actor's compute dtype,
    weight-sync transport, what the "auto" memory settings chose (each model role's, and the CPU KV
    cache), and a warning (``cpu_half_precision_warning``) when there is one."""
    lines = [f"{world} rank(s) on {len(set(placement['actor_rank_nodes']))} node(s), device {device}, "
             f"{compute} compute, weight sync {transport}"]
    lines += [f"{role}: {note}" for role, note in (model_notes or {}).items()]
    return lines + ([f"warning: {warning}"] if warning else [])


# ---- their arguments ---------------------------------------------------------------------------
def _timeout(ctx: RoleContext) -> dict:
    """The process group's collective timeout (verl's ``actor_rollout_ref.nccl_timeout``, every FSDP role)."""
    return dict(timeout_s=ctx.spec.nccl_timeout_s)


def _actor_model(ctx: RoleContext) -> dict:
    return dict(model_path=ctx.model_path, settings=ctx.spec.actor_settings(ctx.device, ctx.total_steps),
                **_timeout(ctx))


def _reference_model(ctx: RoleContext) -> dict:
    return dict(model_path=ctx.model_path, **ctx.spec.reference_kwargs(ctx.device), **_timeout(ctx))


def _critic_model(ctx: RoleContext) -> dict:
    return dict(model_path=ctx.spec.critic_model_path(ctx.model_path),
                settings=ctx.spec.critic_settings(ctx.device, ctx.total_steps), **_timeout(ctx))


def _reward_model_model(ctx: RoleContext, role: str = "reward_model") -> dict:
    path = ctx.spec.reward_model_path(role)
    return dict(model_path=path, settings=ctx.spec.reward_model_settings(ctx.device, role, path, ctx.tokenizer_path))


def _rollout_kwargs(ctx: RoleContext, rank: int) -> dict:
    spec = ctx.spec
    tp = spec.rollout_tp
    engine_kwargs = spec.engine_kwargs(ctx.model_path, ctx.device, ctx.kv_cache_gib)
    # every rank of a tensor-parallel engine must sample alike: the seed is the engine's
    return dict(rank=rank, device=ctx.device, num_threads=ctx.num_threads, engine=spec.rollout_engine, tp=tp,
                engine_kwargs={**engine_kwargs, "seed": spec.rollout_seed + tp_engine_of(rank, tp)},
                external_libs=spec.launch.external_libs)


def _rollout_setup(ctx: RoleContext, group: WorkerGroup) -> list:
    """Tensor parallelism: the ranks of each engine build their shards together, meeting at the
    rendezvous their first rank offers."""
    tp = ctx.spec.rollout_tp
    if tp == 1:
        return []
    return group.submit("init_engine", per_rank=tp_init_args(group.call("address"), tp))


def _reward_kwargs(ctx: RoleContext, rank: int) -> dict:
    return ctx.spec.reward_worker_kwargs(ctx.tokenizer_path)


def _reward_setup(ctx: RoleContext, group: WorkerGroup) -> list:
    """The reward worker's tokenizer: the driver's, as a ``tokenizers`` decoder where it can be
    (``ctx.reward_decoder``), known only once the driver loaded it (after the worker was created)."""
    return group.submit("load_tokenizer", ctx.reward_decoder)


_PARTS: dict[str, dict[str, Any]] = {
    "actor": dict(worker="grpo_dist.workers.actor:ActorWorker", init_kwargs=_rank_kwargs, model=_actor_model, hf_export="huggingface"),
    "reference": dict(worker="grpo_dist.workers.reference:ReferenceWorker", init_kwargs=_rank_kwargs, model=_reference_model),
    "critic": dict(worker="grpo_dist.workers.critic:CriticWorker", init_kwargs=_rank_kwargs, model=_critic_model),
    "reward_model": dict(worker="grpo_dist.workers.reward_model:RewardModelWorker", init_kwargs=_rank_kwargs, model=_reward_model_model),
    "rollout": dict(worker="grpo_dist.workers.rollout:RolloutWorker", init_kwargs=_rollout_kwargs, setup=_rollout_setup),
    "reward": dict(worker="grpo_dist.workers.reward:RewardWorker", init_kwargs=_reward_kwargs, setup=_reward_setup),
}
"""How each row's workers are built, by the row's name."""

ROLES: tuple[Role, ...] = tuple(Role(spec, **_PARTS[spec.name]) for spec in ROLE_SPECS)
"""Every role, in start-up order (:data:`grpo_dist.config.roles.ROLE_SPECS`'s)."""
assert len(ROLES) == len(_PARTS), "a building part without a row in grpo_dist.config.roles.ROLE_SPECS"


def run_roles(spec: RunSpec) -> tuple[Role, ...]:
    """The run's rows (the spec's active ones) with their building parts: a row made from a template
    takes the template's, its ``init_model`` arguments those of the row's own role."""
    roles = []
    for row in spec.rows:
        parts = dict(_PARTS[row.kind])
        if row.template is not None and parts.get("model") is not None:
            parts["model"] = functools.partial(parts["model"], role=row.name)
        roles.append(Role(row, **parts))
    return tuple(roles)


def active_roles(spec: RunSpec, roles: tuple[Role, ...] | None = None) -> list[Role]:
    """The rows this run needs: :func:`run_roles`, or those of ``roles`` (stand-ins in tests) the run has."""
    if roles is None:
        return list(run_roles(spec))
    return [r for r in roles if r.name in spec.roles]


def create_workers(spec: RunSpec, device: str, model_path: str, tokenizer_path: str) -> Workers:
    """The run's workers, created (:meth:`Workers.create`): their processes import what they need while
    the driver reads the data; :meth:`Workers.start` then loads their models."""
    world = spec.shape.world_size
    threads = spec.worker_threads(device, world, cluster_cpus)
    workers = Workers(RoleContext(spec, device, model_path, tokenizer_path, 0, world, threads))
    workers.create()
    return workers


class Workers:
    """The worker groups of a run, started from the role table; placement, shutdown and
    checkpoints iterate the same rows."""

    def __init__(self, ctx: RoleContext, roles: tuple[Role, ...] | None = None) -> None:
        self.ctx = ctx
        self.roles = active_roles(ctx.spec, roles)
        self.groups: dict[str, WorkerGroup] = {}
        self.process_groups: list[WorkerGroup] = []
        """One group per kind of worker process (the shared model process, not its per-role views)."""
        self.pgs: list = []
        self.pools = ctx.spec.placement(self.roles)
        """The ``per_rank`` roles of each pool, as ``(pool, roles)``, the training ranks' pool first."""
        self.plans = {p.name: ResourcePlan(p.nnodes, p.per_node, ctx.device, cpus_per_rank=1.0, keys=p.keys)
                      for p, _ in self.pools}
        """Each pool's bundles, by the pool's name."""
        self._timeouts = ctx.spec.call_deadlines
        self.model_notes: dict[str, str] = {}
        """Per role, the line its workers' ``init_model`` returned (the auto memory choices)."""
        self.profiler: StepProfiler | None = None
        """With verl's profiler keys on: the traces' begin and end in the processes (set by :meth:`start`)."""

    def _deadlines(self) -> CallDeadlines:
        """Each group's own call deadlines (``trainer.worker_call_timeout_s`` / ``_factor`` / ``_min_s``)."""
        return CallDeadlines(*self._timeouts)

    @contextmanager
    def calls_labelled(self, label: str) -> Iterator[None]:
        """Inside, every group's calls are timed under ``<method> (<label>)``: calls of another size
        than the training step's (validation over the whole held-out set) get deadlines of their own."""
        labelled = [g.deadlines for g in self.groups.values() if g.deadlines is not None]
        for d in labelled:
            d.label = label
        try:
            yield
        finally:
            for d in labelled:
                d.label = None

    def __getitem__(self, name: str) -> WorkerGroup:
        return self.groups[name]

    def get(self, name: str) -> WorkerGroup | None:
        return self.groups.get(name)

    def start(self, total_steps: int | None = None, reward_decoder: dict | None = None) -> None:
        """Place and start every active role (unless :meth:`create` did), then load the FSDP2 models of all
        roles at once; ``total_steps`` (the run's, known once the data is read) goes to ``init_model``,
        ``reward_decoder`` (from the driver's tokenizer) to the reward worker."""
        if not self.process_groups:
            self.create()
        if total_steps is not None:
            self.ctx = replace(self.ctx, total_steps=total_steps)
        if reward_decoder is not None:
            self.ctx = replace(self.ctx, reward_decoder=reward_decoder)
        self._load()
        if self.ctx.spec.profiling is not None:
            held = [(g, [name for name, v in self.groups.items() if v.shares_processes_with(g)])
                    for g in self.process_groups]  # each process group with the roles it holds
            self.profiler = StepProfiler(self.ctx.spec.profiling, held, self.ctx.device)
            self.model_notes["profiler"] = self.ctx.spec.profiling.line()  # (said with the start-up lines)

    def profile_step(self, step: int) -> None:
        """Step ``step`` (from 1) begins: the profiled processes begin or end their traces
        (:meth:`~grpo_dist.trainer.profiling.StepProfiler.step_begins`)."""
        if self.profiler is not None:
            self.profiler.step_begins(step)

    def create(self) -> None:
        """Place every active role and create its workers. Ray runs their constructors (the heavy imports:
        torch, vLLM, transformers) in their own processes while the caller goes on; nothing here needs the
        data or the number of steps (:meth:`start` hands it to ``init_model``)."""
        from grpo_dist.workers.models import RemoteModelWorker, shell_class

        ctx = self.ctx
        if ctx.device == "cpu" and ctx.spec.rollout_engine == "vllm":  # one KV-cache size for every engine, said at start-up
            gib, why = ctx.spec.kv_cache_gib(ctx.model_path)
            self.ctx = ctx = replace(ctx, kv_cache_gib=gib)
            if ctx.spec.kv_cache_auto:
                self.model_notes["rollout"] = f"KV cache {gib:g} GiB per engine (auto: {why})"
        pgs = {}
        check_pools_fit(list(self.plans.values()))
        for pool, _ in self.pools:  # every pool placed before any worker is created
            pgs[pool.name] = create_placement_groups(self.plans[pool.name])
            self.pgs += pgs[pool.name]
        # Ray starts a worker with OMP_NUM_THREADS = its CPU share (1 here); libraries that size their
        # thread pools when torch loads keep that even after torch.set_num_threads. On CPU, giving the
        # count at process start made rollout and update 6-14 % faster on the 2-core benchmark
        # machine. GPU workers keep Ray's setting: their CPU threads only launch kernels, and the
        # one GPU run with 4 OpenMP threads was not faster (docs/benchmarks.md).
        cpu = ctx.device == "cpu"
        env = {"OMP_NUM_THREADS": str(ctx.num_threads), **CPU_WORKER_MALLOC_ENV} if cpu else {}
        for pool, pool_roles in self.pools:
            plan, pctx = self.plans[pool.name], self._context(pool.name)
            processes = rank_processes(pool_roles)
            for (process, members), share in zip(processes, device_shares(processes)):
                resources = dict(num_cpus=share, num_gpus=0.0 if cpu else share, env=env)
                if process is None:  # a role in a process of its own
                    role = members[0]
                    group = WorkerGroup(role.name, shell_class(role.worker), plan, pgs[pool.name],
                                        init_kwargs=lambda r, role=role, pctx=pctx: role.init_kwargs(pctx, r),
                                        deadlines=self._deadlines(), **resources)
                    self.groups[role.name] = group
                    self.process_groups.append(group)
                    continue
                shared = WorkerGroup(  # named by its pool too: messages and startup.json tell the processes apart
                    process if pool.name == GLOBAL else f"{process} ({pool.name} pool)", RemoteModelWorker, plan,
                    pgs[pool.name],
                    init_kwargs=lambda r, members=members, pctx=pctx: {
                        "parts": {m.name: (m.worker, m.init_kwargs(pctx, r)) for m in members}},
                    **resources)
                self.process_groups.append(shared)
                for m in members:
                    self.groups[m.name] = shared.view(m.name, roles=[m.name for m in members],
                                                      deadlines=self._deadlines())
        for role in self.roles:
            if not role.per_rank:
                self.groups[role.name] = WorkerGroup(role.name, shell_class(role.worker), None, None,
                                                     init_kwargs=role.init_kwargs(ctx, 0), num_cpus=0.0,
                                                     deadlines=self._deadlines())
                self.process_groups.append(self.groups[role.name])

    def _context(self, pool: str) -> RoleContext:
        """The run's context for the roles of ``pool``: its ``world_size`` is the pool's ranks."""
        size = self.plans[pool].world_size
        return self.ctx if size == self.ctx.world_size else replace(self.ctx, world_size=size)

    def _load(self) -> None:
        ctx = self.ctx
        backend = "gloo" if ctx.device == "cpu" else "nccl"
        loading = []
        for role in self.roles:
            if role.setup is not None:
                refs = role.setup(ctx, self.groups[role.name])
                if refs:
                    loading.append((self.groups[role.name], refs))
        for role in self.roles:
            if role.model is not None:
                group = self.groups[role.name]
                addr, port = group.call("address")[0]
                loading.append((group, group.submit("init_model", master_addr=addr, master_port=port, backend=backend,
                                                    **role.model(self._context(role.pool_of(ctx.spec))))))
        for group, refs in loading:
            # generous: trainer.worker_call_timeout_s (a first load may read a large model from a slow disk)
            notes = group.collect(refs, "model loading",
                                  timeout_s=group.deadlines.limit("init_model") if group.deadlines else None)
            if notes and isinstance(notes[0], str):  # what a role's "auto" memory choices chose (rank 0's)
                self.model_notes[group.role] = notes[0] + ctx.spec.whole_sequence_note(group.role)
        # every constructor has run (an engine that failed to start says so here, naming its role)
        self.nodes = {name: group.call("node_id") for name, group in self.groups.items()}
        for group in self.process_groups:  # where each process's start-up went (the run's startup.json)
            for rank, moments in zip(group.ranks, group.call("startup_moments")):
                startup.add_process(group.role if group.single else f"{group.role} rank {rank}", moments)

    def close(self) -> None:
        if self.profiler is not None:  # the last trace is written before the processes go
            self.profiler, profiler = None, self.profiler
            profiler.finish()
        for group in self.groups.values():
            group.kill()
        self.groups, self.process_groups = {}, []
        remove_placement_groups(self.pgs)
        self.pgs = []

    def write_placement(self, path: Path, **extra: Any) -> dict:
        """Where each role's ranks run (Ray node ids), and ``extra``, as JSON at ``path``."""
        placement = {f"{name}_rank_nodes": nodes for name, nodes in self.nodes.items()} | extra
        path.write_text(json.dumps(placement, indent=1))
        return placement

    # ---- checkpoints -------------------------------------------------------------------------
    def save(self, directory: Path, *, export_hf: bool) -> None:
        """Every checkpointed role into ``directory/<role>``; with ``export_hf`` the exporting roles'
        Hugging Face folders too."""
        for role in self.roles:
            if role.saves(self.ctx.spec):
                self.groups[role.name].call("save_checkpoint", str(directory / role.name))
            if export_hf and role.hf_export:
                self.groups[role.name].call("export_hf", str(directory / role.hf_export), self.ctx.tokenizer_path)

    def load(self, directory: Path) -> None:
        for role in self.roles:
            if role.saves(self.ctx.spec):
                self.groups[role.name].call("load_checkpoint", str(directory / role.name))
