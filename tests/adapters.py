"""A peft LoRA policy with random adapters, built by the tests of the adapter-only weight sync."""

from __future__ import annotations

import torch


def random_adapter(base_dir, seed: int, *, rank: int, alpha: int, targets="all-linear", scale: float = 0.3):
    """A peft LoRA model (``rank``, ``alpha``, on ``targets``) on the model folder ``base_dir`` whose ``B`` factors
    are drawn from N(0, ``scale``^2) with ``seed`` (so the adapted policy differs from the base), in eval mode;
    with its adapter's saved tensors (peft's saved names) and its configuration as the actor reports it."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    from grpo_dist.training.lora import adapter_config_dict

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32),
                           LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    return model.eval(), get_peft_model_state_dict(model), adapter_config_dict(model)
