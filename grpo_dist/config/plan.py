"""The plan of a run, from its validated configuration alone: what ``python -m grpo_dist.main --check``
prints before anything is started.

Nothing here starts Ray, loads a model or imports an engine: the plan is arithmetic on the
configuration plus the row counts of the data files (read from their metadata where the format
allows). It names the ranks and their placement per role, the sizes derived from the keys (steps
from epochs, mini- and micro-batches per step, responses per step, the data-parallel size, token
budgets) and the keys that are accepted here without effect.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from grpo_dist.config.agents import default_agent_loop
from grpo_dist.config.roles import (GLOBAL, ROLLOUT_POOL, Pool, active_specs, describe, device_shares, placement,
                                    rank_processes, rollout_pool_ranks)
from grpo_dist.config.fully_async import fully_async_note, fully_async_settings, rollout_total_steps
from grpo_dist.config.profiling import profile_plan
from grpo_dist.config.schema import GRPOConfig
from grpo_dist.config.reward_sources import reward_model_spec, reward_sources
from grpo_dist.config.validate import critic_enabled, data_parallel_size
from grpo_dist.rollout.tp import tp_groups

#: Field metadata values of ``metadata["state"]`` that mark a key as accepted without effect.
NOOP_STATES = ("no-op", "noop", "no_op")


@dataclass
class RolePlacement:
    """Where one role's workers run (a row of the role table, :mod:`grpo_dist.config.roles`)."""

    name: str
    per_rank: bool  # one worker per rank of its pool, in the rank's bundle
    note: str = ""  # the row's one-line description
    pool: str = GLOBAL
    share: float = 1.0  # of its rank's device, for the process the role lives in (per_rank roles)
    process: str | None = None  # roles with the same process share it (and its share)


@dataclass
class PoolPlan:
    """A pool of ranks other than the training ranks', and the roles on it."""

    pool: Pool
    roles: list[str]


@dataclass
class Plan:
    """Everything ``--check`` reports about a run; ``lines()`` renders it."""

    nnodes: int
    ranks_per_node: int
    device: str
    roles: list[RolePlacement]
    tp: int
    engines: int
    prompts_per_step: int
    n: int
    responses_per_step: int
    dp: int
    train_rows: int | None
    train_rows_note: str
    steps_per_epoch: int | None
    total_steps: int | None
    steps_note: str
    mini_batches: int
    ppo_epochs: int
    mini_responses_per_rank: int
    micro_note: str
    prompt_len: int
    response_len: int
    pools: dict[str, Pool] = field(default_factory=dict)
    """The pools other than the training ranks', by name."""
    rewards: list[str] = field(default_factory=list)
    """The reward sources, one line each (:meth:`grpo_dist.config.reward_sources.RewardSource.describe`)."""
    noop_set: list[tuple[str, Any, str]] = field(default_factory=list)
    noop_total: int = 0
    notes: list[str] = field(default_factory=list)
    rollout_ahead: str = "the next batch while the current one trains: one-step-off-policy"
    """What the rollout's own pool generates ahead (its placement line)."""

    @property
    def optimizer_steps_per_step(self) -> int:
        return self.mini_batches * self.ppo_epochs

    def lines(self) -> list[str]:
        L: list[str] = []
        dev = {"cpu": "CPU rank(s)", "cuda": "GPU(s)"}.get(self.device, "device(s) (trainer.device=auto: GPUs where the Ray cluster has them, else CPU ranks)")
        L.append(f"cluster     {self.nnodes} node(s) x {self.ranks_per_node} {dev} = {self.dp} data-parallel rank(s)")
        pools: dict[str, list[RolePlacement]] = {}
        for r in self.roles:
            if r.per_rank:
                pools.setdefault(r.pool, []).append(r)
        for name, members in pools.items():
            pool = self.pools.get(name, Pool(GLOBAL, self.nnodes, self.ranks_per_node, "trainer"))
            if name != GLOBAL:
                what = (f"; it generates {self.rollout_ahead}"
                        if name == ROLLOUT_POOL else " (its own process group)")
                L.append(f"pool        {name}: {pool.keys}.nnodes {pool.nnodes} x {pool.keys}.n_gpus_per_node "
                         f"{pool.per_node} = {pool.world_size} rank(s) of its own{what}")
            shares = _shares_note(members)
            for node in range(pool.nnodes):
                lo, hi = node * pool.per_node, (node + 1) * pool.per_node - 1
                ranks = f"rank {lo}" if lo == hi else f"ranks {lo}-{hi}"
                where = f"node {node}" if name == GLOBAL else f"{name} pool node {node}"
                L.append(f"placement   {where}: {ranks}: {', '.join(r.name for r in members)}" + shares)
        for r in self.roles:
            L.append(f"            {r.name}: {r.note}")
        per_engine = self.prompts_per_step / max(self.engines, 1)
        if self.tp == 1:
            L.append(f"rollout     {self.engines} engine(s), one per rank; {_num(per_engine)} prompt(s) x n={self.n} per engine per step")
        else:
            L.append(f"rollout     tensor parallel {self.tp}: {self.engines} engine(s), each over {self.tp} consecutive ranks "
                     f"(ranks 0-{self.tp - 1}, {self.tp}-{2 * self.tp - 1}, ...); {_num(per_engine)} prompt(s) x n={self.n} per engine per step")
        L.append(f"data        {self.train_rows_note}")
        L.append(f"steps       {self.steps_note}")
        L.append(f"step        {self.prompts_per_step} prompt(s) x rollout.n {self.n} = {self.responses_per_step} responses")
        L.append(f"update      {self.mini_batches} mini-batch(es) x ppo_epochs {self.ppo_epochs} = {self.optimizer_steps_per_step} "
                 f"optimizer step(s) per training step; {self.mini_responses_per_rank} response(s) per rank per mini-batch, {self.micro_note}")
        seq = self.prompt_len + self.response_len
        L.append(f"tokens      at most {self.prompt_len} + {self.response_len} = {seq} per response, "
                 f"{self.responses_per_step * seq:,} per step, {self.mini_responses_per_rank * seq:,} per rank per mini-batch")
        if len(self.rewards) == 1:
            L.append(f"reward      {self.rewards[0]}")
        elif self.rewards:
            L.append(f"reward      the weighted sum of {len(self.rewards)} sources (weights of 0 leave a source out):")
            L.extend(f"              {r}" for r in self.rewards)
        L.extend(f"note        {n}" for n in self.notes)
        if self.noop_set:
            L.append("no-op keys  without effect in this configuration:")
            L.extend(f"              {k}={v!r}: {why}" for k, v, why in self.noop_set)
        else:
            L.append("no-op keys  none among the keys set here")
        if self.noop_total:
            L.append(f"            ({self.noop_total} key(s) of the schema are accepted as no-ops; docs/configuration.md lists them)")
        return L


def _shares_note(members: list[RolePlacement]) -> str:
    """`` (... of the rank's device)``: how a rank's processes split its device (nothing for one process)."""
    processes: dict[Any, list[RolePlacement]] = {}
    for r in members:
        processes.setdefault(r.process or ("own", r.name), []).append(r)
    if len(processes) < 2:
        return ""
    parts = [f"{'+'.join(r.name for r in rs)} {_fraction(rs[0].share)}" for rs in processes.values()]
    return " (colocated, shares of the rank's device: " + ", ".join(parts) + ")"


def _fraction(x: float) -> str:
    for d in range(1, 9):
        if abs(x * d - round(x * d)) < 1e-9:
            return f"{round(x * d)}/{d}" if d > 1 else f"{round(x * d)}"
    return f"{x:.2f}"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.2f}"


def data_rows(paths: list[str]) -> tuple[int | None, str]:
    """Rows in the data files (parquet from its metadata, jsonl by lines, json by items); None and the
    reason when a file cannot be counted here."""
    from grpo_dist import tasks

    total = 0
    for p in paths:
        try:
            real = tasks.resolve(p) if p.startswith(tasks.BUILTIN_PREFIX) else os.path.expanduser(p)
            total += _rows_in(real)
        except Exception as exc:  # an unreadable file is the run's error to report, not the plan's
            return None, f"{p}: {type(exc).__name__}: {exc}"
    return total, ""


def _rows_in(path: str) -> int:
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    if path.endswith(".jsonl"):
        with open(path, "rb") as f:
            return sum(1 for line in f if line.strip())
    if path.endswith(".json"):
        import json

        with open(path) as f:
            data = json.load(f)
        return len(data) if isinstance(data, list) else 1
    raise ValueError("unsupported file type (expected .parquet, .jsonl or .json)")


def _noop_state(meta: Any) -> tuple[bool, str, tuple | None]:
    """Whether field metadata marks a key as accepted without effect, the reason, and the values that are
    no-ops (None: every value). Reads ``metadata["state"]`` either as a state object with
    ``kind == "no-op"`` (and ``reason`` / ``values``) or as a plain string with ``metadata["reason"]``."""
    state = meta.get("state")
    kind = getattr(state, "kind", state)
    if str(kind or "").lower() not in NOOP_STATES:
        return False, "", None
    reason = getattr(state, "reason", None) or meta.get("reason") or meta.get("help", "")
    return True, str(reason), getattr(state, "values", None)


def noop_keys(cfg: GRPOConfig) -> tuple[list[tuple[str, Any, str]], int]:
    """The keys the schema marks as accepted without effect (:func:`_noop_state`; a section's state
    holds for the leaves below it that have none): those this configuration sets to a value other than
    the default, and how many the schema marks in all. Plus the no-ops that depend on the
    configuration (:func:`situational_noops`)."""
    found: list[tuple[str, Any, str]] = []
    total = 0

    def walk(obj: Any, default: Any, prefix: str, inherited: dict) -> None:
        nonlocal total
        for f in fields(obj):
            val, dflt = getattr(obj, f.name), getattr(default, f.name)
            key = prefix + f.name
            meta = f.metadata if f.metadata.get("state") is not None else {**inherited, "help": f.metadata.get("help", "")}
            if is_dataclass(val):
                walk(val, dflt, key + ".", meta if f.metadata.get("state") is not None else inherited)
                continue
            noop, reason, values = _noop_state(meta)
            if noop:
                total += 1
                if val != dflt and (values is None or val in values):
                    found.append((key, val, reason))

    walk(cfg, GRPOConfig(), "", {})
    seen = {k for k, _, _ in found}
    found += [x for x in situational_noops(cfg) if x[0] not in seen]
    return found, total


def situational_noops(cfg: GRPOConfig) -> list[tuple[str, Any, str]]:
    """Keys whose value has no effect in this particular configuration."""
    r = cfg.actor_rollout_ref.rollout
    out: list[tuple[str, Any, str]] = []
    spec = reward_model_spec(cfg)
    if spec.enable_resource_pool and not spec.enable:
        out.append((f"{spec.pool_keys}.enable_resource_pool", True, "the run has no reward model (reward_model.enable)"))
    if r.enable_chunked_prefill and cfg.trainer.device == "cpu" and r.name == "vllm":
        out.append(("actor_rollout_ref.rollout.enable_chunked_prefill", True,
                    "off on CPU: vLLM's chunked prefill breaks per-request sampling seeds there"))
    return out


def role_placements(cfg: GRPOConfig) -> tuple[list[RolePlacement], dict[str, Pool]]:
    """Where each active row of the role table runs (its pool, and its process's share of a rank's
    device), in the table's order; and the pools other than the training ranks'."""
    roles: dict[str, RolePlacement] = {}
    pools: dict[str, Pool] = {}
    for pool, members in placement(cfg, active_specs(cfg)):
        if pool.name != GLOBAL:
            pools[pool.name] = pool
        processes = rank_processes(members)
        for (process, rows), share in zip(processes, device_shares(processes)):
            for r in rows:
                roles[r.name] = RolePlacement(r.name, True, describe(r, cfg), pool.name, share, process)
    out = [roles.get(r.name) or RolePlacement(r.name, False, describe(r, cfg)) for r in active_specs(cfg)]
    return out, pools


def agents_note(cfg: GRPOConfig) -> str:
    """The plan's line on agent-loop rollouts (``rollout.mode=async``): the default loop, the turn limits, the tools."""
    r = cfg.actor_rollout_ref.rollout
    mt, ag = r.multi_turn, r.agent
    text = f"agent loops: each trajectory a coroutine; rows without agent_name run {default_agent_loop(cfg)}"
    if ag.agent_loop_config_path:
        text += f" (your loops: {ag.agent_loop_config_path})"
    if mt.enable:
        most = {n: "no limit" if v is None else str(v) for n, v in (("assistant", mt.max_assistant_turns),
                                                                      ("user", mt.max_user_turns))}
        text += (f"; multi-turn: assistant turns {most['assistant']}, user turns {most['user']}, within "
                 f"{r.response_length} response tokens")
    tools = [p for p in (mt.tool_config_path, mt.function_tool_path) if p]
    if tools:
        text += "; tools from " + ", ".join(tools)
    return text


def build_plan(cfg: GRPOConfig, *, count_rows: bool = True) -> Plan:
    """The plan of a validated configuration (see the module docstring); ``count_rows=False`` leaves
    the data files alone (they may exist only where the run will happen)."""
    from grpo_dist.data.readers import as_path_list

    d, t, arr = cfg.data, cfg.trainer, cfg.actor_rollout_ref
    actor, rollout = arr.actor, arr.rollout
    dp = data_parallel_size(cfg)
    roles, pools = role_placements(cfg)
    tp = rollout.tensor_model_parallel_size
    engines = len(tp_groups(rollout_pool_ranks(cfg) or dp, tp))
    n = rollout.n
    prompts = d.train_batch_size
    rows, why = data_rows(as_path_list(d.train_files)) if count_rows else (None, "--check=config")
    per_draw = (d.gen_batch_size or d.train_batch_size) if cfg.algorithm.filter_groups.enable else d.train_batch_size
    files = ", ".join(as_path_list(d.train_files))
    if rows is None:
        spe, rows_note = None, f"train files {files}: rows not counted here ({why})"
    else:
        spe = rows // per_draw
        rows_note = (f"{rows} training prompt(s) in {files} -> {spe} step(s) per epoch ({rows} // {per_draw} prompts per "
                     "batch, the remainder dropped each epoch" + (", before data.filter_overlong_prompts" if d.filter_overlong_prompts else "") + ")")
    fa = fully_async_settings(cfg)
    from_rollout = rollout_total_steps(cfg)
    if from_rollout is not None:
        total = from_rollout
        steps_note = (f"{total} = rollout.total_rollout_steps {cfg.rollout.total_rollout_steps} // {fa.chunk_prompts} "
                      "prompts per chunk (fully asynchronous; trainer.total_training_steps / total_epochs unused)")
    elif t.total_training_steps:
        total = t.total_training_steps
        steps_note = f"{total} (trainer.total_training_steps; it wins over trainer.total_epochs={t.total_epochs})"
    elif spe is not None:
        total = t.total_epochs * spe
        steps_note = f"{total} = trainer.total_epochs {t.total_epochs} x {spe} step(s) per epoch"
    else:
        total, steps_note = None, f"trainer.total_epochs {t.total_epochs} x the steps per epoch (rows not counted)"
    if t.val_only:
        steps_note += "; trainer.val_only: validate once and exit, no training step"
    mini_batches = d.train_batch_size // actor.ppo_mini_batch_size
    mini_per_rank = actor.ppo_mini_batch_size * n // dp
    seq = d.max_prompt_length + d.max_response_length
    if actor.use_dynamic_bsz:
        worst = math.ceil(mini_per_rank * seq / actor.ppo_max_token_len_per_gpu)
        micro_note = (f"micro-batches cut by a token budget of {actor.ppo_max_token_len_per_gpu} "
                      f"(at least {worst} per mini-batch when every response is at full length)")
    elif actor.ppo_micro_batch_size_per_gpu:
        k = mini_per_rank // actor.ppo_micro_batch_size_per_gpu
        micro_note = f"{k} micro-batch(es) of {actor.ppo_micro_batch_size_per_gpu} (gradient accumulation)"
    else:
        micro_note = "1 micro-batch (ppo_micro_batch_size_per_gpu=null: the whole mini-batch at once)"
    notes = []
    if fa is not None:
        notes.append(fully_async_note(fa))
    if cfg.algorithm.filter_groups.enable:
        notes.append(f"dynamic sampling: generation batches of {per_draw} prompts until {prompts} prompts with "
                     "differing scores are kept")
    if cfg.algorithm.use_pf_ppo:
        pf = cfg.algorithm.pf_ppo
        notes.append(f"PF-PPO: after the advantages, the {prompts * n} responses are resampled with replacement, weighted "
                     f"by reward ({pf.reweight_method}" + (f", power {pf.weight_pow})" if pf.reweight_method == "pow" else ")"))
    if critic_enabled(cfg):
        c = cfg.critic
        notes.append(f"critic: {d.train_batch_size // c.ppo_mini_batch_size} mini-batch(es) x ppo_epochs {c.ppo_epochs}, "
                     f"{c.ppo_mini_batch_size * n // dp} response(s) per rank per mini-batch")
    if t.log_val_generations:
        notes.append(f"validation: {t.log_val_generations} sample(s) logged as a table each time (val_generations.jsonl)")
    for what, folder in (("training step", t.rollout_data_dir), ("validation", t.validation_data_dir)):
        if folder:
            notes.append(f"every response of each {what} written to {folder}/<step>.jsonl")
    if rollout.mode == "async":
        notes.append(agents_note(cfg))
    profiling = profile_plan(cfg)
    if profiling is not None:
        notes.append(f"profiler: {profiling.line()}")
    noop, noop_total = noop_keys(cfg)
    return Plan(
        nnodes=t.nnodes, ranks_per_node=t.n_gpus_per_node, device=t.device, roles=roles, pools=pools, tp=tp, engines=engines,
        prompts_per_step=prompts, n=n, responses_per_step=prompts * n, dp=dp, train_rows=rows, train_rows_note=rows_note,
        steps_per_epoch=spe, total_steps=total, steps_note=steps_note, mini_batches=mini_batches,
        ppo_epochs=actor.ppo_epochs, mini_responses_per_rank=mini_per_rank, micro_note=micro_note,
        prompt_len=d.max_prompt_length, response_len=d.max_response_length, noop_set=noop, noop_total=noop_total,
        notes=notes, rewards=[s.describe() for s in reward_sources(cfg)],
        rollout_ahead=(f"up to {fa.max_ahead} chunk(s) ahead of the trainer: fully asynchronous" if fa is not None
                       else Plan.rollout_ahead),
    )
