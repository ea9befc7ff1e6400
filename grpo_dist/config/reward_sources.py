"""The run's reward sources: what scores a response, and with what weight.

A source is one of

- ``rule``: the reward function of the reward worker, which is the built-in rule scorer of the row's
  ``data_source`` or, when ``custom_reward_function.path`` is set, that function (at most one per run);
- ``outcome_model``: a learned reward model, one score per response, read at its last valid token;
- ``process_model``: a learned process reward model, one score per reasoning step, read at the tokens
  whose text holds its step separator and at the last response token.

The reward is one rule for every run (:func:`grpo_dist.rewards.combine.weighted_sum`)::

    token_level_scores[b, t] = sum over sources s with weight_s != 0 of  weight_s * placed_s[b, t]

where ``placed_s`` puts an outcome score on the last response token and a process model's step scores
on its step ends; the response's score is the same sum of the sources' response scores (a process
model's: the sum of its step scores). With process supervision (``grpo_process``) a step ends wherever
a weighted source puts a score.

Two ways to declare them:

- **The implicit list** (verl's keys, no ``reward.sources``): the rule source always, weighted by
  ``reward_model.combine`` (``verl``: the reward model's score is the reward, or the custom function's
  when one is set; ``weighted``: ``rm_weight`` and ``rule_weight``), and with ``reward_model.enable`` one
  model source named ``reward_model`` from the ``reward_model.*`` / ``reward.reward_model.*`` keys.
- **A named list**, ``reward.sources.<name>: {kind, weight, path, ...}`` (:data:`ENTRY_KEYS`): exactly the
  run's sources, so a second reward model is one more entry. The implicit form's own switches
  (``reward_model.enable``, ``combine``, the weights, ``process.enable``, the pool keys) are then refused;
  the model sources share the other ``reward_model.*`` settings (FSDP2, dtypes, micro-batches,
  ``input_tokenizer``, ``max_length``) and ``reward_model.iterative.*`` for the one iterative RL trains
  (``reward_model.iterative.source``).

Each model source is one row of the role table (:func:`grpo_dist.config.roles.role_rows`): the implicit
one is the ``reward_model`` role (its checkpoints in ``reward_model/``, its metrics ``reward_model/...``),
a named one ``reward_model.<name>`` (metrics ``reward_model/<name>/...``). A source with
``enable_resource_pool`` has devices of its own (``nnodes x n_gpus_per_node`` ranks, a pool named after its
role), else it shares the training ranks.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

from grpo_dist.config.checks import DTYPES, bad, check_exists, choice, data_parallel_size, one_of_two, positive
from grpo_dist.config.schema import GRPOConfig, RewardModelConfig, RewardModelModelConfig, RewardRewardModelConfig
from grpo_dist.rewards.combine import COMBINE_MODES, RewardCombine

__all__ = ["ENTRY_KEYS", "IMPLICIT_MODEL", "RewardModelSpec", "RewardSource", "SOURCE_KINDS", "model_sources",
           "reward_model_micro_batch", "reward_model_spec", "reward_sources", "trained_source",
           "validate_reward_sources"]

SOURCE_KINDS: tuple[str, ...] = ("rule", "outcome_model", "process_model")
IMPLICIT_MODEL = "reward_model"
"""The name (and role) of the model source the implicit list declares with ``reward_model.enable``."""
IMPLICIT_RULE = "rule"

ENTRY_KEYS: dict[str, str] = {
    "kind": "rule | outcome_model | process_model (required)",
    "weight": "the source's weight in the reward (default 1.0; 0 computes it without using it)",
    "path": "model sources: the reward model's folder (as reward_model.model.path)",
    "step_separator": "process_model: the text that ends a step (default reward_model.process.step_separator)",
    "enable_resource_pool": "model sources: devices of its own instead of a share of the training ranks' (default false)",
    "nnodes": "model sources with enable_resource_pool: nodes of its pool (>= 1)",
    "n_gpus_per_node": "model sources with enable_resource_pool: devices per node of its pool (>= 1; on CPU: rank processes)",
    "micro_batch_size_per_gpu": "model sources: responses per forward on one rank (default: reward_model's)",
}
"""The keys of one ``reward.sources.<name>`` entry, and what each means (docs/algorithms.md lists them)."""
_RULE_KEYS = ("kind", "weight")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


# ---- the implicit reward model's two spellings -------------------------------------------------------
@dataclass(frozen=True)
class RewardModelSpec:
    """The reward-model keys verl spells two ways (``reward_model.*`` legacy, ``reward.reward_model.*``
    current), resolved to one value each."""

    enable: bool
    path: str
    path_key: str  # the key the path came from, for messages
    enable_resource_pool: bool
    n_gpus_per_node: int
    nnodes: int
    pool_keys: str = "reward_model"
    """The section of the pool keys that were set (``reward_model`` or ``reward.reward_model``), for messages."""


def reward_model_spec(cfg: GRPOConfig) -> RewardModelSpec:
    """The learned reward model's switch, folder and pool from either spelling: per setting, the one
    changed from its default wins; both changed to different values is a ``ConfigError``."""
    legacy, current = cfg.reward_model, cfg.reward.reward_model
    d_legacy, d_current = RewardModelConfig(), RewardRewardModelConfig()
    default_path = RewardModelModelConfig().path
    if current.model_path is not None and legacy.model.path != default_path and current.model_path != legacy.model.path:
        raise bad("reward.reward_model.model_path", current.model_path, f"it contradicts reward_model.model.path = "
                  f"{legacy.model.path!r}, another name for the same setting; set only one of them")
    from_current = current.model_path is not None
    pair = lambda name: one_of_two(f"reward_model.{name}", getattr(legacy, name), f"reward.reward_model.{name}",  # noqa: E731
                                   getattr(current, name), getattr(d_legacy, name))
    assert all(getattr(d_legacy, n) == getattr(d_current, n) for n in ("enable", "enable_resource_pool", "n_gpus_per_node", "nnodes"))
    return RewardModelSpec(
        enable=bool(legacy.enable or current.enable),
        path=str(current.model_path if from_current else legacy.model.path),
        path_key="reward.reward_model.model_path" if from_current else "reward_model.model.path",
        enable_resource_pool=bool(pair("enable_resource_pool")),
        n_gpus_per_node=int(pair("n_gpus_per_node")),
        nnodes=int(pair("nnodes")),
        pool_keys="reward.reward_model" if any(getattr(current, n) != getattr(d_current, n) for n in (
            "enable_resource_pool", "n_gpus_per_node", "nnodes")) else "reward_model",
    )


# ---- the sources ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RewardSource:
    """One reward source of the run (module docstring).

    Attributes:
        name: ``rule`` / ``reward_model`` in the implicit list, else the entry's name.
        kind: one of :data:`SOURCE_KINDS`.
        weight: its weight in the reward.
        declared: the keys that declare it, for messages (``reward.sources.<name>``, ``reward_model``).
        role: a model source's row of the role table (``reward_model`` or ``reward_model.<name>``); None
            for the rule source.
        path, path_key: a model source's folder as given, and the key it came from.
        step_separator: a process model's separator; None otherwise.
        own_pool, nnodes, n_gpus_per_node, pool_keys: devices of its own (``enable_resource_pool``), their
            size, and the section of the keys that set them (for messages).
        world_size: a model source's ranks: its own pool's, or the training ranks it shares.
        micro_batch_size_per_gpu: responses per forward on one rank; None: all of a rank's at once.
        trained: iterative RL trains this model source.
    """

    name: str
    kind: str
    weight: float
    declared: str
    role: str | None = None
    path: str = ""
    path_key: str = ""
    step_separator: str | None = None
    own_pool: bool = False
    nnodes: int = 0
    n_gpus_per_node: int = 0
    pool_keys: str = ""
    world_size: int = 0
    micro_batch_size_per_gpu: int | None = None
    trained: bool = False

    @property
    def is_model(self) -> bool:
        return self.kind != "rule"

    @property
    def is_process(self) -> bool:
        return self.kind == "process_model"

    @property
    def metric_prefix(self) -> str:
        """Where its metrics go: ``reward_model`` (the implicit model), ``reward_model/<name>`` (a named one)."""
        return (self.role or self.name).replace(".", "/")

    def describe(self) -> str:
        """One line for ``--check``: the weight, the name, the kind, and for a model where it runs."""
        what = {"rule": "rule score (the reward function)", "outcome_model": "outcome reward model",
                "process_model": "process reward model"}[self.kind]
        if not self.is_model:
            return f"{self.weight:g} x {self.name}: {what}"
        where = f"own pool {self.nnodes}x{self.n_gpus_per_node}" if self.own_pool else "on the training ranks"
        return f"{self.weight:g} x {self.name}: {what} {self.path} ({self.world_size} rank(s), {where})"


def reward_model_micro_batch(cfg: GRPOConfig, world_size: int) -> int | None:
    """Responses per reward-model forward on one rank of ``world_size``: ``reward_model.micro_batch_size_per_gpu``,
    else verl's deprecated global ``micro_batch_size`` divided over the ranks; None: all at once."""
    rm = cfg.reward_model
    if rm.micro_batch_size_per_gpu is not None:
        return rm.micro_batch_size_per_gpu
    if rm.micro_batch_size is not None:
        return max(1, rm.micro_batch_size // world_size)
    return None


def _model_source(cfg: GRPOConfig, name: str, kind: str, weight: float, declared: str, *, path: str, path_key: str,
                  separator: str | None, own_pool: bool, nnodes: int, per_node: int, pool_keys: str,
                  micro: int | None) -> RewardSource:
    world = nnodes * per_node if own_pool else data_parallel_size(cfg)
    return RewardSource(
        name=name, kind=kind, weight=weight, declared=declared, role=IMPLICIT_MODEL if name == IMPLICIT_MODEL
        else f"{IMPLICIT_MODEL}.{name}", path=path, path_key=path_key,
        step_separator=separator if kind == "process_model" else None, own_pool=own_pool,
        nnodes=nnodes if own_pool else 0, n_gpus_per_node=per_node if own_pool else 0, pool_keys=pool_keys,
        world_size=world, micro_batch_size_per_gpu=micro if micro is not None else reward_model_micro_batch(cfg, world))


def _implicit(cfg: GRPOConfig) -> tuple[RewardSource, ...]:
    rm, spec = cfg.reward_model, reward_model_spec(cfg)
    if not spec.enable:
        return (RewardSource(IMPLICIT_RULE, "rule", 1.0, "custom_reward_function"),)
    choice("reward_model.combine", rm.combine, COMBINE_MODES)
    for key, val in (("rm_weight", rm.rm_weight), ("rule_weight", rm.rule_weight)):
        if isinstance(val, bool) or not isinstance(val, (int, float)) or not math.isfinite(val):
            raise bad("reward_model." + key, val, "expected a finite number")
    rm_w, rule_w = RewardCombine(rm.combine, rm.rm_weight, rm.rule_weight, bool(cfg.custom_reward_function.path)).weights
    model = _model_source(
        cfg, IMPLICIT_MODEL, "process_model" if rm.process.enable else "outcome_model", rm_w, "reward_model",
        path=spec.path, path_key=spec.path_key, separator=rm.process.step_separator,
        own_pool=spec.enable_resource_pool, nnodes=spec.nnodes, per_node=spec.n_gpus_per_node,
        pool_keys=spec.pool_keys, micro=None)
    return (RewardSource(IMPLICIT_RULE, "rule", rule_w, "reward_model.combine"), model)


def _explicit_conflicts(cfg: GRPOConfig) -> None:
    """The implicit form's switches are refused beside a named list (module docstring)."""
    rm, d = cfg.reward_model, RewardModelConfig()
    spec = reward_model_spec(cfg)
    changed = [(spec.pool_keys + ".enable" if cfg.reward.reward_model.enable else "reward_model.enable", spec.enable, False)]
    changed += [(f"reward_model.{k}", getattr(rm, k), getattr(d, k)) for k in ("combine", "rm_weight", "rule_weight")]
    changed += [("reward_model.process.enable", rm.process.enable, False),
                (spec.pool_keys + ".enable_resource_pool", spec.enable_resource_pool, False),
                ("reward.reward_model.model_path", cfg.reward.reward_model.model_path, None)]
    for key, val, default in changed:
        if val != default:
            raise bad(key, val, "reward.sources lists every reward source of the run, and this key configures the "
                      "implicit one: declare that reward model as an entry of reward.sources (kind, path, weight, "
                      "enable_resource_pool, ...) instead, or drop reward.sources")


def _entry_value(where: str, entry: dict, key: str, default: Any, kind: type) -> Any:
    val = entry.get(key)
    if val is None:  # not given (or null): the default
        return default
    if kind is float:
        if isinstance(val, bool) or not isinstance(val, (int, float)) or not math.isfinite(val):
            raise bad(f"{where}.{key}", val, "expected a finite number")
        return float(val)
    if kind is int:
        if isinstance(val, bool) or not isinstance(val, int):
            raise bad(f"{where}.{key}", val, "expected a whole number")
        return val
    if kind is bool:
        if not isinstance(val, bool):
            raise bad(f"{where}.{key}", val, "expected true or false")
        return val
    if not isinstance(val, str) or not val:
        raise bad(f"{where}.{key}", val, "expected a non-empty text")
    return val


def _explicit(cfg: GRPOConfig, entries: dict) -> tuple[RewardSource, ...]:
    _explicit_conflicts(cfg)
    out: list[RewardSource] = []
    for name, entry in entries.items():
        where = f"reward.sources.{name}"
        if not _NAME.match(str(name)):
            raise bad("reward.sources", name, "a source's name is letters, digits and underscores (it names its role, "
                      "its checkpoint folder and its metrics), not starting with a digit")
        if not isinstance(entry, dict):
            raise bad(where, entry, "expected a mapping of " + ", ".join(ENTRY_KEYS))
        kind = entry.get("kind")
        choice(where + ".kind", kind, SOURCE_KINDS)
        allowed = _RULE_KEYS if kind == "rule" else tuple(ENTRY_KEYS)
        if kind != "process_model":
            allowed = tuple(k for k in allowed if k != "step_separator")
        for key in entry:
            if key not in allowed:
                raise bad(f"{where}.{key}", entry[key], f"a {kind} source's keys are " + ", ".join(allowed))
        weight = _entry_value(where, entry, "weight", 1.0, float)
        if kind == "rule":
            if any(s.kind == "rule" for s in out):
                raise bad(where + ".kind", kind, "the run has one rule source (the reward worker's function); "
                          "give it one entry")
            out.append(RewardSource(str(name), "rule", weight, where))
            continue
        if "path" not in entry:
            raise bad(where + ".path", None, f"a {kind} source needs its reward model's folder")
        own = _entry_value(where, entry, "enable_resource_pool", False, bool)
        nnodes = _entry_value(where, entry, "nnodes", 0, int)
        per_node = _entry_value(where, entry, "n_gpus_per_node", 0, int)
        if not own and ("nnodes" in entry or "n_gpus_per_node" in entry):
            raise bad(f"{where}.enable_resource_pool", False, f"{where}.nnodes / n_gpus_per_node size a pool of the "
                      "source's own, which it has only with enable_resource_pool=true")
        micro = _entry_value(where, entry, "micro_batch_size_per_gpu", None, int)
        positive(where + ".micro_batch_size_per_gpu", micro)
        out.append(_model_source(
            cfg, str(name), kind, weight, where, path=_entry_value(where, entry, "path", None, str),
            path_key=where + ".path",
            separator=_entry_value(where, entry, "step_separator", cfg.reward_model.process.step_separator, str),
            own_pool=own, nnodes=nnodes, per_node=per_node, pool_keys=where, micro=micro))
    if all(s.weight == 0 for s in out):
        raise bad("reward.sources", sorted(entries), "every source has weight 0, so every reward would be 0; give at "
                  "least one a weight")
    return tuple(out)


def reward_sources(cfg: GRPOConfig) -> tuple[RewardSource, ...]:
    """The run's sources (module docstring): the named list when ``reward.sources`` has entries, else the
    implicit one. ``ConfigError`` naming the key for an entry that is not a valid source."""
    entries = cfg.reward.sources
    sources = _explicit(cfg, dict(entries)) if entries else _implicit(cfg)
    it = cfg.reward_model.iterative
    models = [s.name for s in sources if s.is_model]
    if it.enable and (it.source in models or (it.source is None and len(models) == 1)):
        target = it.source or models[0]
        sources = tuple(replace(s, trained=True) if s.name == target else s for s in sources)
    return sources


def model_sources(cfg: GRPOConfig) -> tuple[RewardSource, ...]:
    """The run's learned reward models, in the order they are declared."""
    return tuple(s for s in reward_sources(cfg) if s.is_model)


def trained_source(cfg: GRPOConfig) -> RewardSource | None:
    """The model source iterative RL trains; None without iterative RL."""
    return next((s for s in model_sources(cfg) if s.trained), None)


def _check_iterative(cfg: GRPOConfig, models: tuple[RewardSource, ...]) -> None:
    it = cfg.reward_model.iterative
    ipre = "reward_model.iterative."
    if not it.enable:
        if it.source is not None:
            raise bad(ipre + "source", it.source, "it names the reward source iterative RL trains, and "
                      "reward_model.iterative.enable is false; set enable=true or leave source null")
        return
    names = [s.name for s in models]
    if it.source is not None and it.source not in names:
        raise bad(ipre + "source", it.source, "expected the name of one of the run's model sources: " + ", ".join(names))
    if it.source is None and len(names) != 1:
        raise bad(ipre + "source", None, "the run has several reward models; name the one iterative RL trains: "
                  + ", ".join(names))
    for key, val in (("steps_per_iteration", it.steps_per_iteration), ("buffer_size", it.buffer_size),
                     ("epochs", it.epochs), ("lr", it.lr), ("mini_batch_size", it.mini_batch_size),
                     ("micro_batch_size_per_gpu", it.micro_batch_size_per_gpu), ("grad_clip", it.grad_clip)):
        positive(ipre + key, val)
    positive(ipre + "weight_decay", it.weight_decay, allow_zero=True)
    for key, val in (("replay_fraction", it.replay_fraction), ("heldout_fraction", it.heldout_fraction)):
        if not 0 <= val < 1:
            raise bad(ipre + key, val, "expected a fraction in [0, 1)")
    if it.label_threshold is not None and (isinstance(it.label_threshold, bool) or not isinstance(
            it.label_threshold, (int, float)) or not math.isfinite(it.label_threshold)):
        raise bad(ipre + "label_threshold", it.label_threshold,
                  "expected a finite number (a rule score at or above it is labelled correct), or null for soft labels")
    if len(it.betas) != 2 or not all(0 <= b < 1 for b in it.betas):
        raise bad(ipre + "betas", list(it.betas), "expected two numbers in [0, 1), e.g. [0.9, 0.999]")


def validate_reward_sources(cfg: GRPOConfig, *, check_paths: bool = True) -> None:
    """The reward sources of a run and the ``reward_model.*`` settings its reward models share."""
    from grpo_dist.core.advantage_registry import get_adv_estimator

    sources = reward_sources(cfg)
    models = tuple(s for s in sources if s.is_model)
    rm = cfg.reward_model
    if not models:
        if rm.iterative.enable or rm.process.enable:
            key = "reward_model.iterative.enable" if rm.iterative.enable else "reward_model.process.enable"
            raise bad(key, True, "it needs a reward model: set reward_model.enable=true and reward_model.model.path "
                      "(or reward.reward_model.enable / model_path, or a model entry of reward.sources)")
        return
    pre = "reward_model."
    # strategy and fsdp_size are checked by their states in the schema
    fsdp = rm.model.fsdp_config
    choice(pre + "model.fsdp_config.model_dtype", fsdp.model_dtype, DTYPES)
    choice(pre + "model.fsdp_config.dtype", fsdp.dtype, ("auto",) + DTYPES)
    for key, val in (("micro_batch_size_per_gpu", rm.micro_batch_size_per_gpu), ("micro_batch_size", rm.micro_batch_size),
                     ("max_length", rm.max_length), ("forward_max_token_len_per_gpu", rm.forward_max_token_len_per_gpu)):
        positive(pre + key, val)
    estimator = get_adv_estimator(cfg.algorithm.adv_estimator)
    custom = bool(cfg.custom_reward_function.path)
    for s in models:
        if s.own_pool:
            for key, val in (("nnodes", s.nnodes), ("n_gpus_per_node", s.n_gpus_per_node)):
                if val < 1:
                    p = s.pool_keys + "."
                    raise bad(p + "enable_resource_pool", True, f"a pool of the reward model's own needs {p}{key} >= 1 "
                              f"(it is {val}): set {p}nnodes and {p}n_gpus_per_node to its size (on CPU: its rank "
                              f"processes), or {p}enable_resource_pool=false to share the training ranks' devices")
        if s.is_process:
            key = pre + "process" if s.declared == IMPLICIT_MODEL else s.declared
            if not s.step_separator:
                raise bad(key + ".step_separator", s.step_separator, "expected a non-empty text, e.g. a newline")
            if not estimator.needs_step_rewards:
                raise bad(key + (".enable" if s.declared == IMPLICIT_MODEL else ".kind"), True if s.declared ==
                          IMPLICIT_MODEL else s.kind, f"a process reward model gives a reward per step; "
                          f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} reads one per response: use "
                          "algorithm.adv_estimator=grpo_process")
    if estimator.needs_step_rewards and not any(
            s.weight != 0 and (s.is_process or (s.kind == "rule" and custom)) for s in sources):
        raise bad("algorithm.adv_estimator", cfg.algorithm.adv_estimator, "it needs a reward per step, and the reward "
                  "comes from an outcome reward model (one score per response): set reward_model.process.enable=true "
                  "(or a process_model source), or custom_reward_function.path to a function returning step_rewards")
    _check_iterative(cfg, models)
    if check_paths:
        for s in models:
            check_exists(s.path_key, s.path, kind="model")
        tok = rm.model.input_tokenizer
        if tok and tok != cfg.actor_rollout_ref.model.path:
            check_exists(pre + "model.input_tokenizer", tok, kind="model")
