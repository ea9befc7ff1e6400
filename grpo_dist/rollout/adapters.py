"""LoRA adapters on the rollout side: the folder an engine loads an adapter from.

The weight sync with ``lora.merge=false`` sends only the adapter tensors, under peft's saved names::

    base_model.model.<module>.lora_A.weight    [r, in]
    base_model.model.<module>.lora_B.weight    [out, r]

with the adapter's peft ``LoraConfig`` as a dict (what ``adapter_config.json`` holds). An engine that loads
adapters from a folder (vLLM) gets one written by :func:`write_adapter`; the Hugging Face engine loads the
tensors into its own peft model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "write_adapter", "check_adapter_names"]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def check_adapter_names(names: Iterable[str]) -> None:
    """``ValueError`` unless every name is a LoRA factor under peft's saved names (module docstring)."""
    bad = [n for n in names if not (n.startswith("base_model.model.") and (n.endswith(".lora_A.weight")
                                                                             or n.endswith(".lora_B.weight")))]
    if bad:
        raise ValueError(f"an adapter sync got {len(bad)} tensors that are not LoRA factors under peft's saved "
                         f"names, e.g. {bad[:2]}; expected 'base_model.model.<module>.lora_A.weight' / '.lora_B.weight'")


def write_adapter(folder: str | os.PathLike, named_tensors: Iterable[tuple[str, torch.Tensor]],
                  config: dict[str, Any]) -> Path:
    """Write a peft adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``) holding
    ``named_tensors`` (peft's saved names, copied to contiguous CPU tensors) and ``config``; returns it."""
    from safetensors.torch import save_file

    tensors = {name: t.detach().to("cpu").contiguous() for name, t in named_tensors}
    if not tensors:
        raise ValueError("an adapter needs at least one tensor")
    check_adapter_names(tensors)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    (folder / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True))
    return folder
