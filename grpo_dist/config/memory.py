"""The memory of a single-machine CPU run: a floor on what it needs, held against what this machine has."""

from __future__ import annotations

from typing import Any

from grpo_dist.config import preflight
from grpo_dist.config.engine import model_shape
from grpo_dist.config.facts import compute_dtype
from grpo_dist.config.reward_sources import model_sources
from grpo_dist.config.role_settings import critic_model_path, reward_model_path
from grpo_dist.config.schema import GRPOConfig
from grpo_dist.config.states import raw_get
from grpo_dist.config.validate import (CRITIC_MODEL, critic_enabled, critic_fsdp, data_parallel_size, lora_settings,
                                       needs_reference)
from grpo_dist.training.memory import ModelShape, lora_parameter_count
from grpo_dist.utils.devices import cuda_available


#: Resident memory of one worker process before it holds a model (Python, torch, transformers; measured
#: 0.40 GiB on the 2-core machine): a floor, so the estimate stays below what the run really needs.
PROCESS_BASE_GIB = 0.35


#: Warn when the estimate passes this share of the available memory (refuse only above all of it).
MEMORY_WARN_SHARE = 0.8


_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


_SAFETENSORS_DTYPE_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
                            "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def model_parameter_count(model_dir: str) -> int | None:
    """Parameters of the model in ``model_dir``, read from its safetensors headers (no weights are
    loaded; a tied embedding is stored, and counted, once); None when the folder has none."""
    import json
    import struct
    from pathlib import Path

    files = sorted(Path(model_dir).glob("*.safetensors")) if Path(model_dir).is_dir() else []
    if not files:
        return None
    total = 0
    try:
        for f in files:
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
            for name, entry in header.items():
                if name == "__metadata__":
                    continue
                count = 1
                for d in entry["shape"]:
                    count *= int(d)
                total += count
    except (OSError, ValueError, KeyError, struct.error):
        return None
    return total


def critic_lora(cfg: GRPOConfig) -> tuple[int, Any, Any]:
    """The value model's LoRA ``(rank, target_modules, exclude_modules)`` as the run resolves it from either
    layout (:func:`grpo_dist.config.validate.lora_settings` of ``critic.model.``); rank 0 without LoRA."""
    lora = lora_settings(cfg, CRITIC_MODEL)
    return lora.rank, lora.target_modules, lora.exclude_modules


def cpu_memory_estimate(cfg: GRPOConfig, ranks: int, params: int, critic_params: int | None = None,
                        reward_model_params: dict[str, int | None] | None = None, shape: ModelShape | None = None,
                        critic_shape: ModelShape | None = None) -> tuple[float, str]:
    """A floor on the resident memory (GiB) a single-machine CPU run of ``ranks`` ranks needs, and its
    breakdown in words. Counted: the actor's master weights, gradients and Adam's two moments (4 x
    ``fsdp_config.model_dtype``'s bytes per parameter, sharded over the ranks by FSDP2, so counted once in all;
    under LoRA the frozen base once and the adapters 4 x, their count from ``shape`` by
    :func:`lora_parameter_count`, not counted without it); the reference's weights (sharded, when a KL
    term is used; none under LoRA, where it is the actor's model with the adapters off); the critic's like
    the actor's (under its own LoRA, ``critic.model.lora_rank`` or ``critic.model.lora.rank``, likewise from
    ``critic_shape``, else ``shape``; its value head not counted); one full copy of the weights in every
    rank's rollout engine (and of the policy's adapters when they are synced alone, ``lora.merge=false``)
    plus its KV cache (``rollout.kv_cache_gib``; 1 GiB for ``auto``, which sizes the cache from the memory
    left; vLLM only); each reward model's weights (``reward_model_params``, by its role; sharded; 4 x with
    gradients and Adam when iterative RL trains it) and one process per rank of a reward model's own pool;
    ``PROCESS_BASE_GIB`` per worker process and for the driver. Not counted: activations, the full weights
    gathered for weight sync and checkpoints, Ray's own processes."""
    a = cfg.actor_rollout_ref
    gib = 2.0**30
    actor_b = _DTYPE_BYTES.get(a.actor.fsdp_config.model_dtype, 4)  # master weights, their gradients, Adam
    rollout_b = _DTYPE_BYTES.get(compute_dtype(a.rollout.dtype, "cpu"), 4)
    policy_lora = lora_settings(cfg)
    lora = policy_lora.rank > 0
    adapters = 0
    if lora:  # the base frozen: no gradients or Adam state for it; the adapters trained in the model's dtype
        parts = [("actor (frozen base weights under LoRA)", actor_b * params / gib)]
        if shape is not None:
            adapters = lora_parameter_count(shape, policy_lora.rank, policy_lora.target_modules,
                                            policy_lora.exclude_modules)
            parts.append(("actor LoRA adapters (weights, gradients, Adam)", 4 * actor_b * adapters / gib))
    else:
        parts = [("actor (weights, gradients, Adam)", 4 * actor_b * params / gib)]
    processes = 2  # actor + rollout per rank
    if needs_reference(cfg) and lora:  # the reference is the actor's model with the adapters off
        processes += 1
    elif needs_reference(cfg):
        parts.append(("reference", _DTYPE_BYTES.get(compute_dtype(a.actor.fsdp_config.dtype, "cpu"), 4) * params / gib))
        processes += 1
    if critic_enabled(cfg):
        cp = critic_params if critic_params is not None else params
        critic_b = _DTYPE_BYTES.get(critic_fsdp(cfg).model_dtype, 4)
        c_rank, c_targets, c_exclude = critic_lora(cfg)
        if c_rank > 0:
            parts.append(("critic (frozen base weights under LoRA)", critic_b * cp / gib))
            c_shape = critic_shape if critic_shape is not None else shape
            if c_shape is not None:
                c_adapters = lora_parameter_count(c_shape, c_rank, c_targets, c_exclude)
                parts.append(("critic LoRA adapters (weights, gradients, Adam)", 4 * critic_b * c_adapters / gib))
        else:
            parts.append(("critic", 4 * critic_b * cp / gib))
        processes += 1
    rm_b = _DTYPE_BYTES.get(cfg.reward_model.model.fsdp_config.model_dtype, 4)
    pool_processes = 0
    for source in model_sources(cfg):
        rp = (reward_model_params or {}).get(source.role)
        if rp:
            parts.append((source.role, (4 if source.trained else 1) * rm_b * rp / gib))
        pool_processes += source.world_size if source.own_pool else 0
    kv_set = a.rollout.kv_cache_gib
    kv = (1.0 if kv_set in (None, "auto") else float(kv_set)) if a.rollout.name == "vllm" else 0.0
    engine_params = params + (adapters if lora and not policy_lora.merge else 0)
    parts.append((f"{ranks} rollout engine(s) (weights + {kv:g} GiB KV cache each)",
                   ranks * (rollout_b * engine_params / gib + kv)))
    count = ranks * processes + pool_processes + 2
    parts.append((f"{count} processes", count * PROCESS_BASE_GIB))
    total = sum(v for _, v in parts)
    return total, ", ".join(f"{name} {v:.1f}" for name, v in parts)


def check_cpu_memory(cfg: GRPOConfig, params: int | None, available_gib: float | None, cores: int | None = None,
                     critic_params: int | None = None, reward_model_params: dict[str, int | None] | None = None,
                     shape: ModelShape | None = None, critic_shape: ModelShape | None = None) -> str | None:
    """Refuse (``ValueError`` naming the keys and the largest ``trainer.n_gpus_per_node`` that fits)
    a single-machine CPU run whose memory floor (:func:`cpu_memory_estimate`) is above the memory
    available now; a warning (returned) when it is above ``MEMORY_WARN_SHARE`` of it; None otherwise.
    Cluster runs, GPU runs and unknown sizes are not checked."""
    t = cfg.trainer
    on_cpu = t.device == "cpu" or (t.device == "auto" and not cuda_available())
    if not on_cpu or cfg.ray_kwargs.ray_init.address or not params or not available_gib:
        return None
    ranks = data_parallel_size(cfg)
    need, parts = cpu_memory_estimate(cfg, ranks, params, critic_params, reward_model_params, shape, critic_shape)
    if need <= MEMORY_WARN_SHARE * available_gib:
        return None
    setting = (f"trainer.nnodes x trainer.n_gpus_per_node = {t.nnodes} x {t.n_gpus_per_node} = {ranks} CPU rank(s) of "
               f"a {params / 1e6:.0f} M-parameter model")
    if need <= available_gib:
        return (f"{setting} need at least {need:.1f} GiB of memory ({parts}) of the {available_gib:.1f} GiB available "
                "now: the run may be killed for memory; fewer ranks, a smaller actor_rollout_ref.rollout.kv_cache_gib "
                "or a smaller model leave more room")
    nodes = max(t.nnodes, 1)
    fits = [n for n in range(t.n_gpus_per_node - 1, 0, -1)
            if cpu_memory_estimate(cfg, nodes * n, params, critic_params, reward_model_params, shape,
                                   critic_shape)[0] <= available_gib
            and (not cores or nodes * n <= cores)]
    fix = (f"use at most trainer.n_gpus_per_node={fits[0]} here (the batch sizes must stay divisible by it)" if fits
           else "even one rank does not fit: lower actor_rollout_ref.rollout.kv_cache_gib, use a smaller model")
    raise ValueError(
        f"{setting} need at least {need:.1f} GiB of memory ({parts}), but this machine has {available_gib:.1f} GiB "
        f"available; {fix}, or run on a Ray cluster (ray_kwargs.ray_init.address)")


def available_memory_gib() -> float | None:
    try:
        import psutil
    except ImportError:
        return None
    return psutil.virtual_memory().available / 2**30


def check_cpu_resources(cfg: GRPOConfig, model_path: str) -> str | None:
    """The single-machine CPU checks before anything starts: ranks against the cores this process may
    use (:func:`check_cpu_ranks`) and the memory floor against the memory available
    (:func:`check_cpu_memory`). ``ValueError`` when the run clearly does not fit; a warning (returned)
    when it is close."""
    cores = preflight.usable_cores(cfg)
    preflight.check_cpu_ranks(cfg, cores)
    if not preflight.local_cpu_run(cfg):
        return None
    critic = model_parameter_count(critic_model_path(cfg, model_path)) if critic_enabled(cfg) else None
    rms = {s.role: model_parameter_count(reward_model_path(s)) for s in model_sources(cfg)}
    critic_lora_on = critic_enabled(cfg) and critic_lora(cfg)[0] > 0
    shape = _shape_or_none(cfg, model_path) if lora_settings(cfg).rank > 0 or critic_lora_on else None
    critic_shape = _shape_or_none(cfg, critic_model_path(cfg, model_path)) if critic_lora_on else None
    return check_cpu_memory(cfg, model_parameter_count(model_path), available_memory_gib(), cores, critic, rms,
                            shape, critic_shape)


def _shape_or_none(cfg: GRPOConfig, model_path: str) -> ModelShape | None:
    """The model's shape for counting LoRA adapters; None when its config cannot be read (the adapters are
    then left out of the floor)."""
    try:
        return model_shape(model_path, cfg.actor_rollout_ref.model.trust_remote_code)
    except (OSError, ValueError):
        return None
