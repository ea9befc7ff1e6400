"""The critic under FSDP2: a value model, its values of the response tokens and the value-loss update.

One :class:`FSDPCritic` per data-parallel rank; every public method is collective and must be called
on all ranks in the same order (a Ray worker group does this). No Ray, no vLLM here.

The value model
---------------
A causal-LM backbone with a scalar head, loaded with ``AutoModelForTokenClassification`` and
``num_labels=1`` (verl's choice): a causal LM's folder gets a new head (drawn from the settings'
seed, the same on every rank), a folder saved that way (by verl, or by this critic's Hugging Face
export) keeps its trained head.

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
import torch.distributed as dist
from torch import nn
from transformers import AutoModelForTokenClassification

from grpo_dist.core.losses import AggSpec, global_counts
from grpo_dist.core.value import value_loss
from grpo_dist.distributed.process_group import all_reduce_sum, comm_device, make_device_mesh
from grpo_dist.training import checkpoint_io
from grpo_dist.training.dtypes import to_dtype
from grpo_dist.training.memory import forward_token_budget, resolve_auto_settings
from grpo_dist.training.micro_batches import plan_micro_batches, restore_order, take_rows
from grpo_dist.training.model_builder import build_fsdp_model, model_config, require_process_group, to_torch_device
from grpo_dist.training.optim import clip_grad_norm, make_adamw, make_lr_scheduler, move_optimizer_state
from grpo_dist.training.model_forward import forward_at, response_positions, to_response_grid
from grpo_dist.training.policy import require_keys
from grpo_dist.training.settings import CRITIC_UPDATE_KEYS, FORWARD_KEYS, CriticSettings
from grpo_dist.training.update import clip_and_step, run_mini_batches

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
    if input_ids.shape != attention_mask.shape or input_ids.shape != position_ids.shape:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)}, attention_mask {tuple(attention_mask.shape)} and "
            f"position_ids {tuple(position_ids.shape)} must have the same [B, P+R] shape"
        )
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


class FSDPCritic:
    """The value model on one data-parallel rank (FSDP2-sharded), with AdamW and its LR schedule.

    The default process group must already be initialised with ``world_size`` ranks. Every method is
    collective. Dropout is zeroed at load; the model is in train mode only inside
    :meth:`update_critic`.
    """

    def __init__(
        self,
        model_path: str | os.PathLike,
        settings: CriticSettings,
        *,
        rank: int,
        world_size: int,
        device: str | torch.device,
    ) -> None:
        require_process_group("FSDPCritic", rank, world_size)
        self.settings = settings
        self.model_path = str(model_path)
        self.rank, self.world_size = rank, world_size
        self.device = to_torch_device(device)
        self.mesh = make_device_mesh(world_size, self.device.type)
        overrides = {**(settings.override_config or {}), **VALUE_HEAD_CONFIG}
        # "auto" gradient checkpointing / micro-batches: decided from the model's config and this rank's memory
        self.forward_dynamic = settings.use_dynamic_bsz
        """How value forwards are cut (the setting as given: an auto update cut does not change them)."""
        hf_config = model_config(self.model_path, overrides, trust_remote_code=settings.trust_remote_code)
        self.settings, self.memory_note = resolve_auto_settings(
            settings, hf_config, device=self.device, world_size=world_size, compute_dtype=to_dtype(settings.param_dtype),
            value_head=True)
        settings = self.settings
        self.forward_max_tokens, _ = forward_token_budget(
            hf_config, device=self.device, world_size=world_size, compute_dtype=to_dtype(settings.param_dtype),
            max_seq_len=settings.max_seq_len, fused_head=True)
        """Token budget of a value forward without a micro-batch size (null: as many rows as fit)."""
        # a head missing from the checkpoint is drawn from the seed: the same on every rank (each rank
        # loads the whole model and keeps its shard), and the process's own RNG is left as it was
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(settings.seed)
            self.model = build_fsdp_model(
                model_path,
                mesh=self.mesh,
                device=self.device,
                model_dtype=settings.model_dtype,
                param_dtype=settings.param_dtype,
                reduce_dtype=settings.reduce_dtype,
                trainable=True,
                attn_implementation=settings.attn_implementation,
                model_class=AutoModelForTokenClassification,
                config_overrides=overrides,
                gradient_checkpointing=settings.enable_gradient_checkpointing,
                reshard_after_forward=settings.reshard_after_forward,
                cpu_offload=settings.param_offload,
                trust_remote_code=settings.trust_remote_code,
            )
        # what export_hf writes: the folder's config (dropout as shipped) as a value model
        self.config = model_config(self.model_path, overrides, trust_remote_code=settings.trust_remote_code)
        self.config.architectures = [type(self.model).__name__.removeprefix("FSDP")]
        self.optimizer = make_adamw(self.model, lr=settings.lr, betas=settings.betas, weight_decay=settings.weight_decay)
        self.lr_scheduler = make_lr_scheduler(
            self.optimizer, kind=settings.lr_scheduler_type, warmup_steps=settings.lr_warmup_steps,
            warmup_ratio=settings.lr_warmup_steps_ratio, total_steps=settings.total_training_steps,
            min_lr_ratio=settings.min_lr_ratio, num_cycles=settings.num_cycles,
            zero_indexed_step=settings.zero_indexed_step,
        )
        self.update_count = 0
        """update_critic calls so far (= scheduler steps)."""
        self.nonfinite_grad_norm_total = 0
        self.defer_grad_sync = world_size == 1
        """One rank: reduce gradients once per mini-batch, not per micro-batch (as the actor)."""

    # ------------------------------------------------------------------------------------------
    @property
    def _offload_optimizer(self) -> bool:
        return self.settings.optimizer_offload and not self.settings.param_offload and self.device.type != "cpu"

    @property
    def _comm_device(self) -> torch.device:
        return comm_device(self.device)

    def _all_reduce_sum(self, values: list[float]) -> list[float]:
        return all_reduce_sum(values, self.device)

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
        n = data["responses"].shape[0]
        rows_range = torch.tensor([n, -n], dtype=torch.long, device=self._comm_device)
        dist.all_reduce(rows_range, op=dist.ReduceOp.MAX)
        if int(rows_range[0]) != -int(rows_range[1]):
            raise ValueError(
                f"update_critic: ranks hold different row counts ({-int(rows_range[1])}..{int(rows_range[0])}); "
                "each rank must get the same number of rows (see rank_shard_indices)"
            )
        mini = s.ppo_mini_batch_size_per_gpu or n
        if n == 0 or n % mini:
            raise ValueError(
                f"update_critic got {n} rows on rank {self.rank}: must be a positive multiple of "
                f"ppo_mini_batch_size_per_gpu={mini} (critic.ppo_mini_batch_size * rollout.n / world_size)"
            )
        cpu_data = {k: data[k] for k in CRITIC_UPDATE_KEYS}
        micro_kwargs = ({"max_token_len": s.ppo_max_token_len_per_gpu} if s.use_dynamic_bsz
                        else {"micro_batch_size": s.ppo_micro_batch_size_per_gpu or mini})
        if self._offload_optimizer:
            move_optimizer_state(self.optimizer, self.device)
        self.model.train()
        lr = self.lr_scheduler.get_last_lr()[0]
        # with epochs_in_rows the caller laid out every epoch's (shuffled) mini-batches in the rows
        out, nonfinite = run_mini_batches(
            lambda rows: self._mini_batch_step(take_rows(cpu_data, rows), micro_kwargs),
            [torch.arange(k * mini, (k + 1) * mini) for k in range(n // mini)],
            epochs=1 if s.epochs_in_rows else s.ppo_epochs,
        )
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
            self.lr_scheduler.step()
        self.model.eval()
        self.update_count += 1
        self.nonfinite_grad_norm_total += nonfinite
        if self._offload_optimizer:
            move_optimizer_state(self.optimizer, "cpu")
        out["critic/lr"] = float(lr)
        out["critic/grad_norm_nonfinite_count"] = float(nonfinite)
        return out

    def _mini_batch_step(self, mb_data: dict[str, torch.Tensor], micro_kwargs: dict[str, int]) -> tuple[dict[str, float], bool]:
        """Forward/backward over the micro-batches of one mini-batch, then clip and step."""
        s = self.settings
        tokens, seqs = global_counts(mb_data["response_mask"])
        g_tokens, g_seqs = self._all_reduce_sum([tokens, seqs])
        spec = AggSpec(mode=s.loss_agg_mode, global_tokens=g_tokens, global_seqs=g_seqs, norm_constant=s.norm_constant)
        R = mb_data["responses"].shape[1]
        # local sums (0-dim tensors on the device, read once per mini-batch): the loss pieces add up to
        # the mini-batch's loss; the token means are weighted by their micro-batch's token count
        sums = {name: torch.zeros((), dtype=torch.float64, device=self.device) for name in ("vf_loss", "vf_clipfrac", "vpred_mean")}
        micro = plan_micro_batches(mb_data["attention_mask"], **micro_kwargs)
        for i, idx in enumerate(micro):
            if self.defer_grad_sync:
                self.model.set_requires_gradient_sync(i == len(micro) - 1)
            mb = {k: v.to(self.device, non_blocking=True) for k, v in take_rows(mb_data, idx).items()}
            mask = mb["response_mask"]
            vpreds = forward_values(self.model, mb["input_ids"], mb["attention_mask"], mb["position_ids"], response_length=R,
                                    remove_padding=s.use_remove_padding)
            loss, metrics = value_loss(vpreds, mb["values"].float(), mb["returns"].float(), mask,
                                       cliprange_value=s.cliprange_value, agg=spec)
            (loss * self.world_size).backward()
            n_tok = mask.detach().double().sum()
            sums["vf_loss"] += loss.detach().double()
            sums["vf_clipfrac"] += metrics["vf_clipfrac"].double() * n_tok
            sums["vpred_mean"] += metrics["vpred_mean"].double() * n_tok
        names = ("vf_loss", "vf_clipfrac", "vpred_mean")
        totals = dict(zip(names, self._all_reduce_sum(torch.stack([sums[k] for k in names]).tolist()), strict=True))
        for name in ("vf_clipfrac", "vpred_mean"):
            totals[name] = totals[name] / g_tokens if g_tokens > 0 else 0.0
        grad_norm, finite = clip_and_step(self.model, self.optimizer, s.grad_clip, clip_grad_norm)
        metrics = {f"critic/{name}": value for name, value in totals.items()}
        metrics["critic/grad_norm"] = grad_norm
        return metrics, finite

    # ------------------------------------------------------------------------------------------
    def save_checkpoint(self, directory: str | os.PathLike) -> None:
        """Collective: sharded model + optimizer (DCP) and per-rank scheduler/RNG/counters; with
        ``settings.export_hf`` also a Hugging Face export under ``directory/huggingface``."""
        checkpoint_io.save_train_state(
            directory, self.model, self.optimizer, self.lr_scheduler,
            extra={"update_count": self.update_count, "nonfinite_grad_norm_total": self.nonfinite_grad_norm_total},
            contents=self.settings.save_contents,
        )
        if self.settings.export_hf:
            self.export_hf(os.path.join(directory, "huggingface"))

    def load_checkpoint(self, directory: str | os.PathLike) -> None:
        """Collective: restore what :meth:`save_checkpoint` wrote (the world size may differ)."""
        extra = checkpoint_io.load_train_state(directory, self.model, self.optimizer, self.lr_scheduler,
                                               contents=self.settings.load_contents)
        self.update_count = int(extra["update_count"])
        self.nonfinite_grad_norm_total = int(extra["nonfinite_grad_norm_total"])
        if self._offload_optimizer:
            move_optimizer_state(self.optimizer, "cpu")

    def export_hf(self, directory: str | os.PathLike, tokenizer_path: str | os.PathLike | None = None) -> None:
        """Collective: rank 0 writes the value model as a Hugging Face folder that
        ``AutoModelForTokenClassification`` (and ``critic.model.path``) loads, head included."""
        checkpoint_io.export_hf(directory, self.model, config=self.config, tokenizer_path=tokenizer_path)
