"""The frozen reference policy under FSDP2: reference log-probs for the KL term.

Collective like the actor: every rank calls :meth:`FSDPReference.compute_ref_log_prob` with its own
rows (the same number of rows on every rank).

Iterative RL resets the reference to the current policy (:meth:`FSDPReference.load_full_weights`,
fed by the same bucketed transfer as the actor -> rollout weight sync); from then on its weights are
no longer those of its folder, so they are checkpointed (:meth:`FSDPReference.save_checkpoint`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from grpo_dist.distributed.process_group import make_device_mesh
from grpo_dist.training import checkpoint_io
from grpo_dist.training.dtypes import to_dtype
from grpo_dist.training.memory import forward_token_budget
from grpo_dist.training.model_builder import build_fsdp_model, model_config, require_process_group, to_torch_device
from grpo_dist.training.policy import batched_logprobs
from grpo_dist.training.settings import ReferenceSettings

__all__ = ["FSDPReference", "AdapterOffReference"]


def _ref_logprobs(model, settings: ReferenceSettings, data: Mapping[str, torch.Tensor], *, device: torch.device,
                  micro_batch_size: int | None, max_token_len: int | None, default_max_tokens: int | None,
                  temperature: float) -> torch.Tensor:
    """Log-probs [B, R] of ``data``'s responses under ``model`` (no grad), cut by count or token budget
    (neither: ``default_max_tokens``), with the settings' forward knobs."""
    if micro_batch_size is not None and max_token_len is not None:
        raise ValueError("give micro_batch_size or max_token_len, not both")
    if micro_batch_size is None and max_token_len is None:
        max_token_len = default_max_tokens
    logp, _ = batched_logprobs(
        model,
        data,
        device=device,
        micro_batch_size=micro_batch_size,
        max_token_len=max_token_len,
        temperature=temperature,
        compute_entropy=False,
        remove_padding=settings.use_remove_padding,
        fused=settings.use_fused_kernels,
        logits_chunk_size=settings.logprob_chunk_size,
    )
    return logp


class FSDPReference:
    """A frozen copy of the initial policy (no grad, eval mode), sharded with FSDP2.

    The weights are loaded in ``param_dtype`` (no separate master copy: nothing is trained). The
    keyword arguments after ``device`` are the fields of
    :class:`~grpo_dist.training.settings.ReferenceSettings` (kept as ``self.settings``).
    """

    memory_note: str | None = None
    """Nothing of the reference is chosen from the rank's memory (the worker shell asks every role)."""

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        rank: int,
        world_size: int,
        device: str | torch.device,
        param_dtype: str = "float32",
        param_offload: bool = False,
        reshard_after_forward: bool = True,
        attn_implementation: str = "auto",
        trust_remote_code: bool = False,
        override_config: dict | None = None,
        use_remove_padding: bool = False,
        use_fused_kernels: bool = False,
        logprob_chunk_size: int | None = None,
    ) -> None:
        require_process_group("FSDPReference", rank, world_size)
        self.settings = ReferenceSettings(
            param_dtype=param_dtype,
            param_offload=param_offload,
            reshard_after_forward=reshard_after_forward,
            attn_implementation=attn_implementation,
            trust_remote_code=trust_remote_code,
            override_config=override_config,
            use_remove_padding=use_remove_padding,
            use_fused_kernels=use_fused_kernels,
            logprob_chunk_size=logprob_chunk_size,
        )
        self.rank, self.world_size = rank, world_size
        self.device = to_torch_device(device)
        self.mesh = make_device_mesh(world_size, self.device.type)
        self.model = build_fsdp_model(
            model_path,
            mesh=self.mesh,
            device=self.device,
            model_dtype=param_dtype,
            param_dtype=param_dtype,
            reduce_dtype=param_dtype,
            trainable=False,
            attn_implementation=attn_implementation,
            reshard_after_forward=reshard_after_forward,
            cpu_offload=param_offload,
            trust_remote_code=trust_remote_code,
            config_overrides=override_config,
        )
        self.forward_max_tokens, _ = forward_token_budget(
            model_config(model_path, override_config, trust_remote_code=trust_remote_code), device=self.device,
            world_size=world_size, compute_dtype=to_dtype(param_dtype), max_seq_len=None,
            fused_head=use_fused_kernels, trainable=False)
        """Token budget of a forward given neither a micro-batch size nor a budget (null: auto)."""

    def compute_ref_log_prob(
        self,
        data: Mapping[str, torch.Tensor],
        *,
        micro_batch_size: int | None = None,
        max_token_len: int | None = None,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """Reference log-probs [B, R] (CPU float32, input row order) of this rank's rows.

        Needs input_ids, attention_mask, position_ids, responses. Micro-batches by count or by token
        budget (neither: as many rows at once as the rank's memory allows, :attr:`forward_max_tokens`).
        ``temperature`` must be the rollout's, as for the actor.
        """
        return _ref_logprobs(self.model, self.settings, data, device=self.device, micro_batch_size=micro_batch_size,
                             max_token_len=max_token_len, default_max_tokens=self.forward_max_tokens,
                             temperature=temperature)

    def load_full_weights(self, named: dict[str, torch.Tensor]) -> None:
        """Collective: replace every weight with the full (unsharded) tensors of ``named`` (Hugging Face
        names, as the actor's state dict; each rank passes all of them and keeps its shard). Every
        weight must be given: a reference partly reset would be neither the old policy nor the new."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        expected = set(self.model.state_dict())
        missing, unknown = sorted(expected - set(named)), sorted(set(named) - expected)
        if missing or unknown:
            raise ValueError(f"reference reset: weights missing {missing[:3]}, unknown {unknown[:3]} "
                             f"({len(missing)} missing, {len(unknown)} unknown)")
        set_model_state_dict(self.model, named, options=StateDictOptions(full_state_dict=True))

    def save_checkpoint(self, directory: str | os.PathLike) -> None:
        """Collective: the reference's weights (sharded, DCP)."""
        checkpoint_io.save_model_sharded(directory, self.model)

    def load_checkpoint(self, directory: str | os.PathLike) -> None:
        """Collective: restore what :meth:`save_checkpoint` wrote."""
        checkpoint_io.load_model_sharded(directory, self.model)


class AdapterOffReference:
    """The reference under LoRA: the policy's own model (an :class:`~grpo_dist.training.actor.FSDPActor`
    with peft adapters, in the same process) with its adapters switched off (peft's
    ``disable_adapter()``), which is the frozen base model: no second copy of the weights.

    Answers :meth:`FSDPReference.compute_ref_log_prob`; the forward knobs are ``settings``' (the
    reference's), the device, the token budget and the weights the policy's. A reset to the policy
    (iterative RL) is not built for it: validation refuses it with LoRA.
    """

    memory_note: str | None = None

    def __init__(self, policy, settings: ReferenceSettings) -> None:
        if not policy.settings.lora.enabled:
            raise ValueError("AdapterOffReference needs a policy with LoRA adapters (lora.rank > 0)")
        self.policy, self.settings = policy, settings

    def compute_ref_log_prob(self, data: Mapping[str, torch.Tensor], *, micro_batch_size: int | None = None,
                             max_token_len: int | None = None, temperature: float = 1.0) -> torch.Tensor:
        """Reference log-probs [B, R] (as :meth:`FSDPReference.compute_ref_log_prob`) of the base model."""
        model = self.policy.model
        model.eval()
        with model.disable_adapter():
            return _ref_logprobs(model, self.settings, data, device=self.policy.device,
                                 micro_batch_size=micro_batch_size, max_token_len=max_token_len,
                                 default_max_tokens=self.policy.forward_max_tokens, temperature=temperature)
