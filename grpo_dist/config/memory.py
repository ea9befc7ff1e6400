"""The memory of a single-machine CPU run: a floor on what it needs, held against what this machine has."""

from __future__ import annotations

import torch

from grpo_dist.config import preflight
from grpo_dist.config.facts import compute_dtype
from grpo_dist.config.reward_sources import model_sources
from grpo_dist.config.role_settings import critic_model_path, reward_model_path
from grpo_dist.config.schema import GRPOConfig
from grpo_dist.config.validate import critic_enabled, critic_fsdp, data_parallel_size, lora_settings, needs_reference


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


def cpu_memory_estimate(cfg: GRPOConfig, ranks: int, params: int, critic_params: int | None = None,
                        reward_model_params: dict[str, int | None] | None = None) -> tuple[float, str]:
    """A floor on the resident memory (GiB) a single-machine CPU run of ``ranks`` ranks needs, and its
    breakdown in words. Counted: the actor's master weights, gradients and Adam's two moments (4 x
    ``fsdp_config.model_dtype``'s bytes per parameter, sharded over the ranks by FSDP2, so counted once in all;
    under LoRA the frozen base once, the adapters not counted); the reference's weights (sharded, when a KL
    term is used; none under LoRA, where it is the actor's model with the adapters off); the critic's like
    the actor's; one full copy of the weights in every rank's rollout engine plus its KV cache (``rollout.kv_cache_gib``; 1 GiB for
    ``auto``, which sizes the cache from the memory left; vLLM only); each reward model's weights
    (``reward_model_params``, by its role; sharded; 4 x with gradients and Adam when iterative RL trains it)
    and one process per rank of a reward model's own pool; ``PROCESS_BASE_GIB`` per worker process and
    for the driver. Not counted: activations, the full weights gathered for weight sync and checkpoints,
    Ray's own processes."""
    a = cfg.actor_rollout_ref
    gib = 2.0**30
    actor_b = _DTYPE_BYTES.get(a.actor.fsdp_config.model_dtype, 4)  # master weights, their gradients, Adam
    rollout_b = _DTYPE_BYTES.get(compute_dtype(a.rollout.dtype, "cpu"), 4)
    lora = lora_settings(cfg).rank > 0
    if lora:  # the base frozen: no gradients or Adam state for it (the small adapters are not counted)
        parts = [("actor (frozen base weights under LoRA)", actor_b * params / gib)]
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
        parts.append(("critic", 4 * _DTYPE_BYTES.get(critic_fsdp(cfg).model_dtype, 4) * cp / gib))
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
    parts.append((f"{ranks} rollout engine(s) (weights + {kv:g} GiB KV cache each)", ranks * (rollout_b * params / gib + kv)))
    count = ranks * processes + pool_processes + 2
    parts.append((f"{count} processes", count * PROCESS_BASE_GIB))
    total = sum(v for _, v in parts)
    return total, ", ".join(f"{name} {v:.1f}" for name, v in parts)


def check_cpu_memory(cfg: GRPOConfig, params: int | None, available_gib: float | None, cores: int | None = None,
                     critic_params: int | None = None, reward_model_params: dict[str, int | None] | None = None) -> str | None:
    """Refuse (``ValueError`` naming the keys and the largest ``trainer.n_gpus_per_node`` that fits)
    a single-machine CPU run whose memory floor (:func:`cpu_memory_estimate`) is above the memory
    available now; a warning (returned) when it is above ``MEMORY_WARN_SHARE`` of it; None otherwise.
    Cluster runs, GPU runs and unknown sizes are not checked."""
    t = cfg.trainer
    on_cpu = t.device == "cpu" or (t.device == "auto" and not torch.cuda.is_available())
    if not on_cpu or cfg.ray_kwargs.ray_init.address or not params or not available_gib:
        return None
    ranks = data_parallel_size(cfg)
    need, parts = cpu_memory_estimate(cfg, ranks, params, critic_params, reward_model_params)
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
            if cpu_memory_estimate(cfg, nodes * n, params, critic_params, reward_model_params)[0] <= available_gib
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
    return check_cpu_memory(cfg, model_parameter_count(model_path), available_memory_gib(), cores, critic, rms)
