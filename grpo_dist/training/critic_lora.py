"""LoRA on the value model (peft): adapters on the frozen backbone, the value head trained in full, and the
merged weights of its Hugging Face export.

With ``LoraSettings.rank = r > 0`` every target ``nn.Linear`` of the backbone (``y = W x + b``, ``W``
[out, in]) becomes peft's LoRA layer, as the policy's (:mod:`grpo_dist.training.lora`)::

    y = W x + b + s * B (A dropout(x)),     A [r, in], B [out, r], s = alpha / r,  B = 0 at the start

with ``W`` and ``b`` frozen. The value head (``score``: ``v = w . h + c``, ``w`` [1, H]) gets no adapter,
whatever the targets say: it is new (or the folder's), so it stays a plain layer and is trained in full.
The trainable parameters are therefore the adapters' ``A`` and ``B`` and the head's weight and bias; the
optimizer holds exactly those (AdamW over the parameters that require a gradient), and FSDP2 shards
frozen and trainable parameters alike.

The model is peft's task-neutral ``PeftModel``: its forward is the value model's own forward through the
adapted layers, so the critic reads its values as without LoRA
(:func:`grpo_dist.training.critic.forward_values`). Its parameter names are the value model's under
``base_model.model.`` (an adapted layer's frozen weight under ``.base_layer.``, its factors under
``.lora_A.default`` / ``.lora_B.default``). A checkpoint holds the trainable ones, adapters and head, and
their optimizer state (:meth:`grpo_dist.training.fsdp_role.FSDPRole.save_checkpoint`: the frozen backbone is
the model folder's). The Hugging Face export holds the merged weights ``W + s * (B @ A)`` under the value model's own names,
which ``AutoModelForTokenClassification`` loads as a plain value model.

Nothing here shards or communicates.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

import torch
from torch import nn

from grpo_dist.training.lora import (
    ADAPTER_NAME,
    is_adapter_folder,
    merge_sources,
    merged_weight,
    peft_lora_config,
)
from grpo_dist.training.model_forward import output_layer
from grpo_dist.training.settings import LoraSettings

__all__ = ["VALUE_HEAD_NAMES", "value_head_name", "add_value_adapters", "value_linear_names", "merged_value_state"]

VALUE_HEAD_NAMES = ("score", "classifier")
"""The value head's module names in the token-classification models transformers builds."""


def value_head_name(model: nn.Module) -> str:
    """The dotted name of ``model``'s value head (its output layer, :func:`output_layer`), not wrapped by
    peft. ``ValueError`` for a model without one."""
    head = output_layer(model)
    name = next((n for n, m in model.named_modules() if m is head), None) if head is not None else None
    if not name:
        raise ValueError(f"{type(model).__name__} has no value head ({', '.join(VALUE_HEAD_NAMES)}) to keep trainable")
    return name


def _without_head(exclude: str | tuple[str, ...] | None, head: str) -> str | list[str]:
    """``exclude_modules`` with the value head added: a list of names gets its name, a regular expression
    an alternative that matches it (peft matches a string against the full name)."""
    if isinstance(exclude, str):
        return f"(?:{exclude})|{re.escape(head)}"
    return [*(exclude or ()), head]


def _lora_config(settings: LoraSettings, head: str):
    # peft's plain PeftModel (no task type): the value model's own forward, no task wrapper
    return peft_lora_config(settings, exclude_modules=_without_head(settings.exclude_modules, head), task_type=None)


def add_value_adapters(model: nn.Module, settings: LoraSettings) -> nn.Module:
    """``model`` (a value model: a backbone and a head, not yet sharded) as a peft model with LoRA adapters on
    its target modules, the base frozen, the adapters and the value head trainable. With
    ``settings.adapter_path`` the adapters are the saved ones (trainable, with their own rank, alpha and
    modules, whatever task they were saved for); an adapter that adapts or saves the value head is refused
    (the head is trained in full, from the model folder)."""
    from peft import PeftConfig, PeftModel, get_peft_model
    from peft.tuners.lora import LoraLayer

    if not settings.enabled:
        raise ValueError("add_value_adapters needs LoraSettings.rank > 0")
    head_name = value_head_name(model)
    head = model.get_submodule(head_name)
    if settings.adapter_path is not None:
        path = os.path.expanduser(settings.adapter_path)
        if not is_adapter_folder(path):
            raise ValueError(f"{settings.adapter_path} is not a peft LoRA adapter folder (adapter_config.json "
                             "with peft_type LORA and adapter_model.safetensors)")
        config = PeftConfig.from_pretrained(path)
        config.task_type = None  # whatever task it was saved for: the value model's own forward
        if any(head_name == m or head_name.endswith("." + m) for m in config.modules_to_save or ()):
            raise ValueError(f"{settings.adapter_path} saves its own value head ({head_name}, modules_to_save); the "
                             "critic's head comes from critic.model.path: use an adapter saved without it")
        peft_model = PeftModel.from_pretrained(model, path, adapter_name=ADAPTER_NAME, is_trainable=True, config=config)
        if isinstance(peft_model.get_base_model().get_submodule(head_name), LoraLayer):
            raise ValueError(f"{settings.adapter_path} adapts the value head ({head_name}), which the critic trains "
                             "in full; use an adapter saved without it")
    else:
        with torch.random.fork_rng(devices=[]):  # the same A on every rank; the process's RNG left as it was
            torch.manual_seed(settings.seed)
            peft_model = get_peft_model(model, _lora_config(settings, head_name), adapter_name=ADAPTER_NAME)
    assert peft_model.get_base_model().get_submodule(head_name) is head, head_name  # not wrapped
    head.requires_grad_(True)
    head_params = {f"base_model.model.{head_name}.{n}" for n, _ in head.named_parameters()}
    for name, p in peft_model.named_parameters():  # the trainable set: adapters + value head
        assert p.requires_grad == (".lora_" in name or name in head_params), name
    return peft_model


def value_linear_names(config, *, trust_remote_code: bool = False) -> list[str]:
    """The dotted names of the linear layers of the value model that ``config`` (a Hugging Face config
    with ``num_labels=1``) builds with ``AutoModelForTokenClassification``, found on the meta device (no
    weights), the value head left out (it gets no adapter)."""
    from transformers import AutoModelForTokenClassification

    with torch.device("meta"):
        model = AutoModelForTokenClassification.from_config(config, trust_remote_code=trust_remote_code)
    head = value_head_name(model)
    return [name for name, m in model.named_modules() if isinstance(m, nn.Linear) and name != head]


def merged_value_state(model: nn.Module, full: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The value model's weights under its own names, each adapted weight merged (``W + s * (B @ A)``,
    :func:`grpo_dist.training.lora.merged_weight`), from ``full``: the peft model ``model``'s full
    (unsharded) state dict. Empty ``full`` (a rank other than 0): ``{}``."""
    if not full:
        return {}
    return {name: merged_weight(src, full) for name, src in merge_sources(model, list(full)).items()}
