"""Cross-key validation of a composed configuration, before any process starts.

Every check raises ``ConfigError`` with one message naming the key, the value given and what
would be valid. Nothing here loads a model, starts Ray or reads a data file beyond checking
that it exists (checks that need the model or the data run later, in the trainer's set-up).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from dataclasses import fields
from typing import Any, Iterator

from grpo_dist.config.schema import (
    ConfigError,
    CriticConfig,
    CriticFSDPConfig,
    CriticOptimConfig,
    GRPOConfig,
)
from grpo_dist.config.agents import check_agent_files, check_agents
from grpo_dist.config.checks import DTYPES, data_parallel_size
from grpo_dist.config.checks import bad as _bad
from grpo_dist.config.checks import check_exists as _check_exists
from grpo_dist.config.checks import choice as _choice
from grpo_dist.config.checks import one_of_two as _one_of_two
from grpo_dist.config.checks import positive as _positive
from grpo_dist.config.fully_async import async_training_given, chunk_prompts, fully_async_on, v1_separate_async
from grpo_dist.config.reward_sources import model_sources, validate_reward_sources
from grpo_dist.config.states import check_states, default_of, get, raw_get, setting
from grpo_dist.core.advantage_registry import get_adv_estimator, list_adv_estimators
from grpo_dist.core.names import ALL_LOSS_AGG_MODES, LOSS_AGG_MODES, PF_PPO_METHODS, canonical_kl_kind
from grpo_dist.core.policy_loss_registry import PolicyLossParams, get_policy_loss, list_policy_losses
from grpo_dist.core.rollout_correction_params import RolloutCorrectionParams
from grpo_dist.core.schedules import LR_SCHEDULER_TYPES
from grpo_dist.rewards.shaping import OverlongBuffer
from grpo_dist.data import TRUNCATION_MODES, as_path_list
from grpo_dist.rollout import ENGINE_NAMES, WEIGHT_SYNC_BACKENDS
from grpo_dist.training.dtypes import dtype_name
from grpo_dist.training.settings import ATTN_IMPLEMENTATIONS, LoraSettings

STRATEGIES = ("fsdp2", "fsdp")
KL_CTRL_TYPES = ("fixed", "adaptive")
RESUME_MODES = ("auto", "disable", "resume_path")
DEVICES = ("auto", "cpu", "cuda")
LOGGERS = ("console", "file", "tensorboard", "wandb", "mlflow")
#: verl's tracking backends that grpo_dist does not have, and what to use instead.
OTHER_VERL_LOGGERS = ("swanlab", "vemlp_wandb", "clearml", "trackio")
REWARD_MANAGERS = ("naive", "prime", "dapo")
FILTER_METRICS = ("acc", "score", "seq_reward", "seq_final_reward")  # trainer.dynamic_sampling.FILTER_METRICS
FILTER_ON_EXHAUSTED = ("error", "train")
ON_ERROR = ("raise", "zero")
CKPT_CONTENTS = ("model", "optimizer", "extra", "hf_model")


def _freq(key: str, value: int) -> None:
    if value != -1 and value <= 0:
        raise _bad(key, value, "expected -1 (off) or a positive number of steps")


def logger_names(value: Any) -> list[str]:
    """``trainer.logger`` as a list of names: verl accepts a list or one name (``trainer.logger=console``)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    raise _bad("trainer.logger", value, "expected a list of names or one name, e.g. [console,file] or console")


def _check_loggers(value: Any) -> None:
    for lg in logger_names(value):
        if lg in OTHER_VERL_LOGGERS:
            raise _bad("trainer.logger", lg, f"verl's {lg} backend is not built into grpo_dist; use one of " + ", ".join(LOGGERS))
        _choice("trainer.logger", lg, LOGGERS)


def _check_rollout_extras(cfg: GRPOConfig) -> None:
    """The agent-loop keys (``rollout.mode``, ``multi_turn.*``, ``agent.*``: :func:`grpo_dist.config.agents.check_agents`)
    and vLLM's pass-through arguments."""
    r = cfg.actor_rollout_ref.rollout
    pre = "actor_rollout_ref.rollout."
    check_agents(cfg)
    backend = r.checkpoint_engine.backend
    if backend not in WEIGHT_SYNC_BACKENDS:
        where = {"hccl": "Ascend NPUs' HCCL", "nixl": "the NIXL transfer library", "mooncake": "Mooncake's transfer engine",
                 "kimi_ckpt_engine": "Mooncake's transfer engine", "delta_sharded": "SGLang's rollout"}.get(backend)
        raise _bad(pre + "checkpoint_engine.backend", backend,
                   (f"verl's {backend} backend needs {where}, which grpo_dist does not run; " if where else "") +
                   "valid: naive (CUDA IPC into an engine on the actor's GPU, else Ray's object store) or nccl (actor "
                   "rank 0 broadcasts to the rollout ranks: NCCL on GPUs, gloo on the CPU)")
    vllm_kwargs = {k: v for k, v in r.engine_kwargs.vllm.items() if v is not None}
    if vllm_kwargs and r.name != "vllm":
        raise _bad(pre + "engine_kwargs.vllm", vllm_kwargs, f"they are vLLM's arguments, but rollout.name={r.name}; "
                   "use rollout.name=vllm or leave them out")
    if r.ignore_eos and r.name != "vllm":
        raise _bad(pre + "ignore_eos", True, f"the {r.name} engine stops at the end-of-sequence token; generating past it "
                   "needs rollout.name=vllm (or leave ignore_eos false)")
    for k in vllm_kwargs:
        if k in VLLM_KWARGS_OWNED:
            raise _bad(pre + f"engine_kwargs.vllm.{k}", vllm_kwargs[k], VLLM_KWARGS_OWNED[k])
    needed = r.prompt_length + r.response_length
    if r.max_model_len is not None and r.max_model_len < needed:
        raise _bad(pre + "max_model_len", r.max_model_len,
                   f"the engine's context must hold a prompt and its response: at least rollout.prompt_length + "
                   f"rollout.response_length = {needed} (data.max_prompt_length + data.max_response_length); "
                   "raise it or leave it null (that sum)")
    if r.name == "vllm" and r.max_num_batched_tokens is not None:
        # the engine schedules at least one whole sequence (max_model_len tokens) per step; vLLM refuses a step
        # budget below max_num_seqs, and would say so only inside a worker
        max_len = r.max_model_len or needed
        if max(r.max_num_batched_tokens, max_len) < r.max_num_seqs:
            raise _bad(pre + "max_num_batched_tokens", r.max_num_batched_tokens,
                       f"a vLLM step must have room for one token of each of the {pre}max_num_seqs={r.max_num_seqs} "
                       f"sequences it may run (the engine uses at least max_model_len={max_len}); raise it to "
                       f">= {r.max_num_seqs} or lower max_num_seqs")


def _check_rollout_tp(cfg: GRPOConfig) -> None:
    """``rollout.tensor_model_parallel_size``: engines of tp consecutive ranks of the rollout's pool (the training
    ranks', or its own with ``hybrid_engine=false``), never across nodes."""
    r = cfg.actor_rollout_ref.rollout
    tp, key = r.tensor_model_parallel_size, "actor_rollout_ref.rollout.tensor_model_parallel_size"
    if tp == 1:
        return
    if r.name != "vllm":
        raise _bad(key, tp, f"tensor parallelism needs rollout.name=vllm (the {r.name} engine runs on one rank); use 1")
    per_node, pool_key = ((rollout_pool_size(cfg)[1], rollout_pool_keys(cfg) + ".n_gpus_per_node") if separate_rollout(cfg)
                          else (cfg.trainer.n_gpus_per_node, "trainer.n_gpus_per_node"))
    if per_node % tp:
        fits = [k for k in _divisors(per_node)]
        raise _bad(key, tp, f"an engine spans {tp} consecutive ranks of one node, so {pool_key} "
                   f"({per_node}) must be divisible by it; valid: {', '.join(str(k) for k in fits)}")


def single_response_grpo(cfg: GRPOConfig) -> bool:
    """GRPO with one response per prompt (``rollout.n=1``), which verl runs: each group's mean is taken as 0 and
    its std as 1 (:func:`grpo_dist.core.advantages.compute_grpo_advantage`'s convention for a group of one), so
    the advantage is the raw score, without a baseline. Accepted, with a warning at start-up."""
    return cfg.algorithm.adv_estimator == "grpo" and cfg.actor_rollout_ref.rollout.n == 1


def _check_separate_rollout(cfg: GRPOConfig) -> None:
    """The rollout on devices of its own (``actor_rollout_ref.hybrid_engine=false``, or verl's v1
    ``separate_async`` mode): the pool's size, and what the overlapped step cannot do (generation batches decided
    while the step trains)."""
    if not separate_rollout(cfg):
        return

    keys = rollout_pool_keys(cfg)
    for key, value in zip(("nnodes", "n_gpus_per_node"), rollout_pool_size(cfg)):
        _positive(f"{keys}.{key}", value)
    mode, off = (("trainer.v1.trainer_mode=separate_async", "trainer.v1.trainer_mode=sync") if v1_separate_async(cfg)
                 else ("actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.hybrid_engine=true"))
    why = (f"with {mode} the next batch is generated while this one trains (the rollout has devices of its own), "
           f"so {{}}; use {off} with it")
    if cfg.algorithm.filter_groups.enable:
        raise _bad("algorithm.filter_groups.enable", True, why.format(
            "how many generation batches a step needs is not known when the next one starts (dynamic sampling)"))
    if get_adv_estimator(cfg.algorithm.adv_estimator).needs_baseline_rollout:
        raise _bad("algorithm.adv_estimator", cfg.algorithm.adv_estimator, why.format(
            "the greedy baseline responses would come from another policy than the sampled ones"))


def _check_v1_trainer(cfg: GRPOConfig) -> None:
    """verl's v1 trainer modes (``trainer.v1.*``, read with ``trainer.use_v1``, verl's default): ``sync`` (this
    trainer's loop) or ``separate_async`` (fully asynchronous training on the standalone rollout devices
    ``actor_rollout_ref.rollout.nnodes x n_gpus_per_node``: :mod:`grpo_dist.config.fully_async`); its batch
    invariant and staleness bound. ``colocate_async`` is refused by its state."""
    t, r, a = cfg.trainer, cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor
    mode, key = t.v1.trainer_mode, "trainer.v1.trainer_mode"
    if t.use_v1 and mode not in ("sync", "separate_async", "colocate_async"):
        raise _bad(key, mode, "expected sync (this trainer's loop) or separate_async (the rollout on devices of its own, "
                   "generating ahead)")
    if not v1_separate_async(cfg):
        if r.nnodes != 0:
            raise _bad("actor_rollout_ref.rollout.nnodes", r.nnodes, "standalone rollout devices are read by verl's v1 "
                       "separate_async mode: set trainer.v1.trainer_mode=separate_async with them (or, in the spelling "
                       "of verl's one-step-off recipe, actor_rollout_ref.hybrid_engine=false with the top-level "
                       "rollout.nnodes / rollout.n_gpus_per_node), or leave it at 0")
        return
    both = "both select asynchronous training (verl's v1 trainer mode and its fully_async_policy recipe); "
    if async_training_given(cfg):
        raise _bad(key, mode, "the async_training.* keys given " + both + "use one of the two")
    if not cfg.actor_rollout_ref.hybrid_engine:
        raise _bad("actor_rollout_ref.hybrid_engine", False, f"with {key}=separate_async the rollout's own devices are "
                   "actor_rollout_ref.rollout.nnodes x n_gpus_per_node (verl's v1 layout), and the training ranks keep "
                   "the model roles; leave actor_rollout_ref.hybrid_engine=true")
    for top, val in (("rollout.total_rollout_steps", cfg.rollout.total_rollout_steps), ("rollout.test_freq", cfg.rollout.test_freq)):
        if val is not None:
            raise _bad(top, val, f"it is read by verl's fully_async_policy recipe; with {key}=separate_async the run's "
                       "length and validation are trainer.total_training_steps / total_epochs and trainer.test_freq")
    sa, sampler = t.v1.separate_async, t.v1.sampler
    _positive("trainer.v1.separate_async.parameter_sync_step", sa.parameter_sync_step)
    if sa.num_warmup_batches < 0:
        raise _bad("trainer.v1.separate_async.num_warmup_batches", sa.num_warmup_batches, "expected a count >= 0 of "
                   "batches generated ahead of the one being trained")
    want = sa.parameter_sync_step * a.ppo_mini_batch_size
    if cfg.data.train_batch_size != want:
        raise _bad("data.train_batch_size", cfg.data.train_batch_size, f"with {key}=separate_async a step trains "
                   "parameter_sync_step mini-batches and then syncs the weights, so it must equal "
                   "trainer.v1.separate_async.parameter_sync_step x actor_rollout_ref.actor.ppo_mini_batch_size = "
                   f"{sa.parameter_sync_step} x {a.ppo_mini_batch_size} = {want} (verl's invariant)")
    _positive("trainer.v1.sampler.max_off_policy_threshold", sampler.max_off_policy_threshold)
    if sa.num_warmup_batches > sampler.max_off_policy_threshold:
        raise _bad("trainer.v1.separate_async.num_warmup_batches", sa.num_warmup_batches, "a batch would then be trained "
                   f"up to {sa.num_warmup_batches} versions after the one that started it, beyond "
                   f"trainer.v1.sampler.max_off_policy_threshold={sampler.max_off_policy_threshold}; here the bound is "
                   "kept by what the rollout may start, so no group is ever dropped for its age: use at most "
                   f"{sampler.max_off_policy_threshold} batches, or raise the threshold")


def _check_fully_async(cfg: GRPOConfig) -> None:
    """Fully asynchronous training (any ``async_training.*`` key given): on the rollout's own devices, its
    numbers' ranges; ``rollout.total_rollout_steps`` / ``rollout.test_freq`` only with it."""
    r, a = cfg.rollout, cfg.async_training
    if not fully_async_on(cfg):
        for key, val in (("rollout.total_rollout_steps", r.total_rollout_steps), ("rollout.test_freq", r.test_freq)):
            if val is not None:
                raise _bad(key, val, "it is read only in fully asynchronous training (any async_training.* key given, "
                           "with actor_rollout_ref.hybrid_engine=false); use trainer.total_training_steps / "
                           "trainer.test_freq, or leave it null")
        return
    if v1_separate_async(cfg):
        return  # its keys: _check_v1_trainer
    if cfg.actor_rollout_ref.hybrid_engine:
        raise _bad("actor_rollout_ref.hybrid_engine", True, "async_training.* keys select fully asynchronous training, "
                   "which generates on the rollout's own devices: set actor_rollout_ref.hybrid_engine=false (with "
                   "rollout.nnodes / rollout.n_gpus_per_node), or remove the async_training.* keys")
    if a.staleness_threshold is not None and not a.staleness_threshold >= 0:
        raise _bad("async_training.staleness_threshold", a.staleness_threshold, "expected a number >= 0 (0: at most "
                   "trigger_parameter_sync_step chunks per weight version)")
    for key in ("trigger_parameter_sync_step", "require_batches"):
        if getattr(a, key) is not None:
            _positive("async_training." + key, getattr(a, key))
    if r.test_freq is not None and r.test_freq != -1:
        _positive("rollout.test_freq", r.test_freq)
    chunk = chunk_prompts(cfg)
    if r.total_rollout_steps is not None and r.total_rollout_steps < chunk:
        raise _bad("rollout.total_rollout_steps", r.total_rollout_steps, f"expected at least one chunk of "
                   f"async_training.require_batches x actor_rollout_ref.actor.ppo_mini_batch_size = {chunk} prompts")


#: vLLM arguments that grpo_dist sets itself; passing them through engine_kwargs.vllm is refused.
VLLM_KWARGS_OWNED = {
    "model": "the model is actor_rollout_ref.model.path",
    "tokenizer": "the tokenizer is data.tokenizer (or the model's own)",
    "dtype": "use actor_rollout_ref.rollout.dtype",
    "tensor_parallel_size": "use actor_rollout_ref.rollout.tensor_model_parallel_size",
    "distributed_executor_backend": "grpo_dist picks the executor (in-process, or the external launcher for tensor parallel)",
    "max_model_len": "use actor_rollout_ref.rollout.max_model_len",
    "gpu_memory_utilization": "use actor_rollout_ref.rollout.gpu_memory_utilization",
    "max_num_seqs": "use actor_rollout_ref.rollout.max_num_seqs",
    "max_num_batched_tokens": "use actor_rollout_ref.rollout.max_num_batched_tokens",
    "enforce_eager": "use actor_rollout_ref.rollout.enforce_eager",
    "enable_chunked_prefill": "use actor_rollout_ref.rollout.enable_chunked_prefill",
    "enable_sleep_mode": "use actor_rollout_ref.rollout.free_cache_engine",
    "seed": "use actor_rollout_ref.rollout.seed",
    "logprobs_mode": "grpo_dist needs the processed log-probs of the sampled tokens (docs/algorithms.md)",
    "kv_cache_memory_bytes": "use actor_rollout_ref.rollout.kv_cache_gib (CPU) or gpu_memory_utilization (GPU)",
}


def separate_rollout(cfg: GRPOConfig) -> bool:
    """Whether the rollout engines run on devices of their own (``actor_rollout_ref.hybrid_engine=false``, or
    verl's v1 ``trainer.v1.trainer_mode=separate_async``): then they generate ahead while the trainer trains."""
    return not cfg.actor_rollout_ref.hybrid_engine or v1_separate_async(cfg)


def rollout_pool_keys(cfg: GRPOConfig) -> str:
    """The section whose ``nnodes`` / ``n_gpus_per_node`` size the rollout's own devices: verl's one-step-off and
    fully_async_policy recipes spell them top-level (``rollout``), its v1 ``separate_async`` mode as the standalone
    rollout servers' (``actor_rollout_ref.rollout``)."""
    return "actor_rollout_ref.rollout" if v1_separate_async(cfg) else "rollout"


def rollout_pool_size(cfg: GRPOConfig) -> tuple[int, int]:
    """``(nnodes, n_gpus_per_node)`` of the rollout's own devices, from :func:`rollout_pool_keys`' section."""
    section = cfg.actor_rollout_ref.rollout if v1_separate_async(cfg) else cfg.rollout
    return section.nnodes, section.n_gpus_per_node


def critic_enabled(cfg: GRPOConfig) -> bool:
    """Whether the run trains a critic: ``critic.enable``, or when it is null, whether the advantage
    estimator needs values (verl's rule). The one place this is decided."""
    if cfg.critic.enable is not None:
        return bool(cfg.critic.enable)
    return get_adv_estimator(cfg.algorithm.adv_estimator).needs_values


def needs_reference(cfg: GRPOConfig) -> bool:
    """Whether the run needs the frozen reference policy: a KL loss or a KL penalty in the reward.
    The one place this is decided."""
    return cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward


POLICY_MODEL = "actor_rollout_ref.model."
CRITIC_MODEL = "critic.model."
LORA_MODELS = (POLICY_MODEL, CRITIC_MODEL)
"""The model sections with LoRA keys: the policy's and the value model's (schema/model.py)."""
_LORA_KEYS = (("rank", "lora_rank", "lora.rank"), ("alpha", "lora_alpha", "lora.alpha"),
              ("target_modules", "target_modules", "lora.target_modules"),
              ("exclude_modules", "exclude_modules", "lora.exclude_modules"),
              ("adapter_path", "lora_adapter_path", "lora.adapter_path"))
"""A model section's LoRA settings and their two spellings: verl's early layout (``model.lora_rank`` ...) and
its current one (``model.lora.rank`` ...), the second an alias of the first (schema/model.py)."""


def _changed(cfg: GRPOConfig, key: str, read) -> bool:
    """Whether ``key`` was given a value other than null and its default."""
    value, default = read(cfg, key), default_of(key)
    return value is not None and _as_list(value) != _as_list(default)


def _as_list(value: Any) -> Any:
    return list(value) if isinstance(value, (list, tuple)) else value


def _lora_model(model: str) -> str:
    if model not in LORA_MODELS:
        raise ValueError(f"no LoRA keys under {model!r}; valid: {', '.join(LORA_MODELS)}")
    return model


def lora_spellings(cfg: GRPOConfig, model: str = POLICY_MODEL, *, raw: bool = False) -> dict[str, tuple[str, Any]]:
    """Each LoRA setting of the model section ``model`` (:data:`LORA_MODELS`) -> ``(the key it was read
    from, its value)``: the spelling changed from its default (both changed differently: ``ConfigError``);
    neither: the layout of the rank's, so a current-layout run takes that layout's alpha (32), and its
    default modules (Megatron's names for every linear layer of the blocks) are all-linear. ``raw``: read as
    the validation's checks read (not a use)."""
    m = _lora_model(model)
    read = raw_get if raw else get
    current = _changed(cfg, m + "lora.rank", read)
    out = {}
    for name, early, now in _LORA_KEYS:
        value = setting(cfg, m + early, raw=raw)
        if _changed(cfg, m + now, read) or (current and name == "alpha" and not _changed(cfg, m + early, read)):
            out[name] = (m + now, read(cfg, m + now))
        else:
            out[name] = (m + early, value)
    return out


def lora_settings(cfg: GRPOConfig, model: str = POLICY_MODEL) -> LoraSettings:
    """The :class:`LoraSettings` (rank 0: no adapters) of the model section ``model`` (the policy's, or the
    value model's: :data:`CRITIC_MODEL`) from either layout. Only the policy's adapters are synced to a
    rollout engine (``merge``); the value model's keep the default."""
    given = {name: value for name, (_, value) in lora_spellings(cfg, model).items()}
    targets, exclude = given["target_modules"], given["exclude_modules"]
    return LoraSettings(
        rank=int(given["rank"]), alpha=float(given["alpha"]), dropout=float(get(cfg, model + "lora.dropout")),
        target_modules=targets if isinstance(targets, str) else tuple(targets),
        exclude_modules=None if not exclude else exclude if isinstance(exclude, str) else tuple(exclude),
        adapter_path=given["adapter_path"], seed=cfg.trainer.seed,
        merge=bool(cfg.actor_rollout_ref.model.lora.merge) if model == POLICY_MODEL else False)


_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def _external_lib_keys(cfg: GRPOConfig) -> list[str]:
    """verl's ``external_lib`` keys of this run's models: the policy's, the critic's when it trains one, the
    reward model's when it has one (verl imports each where that model's configuration is built)."""
    keys = ["actor_rollout_ref.model.external_lib"]
    if critic_enabled(cfg):
        keys.append("critic.model.external_lib")
    if model_sources(cfg):
        keys.append("reward_model.model.external_lib")
    return keys


def _module_names(key: str, value: Any) -> list[str]:
    from omegaconf import OmegaConf

    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value)
    names = [] if value is None else [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) and _MODULE_NAME.fullmatch(n) for n in names):
        raise _bad(key, value, "expected null, a module name (e.g. my_models.register) or a list of module names")
    return names


def external_libs(cfg: GRPOConfig) -> tuple[str, ...]:
    """The modules the ``external_lib`` keys of this run's models name, each once, in key order: the driver
    and every worker process that builds a model or a rollout engine import them before doing so."""
    out: list[str] = []
    for key in _external_lib_keys(cfg):
        out += [n for n in _module_names(key, get(cfg, key)) if n not in out]
    return tuple(out)


def _check_external_libs(cfg: GRPOConfig, check_paths: bool) -> None:
    """The ``external_lib`` values are module names; with ``check_paths`` (not ``--check=config``) each is found
    here, without importing it (the run imports it first thing, before any worker starts)."""
    import importlib.util

    for key in _external_lib_keys(cfg):
        names = _module_names(key, get(cfg, key))
        for name in names if check_paths else ():
            try:
                found = importlib.util.find_spec(name) is not None
            except (ImportError, ValueError):  # a parent package that is missing or fails to import
                found = False
            if not found:
                raise _bad(key, name, f"no module {name!r} can be imported here; the driver and every model and "
                           "rollout worker import it, so it must be on PYTHONPATH or installed where they run")


def _check_lora(cfg: GRPOConfig, model: str) -> None:
    """The LoRA keys of the model section ``model``, one message each: rank >= 0, alpha > 0, dropout in
    [0, 1), modules named, the adapter path a peft adapter folder, and (the policy's) what LoRA does not
    combine with here."""
    given = lora_spellings(cfg, model, raw=True)
    key, rank = given["rank"]
    if not isinstance(rank, int) or rank < 0:
        raise _bad(key, rank, "expected an integer >= 0 (0: full fine-tuning, > 0: LoRA adapters of that rank)")
    if rank == 0:
        return
    key, alpha = given["alpha"]
    if not alpha > 0:
        raise _bad(key, alpha, "expected a number > 0 (the adapters' update is scaled by alpha / rank)")
    dropout = raw_get(cfg, model + "lora.dropout")
    if not 0.0 <= dropout < 1.0:
        raise _bad(model + "lora.dropout", dropout, "expected a probability in [0, 1)")
    key, targets = given["target_modules"]
    if not isinstance(targets, str) and (not targets or not all(isinstance(t, str) and t for t in targets)):
        raise _bad(key, targets, "expected all-linear, a list of module names, or a regular expression")
    key, path = given["adapter_path"]
    if path is not None:
        from grpo_dist.training.lora import is_adapter_folder

        if not is_adapter_folder(path):
            raise _bad(key, path, "expected a saved peft LoRA adapter folder (adapter_config.json with peft_type LORA "
                       "and adapter_model.safetensors, as PeftModel.save_pretrained writes)")
    if model == POLICY_MODEL and raw_get(cfg, "reward_model.iterative.enable") \
            and raw_get(cfg, "reward_model.iterative.reset_reference") and needs_reference(cfg):
        raise _bad("reward_model.iterative.reset_reference", True, "with LoRA the reference is the policy's base "
                   "model (its adapters off), which a reset to the policy cannot change; set it to false")


class _EitherLayout:
    """Attribute access over the critic's two FSDP layouts: each read takes the field from whichever
    layout changed it (``_one_of_two``), reading both layouts' field only then."""

    def __init__(self, cfg: GRPOConfig) -> None:
        self._cfg, self._default = cfg, CriticFSDPConfig()

    def __getattr__(self, name: str) -> Any:
        c = self._cfg.critic
        return _one_of_two(f"critic.fsdp.{name}", getattr(c.fsdp, name), f"critic.model.fsdp_config.{name}",
                           getattr(c.model.fsdp_config, name), getattr(self._default, name))


def critic_fsdp(cfg: GRPOConfig) -> Any:
    """The critic's FSDP settings from either layout: ``critic.fsdp.*`` (verl's current) or
    ``critic.model.fsdp_config.*`` (early 2026), read field by field. Per field, the one changed from
    the default wins; both changed to different values is a ``ConfigError`` (raised on reading it;
    validation reads them all)."""
    return _EitherLayout(cfg)


def critic_grad_clip(cfg: GRPOConfig) -> float:
    """The critic's gradient-norm clip: ``critic.optim.clip_grad`` (verl's current key) or
    ``critic.grad_clip`` (early 2026), whichever was changed from the default."""
    default = CriticConfig().grad_clip
    assert default == CriticOptimConfig().clip_grad, "the two keys share one default"
    return _one_of_two("critic.optim.clip_grad", cfg.critic.optim.clip_grad, "critic.grad_clip", cfg.critic.grad_clip, default)


CRITIC_CKPT_REQUIRED = ("model", "optimizer", "extra")


def optimizer_overrides(optim: Any) -> dict:
    """An ``optim`` section's ``override_optimizer_config`` as a plain dict ({} when null)."""
    from omegaconf import OmegaConf

    extra = optim.override_optimizer_config
    return dict(OmegaConf.to_container(extra) if OmegaConf.is_config(extra) else (extra or {}))


@contextlib.contextmanager
def _compiler_left_unloaded() -> Iterator[None]:
    """Inside, building a torch optimizer does not import torch's compiler (``torch._dynamo``: 1.5-3 s of a CPU,
    the largest part of validating a configuration). ``Optimizer.add_param_group``, which every optimizer's
    constructor calls, is wrapped by torch so that its first call imports the compiler, to keep compiled code out
    of it; the wrapper skips that import when the function already carries its compiler-disabled version. The
    check's throwaway optimizer compiles nothing, so for its duration the plain function stands in for that
    version. With a torch whose wrapper differs, the import simply happens as before."""
    import torch

    fn = getattr(torch.optim.Optimizer.add_param_group, "__wrapped__", None)
    if fn is None or hasattr(fn, "__dynamo_disable"):
        yield
        return
    fn.__dynamo_disable = fn
    try:
        yield
    finally:
        del fn.__dynamo_disable


# torch.optim's optimizers whose arguments without override_optimizer_config (lr, betas, weight_decay) are
# exactly what the callers check first: building one could only say yes, after importing torch (~2 s).
_ARGUMENTS_CHECKED_HERE = {("torch.optim", "AdamW"), ("torch.optim", "Adam")}


def check_optimizer(key: str, optim: Any) -> None:
    """An ``optim`` section's optimizer (``key`` names it): the class imports and takes the arguments it
    would be built with (tried on one dummy parameter), before any worker starts. Call it after checking
    ``lr`` > 0, ``weight_decay`` >= 0 and ``betas`` in [0, 1): for torch's Adam and AdamW without
    ``override_optimizer_config`` those checks are all there is."""
    extra = optimizer_overrides(optim)
    if (optim.optimizer_impl, optim.optimizer) in _ARGUMENTS_CHECKED_HERE and not extra:
        return
    import torch

    from grpo_dist.training.optimizer_choice import optimizer_arguments, optimizer_class

    try:
        cls = optimizer_class(optim.optimizer_impl, optim.optimizer)
    except ValueError as e:
        raise ConfigError(f"{key}.{e}") from None
    args = optimizer_arguments(optim.optimizer, lr=optim.lr, betas=tuple(optim.betas), weight_decay=optim.weight_decay,
                               extra=extra)
    try:
        with _compiler_left_unloaded():
            cls([torch.nn.Parameter(torch.zeros(1))], **args)
    except (TypeError, ValueError) as e:
        where, value = (f"{key}.override_optimizer_config", extra) if extra else (f"{key}.optimizer", optim.optimizer)
        raise _bad(where, value, f"{optim.optimizer_impl}.{optim.optimizer} refuses the arguments {sorted(args)} "
                   f"({e})") from None


def validate_critic(cfg: GRPOConfig, *, check_paths: bool = True) -> None:
    """The ``critic.*`` keys and ``trainer.critic_warmup`` of a run that trains a critic."""
    c, d, rollout = cfg.critic, cfg.data, cfg.actor_rollout_ref.rollout
    _choice("critic.strategy", c.strategy, STRATEGIES)
    _choice("critic.loss_agg_mode", c.loss_agg_mode, LOSS_AGG_MODES)
    _choice("critic.optim.lr_scheduler_type", setting(cfg, "critic.optim.lr_scheduler_type"), LR_SCHEDULER_TYPES)
    fsdp = critic_fsdp(cfg)
    for f in fields(CriticFSDPConfig):
        getattr(fsdp, f.name)  # two layouts that contradict each other
    where = "critic.fsdp" if fsdp.model_dtype == c.fsdp.model_dtype else "critic.model.fsdp_config"
    _choice(f"{where}.model_dtype", fsdp.model_dtype, DTYPES)
    where = "critic.fsdp" if fsdp.dtype == c.fsdp.dtype else "critic.model.fsdp_config"
    _choice(f"{where}.dtype", fsdp.dtype, ("auto",) + DTYPES)
    for key, contents in (("critic.checkpoint.save_contents", c.checkpoint.save_contents),
                          ("critic.checkpoint.load_contents", c.checkpoint.load_contents)):
        for item in contents:
            _choice(key, item, CKPT_CONTENTS)
        missing = [x for x in CRITIC_CKPT_REQUIRED if x not in contents]
        if missing:
            raise _bad(key, list(contents), f"it lacks {missing}: the critic is saved and resumed whole (model, "
                       "optimizer, extra) so that a resumed run continues exactly; add them (hf_model is optional)")
    for key, val in (
        ("critic.optim.lr", c.optim.lr),
        ("critic.ppo_mini_batch_size", c.ppo_mini_batch_size),
        ("critic.ppo_micro_batch_size_per_gpu", c.ppo_micro_batch_size_per_gpu),
        ("critic.ppo_max_token_len_per_gpu", c.ppo_max_token_len_per_gpu),
        ("critic.forward_micro_batch_size_per_gpu", c.forward_micro_batch_size_per_gpu),
        ("critic.forward_max_token_len_per_gpu", c.forward_max_token_len_per_gpu),
        ("critic.ppo_epochs", c.ppo_epochs),
    ):
        _positive(key, val)
    for key, val in (
        ("critic.cliprange_value", c.cliprange_value),
        ("critic.optim.weight_decay", c.optim.weight_decay),
        ("critic.optim.lr_warmup_steps_ratio", c.optim.lr_warmup_steps_ratio),
        ("critic.optim.min_lr_ratio", c.optim.min_lr_ratio),
        ("trainer.critic_warmup", cfg.trainer.critic_warmup),
    ):
        _positive(key, val, allow_zero=True)
    if critic_grad_clip(cfg) <= 0:
        raise _bad("critic.optim.clip_grad", critic_grad_clip(cfg), "expected a number > 0 (critic.grad_clip is the same setting)")
    if c.optim.min_lr_ratio > 1:
        raise _bad("critic.optim.min_lr_ratio", c.optim.min_lr_ratio, "expected a number in [0, 1]")
    if len(c.optim.betas) != 2 or not all(0 <= b < 1 for b in c.optim.betas):
        raise _bad("critic.optim.betas", list(c.optim.betas), "expected two numbers in [0, 1), e.g. [0.9, 0.999]")
    check_optimizer("critic.optim", c.optim)  # after the numbers' own checks, which name their keys
    if d.train_batch_size % c.ppo_mini_batch_size:
        raise _bad("critic.ppo_mini_batch_size", c.ppo_mini_batch_size,
                   f"data.train_batch_size ({d.train_batch_size}) must be divisible by it; "
                   f"valid: {', '.join(str(x) for x in _divisors(d.train_batch_size))}")
    dp = data_parallel_size(cfg)
    mini_responses = c.ppo_mini_batch_size * rollout.n
    micro = None if c.use_dynamic_bsz else _micro_per_gpu(
        "critic.ppo_micro_batch_size", c.ppo_micro_batch_size, "critic.ppo_micro_batch_size_per_gpu",
        c.ppo_micro_batch_size_per_gpu, dp)
    _micro_per_gpu("critic.forward_micro_batch_size", c.forward_micro_batch_size,
                   "critic.forward_micro_batch_size_per_gpu", c.forward_micro_batch_size_per_gpu, dp)
    if mini_responses % (dp * (micro or 1)):
        what = f"{dp} data-parallel ranks (trainer.nnodes x trainer.n_gpus_per_node)"
        if micro:
            what += f" x critic.ppo_micro_batch_size_per_gpu {micro}"
        raise _bad("critic.ppo_micro_batch_size_per_gpu" if micro else "critic.ppo_mini_batch_size",
                   micro if micro else c.ppo_mini_batch_size,
                   f"a critic mini-batch of ppo_mini_batch_size x rollout.n = {mini_responses} responses must split "
                   f"evenly over {what}")
    if check_paths:
        _check_exists("critic.model.path", c.model.path, kind="model")


def rollout_correction_params(cfg: GRPOConfig) -> RolloutCorrectionParams:
    """The parsed ``algorithm.rollout_correction.*`` keys; ``ConfigError`` naming the key."""
    rc = cfg.algorithm.rollout_correction
    try:
        return RolloutCorrectionParams.from_config(
            rollout_is=rc.rollout_is, rollout_is_threshold=rc.rollout_is_threshold, rollout_rs=rc.rollout_rs,
            rollout_rs_threshold=rc.rollout_rs_threshold, bypass_mode=rc.bypass_mode, loss_type=rc.loss_type,
            rollout_is_batch_normalize=rc.rollout_is_batch_normalize)
    except ValueError as exc:
        raise ConfigError(f"algorithm.rollout_correction.{exc}") from None


def overlong_buffer(cfg: GRPOConfig) -> OverlongBuffer | None:
    """DAPO's overlong shaping from whichever spelling enables it (``reward_model.overlong_buffer``,
    ``reward_model.reward_kwargs.overlong_buffer_cfg``, ``reward.reward_kwargs.overlong_buffer_cfg``);
    None when none does. ``ConfigError`` for bad values or two spellings that disagree."""
    rm = cfg.reward_model
    spellings = (
        ("reward_model.overlong_buffer", rm.overlong_buffer, cfg.data.max_response_length),
        ("reward_model.reward_kwargs.overlong_buffer_cfg", rm.reward_kwargs.overlong_buffer_cfg, rm.reward_kwargs.max_resp_len),
        ("reward.reward_kwargs.overlong_buffer_cfg", cfg.reward.reward_kwargs.overlong_buffer_cfg, cfg.reward.reward_kwargs.max_resp_len),
    )
    found: dict[str, OverlongBuffer] = {}
    for key, ob, max_len in spellings:
        if not ob.enable:
            continue
        if not 0 < ob.len <= max_len:
            raise _bad(f"{key}.len", ob.len, f"expected a length in [1, max_resp_len = {max_len}] (the buffer before max_resp_len)")
        if not ob.penalty_factor >= 0:
            raise _bad(f"{key}.penalty_factor", ob.penalty_factor, "expected a number >= 0")
        found[key] = OverlongBuffer(max_resp_len=int(max_len), buffer_len=int(ob.len),
                                    penalty_factor=float(ob.penalty_factor), log=bool(ob.log))
    if len(set(found.values())) > 1:
        raise _bad(next(iter(found)), "enable", "the overlong shaping is enabled under two spellings with different "
                   f"settings ({', '.join(found)}); set it under one")
    return next(iter(found.values()), None)


def validate_config(cfg: GRPOConfig, *, check_paths: bool = True) -> None:
    """Raise ConfigError on the first problem found. Order: choices, ranges, sizes, paths."""
    from grpo_dist.config.profiling import profile_plan
    from grpo_dist.utils.run_log import log_level

    d, arr, alg, tr = cfg.data, cfg.actor_rollout_ref, cfg.algorithm, cfg.trainer
    actor, rollout, optim = arr.actor, arr.rollout, arr.actor.optim

    check_states(cfg)  # every key's state: refused features, values with no effect, two spellings
    _check_fully_async(cfg)
    _validate_verl_extras(cfg)
    profile_plan(cfg)  # the profiler's steps, contents and modes (the run reads the same plan)
    for model in LORA_MODELS:
        _check_lora(cfg, model)
    _positive("trainer.worker_call_timeout_s", tr.worker_call_timeout_s, allow_zero=True)
    _positive("trainer.worker_call_timeout_factor", tr.worker_call_timeout_factor)
    _positive("trainer.worker_call_timeout_min_s", tr.worker_call_timeout_min_s)
    _positive("trainer.preemption_grace_s", tr.preemption_grace_s, allow_zero=True)
    try:
        log_level(tr.log_level)  # trainer.log_level, or GRPO_DIST_LOG_LEVEL when set
    except ValueError as exc:
        raise ConfigError(str(exc)) from None

    # --- choices -----------------------------------------------------------------------------
    if alg.adv_estimator not in list_adv_estimators():
        raise _bad("algorithm.adv_estimator", alg.adv_estimator, "expected one of " + ", ".join(list_adv_estimators()))
    _choice("actor_rollout_ref.actor.loss_agg_mode", actor.loss_agg_mode, ALL_LOSS_AGG_MODES)
    if actor.kl_loss_agg_mode is not None:
        _choice("actor_rollout_ref.actor.kl_loss_agg_mode", actor.kl_loss_agg_mode, ALL_LOSS_AGG_MODES)
    _choice("actor_rollout_ref.actor.policy_loss.loss_mode", actor.policy_loss.loss_mode, list_policy_losses())
    for key, kind in (("actor_rollout_ref.actor.kl_loss_type", actor.kl_loss_type), ("algorithm.kl_penalty", alg.kl_penalty)):
        try:
            canonical_kl_kind(kind)
        except ValueError as exc:
            raise _bad(key, kind, str(exc)) from None
    if canonical_kl_kind(actor.kl_loss_type) == "full":
        raise _bad("actor_rollout_ref.actor.kl_loss_type", actor.kl_loss_type,
                   "'full' needs both models' logits over the vocabulary, which the workers do not exchange yet; use low_var_kl (k3), kl (k1), mse (k2) or abs")
    if canonical_kl_kind(alg.kl_penalty) == "full":
        raise _bad("algorithm.kl_penalty", alg.kl_penalty, "the in-reward penalty needs a per-token estimator: kl, abs, mse or low_var_kl")
    _check_algorithm_variants(cfg)
    _choice("actor_rollout_ref.rollout.name", rollout.name, ENGINE_NAMES)
    _check_rollout_extras(cfg)
    _choice("actor_rollout_ref.actor.strategy", actor.strategy, STRATEGIES)
    _choice("data.truncation", d.truncation, TRUNCATION_MODES)
    _choice("actor_rollout_ref.actor.optim.lr_scheduler_type", setting(cfg, "actor_rollout_ref.actor.optim.lr_scheduler_type"),
            LR_SCHEDULER_TYPES)
    _choice("algorithm.kl_ctrl.type", alg.kl_ctrl.type, KL_CTRL_TYPES)
    _choice("trainer.resume_mode", tr.resume_mode, RESUME_MODES)
    _choice("trainer.device", tr.device, DEVICES)
    _check_loggers(tr.logger)
    _positive("trainer.log_val_generations", tr.log_val_generations, allow_zero=True)
    if tr.rollout_data_dir and tr.validation_data_dir and (
            os.path.abspath(os.path.expanduser(tr.rollout_data_dir)) == os.path.abspath(os.path.expanduser(tr.validation_data_dir))):
        raise _bad("trainer.validation_data_dir", tr.validation_data_dir,
                   "it is also trainer.rollout_data_dir: both write <step>.jsonl, so a step's validation would overwrite "
                   "the responses that step trained on; give the two different folders")
    if tr.val_only and not tr.val_before_train:
        raise _bad("trainer.val_only", True, "verl validates only before training and then stops, so with "
                   "trainer.val_before_train=false it ignores val_only and trains; set val_before_train=true (its default) "
                   "or val_only=false")
    if tr.val_only and not as_path_list(d.val_files):
        raise _bad("trainer.val_only", True, "there is nothing to validate: data.val_files is null; give validation files")
    _choice("reward_model.reward_manager", cfg.reward_model.reward_manager, REWARD_MANAGERS)
    _choice("reward_model.on_error", cfg.reward_model.on_error, ON_ERROR)
    validate_reward_sources(cfg, check_paths=check_paths)
    _choice("actor_rollout_ref.actor.fsdp_config.model_dtype", actor.fsdp_config.model_dtype, DTYPES)
    for key, val in (
        ("actor_rollout_ref.actor.fsdp_config.dtype", actor.fsdp_config.dtype),
        ("actor_rollout_ref.ref.fsdp_config.dtype", arr.ref.fsdp_config.dtype),
        ("actor_rollout_ref.rollout.dtype", rollout.dtype),
    ):
        _choice(key, val, ("auto",) + DTYPES)
    _choice("actor_rollout_ref.model.attn_implementation", arr.model.attn_implementation, ATTN_IMPLEMENTATIONS)
    _check_actor_checkpoint(cfg)
    for key, value in (("actor_rollout_ref.model.enable_gradient_checkpointing", arr.model.enable_gradient_checkpointing),
                       ("critic.model.enable_gradient_checkpointing", cfg.critic.model.enable_gradient_checkpointing)):
        if not (value is True or value is False or value == "auto"):
            raise _bad(key, value, "expected true, false or auto")
    kv = arr.rollout.kv_cache_gib
    if kv != "auto" and (isinstance(kv, bool) or not isinstance(kv, (int, float))):
        raise _bad("actor_rollout_ref.rollout.kv_cache_gib", kv, "expected a size in GiB (> 0) or auto")

    # --- ranges ------------------------------------------------------------------------------
    spec = get_adv_estimator(alg.adv_estimator)
    if spec.group_based and rollout.n < 2 and not single_response_grpo(cfg):
        raise _bad(
            "actor_rollout_ref.rollout.n",
            rollout.n,
            f"algorithm.adv_estimator={alg.adv_estimator} compares responses within a group; set rollout.n >= 2",
        )
    if spec.needs_step_rewards and alg.use_kl_in_reward:
        raise _bad("algorithm.use_kl_in_reward", True,
                   f"algorithm.adv_estimator={alg.adv_estimator} reads rewards only at step ends; use the KL loss "
                   "(actor_rollout_ref.actor.use_kl_loss=true) instead")
    if spec.needs_values and cfg.critic.enable is False:
        raise _bad("critic.enable", False, f"algorithm.adv_estimator={alg.adv_estimator} needs the critic's values; "
                   "set critic.enable=true (or null), or use an estimator without values (grpo, rloo, reinforce_plus_plus)")
    if rollout.n < 1:
        raise _bad("actor_rollout_ref.rollout.n", rollout.n, "expected >= 1")
    if rollout.do_sample and rollout.temperature == 0 and rollout.n > 1:
        raise _bad("actor_rollout_ref.rollout.temperature", rollout.temperature,
                   f"temperature 0 is greedy decoding, which gives rollout.n={rollout.n} identical responses to every "
                   "prompt (and no group-relative signal); sample with a positive temperature (e.g. "
                   "actor_rollout_ref.rollout.temperature=1.0). For greedy decoding verl's key is "
                   "actor_rollout_ref.rollout.do_sample=false, which needs actor_rollout_ref.rollout.n=1")
    if not rollout.do_sample and rollout.n > 1:
        raise _bad("actor_rollout_ref.rollout.do_sample", rollout.do_sample,
                   f"greedy decoding (do_sample=false) gives rollout.n={rollout.n} identical responses; set "
                   "actor_rollout_ref.rollout.do_sample=true with a positive temperature, or rollout.n=1")
    vk = rollout.val_kwargs
    if vk.do_sample and vk.temperature == 0 and vk.n > 1:
        raise _bad("actor_rollout_ref.rollout.val_kwargs.temperature", vk.temperature,
                   f"temperature 0 is greedy decoding, which gives val_kwargs.n={vk.n} identical responses; give a "
                   "positive actor_rollout_ref.rollout.val_kwargs.temperature, or val_kwargs.n=1 for greedy validation")
    if (not vk.do_sample or vk.temperature == 0) and vk.n > 1:
        raise _bad("actor_rollout_ref.rollout.val_kwargs.n", vk.n,
                   "greedy validation (val_kwargs.do_sample=false or temperature=0) needs val_kwargs.n=1; set val_kwargs.do_sample=true and a temperature > 0 for n > 1")
    clip_low = actor.clip_ratio if actor.clip_ratio_low is None else actor.clip_ratio_low
    clip_high = actor.clip_ratio if actor.clip_ratio_high is None else actor.clip_ratio_high
    for key, val in (
        ("actor_rollout_ref.actor.clip_ratio", actor.clip_ratio),
        ("actor_rollout_ref.actor.clip_ratio_low", clip_low),
        ("actor_rollout_ref.actor.clip_ratio_high", clip_high),
    ):
        _positive(key, val)
    if clip_low >= 1:
        raise _bad("actor_rollout_ref.actor.clip_ratio_low", clip_low, "expected a number in (0, 1): the ratio is clipped at 1 - clip_ratio_low")
    if actor.clip_ratio_c <= 1:
        raise _bad("actor_rollout_ref.actor.clip_ratio_c", actor.clip_ratio_c, "expected a number > 1 (dual-clip bound, verl's default 3.0)")
    for key, val in (
        ("actor_rollout_ref.actor.kl_loss_coef", actor.kl_loss_coef),
        ("actor_rollout_ref.actor.entropy_coeff", actor.entropy_coeff),
        ("algorithm.kl_ctrl.kl_coef", alg.kl_ctrl.kl_coef),
        ("actor_rollout_ref.actor.optim.weight_decay", optim.weight_decay),
        ("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio", optim.lr_warmup_steps_ratio),
        ("actor_rollout_ref.actor.optim.min_lr_ratio", optim.min_lr_ratio),
        ("actor_rollout_ref.rollout.temperature", rollout.temperature),
        ("actor_rollout_ref.rollout.val_kwargs.temperature", rollout.val_kwargs.temperature),
    ):
        _positive(key, val, allow_zero=True)
    for key, val in (
        ("actor_rollout_ref.actor.optim.lr", optim.lr),
        ("actor_rollout_ref.actor.grad_clip", setting(cfg, "actor_rollout_ref.actor.grad_clip")),
        ("actor_rollout_ref.actor.ppo_epochs", actor.ppo_epochs),
        ("data.max_prompt_length", d.max_prompt_length),
        ("data.max_response_length", d.max_response_length),
        ("actor_rollout_ref.rollout.prompt_length", rollout.prompt_length),
        ("actor_rollout_ref.rollout.response_length", rollout.response_length),
        ("data.train_batch_size", d.train_batch_size),
        ("data.val_batch_size", d.val_batch_size),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", actor.ppo_mini_batch_size),
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", actor.ppo_micro_batch_size_per_gpu),
        ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", actor.ppo_max_token_len_per_gpu),
        ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", rollout.log_prob_micro_batch_size_per_gpu),
        ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", arr.ref.log_prob_micro_batch_size_per_gpu),
        ("actor_rollout_ref.rollout.val_kwargs.n", rollout.val_kwargs.n),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size", rollout.tensor_model_parallel_size),
        ("actor_rollout_ref.rollout.max_num_seqs", rollout.max_num_seqs),
        ("actor_rollout_ref.rollout.kv_cache_gib", None if rollout.kv_cache_gib == "auto" else rollout.kv_cache_gib),
        ("actor_rollout_ref.model.logprob_chunk_size", arr.model.logprob_chunk_size),
        ("actor_rollout_ref.rollout.update_weights_bucket_megabytes", rollout.update_weights_bucket_megabytes),
        ("trainer.nnodes", tr.nnodes),
        ("trainer.n_gpus_per_node", tr.n_gpus_per_node),
        ("trainer.total_epochs", tr.total_epochs),
        ("trainer.total_training_steps", tr.total_training_steps),
        ("reward_model.timeout_s", cfg.reward_model.timeout_s),
        ("reward_model.num_workers", cfg.reward_model.num_workers),
        ("algorithm.kl_ctrl.horizon", alg.kl_ctrl.horizon),
        ("algorithm.kl_ctrl.target_kl", alg.kl_ctrl.target_kl),
    ):
        _positive(key, val)
    for key, val in (("actor_rollout_ref.rollout.top_p", rollout.top_p), ("actor_rollout_ref.rollout.val_kwargs.top_p", rollout.val_kwargs.top_p),
                     ("actor_rollout_ref.rollout.gpu_memory_utilization", rollout.gpu_memory_utilization)):
        if not 0 < val <= 1:
            raise _bad(key, val, "expected a number in (0, 1]")
    if not 0 <= alg.gamma <= 1 or not 0 <= alg.lam <= 1:
        raise _bad("algorithm.gamma/lam", (alg.gamma, alg.lam), "expected numbers in [0, 1]")
    if optim.min_lr_ratio > 1:
        raise _bad("actor_rollout_ref.actor.optim.min_lr_ratio", optim.min_lr_ratio, "expected a number in [0, 1]")
    if len(optim.betas) != 2 or not all(0 <= b < 1 for b in optim.betas):
        raise _bad("actor_rollout_ref.actor.optim.betas", list(optim.betas), "expected two numbers in [0, 1), e.g. [0.9, 0.999]")
    check_optimizer("actor_rollout_ref.actor.optim", optim)  # after the numbers' own checks, which name their keys
    _positive("trainer.max_consecutive_nonfinite_steps", tr.max_consecutive_nonfinite_steps, allow_zero=True)
    _freq("trainer.save_freq", tr.save_freq)
    _freq("trainer.test_freq", tr.test_freq)
    if tr.resume_mode == "resume_path" and not tr.resume_from_path:
        raise _bad("trainer.resume_from_path", tr.resume_from_path, "trainer.resume_mode=resume_path needs a checkpoint folder (…/global_step_N)")
    if (tr.max_actor_ckpt_to_keep is not None) and tr.max_actor_ckpt_to_keep < 1:
        raise _bad("trainer.max_actor_ckpt_to_keep", tr.max_actor_ckpt_to_keep, "expected null (keep all) or >= 1")

    # --- batch sizes -------------------------------------------------------------------------
    if d.train_batch_size % actor.ppo_mini_batch_size:
        raise _bad(
            "actor_rollout_ref.actor.ppo_mini_batch_size",
            actor.ppo_mini_batch_size,
            f"data.train_batch_size ({d.train_batch_size}) must be divisible by it; "
            f"valid: {', '.join(str(x) for x in _divisors(d.train_batch_size))}",
        )
    if actor.ppo_mini_batch_size > d.train_batch_size:
        raise _bad("actor_rollout_ref.actor.ppo_mini_batch_size", actor.ppo_mini_batch_size, f"expected <= data.train_batch_size ({d.train_batch_size})")
    dp = data_parallel_size(cfg)
    mini_responses = actor.ppo_mini_batch_size * rollout.n
    micro = None if actor.use_dynamic_bsz else _micro_per_gpu(
        "actor_rollout_ref.actor.ppo_micro_batch_size", actor.ppo_micro_batch_size,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", actor.ppo_micro_batch_size_per_gpu, dp)
    for sec in ("rollout", "ref"):
        section = getattr(arr, sec)
        _micro_per_gpu(f"actor_rollout_ref.{sec}.log_prob_micro_batch_size", section.log_prob_micro_batch_size,
                       f"actor_rollout_ref.{sec}.log_prob_micro_batch_size_per_gpu",
                       section.log_prob_micro_batch_size_per_gpu, dp)
    per_step = dp * (micro or 1)
    if mini_responses % per_step:
        what = f"{dp} data-parallel ranks (trainer.nnodes x trainer.n_gpus_per_node)"
        if micro:
            what += f" x ppo_micro_batch_size_per_gpu {micro}"
        raise _bad(
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu" if micro else "actor_rollout_ref.actor.ppo_mini_batch_size",
            micro if micro else actor.ppo_mini_batch_size,
            f"a mini-batch of ppo_mini_batch_size x rollout.n = {mini_responses} responses must split evenly over {what}",
        )
    _check_rollout_tp(cfg)
    _check_v1_trainer(cfg)
    _check_separate_rollout(cfg)

    if critic_enabled(cfg):
        validate_critic(cfg, check_paths=check_paths)
    _check_external_libs(cfg, check_paths)  # which models the run has: the estimator and reward sources are valid

    # --- paths -------------------------------------------------------------------------------
    if check_paths:
        _check_exists("actor_rollout_ref.model.path", arr.model.path, kind="model")
        if d.tokenizer:
            _check_exists("data.tokenizer", d.tokenizer, kind="model")
        _check_exists("data.train_files", d.train_files, kind="data")
        _check_exists("data.val_files", d.val_files, kind="data")
        if not as_path_list(d.train_files):
            raise _bad("data.train_files", d.train_files, "expected a parquet/jsonl path or a list of them")
        if cfg.custom_reward_function.path:
            _check_exists("custom_reward_function.path", cfg.custom_reward_function.path, kind="file")
        check_agent_files(cfg)
        if tr.resume_mode == "resume_path":
            _check_exists("trainer.resume_from_path", tr.resume_from_path, kind="checkpoint")


def _micro_per_gpu(global_key: str, global_size: int | None, key: str, per_gpu: int | None, dp: int) -> int | None:
    """A micro-batch size per rank from verl's two spellings: ``*_per_gpu``, or the former global size
    divided by the data-parallel ranks (verl refuses both set)."""
    if global_size is None:
        return per_gpu
    if per_gpu is not None:
        raise _bad(global_key, global_size, f"it and {key} are two spellings of one size (global, per rank); set only one")
    if global_size < dp:
        raise _bad(global_key, global_size, f"it is divided by the {dp} data-parallel ranks; use at least {dp}, "
                   f"or set {key}")
    return global_size // dp


def _check_actor_checkpoint(cfg: GRPOConfig) -> None:
    """``actor.checkpoint.save_contents`` / ``load_contents`` (and the former ``checkpoint.contents``)."""
    c = cfg.actor_rollout_ref.actor.checkpoint
    pre = "actor_rollout_ref.actor.checkpoint."
    save = setting(cfg, pre + "save_contents")
    save_key = pre + ("contents" if c.contents is not None else "save_contents")
    for key, contents in ((save_key, save), (pre + "load_contents", c.load_contents)):
        for item in contents:
            _choice(key, item, CKPT_CONTENTS)
        if "model" not in contents:
            raise _bad(key, list(contents), "it lacks model: a checkpoint is resumed from the policy's weights "
                       "(optimizer and extra may be left out; what is not loaded starts fresh)")


def _validate_verl_extras(cfg: GRPOConfig) -> None:
    """Ranges of the honoured keys that verl's layouts add (sizes, seeds, dtypes, spellings)."""
    d, arr = cfg.data, cfg.actor_rollout_ref
    _positive("actor_rollout_ref.nccl_timeout", arr.nccl_timeout)
    for key, val in (("data.train_max_samples", d.train_max_samples), ("data.val_max_samples", d.val_max_samples)):
        if val != -1 and val < 1:
            raise _bad(key, val, "expected -1 (all rows) or a positive number of rows")
    if not d.reward_fn_key:
        raise _bad("data.reward_fn_key", d.reward_fn_key, "expected the name of a column (verl: data_source)")
    _positive("reward.num_workers", setting(cfg, "reward_model.num_workers"))
    _positive("actor_rollout_ref.actor.optim.num_cycles", arr.actor.optim.num_cycles)
    _positive("critic.optim.num_cycles", cfg.critic.optim.num_cycles)
    for key, val in (("actor_rollout_ref.actor.loss_scale_factor", arr.actor.loss_scale_factor),
                     ("critic.loss_scale_factor", cfg.critic.loss_scale_factor)):
        _positive(key, val)
    for role, fsdp in (("actor_rollout_ref.actor", arr.actor.fsdp_config), ("actor_rollout_ref.ref", arr.ref.fsdp_config),
                       ("critic.fsdp", cfg.critic.fsdp), ("critic.model.fsdp_config", cfg.critic.model.fsdp_config)):
        pre = f"{role}.fsdp_config" if role.startswith("actor_rollout_ref") else role
        mp = fsdp.mixed_precision
        _choice(f"{pre}.mixed_precision.reduce_dtype", mp.reduce_dtype, DTYPES)
        if mp.param_dtype is not None:
            _choice(f"{pre}.mixed_precision.param_dtype", mp.param_dtype, DTYPES)
            if fsdp.dtype != "auto" and dtype_name(fsdp.dtype) != dtype_name(mp.param_dtype):
                raise _bad(f"{pre}.mixed_precision.param_dtype", mp.param_dtype,
                           f"it contradicts {pre}.dtype = {fsdp.dtype!r}, the same setting; set only one of them")


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _check_algorithm_variants(cfg: GRPOConfig) -> None:
    """The GRPO-family keys: policy-loss extras, rollout correction, dynamic sampling, overlong shaping."""
    alg, actor, d = cfg.algorithm, cfg.actor_rollout_ref.actor, cfg.data
    pl = actor.policy_loss
    pre = "actor_rollout_ref.actor.policy_loss."
    for key, val in (("clip_cov_ratio", pl.clip_cov_ratio), ("kl_cov_ratio", pl.kl_cov_ratio)):
        if not 0 < val <= 1:
            raise _bad(pre + key, val, "expected a fraction in (0, 1] (verl's default 0.0002)")
    if not pl.clip_cov_lb < pl.clip_cov_ub:
        raise _bad(pre + "clip_cov_lb", pl.clip_cov_lb, f"expected a number below clip_cov_ub ({pl.clip_cov_ub})")
    _positive(pre + "ppo_kl_coef", pl.ppo_kl_coef, allow_zero=True)
    for key in ("actor_rollout_ref.actor.tau_pos", "actor_rollout_ref.actor.tau_neg"):  # SAPO's gate temperatures
        _positive(key, setting(cfg, key))
    try:  # the checks of the parameters' own declaration and of the mode (a new loss parameter needs no line here)
        get_policy_loss(pl.loss_mode).check_params(PolicyLossParams.from_section(pl))
    except ValueError as e:
        raise ConfigError(f"{pre}{e}") from None

    rc = rollout_correction_params(cfg)
    key = "algorithm.rollout_correction."
    if pl.loss_mode == "bypass_mode" and not rc.bypass:
        raise _bad(pre + "loss_mode", pl.loss_mode, f"bypass_mode is set up by {key}bypass_mode=true; choose another loss mode")
    if rc.bypass and pl.loss_mode not in ("vanilla", "bypass_mode"):
        raise _bad(key + "bypass_mode", True, f"bypass mode brings its own loss ({key}loss_type = ppo_clip | reinforce) and "
                   f"cannot be combined with {pre}loss_mode={pl.loss_mode}; use loss_mode=vanilla or bypass_mode=false")
    if rc.loss_type != "ppo_clip" and not rc.bypass:
        raise _bad(key + "loss_type", rc.loss_type, f"loss_type only applies in bypass mode; set {key}bypass_mode=true or loss_type=ppo_clip")
    if rc.is_level is not None and not rc.bypass and not get_policy_loss(pl.loss_mode).accepts_rollout_is_weights:
        raise _bad(key + "rollout_is", rc.is_level, f"{pre}loss_mode={pl.loss_mode} does not take rollout importance weights "
                   "(it was not registered with rollout_is_weights=True); use rollout_is=null or another loss mode")

    if alg.use_pf_ppo:  # PF-PPO: verl resamples only after GAE advantages
        if alg.adv_estimator != "gae":
            raise _bad("algorithm.use_pf_ppo", True, f"verl applies PF-PPO only with adv_estimator=gae (with "
                       f"{alg.adv_estimator!r} it has no effect there); set algorithm.adv_estimator=gae or use_pf_ppo=false")
        _choice("algorithm.pf_ppo.reweight_method", alg.pf_ppo.reweight_method, PF_PPO_METHODS)
        if not (math.isfinite(alg.pf_ppo.weight_pow) and alg.pf_ppo.weight_pow >= 0):
            raise _bad("algorithm.pf_ppo.weight_pow", alg.pf_ppo.weight_pow, "expected a finite number >= 0 (a negative "
                       "power gives a zero reward an infinite weight); verl's default is 2.0")

    fg = alg.filter_groups
    if fg.enable or fg.metric is not None:
        _choice("algorithm.filter_groups.metric", fg.metric, FILTER_METRICS)
    _choice("algorithm.filter_groups.on_exhausted", fg.on_exhausted, FILTER_ON_EXHAUSTED)
    _positive("data.gen_batch_size", d.gen_batch_size)
    if fg.enable and alg.use_kl_in_reward:
        raise _bad("algorithm.filter_groups.enable", True, "dynamic sampling cannot be combined with algorithm.use_kl_in_reward "
                   "(the penalty needs the old and reference log-probs of every generation batch); use the KL loss instead")
    overlong_buffer(cfg)
