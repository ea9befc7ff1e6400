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
from collections.abc import Mapping

import torch
from torch.distributed.tensor import DTensor

from grpo_dist.rollout.weight_sync import Bucket, pack, plan_buckets
from grpo_dist.training import checkpoint_io, fsdp
from grpo_dist.training.dtypes import to_dtype
from grpo_dist.training.fsdp_role import FSDPRole
from grpo_dist.training.memory import forward_token_budget
from grpo_dist.training.micro_batches import plan_micro_batches, take_rows
from grpo_dist.training.objective import PolicyObjective
from grpo_dist.training.optim import clip_grad_norm
from grpo_dist.training.policy import batched_logprobs, require_keys
from grpo_dist.training.settings import ActorSettings, update_keys
from grpo_dist.training.update import policy_mini_batch_step

__all__ = ["FSDPActor"]


class FSDPActor(FSDPRole):
    """The policy on one data-parallel rank (FSDP2-sharded), with AdamW and its LR schedule
    (the scaffold: :class:`~grpo_dist.training.fsdp_role.FSDPRole`).

    The default process group must already be initialised
    (:func:`grpo_dist.distributed.process_group.init_process_group`) with ``world_size`` ranks.
    Every method is collective. Dropout is zeroed at load; the model is in train mode only inside
    :meth:`update_policy` (for gradient checkpointing), in eval mode otherwise.
    """

    metric_prefix = "actor"

    def __init__(self, model_path: str | os.PathLike, settings: ActorSettings, *, rank: int, world_size: int,
                 device: str | torch.device) -> None:
        super().__init__(model_path, settings, rank=rank, world_size=world_size, device=device,
                         config_overrides=settings.override_config)
        self.objective = PolicyObjective.from_settings(settings)
        """The loss of every micro-batch (:mod:`grpo_dist.training.objective`); the policy-loss mode is
        looked up here: it must be registered in this process."""
        self.policy_loss = self.objective.policy_loss
        self.policy_loss_params = self.objective.params
        # "auto" gradient checkpointing / micro-batches: decided from the model's config and this rank's memory
        self.resolve_memory()
        settings = self.settings
        self.forward_max_tokens, _ = forward_token_budget(
            self.config, device=self.device, world_size=world_size, compute_dtype=to_dtype(settings.param_dtype),
            max_seq_len=settings.max_seq_len, fused_head=settings.use_fused_kernels,
            response_fraction=(settings.max_response_len or 1) / (settings.max_seq_len or 1))
        """Token budget of a no-grad forward given neither a micro-batch size nor a budget (null: auto)."""
        self.build_model(gradient_checkpointing=settings.enable_gradient_checkpointing, lora=settings.lora)
        self.build_optimizer()  # over the trainable parameters: with LoRA, the adapters only
        self._merge = self._lora_merge_sources() if settings.lora.enabled else None
        """With LoRA: the base model's weight names -> where each comes from in the peft model (the weight
        sync and the export send the merged weights under the base model's names); None otherwise."""
        self._adapters = self._lora_adapter_sources() if settings.lora.enabled and not settings.lora.merge else None
        """With LoRA and ``lora.merge=false``: the adapter-only sync's names (peft's saved names) -> their
        state-dict keys; the engine receives these tensors alone (:meth:`adapter_config`). None otherwise."""

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
        n, mini = self.check_update_rows(data, s.ppo_mini_batch_size_per_gpu, where="update_policy",
                                         size_name="ppo_mini_batch_size_per_gpu",
                                         size_origin=" (ppo_mini_batch_size * rollout.n / world_size)")
        cpu_data = {k: data[k] for k in keys}
        micro_kwargs = s.micro_batch_cut(mini)

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
                all_reduce_sum=self._all_reduce_sum,
                loss_scale=float(self.world_size),  # FSDP2 averages gradients over the ranks
                on_micro_batch=self._gradient_sync if self.defer_grad_sync else None,
                grad_norm=clip_grad_norm,
                remove_padding=s.use_remove_padding,
            )
            return result.actor_metrics(), result.finite

        # with epochs_in_rows the caller laid out every epoch's (shuffled) mini-batches in the rows
        out = self.run_update(step, n, mini, epochs=s.update_epochs,
                              summed=("perf/update_tokens",))  # token counts add up over the step
        if s.use_kl_loss:
            out["actor/kl_coef"] = float(s.kl_loss_coef)
        return out

    def _lora_merge_sources(self) -> dict:
        from grpo_dist.training.lora import merge_sources

        return merge_sources(self.model, list(self.model.state_dict()))

    def _lora_adapter_sources(self) -> dict[str, str]:
        from grpo_dist.training.lora import adapter_sources

        return adapter_sources(list(self.model.state_dict()))

    def adapter_config(self) -> dict | None:
        """The adapter's peft configuration (``adapter_config.json``) the engine serves the synced adapter with,
        when the weight sync sends adapters only (``lora.merge=false``); None when it sends whole weights."""
        if self._adapters is None:
            return None
        from grpo_dist.training.lora import adapter_config_dict

        return adapter_config_dict(self.model)

    # ------------------------------------------------------------------------------------------
    def state_dict_for_sync(self, dtype: str | torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """Collective: the full unsharded weights on CPU (rank 0); ``{}`` on other ranks. With LoRA: the
        merged weights under the base model's names (:mod:`grpo_dist.training.lora`).

        ``dtype`` casts floating tensors (e.g. ``"bfloat16"`` for the rollout engine).
        """
        sd = fsdp.full_state_dict(self.model)
        if self._merge is not None and sd:
            from grpo_dist.training.lora import merged_weight

            sd = {name: merged_weight(src, sd) for name, src in self._merge.items()}
        if dtype is not None and sd:
            target = to_dtype(dtype)
            sd = {k: v.to(target) if v.is_floating_point() else v for k, v in sd.items()}
        return sd

    def weight_buckets(self, dtype: str | torch.dtype | None, bucket_bytes: int) -> list[Bucket]:
        """Layout of the weights for the rollout engine (Hugging Face names, full shapes), in flat
        buckets of at most ``bucket_bytes``; floating tensors are cast to ``dtype`` when given.
        The same on every rank; no communication."""
        target = to_dtype(dtype) if dtype is not None else None
        state = self.model.state_dict()
        meta = []
        for name in self._sync_names(state):
            if self._adapters is not None:
                t = state[self._adapters[name]]
            else:
                t = state[self._merge[name].weight] if self._merge is not None else state[name]
            dt = target if (target is not None and t.is_floating_point()) else t.dtype
            meta.append((name, tuple(t.shape), dt))
        return plan_buckets(meta, bucket_bytes)

    def _sync_names(self, state: Mapping[str, torch.Tensor]) -> list[str]:
        """The names the rollout engine receives: the adapters' (peft's saved names) with an adapter-only sync,
        the base model's (merged weights) with LoRA, else the state dict's."""
        if self._adapters is not None:
            return list(self._adapters)
        return list(self._merge) if self._merge is not None else list(state)

    def pack_weight_bucket(self, bucket: Bucket) -> torch.Tensor:
        """Collective: the full (unsharded) weights of ``bucket`` in one new flat buffer, on the
        compute device (the GPU under nccl, the CPU under gloo), on every rank. With LoRA each weight
        is merged, ``W + scale * (B @ A)``, from its gathered parts; with an adapter-only sync the bucket
        holds the adapter factors themselves."""
        state = self.model.state_dict()
        if self._adapters is not None:
            full = {e.name: self._full_tensor(state[self._adapters[e.name]]) for e in bucket.entries}
        elif self._merge is None:
            full = {e.name: self._full_tensor(state[e.name]) for e in bucket.entries}
        else:
            from grpo_dist.training.lora import merged_weight

            full = {}
            for e in bucket.entries:
                src = self._merge[e.name]
                parts = [k for k in (src.weight, src.lora_A, src.lora_B) if k is not None]
                full[e.name] = merged_weight(src, {k: self._full_tensor(state[k]) for k in parts})
        return pack(bucket, full, self._comm_device)

    def _full_tensor(self, t: torch.Tensor) -> torch.Tensor:
        if not isinstance(t, DTensor):
            return t.to(self._comm_device)
        local = t.to_local()
        if local.device != self._comm_device:  # parameters offloaded to the CPU under nccl
            t = DTensor.from_local(local.to(self._comm_device), t.device_mesh, t.placements, run_check=False,
                                   shape=t.shape, stride=t.stride())
        return t.full_tensor()

    def export_hf(
        self, directory: str | os.PathLike, tokenizer_path: str | os.PathLike | None = None, dtype: str | None = None,
        *, merged: bool = True,
    ) -> None:
        """Collective: rank 0 writes a Hugging Face model directory (safetensors + config + tokenizer, and
        the folder's generation config); ``dtype`` casts the floating weights.

        With LoRA: ``directory/lora_adapter/``, a peft adapter folder (``adapter_config.json`` naming the
        model folder as its base, ``adapter_model.safetensors``, the tokenizer files) that
        ``PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), folder)`` loads as the
        policy; and, with ``merged``, the merged model ``W + (alpha / r) B A`` (peft's ``merge_and_unload``,
        under the base model's names and classes) in ``directory`` itself. ``merged`` is ignored without
        LoRA (the model is always written)."""
        if self._merge is None or merged:
            checkpoint_io.export_hf(
                directory,
                self.model,
                config=self.config,
                tokenizer_path=tokenizer_path,
                generation_config_path=self.model_path,
                dtype=dtype,
                state_dict=self.state_dict_for_sync() if self._merge is not None else None,
            )
        if self._merge is not None:
            from grpo_dist.training.lora import ADAPTER_EXPORT_DIR, adapter_export_config, adapter_sources

            checkpoint_io.export_adapter(
                os.path.join(directory, ADAPTER_EXPORT_DIR),
                self.model,
                config=adapter_export_config(self.model, os.path.abspath(self.model_path)
                                             if os.path.isdir(self.model_path) else self.model_path),
                saved_names=adapter_sources(self.model.state_dict()),
                tokenizer_path=tokenizer_path,
            )
