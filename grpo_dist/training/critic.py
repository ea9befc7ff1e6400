"""The critic under FSDP2: a value model, its values of the response tokens and the value-loss update.

One :class:`FSDPCritic` per data-parallel rank; every public method is collective and must be called
on all ranks in the same order (a Ray worker group does this). No Ray, no vLLM here.

The value model
---------------
A causal-LM backbone with a scalar head, loaded with ``AutoModelForTokenClassification`` and
``num_labels=1`` (verl's choice): a causal LM's folder gets a new head (drawn from the settings'
seed, the same on every rank), a folder saved that way (by verl, or by this critic's Hugging Face
export) keeps its trained head. With ``settings.lora`` enabled the backbone is frozen under LoRA
adapters and the head stays trained in full (:mod:`grpo_dist.training.critic_lora`); the optimizer holds
only those parameters.

Values are read where the policy's log-probs are: the batch is a left-padded prompt (P) followed by
a right-padded response (R), and the value of response token ``t`` is the head's output at position
``P - 1 + t``, the position whose hidden state predicts that token (the state before it is chosen).

Data layout and loss
--------------------
:meth:`FSDPCritic.update_critic` takes rank ``r``'s rows laid out as the actor's update does
(:func:`grpo_dist.training.micro_batches.rank_shard_indices`): ``M`` contiguous equal chunks, chunk
``k`` being rank ``r``'s share of global mini-batch ``k``. Each mini-batch's token and sequence counts
are summed over all ranks; every micro-batch adds its piece of the mini-batch's value loss
(:func:`grpo_dist.core.value.value_loss`) and back-propagates ``loss * W`` (FSDP2 averages gradients
over the ``W`` ranks), so the update does not depend on the micro-batch size, the token budget or
the number of ranks (up to float rounding).

Metrics (verl's names)
----------------------
``critic/vf_loss`` (the mini-batch's value loss), ``critic/vf_clipfrac`` and ``critic/vpred_mean``
(token means over the mini-batch), ``critic/grad_norm``: each averaged over the step's mini-batches
and epochs; ``critic/lr`` (the rate of this step) and ``critic/grad_norm_nonfinite_count`` (optimizer
steps skipped because the gradient norm was not finite).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping

import torch
from torch import nn
from transformers import AutoModelForTokenClassification

from grpo_dist.core.losses import AggSpec, global_counts
from grpo_dist.core.value import value_loss
from grpo_dist.training import checkpoint_io, fsdp
from grpo_dist.training.critic_lora import add_value_adapters, merged_value_state
from grpo_dist.training.dtypes import to_dtype
from grpo_dist.training.fsdp_role import FSDPRole
from grpo_dist.training.memory import forward_token_budget
from grpo_dist.training.micro_batches import plan_micro_batches, restore_order, take_rows
from grpo_dist.training.model_builder import load_hf_model, resolve_attn_implementation
from grpo_dist.training.model_forward import forward_at, response_positions, to_response_grid
from grpo_dist.training.policy import require_keys, require_same_shape
from grpo_dist.training.settings import CRITIC_UPDATE_KEYS, FORWARD_KEYS, CriticSettings

__all__ = ["FSDPCritic", "forward_values", "VALUE_HEAD_CONFIG"]

VALUE_HEAD_CONFIG = {"num_labels": 1}
"""Config fields of a value model: one output per position (verl: ``num_labels = 1``)."""


def forward_values(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    *,
    response_length: int,
    remove_padding: bool = False,
) -> torch.Tensor:
    """Value of each response token: the head's output at the position that predicts the token.

    Shapes: input_ids, attention_mask, position_ids [B, P+R] -> values_BR [B, R] float32 (the head's
    output at positions ``P-1 .. P+R-2``); positions that are not real response tokens hold 0. The
    model runs through the shared forward (:func:`grpo_dist.training.model_forward.forward_at`):
    padded, or packed with ``remove_padding``, and the head only at the response positions.
    Gradients flow under grad mode.
    """
    require_same_shape(input_ids, attention_mask, position_ids)
    B, total = input_ids.shape
    R = response_length
    row_M, col_M = response_positions(attention_mask, R)
    if row_M.numel() == 0:
        return torch.zeros(B, R, device=input_ids.device)
    with warnings.catch_warnings():
        # the token-classification head's output is a view; FSDP2 warns that an in-place op on it
        # would skip its backward hook, and nothing here modifies it in place
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
        out_M1 = forward_at(model, input_ids, attention_mask, position_ids, row_M, total - R - 1 + col_M,
                            remove_padding=remove_padding)
    return to_response_grid(out_M1[:, 0].float(), row_M, col_M, B, R)


class FSDPCritic(FSDPRole):
    """The value model on one data-parallel rank (FSDP2-sharded), with AdamW and its LR schedule
    (the scaffold: :class:`~grpo_dist.training.fsdp_role.FSDPRole`).

    The default process group must already be initialised with ``world_size`` ranks. Every method is
    collective. Dropout is zeroed at load; the model is in train mode only inside
    :meth:`update_critic`.
    """

    metric_prefix = "critic"

    def __init__(self, model_path: str | os.PathLike, settings: CriticSettings, *, rank: int, world_size: int,
                 device: str | torch.device) -> None:
        super().__init__(model_path, settings, rank=rank, world_size=world_size, device=device,
                         config_overrides={**(settings.override_config or {}), **VALUE_HEAD_CONFIG})
        self.forward_dynamic = settings.use_dynamic_bsz
        """How value forwards are cut (the setting as given: an auto update cut does not change them)."""
        # "auto" gradient checkpointing / micro-batches: decided from the model's config and this rank's memory
        self.resolve_memory(value_head=True)
        settings = self.settings
        self.forward_max_tokens, _ = forward_token_budget(
            self.config, device=self.device, world_size=world_size, compute_dtype=to_dtype(settings.param_dtype),
            max_seq_len=settings.max_seq_len, fused_head=True)
        """Token budget of a value forward without a micro-batch size (null: as many rows as fit)."""
        # a head missing from the checkpoint is drawn from the seed, the same on every rank
        if settings.lora.enabled:
            self._build_adapted_model()
        else:
            self.build_model(model_class=AutoModelForTokenClassification,
                             gradient_checkpointing=settings.enable_gradient_checkpointing, seed=settings.seed)
        self.build_optimizer()  # AdamW over the trainable parameters (with LoRA: adapters + value head)

    def _build_adapted_model(self) -> None:
        """Collective: :attr:`model` as :meth:`build_model` builds it (the same load, head drawn from the same
        seed, the same FSDP2 sharding), with LoRA adapters added before sharding
        (:func:`grpo_dist.training.critic_lora.add_value_adapters`: backbone frozen, adapters and value head
        trained)."""
        s = self.settings
        compute = to_dtype(s.param_dtype)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(s.seed)
            model = load_hf_model(
                self.model_path, dtype=to_dtype(s.model_dtype),
                attn_implementation=resolve_attn_implementation(s.attn_implementation, self.device, compute),
                model_class=AutoModelForTokenClassification, config_overrides=self.config_overrides,
                trust_remote_code=s.trust_remote_code)
        self.config.architectures = [type(model).__name__]
        if s.enable_gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model = add_value_adapters(model, s.lora)
        self.model = fsdp.apply_fsdp2(model, self.mesh, param_dtype=compute, reduce_dtype=s.reduce_dtype,
                                      reshard_after_forward=s.reshard_after_forward, cpu_offload=s.param_offload).eval()

    # ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def compute_values(self, data: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Values [B, R] (CPU float32, input row order) of this rank's rows, 0 outside ``response_mask``.

        Needs input_ids, attention_mask, position_ids, responses, response_mask. Micro-batches of
        ``forward_micro_batch_size_per_gpu`` rows, or by ``forward_max_token_len_per_gpu`` tokens with
        ``use_dynamic_bsz``; neither: as many rows at once as the rank's memory allows
        (:attr:`forward_max_tokens`).
        """
        s = self.settings
        require_keys(data, FORWARD_KEYS + ("response_mask",), "compute_values")
        self.model.eval()
        R = data["responses"].shape[1]
        if self.forward_dynamic:
            mbs = plan_micro_batches(data["attention_mask"], max_token_len=s.forward_max_token_len_per_gpu)
        elif s.forward_micro_batch_size_per_gpu is not None:
            mbs = plan_micro_batches(data["attention_mask"], micro_batch_size=s.forward_micro_batch_size_per_gpu)
        else:
            mbs = plan_micro_batches(data["attention_mask"], max_token_len=self.forward_max_tokens)
        if not mbs:
            return torch.zeros(0, R)
        pieces = []
        for idx in mbs:
            mb = {k: v.to(self.device, non_blocking=True) for k, v in take_rows({k: data[k] for k in FORWARD_KEYS}, idx).items()}
            pieces.append(forward_values(self.model, mb["input_ids"], mb["attention_mask"], mb["position_ids"],
                                         response_length=R, remove_padding=s.use_remove_padding).cpu())
        values_BR = restore_order(pieces, mbs)
        mask_BR = data["response_mask"].to(values_BR.dtype)
        return torch.where(mask_BR != 0, values_BR * mask_BR, torch.zeros_like(values_BR))

    def update_critic(self, data: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """One training step of the critic: ``ppo_epochs`` x mini-batches of optimizer steps, then one
        LR-schedule step. ``data``: this rank's rows (layout in the module docstring; keys
        :data:`~grpo_dist.training.settings.CRITIC_UPDATE_KEYS`). Returns verl-named metrics,
        identical on all ranks."""
        s = self.settings
        require_keys(data, CRITIC_UPDATE_KEYS, "update_critic")
        n, mini = self.check_update_rows(data, s.ppo_mini_batch_size_per_gpu, where="update_critic",
                                         size_name="ppo_mini_batch_size_per_gpu",
                                         size_origin=" (critic.ppo_mini_batch_size * rollout.n / world_size)")
        cpu_data = {k: data[k] for k in CRITIC_UPDATE_KEYS}
        micro_kwargs = s.micro_batch_cut(mini)
        # with epochs_in_rows the caller laid out every epoch's (shuffled) mini-batches in the rows
        return self.run_update(lambda rows: self._mini_batch_step(take_rows(cpu_data, rows), micro_kwargs),
                               n, mini, epochs=s.update_epochs)

    def _mini_batch_step(self, mb_data: dict[str, torch.Tensor], micro_kwargs: dict[str, int]) -> tuple[dict[str, float], bool]:
        """Forward/backward over the micro-batches of one mini-batch, then clip and step."""
        s = self.settings
        tokens, seqs = global_counts(mb_data["response_mask"])
        g_tokens, g_seqs = self._all_reduce_sum([tokens, seqs])
        spec = AggSpec(mode=s.loss_agg_mode, global_tokens=g_tokens, global_seqs=g_seqs, norm_constant=s.norm_constant)
        R = mb_data["responses"].shape[1]

        def piece(mb: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            # the loss pieces add up to the mini-batch's loss; the token means are weighted by their
            # micro-batch's token count
            mask = mb["response_mask"]
            vpreds = forward_values(self.model, mb["input_ids"], mb["attention_mask"], mb["position_ids"], response_length=R,
                                    remove_padding=s.use_remove_padding)
            loss, metrics = value_loss(vpreds, mb["values"].float(), mb["returns"].float(), mask,
                                       cliprange_value=s.cliprange_value, agg=spec)
            n_tok = mask.detach().double().sum()
            return loss, {"vf_loss": loss.detach().double(), "vf_clipfrac": metrics["vf_clipfrac"].double() * n_tok,
                          "vpred_mean": metrics["vpred_mean"].double() * n_tok}

        totals = self.backward_micro_batches(mb_data, plan_micro_batches(mb_data["attention_mask"], **micro_kwargs), piece,
                                             ("vf_loss", "vf_clipfrac", "vpred_mean"))
        for name in ("vf_clipfrac", "vpred_mean"):
            totals[name] = totals[name] / g_tokens if g_tokens > 0 else 0.0
        grad_norm, finite = self.clip_and_step()
        metrics = {f"critic/{name}": value for name, value in totals.items()}
        metrics["critic/grad_norm"] = grad_norm
        return metrics, finite

    # ------------------------------------------------------------------------------------------
    def save_checkpoint(self, directory: str | os.PathLike) -> None:
        """Collective: sharded model + optimizer (DCP) and per-rank scheduler/RNG/counters; with
        ``settings.export_hf`` also a Hugging Face export under ``directory/huggingface``. With LoRA the
        sharded model and optimizer state are those of the trainable parameters alone, the adapters and the
        value head (the frozen backbone is the model folder's), with ``lora.json``
        (:meth:`FSDPRole.save_checkpoint`)."""
        super().save_checkpoint(directory)
        if self.settings.export_hf:
            self.export_hf(os.path.join(directory, "huggingface"))

    def export_hf(self, directory: str | os.PathLike, tokenizer_path: str | os.PathLike | None = None) -> None:
        """Collective: rank 0 writes the value model as a Hugging Face folder that
        ``AutoModelForTokenClassification`` loads, head included; with LoRA the merged weights under the
        value model's own names (:func:`grpo_dist.training.critic_lora.merged_value_state`)."""
        merged = merged_value_state(self.model, fsdp.full_state_dict(self.model)) if self.settings.lora.enabled else None
        checkpoint_io.export_hf(directory, self.model, config=self.config, tokenizer_path=tokenizer_path,
                                state_dict=merged)
