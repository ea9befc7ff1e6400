"""The scaffold of a trained FSDP2 model role: the actor, the critic and the reward model are each one.

A role is one object per data-parallel rank; every public method is collective (all ranks call it in
the same order). :class:`FSDPRole` holds what the three do alike, and a role keeps what is its own:
its forward, its loss, its metrics. The worker shells (:mod:`grpo_dist.workers.shell`) drive any role
through the same surface (``save_checkpoint``, ``load_checkpoint``, ``export_hf``, ``memory_note``).

Building, from the settings' shared parts (:mod:`grpo_dist.training.settings`)
--------------------------------------------------------------------------------
- :meth:`FSDPRole.__init__`: the process group checked, the rank's device, a one-dimensional device
  mesh over the ranks, and the model folder's Hugging Face config with the role's overrides (what the
  memory plan reads and the Hugging Face export writes).
- :meth:`FSDPRole.resolve_memory`: the ``"auto"`` gradient checkpointing / micro-batch size decided
  from that config and the rank's memory (:class:`~grpo_dist.training.settings.MemorySettings`).
- :meth:`FSDPRole.build_model`: load and shard with FSDP2
  (:class:`~grpo_dist.training.settings.FSDPModelSettings`); with a seed, weights the folder lacks are
  drawn the same on every rank and the process's own RNG is left as it was.
- :meth:`FSDPRole.build_optimizer`: AdamW or another optimizer (:class:`~grpo_dist.training.settings.OptimizerSettings`)
  and, for settings with a :class:`~grpo_dist.training.settings.ScheduleSettings` part, its LR schedule.

One update call (:meth:`FSDPRole.run_update`)
---------------------------------------------
A rank's ``n`` rows are ``n / mini`` contiguous mini-batch chunks (one optimizer step each;
:func:`grpo_dist.training.micro_batches.rank_shard_indices`)::

    check_update_rows      every rank holds the same n, a positive multiple of the mini-batch size
    optimizer state to the device (optimizer_offload); train mode
    epochs x for each chunk: metrics, finite = step(rows of the chunk)       the role's step
    one LR-schedule step; eval mode; update_count += 1; optimizer state back to the CPU
    -> the mean of every metric over the steps, <prefix>/lr (the rate of this call),
       <prefix>/grad_norm_nonfinite_count (optimizer steps skipped: the norm was NaN or infinite)

A role's step (:meth:`FSDPRole.backward_micro_batches`, then :meth:`FSDPRole.clip_and_step`)::

    for each micro-batch:  loss, sums = piece(micro-batch on the device)      the role's loss
                           backward(loss * W)
    sums of every micro-batch, summed over the ranks (one all-reduce)
    grad_norm = global norm (clipped to grad_clip); optimizer step unless it is not finite

``loss`` is the micro-batch's piece of the whole mini-batch's loss (normalised by counts summed over
all ranks), and FSDP2 averages gradients over the ``W`` ranks, so back-propagating ``W`` times each
piece accumulates the gradient of the mini-batch's loss: the update depends neither on the
micro-batch size nor on the number of ranks (up to float rounding). On one rank the gradient
reduce-scatter runs once per mini-batch (:attr:`FSDPRole.defer_grad_sync`).

Checkpoints: the sharded model and optimizer (DCP) and, per rank, the LR schedule, the RNG and the
counters, as far as the settings' ``save_contents`` / ``load_contents`` ask
(:mod:`grpo_dist.training.checkpoint_io`); of a model with LoRA adapters, only the adapters and their
optimizer state, with ``lora.json`` saying what the adapters are.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.lr_scheduler import LambdaLR
from transformers import AutoModelForCausalLM

from grpo_dist.distributed.process_group import all_reduce_sum, comm_device, make_device_mesh
from grpo_dist.training import checkpoint_io
from grpo_dist.training.dtypes import to_dtype
from grpo_dist.training.memory import resolve_auto_settings
from grpo_dist.training.micro_batches import take_rows
from grpo_dist.training.model_builder import build_fsdp_model, model_config, require_process_group, to_torch_device
from grpo_dist.training.optim import clip_grad_norm, make_lr_scheduler, make_optimizer, move_optimizer_state
from grpo_dist.training.settings import ScheduleSettings
from grpo_dist.training.update import clip_and_step, run_mini_batches

__all__ = ["FSDPRole"]

Step = Callable[[torch.Tensor], tuple[Mapping[str, float], bool]]
"""A role's mini-batch step: this rank's rows of one mini-batch -> (its metrics, whether the optimizer
stepped)."""

Piece = Callable[[dict[str, torch.Tensor]], tuple[torch.Tensor, Mapping[str, torch.Tensor]]]
"""A role's loss on one micro-batch (on the device) -> (its piece of the mini-batch's loss, 0-dim float64
sums to add up over micro-batches and ranks)."""


class FSDPRole:
    """A trained model on one data-parallel rank (FSDP2-sharded), with AdamW (and its LR schedule).

    The default process group must already be initialised with ``world_size`` ranks. Dropout is zeroed
    at load; the model is in train mode only inside :meth:`run_update`. A role sets
    :attr:`metric_prefix` and builds its model and optimizer in its constructor with
    :meth:`build_model` and :meth:`build_optimizer`.
    """

    metric_prefix: ClassVar[str] = ""
    """Namespace of the role's metrics (``actor``, ``critic``, ``reward_model``)."""
    memory_note: str | None = None
    """What the auto memory choices chose and why (printed at start-up); None: nothing was auto."""

    def __init__(self, model_path: str | os.PathLike, settings: Any, *, rank: int, world_size: int,
                 device: str | torch.device, config_overrides: Mapping[str, Any] | None) -> None:
        require_process_group(type(self).__name__, rank, world_size)
        self.settings = settings
        self.model_path = str(model_path)
        self.rank, self.world_size = rank, world_size
        self.device = to_torch_device(device)
        self.mesh = make_device_mesh(world_size, self.device.type)
        self.config_overrides = config_overrides
        self.config = model_config(self.model_path, config_overrides, trust_remote_code=settings.trust_remote_code)
        """The folder's config with the role's overrides, dropout as shipped: what the memory plan reads
        and what :meth:`export_hf` writes."""
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.lr_scheduler: LambdaLR | None = None
        self.update_count = 0
        """Update calls so far (= LR-schedule steps)."""
        self.nonfinite_grad_norm_total = 0
        """Optimizer steps skipped so far because the gradient norm was not finite."""
        self.defer_grad_sync = world_size == 1
        """Run FSDP2's gradient reduce-scatter once per mini-batch (after its last micro-batch) instead
        of after every micro-batch; gradients accumulate unsharded in ``reduce_dtype`` meanwhile. On one
        rank the unsharded gradient is the sharded one, so this costs no memory and removes the
        per-micro-batch post-backward work (on a GPU that CPU-side work, not the math, bounds small
        models). With several ranks it would hold full-size gradients on every rank: off."""

    # ---- building ---------------------------------------------------------------------------------
    def resolve_memory(self, *, value_head: bool = False) -> None:
        """Collective: settle ``"auto"`` gradient checkpointing and micro-batch size from the model's
        config and this rank's memory (:func:`grpo_dist.training.memory.resolve_auto_settings`); sets
        :attr:`settings` and :attr:`memory_note`."""
        self.settings, self.memory_note = resolve_auto_settings(
            self.settings, self.config, device=self.device, world_size=self.world_size,
            compute_dtype=to_dtype(self.settings.param_dtype), value_head=value_head)

    def build_model(
        self,
        *,
        model_class: Any = AutoModelForCausalLM,
        trainable: bool = True,
        gradient_checkpointing: bool = False,
        seed: int | None = None,
        require_head: bool = False,
        lora: Any = None,
    ) -> None:
        """Collective: :attr:`model`, the folder loaded with ``model_class`` and sharded with FSDP2 as the
        settings' :class:`~grpo_dist.training.settings.FSDPModelSettings` say
        (:func:`~grpo_dist.training.model_builder.build_fsdp_model`). ``seed``: what the folder lacks (a
        new value head) is drawn from it, the same on every rank (each rank loads the whole model and
        keeps its shard), and the process's own RNG is left as it was. A head class other than the
        causal LM's is written into :attr:`config` (``architectures``) for the export. ``lora``: the
        :class:`~grpo_dist.training.settings.LoraSettings` of adapters to add (the actor's)."""
        s = self.settings

        def build() -> nn.Module:
            return build_fsdp_model(
                self.model_path,
                mesh=self.mesh,
                device=self.device,
                model_dtype=s.model_dtype,
                param_dtype=s.param_dtype,
                reduce_dtype=s.reduce_dtype,
                trainable=trainable,
                attn_implementation=s.attn_implementation,
                model_class=model_class,
                config_overrides=self.config_overrides,
                gradient_checkpointing=gradient_checkpointing,
                reshard_after_forward=s.reshard_after_forward,
                cpu_offload=s.param_offload,
                trust_remote_code=s.trust_remote_code,
                require_head=require_head,
                lora=lora,
            )

        if seed is None:
            self.model = build()
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                self.model = build()
        if model_class is not AutoModelForCausalLM:
            self.config.architectures = [type(self.model).__name__.removeprefix("FSDP")]

    def build_optimizer(self) -> None:
        """:attr:`optimizer` (AdamW, or the settings' optimizer class, over the trainable parameters) and, when the settings have a
        :class:`~grpo_dist.training.settings.ScheduleSettings` part, :attr:`lr_scheduler` (else the rate
        stays ``lr``)."""
        s = self.settings
        self.optimizer = make_optimizer(self.model, lr=s.lr, betas=s.betas, weight_decay=s.weight_decay,
                                        optimizer=s.optimizer, optimizer_impl=s.optimizer_impl, extra=s.optimizer_kwargs)
        if isinstance(s, ScheduleSettings):
            self.lr_scheduler = make_lr_scheduler(
                self.optimizer, kind=s.lr_scheduler_type, warmup_steps=s.lr_warmup_steps,
                warmup_ratio=s.lr_warmup_steps_ratio, total_steps=s.total_training_steps,
                min_lr_ratio=s.min_lr_ratio, num_cycles=s.num_cycles, zero_indexed_step=s.zero_indexed_step,
            )

    # ---- collectives and devices ------------------------------------------------------------------
    @property
    def _offload_optimizer(self) -> bool:
        return self.settings.optimizer_offload and not self.settings.param_offload and self.device.type != "cpu"

    @property
    def _comm_device(self) -> torch.device:
        return comm_device(self.device)

    def _all_reduce_sum(self, values: list[float]) -> list[float]:
        return all_reduce_sum(values, self.device)

    def _gradient_sync(self, i: int, count: int) -> None:
        """FSDP2's gradient reduce-scatter only after the last of ``count`` micro-batches
        (:attr:`defer_grad_sync`)."""
        self.model.set_requires_gradient_sync(i == count - 1)

    # ---- the update -------------------------------------------------------------------------------
    def check_update_rows(self, data: Mapping[str, torch.Tensor], mini_batch_size: int | None, *, where: str,
                          size_name: str, size_origin: str = "") -> tuple[int, int]:
        """Collective: ``(n, mini)``, this rank's row count and the mini-batch size (``mini_batch_size``;
        None: all ``n`` rows). ``ValueError`` (``where``: the method, ``size_name``/``size_origin``: the
        setting and where it comes from) unless every rank holds the same ``n``, a positive multiple
        of ``mini``."""
        n = data["responses"].shape[0]
        rows_range = torch.tensor([n, -n], dtype=torch.long, device=self._comm_device)
        dist.all_reduce(rows_range, op=dist.ReduceOp.MAX)
        if int(rows_range[0]) != -int(rows_range[1]):
            raise ValueError(
                f"{where}: ranks hold different row counts ({-int(rows_range[1])}..{int(rows_range[0])}); "
                "each rank must get the same number of rows (see rank_shard_indices)"
            )
        mini = mini_batch_size or n
        if n == 0 or n % mini:
            raise ValueError(f"{where} got {n} rows on rank {self.rank}: must be a positive multiple of "
                             f"{size_name}={mini}{size_origin}")
        return n, mini

    def run_update(self, step: Step, n: int, mini: int, *, epochs: int, summed: tuple[str, ...] = ()) -> dict[str, float]:
        """One update call over this rank's ``n`` rows (module docstring): ``epochs`` passes of
        ``step`` over the ``n / mini`` mini-batch chunks, then one LR-schedule step. ``summed``: metric
        names (prefixes) added up over the steps instead of averaged. Returns the metrics, with
        ``<prefix>/lr`` and ``<prefix>/grad_norm_nonfinite_count``."""
        if self._offload_optimizer:
            move_optimizer_state(self.optimizer, self.device)
        # train mode (Hugging Face gradient checkpointing only runs in it); dropout was zeroed at load,
        # so the update's forwards compute what the no-grad forwards compute
        self.model.train()
        lr = self.lr_scheduler.get_last_lr()[0] if self.lr_scheduler is not None else self.optimizer.param_groups[0]["lr"]
        out, nonfinite = run_mini_batches(step, [torch.arange(k * mini, (k + 1) * mini) for k in range(n // mini)],
                                          epochs=epochs, summed=summed)
        if self.lr_scheduler is not None:
            with warnings.catch_warnings():
                # torch warns when the schedule steps although every optimizer step was skipped
                warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
                self.lr_scheduler.step()
        self.model.eval()
        self.update_count += 1
        self.nonfinite_grad_norm_total += nonfinite
        if self._offload_optimizer:
            move_optimizer_state(self.optimizer, "cpu")
        out[f"{self.metric_prefix}/lr"] = float(lr)
        out[f"{self.metric_prefix}/grad_norm_nonfinite_count"] = float(nonfinite)
        return out

    def backward_micro_batches(self, mb_data: Mapping[str, torch.Tensor], micro_batches: Sequence[Sequence[int]],
                               piece: Piece, names: tuple[str, ...]) -> dict[str, float]:
        """Forward/backward of one mini-batch, micro-batch by micro-batch (module docstring): each
        micro-batch's rows of ``mb_data`` go to the device, ``piece`` gives its loss and its ``names``
        sums; the loss times ``W`` is back-propagated. Returns the sums over the micro-batches and the
        ranks (one all-reduce; the same on every rank)."""
        sums = {name: torch.zeros((), dtype=torch.float64, device=self.device) for name in names}
        for i, idx in enumerate(micro_batches):
            if self.defer_grad_sync:
                self._gradient_sync(i, len(micro_batches))
            mb = {k: v.to(self.device, non_blocking=True) for k, v in take_rows(mb_data, idx).items()}
            loss, parts = piece(mb)
            (loss * self.world_size).backward()  # FSDP2 averages gradients over the ranks
            for name in names:
                sums[name] += parts[name]
        return dict(zip(names, self._all_reduce_sum(torch.stack([sums[k] for k in names]).tolist()), strict=True))

    def clip_and_step(self) -> tuple[float, bool]:
        """Collective: ``(grad_norm, finite)``: the global gradient norm (clipped to ``grad_clip``), the
        optimizer step unless it is not finite, the gradients zeroed."""
        return clip_and_step(self.model, self.optimizer, self.settings.grad_clip, clip_grad_norm)

    # ---- checkpoints ------------------------------------------------------------------------------
    def save_checkpoint(self, directory: str | os.PathLike) -> None:
        """Collective: sharded model + optimizer (DCP) and per-rank scheduler/RNG/counters, as far as
        ``settings.save_contents`` asks (the counters always). A model with LoRA adapters: the adapters and
        their optimizer state alone (the frozen base is the model folder's), and ``lora.json``, what the
        adapters are (:func:`grpo_dist.training.lora.lora_layout`), which :meth:`load_checkpoint` checks."""
        from grpo_dist.training.lora import lora_layout

        layout = lora_layout(self.model)
        checkpoint_io.save_train_state(
            directory, self.model, self.optimizer, self.lr_scheduler,
            extra={"update_count": self.update_count, "nonfinite_grad_norm_total": self.nonfinite_grad_norm_total},
            contents=self.settings.save_contents, trainable_only=layout is not None,
        )
        if layout is not None:
            checkpoint_io.write_adapter_layout(directory, layout)

    def load_checkpoint(self, directory: str | os.PathLike) -> None:
        """Collective: restore the ``settings.load_contents`` parts of what :meth:`save_checkpoint` wrote
        (the world size may differ); the others keep their fresh state. ``ValueError`` before anything is
        loaded when the checkpoint's LoRA adapters (or their absence) do not match the model's
        (:func:`grpo_dist.training.lora.layout_mismatch`)."""
        from grpo_dist.training.lora import layout_mismatch, lora_layout

        layout = lora_layout(self.model)
        problem = layout_mismatch(checkpoint_io.read_adapter_layout(directory), layout)
        if problem:
            raise ValueError(f"cannot load the checkpoint {directory}: {problem}")
        extra = checkpoint_io.load_train_state(directory, self.model, self.optimizer, self.lr_scheduler,
                                               contents=self.settings.load_contents,
                                               trainable_only=layout is not None)
        self.update_count = int(extra["update_count"])
        self.nonfinite_grad_norm_total = int(extra["nonfinite_grad_norm_total"])
        if self._offload_optimizer:
            move_optimizer_state(self.optimizer, "cpu")

    def export_hf(self, directory: str | os.PathLike, tokenizer_path: str | os.PathLike | None = None) -> None:
        """Collective: rank 0 writes the model as a Hugging Face folder (safetensors + :attr:`config` +
        the tokenizer of ``tokenizer_path``) that its model class loads, head included."""
        checkpoint_io.export_hf(directory, self.model, config=self.config, tokenizer_path=tokenizer_path)
