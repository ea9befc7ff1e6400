"""The models: a plain ``torch.nn.Module`` (``forward(input_ids) -> logits``) or a Hugging Face causal
LM (called with attention mask and position ids), how each is called, probed for its vocabulary,
and where its pad and EOS ids come from.
"""

from __future__ import annotations

import numbers
import sys
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from grpo_dist.api.options import check_int


class LogitsOnly(nn.Module):
    """Calls a plain module as ``forward(input_ids)``: the keyword call that
    :func:`~grpo_dist.training.policy.forward_logprobs` makes (Hugging Face's) is reduced to it."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: torch.Tensor, **_hf_keywords: Any) -> SimpleNamespace:
        return SimpleNamespace(logits=logits_of(self.inner(input_ids)))


def logits_of(output: Any) -> Any:
    """A forward's logits: its ``.logits``, or the output itself (a plain module's tensor)."""
    return output.logits if hasattr(output, "logits") else output


def is_peft_model(model: nn.Module) -> bool:
    """A peft model (``peft.PeftModel``: adapters around a base model). Like :func:`is_hf_causal_lm`,
    this never imports peft: a peft model can exist only once it is imported."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def base_model_of(model: nn.Module) -> nn.Module:
    """The model a peft model wraps (its forward runs through the adapters unless they are disabled);
    any other model itself."""
    return model.get_base_model() if is_peft_model(model) else model


def is_hf_causal_lm(model: nn.Module) -> bool:
    """A Hugging Face ``PreTrainedModel``, or a peft model around one (called with attention mask and
    position ids, sampled with ``generate``). A model of that class can exist only once transformers is
    imported, so this never imports it."""
    transformers = sys.modules.get("transformers")
    return transformers is not None and isinstance(base_model_of(model), transformers.PreTrainedModel)


def policy_module(model: Any, is_hf: bool) -> Any:
    """What :func:`micro_batch_loss` / :func:`forward_logprobs` call, for a module or a callable that
    stands for one (:class:`~grpo_dist.api.lora.AdaptersOff`)."""
    return model if is_hf else LogitsOnly(model)


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (the CPU for a model without parameters)."""
    first = next(iter(model.parameters()), None)
    return first.device if first is not None else torch.device("cpu")


# ----------------------------------------------------------------------------------------------
# pad and EOS ids
# ----------------------------------------------------------------------------------------------
def _config_id(model: nn.Module, name: str) -> Any:
    """``name`` from the model's generation config, then its config (Hugging Face models only)."""
    model = base_model_of(model)
    for cfg in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        value = getattr(cfg, name, None) if cfg is not None else None
        if value is not None:
            return value
    return None


def resolve_pad(pad_token_id: int | None, *, model: nn.Module, is_hf: bool, tokenizer: Any) -> int | None:
    """The given id, else the tokenizer's, else (Hugging Face) the model config's; None: prompts are not padded."""
    if pad_token_id is None and tokenizer is not None:
        pad_token_id = tokenizer.pad_token_id
    if pad_token_id is None and is_hf:
        pad_token_id = _config_id(model, "pad_token_id")
    if pad_token_id is not None:
        check_int("pad_token_id", pad_token_id, 0)
    return pad_token_id


def resolve_eos(eos_token_id: int | Sequence[int] | None, *, model: nn.Module, is_hf: bool, tokenizer: Any) -> list[int]:
    """The given id(s), else (Hugging Face) what ``generate`` stops on, else the tokenizer's; [] for none."""
    if eos_token_id is None and is_hf:  # what generate stops on (may list several ids)
        eos_token_id = _config_id(model, "eos_token_id")
    if eos_token_id is None and tokenizer is not None:
        eos_token_id = tokenizer.eos_token_id
    if eos_token_id is None:
        return []
    ids = [eos_token_id] if isinstance(eos_token_id, numbers.Integral) else list(eos_token_id)
    return [check_int("eos_token_id", i, 0) for i in ids]


# ----------------------------------------------------------------------------------------------
# the probe
# ----------------------------------------------------------------------------------------------
def _call(model: nn.Module, input_ids: torch.Tensor, is_hf: bool) -> Any:
    """Logits of ``model`` on unpadded ``input_ids`` [B, T] (the probe)."""
    if is_hf:
        ones = torch.ones_like(input_ids)
        pos = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        return logits_of(model(input_ids=input_ids, attention_mask=ones, position_ids=pos, use_cache=False))
    return logits_of(model(input_ids))


@torch.no_grad()
def probe_vocab_size(model: nn.Module, name: str, *, is_hf: bool, device: torch.device) -> int:
    """Run ``model`` on a [2, 3] input; the vocabulary size V of its logits [2, 3, V]. ``ValueError``
    naming the argument ``name`` when it does not return such logits."""
    was_training = model.training
    model.eval()
    try:
        out = _call(model, torch.zeros((2, 3), dtype=torch.long, device=device), is_hf)
    finally:
        model.train(was_training)
    if not (isinstance(out, torch.Tensor) and out.dim() == 3 and tuple(out.shape[:2]) == (2, 3)
            and out.is_floating_point() and out.shape[2] >= 2):
        got = f"a tensor of shape {tuple(out.shape)} and dtype {out.dtype}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"GRPO {name}: forward(input_ids [2, 3]) must return float logits [2, 3, V] with V >= 2 "
                         f"(a tensor or an object with .logits), got {got}")
    return int(out.shape[2])
