"""The rollout engine's constructor arguments and the CPU KV cache of each vLLM engine."""

from __future__ import annotations

from grpo_dist.config.facts import compute_dtype, prompts_per_draw
from grpo_dist.config.schema import GRPOConfig
from grpo_dist.config.validate import data_parallel_size, separate_rollout


def engine_kwargs(cfg: GRPOConfig, model_path: str, device: str, kv_gib: float | None = None) -> dict:
    """Constructor arguments of the rollout engine named by actor_rollout_ref.rollout.name (``kv_gib``:
    the CPU KV cache chosen once for the run by :func:`kv_cache_gib`, which the role table passes;
    without it a set size is used as it is and ``auto`` leaves the engine's own default, 1 GiB)."""
    r = cfg.actor_rollout_ref.rollout
    dtype = compute_dtype(r.dtype, device)
    trust = cfg.actor_rollout_ref.model.trust_remote_code
    overrides = dict(cfg.actor_rollout_ref.model.override_config) or None  # the policy's config as the actor builds it
    if r.name == "hf":
        return dict(model_path=model_path, dtype=dtype, device=device, trust_remote_code=trust, config_overrides=overrides)
    rank = served_adapter_rank(cfg)
    return dict(
        **({"max_lora_rank": rank} if rank else {}),
        model_path=model_path,
        dtype=dtype,
        trust_remote_code=trust,
        hf_overrides=overrides,
        max_model_len=r.max_model_len or (r.prompt_length + r.response_length),
        gpu_memory_utilization=r.gpu_memory_utilization,
        tensor_parallel_size=r.tensor_model_parallel_size,
        max_num_seqs=r.max_num_seqs,
        max_num_batched_tokens=r.max_num_batched_tokens,
        enable_chunked_prefill=r.enable_chunked_prefill,
        extra_kwargs={k: v for k, v in r.engine_kwargs.vllm.items() if v is not None},
        enforce_eager=r.enforce_eager,
        enable_sleep_mode=bool(r.free_cache_engine and device == "cuda" and not separate_rollout(cfg)),
        kv_cache_gib=(kv_gib if kv_gib is not None else None if r.kv_cache_gib == "auto" else float(r.kv_cache_gib))
        if device == "cpu" else None,
    )


def served_adapter_rank(cfg: GRPOConfig) -> int:
    """The rank of the LoRA adapter the rollout engine serves: the policy's LoRA rank (a saved adapter's own,
    from its ``adapter_config.json``, when training starts from one) when the weight sync sends adapters only
    (``lora.merge=false``); 0 when the engine gets whole weights."""
    from grpo_dist.config.validate import lora_settings

    lora = lora_settings(cfg)
    if not lora.enabled or lora.merge:
        return 0
    if lora.adapter_path is None:
        return lora.rank
    import json
    import os
    from pathlib import Path

    saved = json.loads((Path(os.path.expanduser(lora.adapter_path)) / "adapter_config.json").read_text())
    return max([int(saved["r"]), *(int(r) for r in (saved.get("rank_pattern") or {}).values())])


#: The fields of a model's ``config.json`` that :class:`~grpo_dist.training.memory.ModelShape` reads.
SHAPE_FIELDS = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size",
                "num_key_value_heads", "head_dim", "tie_word_embeddings")


def model_shape(model_path: str, trust_remote_code: bool):
    """The model's :class:`~grpo_dist.training.memory.ModelShape`. Read from ``config.json`` itself
    when it states every field the shape needs under its own name (what transformers' config then
    holds too), so that the run does not wait for transformers' import before it creates the rollout
    workers (~1.5-2 s on the critical path of start-up); otherwise (a field left to the config class's
    default, an aliased name, a nested text config) from ``AutoConfig``."""
    import json
    from pathlib import Path
    from types import SimpleNamespace

    from grpo_dist.training.memory import ModelShape

    try:
        raw = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        raw = None
    if isinstance(raw, dict) and all(raw.get(k) is not None for k in SHAPE_FIELDS):
        return ModelShape.from_config(SimpleNamespace(**{k: raw[k] for k in SHAPE_FIELDS}))
    from transformers import AutoConfig

    return ModelShape.from_config(AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code))


def kv_cache_gib(cfg: GRPOConfig, model_path: str, available: float | None = None) -> tuple[float, str]:
    """The CPU KV cache of each vLLM engine: ``rollout.kv_cache_gib``, or with ``auto`` what
    :func:`grpo_dist.training.memory.auto_kv_cache_gib` picks for one rank's share of a step (at most
    ``max_num_seqs`` sequences at once) from this machine's available memory; and why."""
    r = cfg.actor_rollout_ref.rollout
    if r.kv_cache_gib != "auto":
        return float(r.kv_cache_gib), "set"
    import psutil

    from grpo_dist.training.memory import auto_kv_cache_gib

    from grpo_dist.config.roles import rollout_pool_ranks

    ranks = rollout_pool_ranks(cfg) or data_parallel_size(cfg)  # the engines' ranks
    per_rank = -(-prompts_per_draw(cfg) * r.n // ranks)
    sequences = max(1, min(r.max_num_seqs, per_rank))
    b = 2 if compute_dtype(r.dtype, "cpu") in ("bfloat16", "float16") else 4
    avail = psutil.virtual_memory().available if available is None else available
    shape = model_shape(model_path, cfg.actor_rollout_ref.model.trust_remote_code)
    return auto_kv_cache_gib(shape, b, sequences=sequences,
                             seq_len=r.max_model_len or (r.prompt_length + r.response_length), available=avail,
                             engines_on_node=cfg.trainer.n_gpus_per_node)
