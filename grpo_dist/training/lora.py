"""LoRA adapters on the policy (peft): wrapping, the checks of a configuration against a model, and the
merged weights the rollout engine receives.

With ``LoraSettings.rank = r > 0`` every target ``nn.Linear`` (``y = W x + b``, ``W`` [out, in]) becomes
peft's LoRA layer::

    y = W x + b + s * B (A dropout(x)),     A [r, in], B [out, r], s = alpha / r

with ``W`` and ``b`` frozen and only ``A`` and ``B`` trained (``B`` starts at zero, so the adapted model
starts as the base model). The model is a ``PeftModelForCausalLM``: its forward is the base model's
forward through the adapted layers, and ``disable_adapter()`` switches every adapter off (the base
model, which is the reference policy under LoRA).

The weight sync sends the merged weights under the base model's parameter names::

    W' = W + s * (B @ A)        (the same expression and order as peft's ``merge_and_unload``)

so the rollout engine holds the same function as the adapted policy and loads it as a plain model. With
``merge=False`` the sync sends the adapter tensors alone (:func:`adapter_sources`) and the engine serves them
as a LoRA adapter on the base weights it loaded at start (:mod:`grpo_dist.rollout.adapters`).
Nothing here shards or communicates: the actor (:mod:`grpo_dist.training.actor`) gathers the full
tensors and calls :func:`merged_weight`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from grpo_dist.core.lora import merge_lora
from grpo_dist.training.settings import LoraSettings, module_matches

__all__ = ["ADAPTER_NAME", "add_adapters", "peft_lora_config", "module_matches", "is_adapter_folder",
           "linear_module_names", "unmatched_targets",
           "MergeSource", "merge_sources", "merged_weight", "adapter_sources", "adapter_config_dict", "base_name",
           "ADAPTER_EXPORT_DIR", "lora_layout", "layout_mismatch", "adapter_export_config"]

ADAPTER_NAME = "default"
"""peft's name of the one adapter the policy has."""

_PEFT_PREFIX = "base_model.model."


def is_adapter_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder holding a saved peft LoRA adapter (``adapter_config.json`` with
    ``peft_type`` LORA beside its weights)."""
    folder = Path(os.path.expanduser(str(path)))
    config = folder / "adapter_config.json"
    if not config.is_file():
        return False
    try:
        peft_type = json.loads(config.read_text()).get("peft_type")
    except (OSError, ValueError, AttributeError):
        return False
    has_weights = any((folder / name).is_file() for name in ("adapter_model.safetensors", "adapter_model.bin"))
    return str(peft_type).upper() == "LORA" and has_weights


def peft_lora_config(settings: LoraSettings, *, exclude_modules=None, task_type: str | None = "CAUSAL_LM"):
    """peft's ``LoraConfig`` of ``settings`` (rank, alpha, dropout, target modules); ``exclude_modules``: the
    settings' own when None; ``task_type``: peft's task (None: the plain ``PeftModel``, the model's own forward)."""
    from peft import LoraConfig

    targets = settings.target_modules
    exclude = settings.exclude_modules if exclude_modules is None else exclude_modules
    return LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(targets) if isinstance(targets, tuple) else targets,
        exclude_modules=list(exclude) if isinstance(exclude, tuple) else exclude,
        task_type=task_type,
    )


def add_adapters(model: nn.Module, settings: LoraSettings) -> nn.Module:
    """``model`` (a Hugging Face causal LM, not yet sharded) as a peft model with LoRA adapters on its
    target modules: the base frozen, the adapters trainable. With ``settings.adapter_path`` the adapters
    are the saved ones (trainable), with their own rank, alpha and modules."""
    from peft import PeftModel, get_peft_model

    if not settings.enabled:
        raise ValueError("add_adapters needs LoraSettings.rank > 0")
    if settings.adapter_path is not None:
        path = os.path.expanduser(settings.adapter_path)
        if not is_adapter_folder(path):
            raise ValueError(f"{settings.adapter_path} is not a peft LoRA adapter folder (adapter_config.json "
                             "with peft_type LORA and adapter_model.safetensors)")
        peft_model = PeftModel.from_pretrained(model, path, adapter_name=ADAPTER_NAME, is_trainable=True)
    else:
        with torch.random.fork_rng(devices=[]):  # the same A on every rank; the process's RNG left as it was
            torch.manual_seed(settings.seed)
            peft_model = get_peft_model(model, peft_lora_config(settings), adapter_name=ADAPTER_NAME)
    for name, p in peft_model.named_parameters():  # peft's rule, held as a contract
        assert p.requires_grad == (".lora_" in name), name
    return peft_model


def linear_module_names(config, *, trust_remote_code: bool = False) -> list[str]:
    """The dotted names of every ``nn.Linear`` of the causal LM that ``config`` (a Hugging Face config)
    builds, found on the meta device (no weights are allocated), the output layer included."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]


def unmatched_targets(module_names: list[str], settings: LoraSettings) -> list[str]:
    """The entries of ``settings.target_modules`` that match no module of ``module_names`` (after
    ``exclude_modules``); ``"all-linear"`` matches every linear layer but the output layer, and a
    regular expression counts as one entry. Empty: every entry adapts at least one module."""
    targets = settings.target_modules
    kept = [n for n in module_names if not (settings.exclude_modules and module_matches(n, settings.exclude_modules))]
    if targets == "all-linear":
        return [] if any(n.split(".")[-1] != "lm_head" for n in kept) else ["all-linear"]
    if isinstance(targets, str):
        return [] if any(module_matches(n, targets) for n in kept) else [targets]
    return [t for t in targets if not any(module_matches(n, (t,)) for n in kept)]


def adapter_sources(state_keys: Iterable[str]) -> dict[str, str]:
    """The adapter-only weight sync's names: peft's saved name of each LoRA factor (what
    ``adapter_model.safetensors`` holds, e.g. ``base_model.model.model.layers.0.mlp.up_proj.lora_A.weight``) ->
    its key in the peft model's state dict (``...up_proj.lora_A.default.weight``), in state-dict order."""
    out: dict[str, str] = {}
    for key in state_keys:
        if ".lora_A." in key or ".lora_B." in key:
            saved = key.replace(f".{ADAPTER_NAME}.", ".")
            assert saved != key, key
            out[saved] = key
    return out


def adapter_config_dict(model: nn.Module) -> dict:
    """The peft model's adapter configuration as ``adapter_config.json`` holds it (sets as sorted lists)."""
    config = model.peft_config[ADAPTER_NAME].to_dict()
    return {k: sorted(v) if isinstance(v, (set, frozenset)) else v for k, v in config.items()}


def base_name(name: str) -> str:
    """The base model's name of a parameter of the peft model:
    ``base_model.model.model.layers.0.mlp.up_proj.base_layer.weight`` -> ``model.layers.0.mlp.up_proj.weight``."""
    return name.removeprefix(_PEFT_PREFIX).replace(".base_layer.", ".")


@dataclass(frozen=True)
class MergeSource:
    """Where one weight of the base model's state dict comes from in the peft model's state dict:
    ``weight`` alone, or ``weight + scale * (lora_B @ lora_A)``."""

    weight: str
    lora_A: str | None = None  # noqa: N815 - peft's names
    lora_B: str | None = None  # noqa: N815
    scale: float = 0.0


def merge_sources(model: nn.Module, state_keys: Iterable[str]) -> dict[str, MergeSource]:
    """The base model's names (in the peft state dict's order) -> their :class:`MergeSource`, for the
    peft model ``model`` (sharded or not) whose state dict has ``state_keys``."""
    from peft.tuners.lora import LoraLayer

    scales = {name: m.scaling[ADAPTER_NAME] for name, m in model.named_modules() if isinstance(m, LoraLayer)}
    keys = set(state_keys)
    out: dict[str, MergeSource] = {}
    for key in state_keys:
        if ".lora_" in key:
            continue
        module, _, leaf = key.rpartition(".base_layer.")
        if module in scales and leaf == "weight":
            a, b = f"{module}.lora_A.{ADAPTER_NAME}.weight", f"{module}.lora_B.{ADAPTER_NAME}.weight"
            assert a in keys and b in keys, (a, b)
            out[base_name(key)] = MergeSource(key, a, b, float(scales[module]))
        else:
            out[base_name(key)] = MergeSource(key)
    return out


def merged_weight(source: MergeSource, full: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The merged weight of ``source`` from the full (unsharded) tensors ``full`` (peft names):
    :func:`grpo_dist.core.lora.merge_lora`."""
    w = full[source.weight]
    if source.lora_A is None:
        return w
    return merge_lora(w, full[source.lora_A], full[source.lora_B], source.scale)


# --------------------------------------------------------------------------------------------------
# checkpoints and the adapter export
# --------------------------------------------------------------------------------------------------
ADAPTER_EXPORT_DIR = "lora_adapter"
"""The folder, inside a LoRA policy's Hugging Face export, that holds its peft adapter (verl's model merger
writes ``lora_adapter/`` there too)."""


def lora_layout(model: nn.Module) -> dict | None:
    """What a checkpoint of the peft model ``model`` (sharded or not) must match to be loaded into it:
    ``{"r", "lora_alpha", "modules"}`` (the rank, alpha, and the sorted base-model names of the adapted
    modules); None when ``model`` has no LoRA adapters (full fine-tuning)."""
    from peft.tuners.lora import LoraLayer

    if not hasattr(model, "peft_config"):
        return None
    config = model.peft_config[ADAPTER_NAME]
    modules = sorted(name.removeprefix(_PEFT_PREFIX) for name, m in model.named_modules() if isinstance(m, LoraLayer))
    return {"r": int(config.r), "lora_alpha": float(config.lora_alpha), "modules": modules}


def layout_mismatch(saved: Mapping | None, current: Mapping | None) -> str | None:
    """Why a checkpoint whose adapters are ``saved`` (:func:`lora_layout`; None: a full fine-tuning
    checkpoint) cannot be loaded into a policy whose adapters are ``current``, or None when it can."""
    if saved is None and current is None:
        return None
    if saved is None:
        return (f"it holds a fully fine-tuned model, but this model trains LoRA adapters (rank {current['r']}); "
                "resume it with LoRA off (lora_rank=0), or start this LoRA run from a fresh folder")
    if current is None:
        return (f"it holds only LoRA adapters (rank {saved['r']} on {len(saved['modules'])} modules), not the whole "
                "model, but this model is fully fine-tuned (lora_rank=0); resume it with the LoRA settings it was "
                "saved with")
    diffs = [f"{key} {saved[key]} (checkpoint) vs {current[key]} (this model)"
             for key in ("r", "lora_alpha") if saved[key] != current[key]]
    only_saved = sorted(set(saved["modules"]) - set(current["modules"]))
    only_current = sorted(set(current["modules"]) - set(saved["modules"]))
    if only_saved or only_current:
        diffs.append("the adapted modules differ (only in the checkpoint: "
                     f"{', '.join(only_saved[:3]) or 'none'}{' ...' if len(only_saved) > 3 else ''}; only in this "
                     f"model: {', '.join(only_current[:3]) or 'none'}{' ...' if len(only_current) > 3 else ''})")
    if not diffs:
        return None
    return ("its LoRA adapters do not match this model's: " + "; ".join(diffs)
            + "; resume with the LoRA settings (rank, alpha, target_modules, exclude_modules) it was saved with")


def adapter_export_config(model: nn.Module, base_model_path: str | os.PathLike) -> dict:
    """``adapter_config.json`` of the exported adapter: the peft model's configuration with
    ``base_model_name_or_path`` set to ``base_model_path`` (so ``PeftModel.from_pretrained`` of a model loaded
    from there finds its base), inference mode on."""
    config = adapter_config_dict(model)
    config["base_model_name_or_path"] = str(base_model_path)
    config["inference_mode"] = True
    return config
