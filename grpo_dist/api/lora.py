"""LoRA in the in-process API: the policy as a peft model whose adapters alone are trained, and the
reference as the same model with its adapters switched off.

With ``lora_rank = r > 0`` the Hugging Face causal LM given to :class:`~grpo_dist.api.GRPO` is wrapped
by the distributed actor's :func:`grpo_dist.training.lora.add_adapters` (peft's ``get_peft_model``):
every target linear layer ``y = W x + b`` becomes ``y = W x + b + (alpha / r) * B (A dropout(x))``
with ``W``, ``b`` frozen, ``A`` [r, in] drawn from the API's ``seed`` and ``B`` [out, r] zero, so the
adapted model starts as the base model. A model that already is a peft model is trained as it is
(whatever it marks ``requires_grad``: its adapters).

The reference of a peft policy (when no ``ref_model`` is given) is :class:`AdaptersOff`: the policy's
own forward inside peft's ``disable_adapter()``, which is the frozen base model; no copy of the base
weights is made.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from grpo_dist.api.models import is_hf_causal_lm, is_peft_model
from grpo_dist.training.lora import unmatched_targets
from grpo_dist.training.settings import LoraSettings


def check_lora_model(model: nn.Module, lora: LoraSettings) -> None:
    """``lora_rank > 0`` needs a Hugging Face causal LM that is not a peft model yet, and target modules
    that each match one of its linear layers (peft's matching rules,
    :func:`grpo_dist.training.lora.unmatched_targets`). Nothing is checked with ``lora_rank == 0``."""
    if not lora.enabled:
        return
    if is_peft_model(model):
        raise ValueError(f"GRPO lora_rank={lora.rank} with a model that already is a peft model: its adapters are "
                         "trained as they are; pass lora_rank=0 (the default) to train them, or the base model to "
                         "get new adapters")
    if not is_hf_causal_lm(model):
        raise ValueError(f"GRPO lora_rank={lora.rank} needs a Hugging Face causal LM (a transformers "
                         f"PreTrainedModel) or a peft model, got {type(model).__name__}: wrap a plain module with "
                         "peft yourself (peft.get_peft_model) and pass lora_rank=0, or train it fully with lora_rank=0")
    linear = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    missing = unmatched_targets(linear, lora)
    if missing:
        leaves = sorted({name.rsplit(".", 1)[-1] for name in linear})
        raise ValueError(f"GRPO lora_target_modules {missing} match no linear layer of the model (the output layer "
                         f"does not count for 'all-linear'); its linear layers are named {leaves}")


class AdaptersOff:
    """The reference of a peft policy: calls the policy with every adapter disabled (peft's
    ``disable_adapter()``), which is its frozen base model.

    Not an ``nn.Module`` on purpose: it holds the policy's own weights, and what is done to a reference
    (frozen, moved, put in eval mode) must not be done to the policy through it.
    """

    def __init__(self, policy: nn.Module) -> None:
        if not is_peft_model(policy):
            raise ValueError(f"AdaptersOff needs a peft model, got {type(policy).__name__}")
        self.policy = policy

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.policy.disable_adapter():
            return self.policy(*args, **kwargs)

    def get_output_embeddings(self) -> nn.Module | None:
        """The policy's output layer (the reference forward reads logits only where it needs them, as
        the policy's does)."""
        get = getattr(self.policy, "get_output_embeddings", None)
        return get() if callable(get) else None
