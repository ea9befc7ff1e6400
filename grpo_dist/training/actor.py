"""The policy under FSDP2: log-probs, the PPO/GRPO update, weight export and checkpoints.

One :class:`FSDPActor` per data-parallel rank; every public method is collective and must be called
on all ranks in the same order (a Ray worker group does this). No Ray, no vLLM here.

Data layout for :meth:`FSDPActor.update_policy`
-----------------------------------------------
A step's global batch of ``N`` responses is cut into ``M`` global mini-batches (one optimizer step
each). Rank ``r`` receives ``N / W`` rows laid out as ``M`` contiguous equal chunks: chunk ``k`` is
rank ``r``'s share of global mini-batch ``k``, and the union of chunk ``k`` over the ``W`` ranks is
global mini-batch ``k``. ``M = rows_on_this_rank / settings.ppo_mini_batch_size_per_gpu``. With
``settings.epochs_in_rows`` (``actor.shuffle``) the rows hold every PPO epoch's chunks one epoch after
the other, each epoch's mini-batches cut from its own global permutation of the step's responses
(:func:`grpo_dist.training.micro_batches.update_layout`), and the update runs over them once.
:func:`grpo_dist.training.micro_batches.rank_shard_indices` produces exactly this layout from a
global batch (verl: ``ppo_mini_batch_size_per_gpu = ppo_mini_batch_size * rollout.n // W``).

Loss and gradient
-----------------
For mini-batch ``k`` the response-token count and the non-empty-sequence count are summed over all
ranks (one all-reduce) to form the :class:`~grpo_dist.core.losses.AggSpec`. Every micro-batch adds
its piece of the global aggregated loss::

    loss = pg_loss - entropy_coeff * agg(entropy) + kl_loss_coef * agg(kl_penalty(logp, ref_logp))

where ``pg_loss`` is the registered policy-loss mode ``settings.loss_mode``
(:mod:`grpo_dist.core.policy_loss`) called on the micro-batch with the mini-batch's ``AggSpec``
(:func:`grpo_dist.training.objective.micro_batch_loss`; the mini-batch step and the passes over
mini-batches are :mod:`grpo_dist.training.update`, shared with the in-process API);
it back-propagates ``loss * W`` (FSDP2 averages gradients over the ``W`` ranks), so the accumulated
gradient is that of the whole mini-batch's loss: the update does not depend on the micro-batch size,
the token budget, or the number of ranks (up to float rounding).

Metrics
-------
``actor/pg_loss``, ``actor/entropy``, ``actor/kl_loss`` (with the KL loss) are the mini-batch
aggregates; every metric the policy loss returns (masked token means of a micro-batch) is weighted by
its micro-batch's token count and summed over micro-batches and ranks, divided by the mini-batch's
token count, and reported as ``actor/<name>``; all are averaged over the step's mini-batches.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from grpo_dist.distributed.process_group import all_reduce_sum, comm_device, make_device_mesh
from grpo_dist.rollout.weight_sync import Bucket, pack, plan_buckets
from grpo_dist.training import checkpoint_io, fsdp
from grpo_dist.training.dtypes import to_dtype
from grpo_dist.training.memory import forward_token_budget, resolve_auto_settings
from grpo_dist.training.micro_batches import plan_micro_batches, take_rows
from grpo_dist.training.model_builder import build_fsdp_model, model_config, require_process_group, to_torch_device
from grpo_dist.training.objective import PolicyObjective
from grpo_dist.training.optim import clip_grad_norm, make_adamw, make_lr_scheduler, move_optimizer_state
from grpo_dist.training.policy import batched_logprobs, require_keys
from grpo_dist.training.settings import ActorSettings, update_keys
from grpo_dist.training.update import policy_mini_batch_step, run_mini_batches

__all__ = ["FSDPActor"]


class FSDPActor:
    """The policy on one data-parallel rank (FSDP2-sharded), with AdamW and its LR schedule.

    The default process group must already be initialised
    (:func:`grpo_dist.distributed.process_group.init_process_group`) with ``world_size`` ranks.
    Every method is collective. Dropout is zeroed at load; the model is in train mode only inside
    :meth:`update_policy` (for gradient checkpointing), in eval mode otherwise.
    """

    def __init__(
        self,
        model_path: str | os.PathLike,
        settings: ActorSettings,
        *,
        rank: int,
        world_size: int,
        device: str | torch.device,
    ) -> None:
        require_process_group("FSDPActor", rank, world_size)
        self.settings = settings
        self.objective = PolicyObjective.from_settings(settings)
        """The loss of every micro-batch (:mod:`grpo_dist.training.objective`); the policy-loss mode is
        looked up here: it must be registered in this process."""
        self.policy_loss = self.objective.policy_loss
        self.policy_loss_params = self.objective.params
        self.model_path = str(model_path)
        self.rank, self.world_size = rank, world_size
        self.device = to_torch_device(device)
        self.mesh = make_device_mesh(world_size, self.device.type)
        # "auto" gradient checkpointing / micro-batches: decided from the model's config and this rank's memory
        hf_config = model_config(self.model_path, settings.override_config, trust_remote_code=settings.trust_remote_code)
        self.settings, self.memory_note = resolve_auto_settings(
            settings, hf_config, device=self.device, world_size=world_size, compute_dtype=to_dtype(settings.param_dtype))
        settings = self.settings  # memory_note: what the auto choices chose and why (printed at start-up)
        self.forward_max_tokens, _ = forward_token_budget(
            hf_config, device=self.device, world_size=world_size, compute_dtype=to_dtype(settings.param_dtype),
            max_seq_len=settings.max_seq_len, fused_head=settings.use_fused_kernels,
            response_fraction=(settings.max_response_len or 1) / (settings.max_seq_len or 1))
        """Token budget of a no-grad forward given neither a micro-batch size nor a budget (null: auto)."""
        self.model = build_fsdp_model(
            model_path,
            mesh=self.mesh,
            device=self.device,
            model_dtype=settings.model_dtype,
            param_dtype=settings.param_dtype,
            reduce_dtype=settings.reduce_dtype,
            trainable=True,
            attn_implementation=settings.attn_implementation,
            gradient_checkpointing=settings.enable_gradient_checkpointing,
            reshard_after_forward=settings.reshard_after_forward,
            cpu_offload=settings.param_offload,
            trust_remote_code=settings.trust_remote_code,
            config_overrides=settings.override_config,
        )
        # the model's own config (dropout as shipped, with model.override_config) is what export_hf writes
        self.config = model_config(self.model_path, settings.override_config, trust_remote_code=settings.trust_remote_code)
        self.optimizer = make_adamw(self.model, lr=settings.lr, betas=settings.betas, weight_decay=settings.weight_decay)
        self.lr_scheduler = make_lr_scheduler(
            self.optimizer, kind=settings.lr_scheduler_type, warmup_steps=settings.lr_warmup_steps,
            warmup_ratio=settings.lr_warmup_steps_ratio, total_steps=settings.total_training_steps,
            min_lr_ratio=settings.min_lr_ratio, num_cycles=settings.num_cycles,
            zero_indexed_step=settings.zero_indexed_step,
        )
        self.update_count = 0
        """update_policy calls so far (= scheduler steps)."""
        self.nonfinite_grad_norm_total = 0
        """Optimizer steps skipped so far because the gradient norm was not finite."""
        self.defer_grad_sync = world_size == 1
        """Run FSDP2's gradient reduce-scatter once per mini-batch (after its last micro-batch) instead
        of after every micro-batch; gradients accumulate unsharded in ``reduce_dtype`` meanwhile. On one
        rank the unsharded gradient is the sharded one, so this costs no memory and removes the
        per-micro-batch post-backward work (on a GPU that CPU-side work, not the math, bounds small
        models). With several ranks it would hold full-size gradients on every rank: off."""

    # ------------------------------------------------------------------------------------------
    @property
    def _offload_optimizer(self) -> bool:
        return self.settings.optimizer_offload and not self.settings.param_offload and self.device.type != "cpu"

    @property
    def _comm_device(self) -> torch.device:
        return comm_device(self.device)

    # ------------------------------------------------------------------------------------------
    def compute_log_prob(
        self,
        data: Mapping[str, torch.Tensor],
        *,
        micro_batch_size: int | None = None,
        max_token_len: int | None = None,
        temperature: float | None = None,
        compute_entropy: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs [B, R] (and entropy [B, R]) of this rank's rows under the current policy, no grad.

        Micro-batches by count (``micro_batch_size``) or token budget (``max_token_len``); neither: as
        many rows at once as the rank's memory allows (:attr:`forward_max_tokens`; all of them on a
        small job). ``temperature`` defaults to ``settings.temperature``. CPU float32 tensors, in the
        input row order; positions outside the response are 0 or arbitrary (mask them).
        """
        if micro_batch_size is not None and max_token_len is not None:
            raise ValueError("give micro_batch_size or max_token_len, not both")
        if micro_batch_size is None and max_token_len is None:
            max_token_len = self.forward_max_tokens
        self.model.eval()
        return batched_logprobs(
            self.model,
            data,
            device=self.device,
            micro_batch_size=micro_batch_size,
            max_token_len=max_token_len,
            temperature=self.settings.temperature if temperature is None else temperature,
            compute_entropy=compute_entropy,
            remove_padding=self.settings.use_remove_padding,
            fused=self.settings.use_fused_kernels,
            logits_chunk_size=self.settings.logprob_chunk_size,
        )

    def update_policy(self, data: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """One training step: ``ppo_epochs`` x mini-batches of optimizer steps, then one LR-schedule step.

        ``data``: this rank's rows, laid out as described in the module docstring (keys
        input_ids, attention_mask, position_ids, responses, response_mask, old_log_probs, advantages,
        ref_log_prob when ``use_kl_loss``, rollout_is_weights when the step has rollout importance
        weights). Returns verl-named metrics, identical on all ranks.
        """
        s = self.settings
        require_keys(data, update_keys(use_kl_loss=s.use_kl_loss, old_log_probs=False, rollout_is_weights=False),
                     "update_policy")
        keys = update_keys(use_kl_loss=s.use_kl_loss, old_log_probs="old_log_probs" in data,
                           rollout_is_weights="rollout_is_weights" in data)
        if "rollout_is_weights" in data and not self.policy_loss.accepts_rollout_is_weights:
            raise ValueError(f"the batch has rollout importance weights but policy loss {self.policy_loss.name!r} does not "
                             "take them (register it with rollout_is_weights=True)")
        if "old_log_probs" not in data:
            # On-policy (one mini-batch, one epoch): every micro-batch runs before the only optimizer
            # step, so the policy that sampled is the current one and the ratio is exactly 1; the
            # caller may skip the old-log-prob forward, and logp.detach() stands in for it.
            on_policy = s.ppo_epochs == 1 and (s.ppo_mini_batch_size_per_gpu in (None, data["responses"].shape[0]))
            if not on_policy:
                raise ValueError("update_policy needs old_log_probs unless it makes a single optimizer step "
                                 "(one mini-batch, ppo_epochs=1)")
        n = data["responses"].shape[0]
        rows_range = torch.tensor([n, -n], dtype=torch.long, device=self._comm_device)
        dist.all_reduce(rows_range, op=dist.ReduceOp.MAX)
        if int(rows_range[0]) != -int(rows_range[1]):
            raise ValueError(
                f"update_policy: ranks hold different row counts ({-int(rows_range[1])}..{int(rows_range[0])}); "
                "each rank must get the same number of rows (see rank_shard_indices)"
            )
        mini = s.ppo_mini_batch_size_per_gpu or n
        if n == 0 or n % mini:
            raise ValueError(
                f"update_policy got {n} rows on rank {self.rank}: must be a positive multiple of "
                f"ppo_mini_batch_size_per_gpu={mini} (ppo_mini_batch_size * rollout.n / world_size)"
            )
        cpu_data = {k: data[k] for k in keys}
        micro_kwargs = (
            {"max_token_len": s.ppo_max_token_len_per_gpu}
            if s.use_dynamic_bsz
            else {"micro_batch_size": s.ppo_micro_batch_size_per_gpu or mini}
        )

        def step(rows: torch.Tensor) -> tuple[dict[str, float], bool]:
            mb_data = take_rows(cpu_data, rows)
            result = policy_mini_batch_step(
                self.model,
                mb_data,
                plan_micro_batches(mb_data["attention_mask"], **micro_kwargs),
                objective=self.objective,
                optimizer=self.optimizer,
                grad_clip=s.grad_clip,
                device=self.device,
                all_reduce_sum=lambda values: all_reduce_sum(values, self.device),
                loss_scale=float(self.world_size),  # FSDP2 averages gradients over the ranks
                on_micro_batch=self._gradient_sync if self.defer_grad_sync else None,
                grad_norm=clip_grad_norm,
                remove_padding=s.use_remove_padding,
            )
            return result.actor_metrics(), result.finite

        if self._offload_optimizer:
            move_optimizer_state(self.optimizer, self.device)
        # train mode (Hugging Face gradient checkpointing only runs in it); dropout was zeroed at load,
        # so the update's log-probs are the ones compute_log_prob gives
        self.model.train()
        lr = self.lr_scheduler.get_last_lr()[0]
        # with epochs_in_rows the caller laid out every epoch's (shuffled) mini-batches in the rows
        out, nonfinite = run_mini_batches(step, [torch.arange(k * mini, (k + 1) * mini) for k in range(n // mini)],
                                          epochs=1 if s.epochs_in_rows else s.ppo_epochs,
                                          summed=("perf/update_tokens",))  # token counts add up over the step
        with warnings.catch_warnings():
            # torch warns when the schedule steps although every optimizer step was skipped
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
            self.lr_scheduler.step()
        self.model.eval()
        self.update_count += 1
        self.nonfinite_grad_norm_total += nonfinite
        if self._offload_optimizer:
            move_optimizer_state(self.optimizer, "cpu")

        out["actor/lr"] = float(lr)
        out["actor/grad_norm_nonfinite_count"] = float(nonfinite)
        if s.use_kl_loss:
            out["actor/kl_coef"] = float(s.kl_loss_coef)
        return out

    def _gradient_sync(self, i: int, count: int) -> None:
        """FSDP2's gradient reduce-scatter only after the last of ``count`` micro-batches
        (:attr:`defer_grad_sync`)."""
        self.model.set_requires_gradient_sync(i == count - 1)

    # ------------------------------------------------------------------------------------------
    def state_dict_for_sync(self, dtype: str | torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """Collective: the full unsharded weights on CPU (rank 0); ``{}`` on other ranks.

        ``dtype`` casts floating tensors (e.g. ``"bfloat16"`` for the rollout engine).
        """
        sd = fsdp.full_state_dict(self.model)
        if dtype is not None and sd:
            target = to_dtype(dtype)
            sd = {k: v.to(target) if v.is_floating_point() else v for k, v in sd.items()}
        return sd

    def weight_buckets(self, dtype: str | torch.dtype | None, bucket_bytes: int) -> list[Bucket]:
        """Layout of the weights for the rollout engine (Hugging Face names, full shapes), in flat
        buckets of at most ``bucket_bytes``; floating tensors are cast to ``dtype`` when given.
        The same on every rank; no communication."""
        target = to_dtype(dtype) if dtype is not None else None
        meta = []
        for name, t in self.model.state_dict().items():
            dt = target if (target is not None and t.is_floating_point()) else t.dtype
            meta.append((name, tuple(t.shape), dt))
        return plan_buckets(meta, bucket_bytes)

    def pack_weight_bucket(self, bucket: Bucket) -> torch.Tensor:
        """Collective: the full (unsharded) weights of ``bucket`` in one new flat buffer, on the
        compute device (the GPU under nccl, the CPU under gloo), on every rank."""
        state = self.model.state_dict()
        full = {e.name: self._full_tensor(state[e.name]) for e in bucket.entries}
        return pack(bucket, full, self._comm_device)

    def _full_tensor(self, t: torch.Tensor) -> torch.Tensor:
        if not isinstance(t, DTensor):
            return t.to(self._comm_device)
        local = t.to_local()
        if local.device != self._comm_device:  # parameters offloaded to the CPU under nccl
            t = DTensor.from_local(local.to(self._comm_device), t.device_mesh, t.placements, run_check=False,
                                   shape=t.shape, stride=t.stride())
        return t.full_tensor()

    def save_checkpoint(self, directory: str | os.PathLike) -> None:
        """Collective: sharded model + optimizer (DCP) and per-rank scheduler/RNG/counters, as far as
        ``settings.save_contents`` asks (the counters always)."""
        checkpoint_io.save_train_state(
            directory,
            self.model,
            self.optimizer,
            self.lr_scheduler,
            extra={"update_count": self.update_count, "nonfinite_grad_norm_total": self.nonfinite_grad_norm_total},
            contents=self.settings.save_contents,
        )

    def load_checkpoint(self, directory: str | os.PathLike) -> None:
        """Collective: restore the ``settings.load_contents`` parts of what :meth:`save_checkpoint` wrote
        (the world size may differ); the others keep their fresh state."""
        extra = checkpoint_io.load_train_state(directory, self.model, self.optimizer, self.lr_scheduler,
                                               contents=self.settings.load_contents)
        self.update_count = int(extra["update_count"])
        self.nonfinite_grad_norm_total = int(extra["nonfinite_grad_norm_total"])
        if self._offload_optimizer:
            move_optimizer_state(self.optimizer, "cpu")

    def export_hf(
        self, directory: str | os.PathLike, tokenizer_path: str | os.PathLike | None = None, dtype: str | None = None
    ) -> None:
        """Collective: rank 0 writes a Hugging Face model directory (safetensors + config + tokenizer)."""
        checkpoint_io.export_hf(
            directory,
            self.model,
            config=self.config,
            tokenizer_path=tokenizer_path,
            generation_config_path=self.model_path,
            dtype=dtype,
        )
