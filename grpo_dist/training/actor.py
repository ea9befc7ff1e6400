"""The policy under FSDP2: log-probs, the PPO/GRPO update, weight export and checkpoints.

One :class:`FSDPActor` per data-parallel rank; every public method is collective and must be called
on all ranks in the same order (a Ray worker group does this). No Ray, no vLLM here.

Data layout for :meth:`FSDPActor.update_policy`
-----------------------------------------------
A step's global batch of ``N`` responses is cut into ``M`` global mini-batches (one optimizer step
each). Rank ``r`` receives ``N / W`` rows laid out as ``M`` contiguous equal chunks: chunk ``k`` is
rank ``r``'s share of global mini-batch ``k``, and the union of chunk ``k`` over the ``W`` ranks is
global mini-batch ``k``. ``M = rows_on_this_rank / settings.ppo_mini_batch_size_per_gpu``.
:func:`grpo_dist.training.micro_batches.rank_shard_indices` produces exactly this layout from a
global batch (verl: ``ppo_mini_batch_size_per_gpu = ppo_mini_batch_size * rollout.n // W``).

Loss and gradient
-----------------
For mini-batch ``k`` the response-token count and the non-empty-sequence count are summed over all
ranks (one all-reduce) to form the :class:`~grpo_dist.core.losses.AggSpec`. Every micro-batch adds
its piece of the global aggregated loss::

    loss = pg_loss - entropy_coeff * agg(entropy) + kl_loss_coef * agg(kl_penalty(logp, ref_logp))

and back-propagates ``loss * W`` (FSDP2 averages gradients over the ``W`` ranks), so the accumulated
gradient is that of the whole mini-batch's loss: the update does not depend on the micro-batch size,
the token budget, or the number of ranks (up to float rounding).
"""

from __future__ import annotations

import math
import os
import random
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LambdaLR

from grpo_dist.core.kl import canonical_kl_kind, kl_penalty
from grpo_dist.core.losses import LOSS_AGG_MODES, AggSpec, agg_loss, global_counts, ppo_clip_policy_loss
from grpo_dist.distributed.process_group import make_device_mesh
from grpo_dist.rollout.weight_sync import Bucket, pack, plan_buckets
from grpo_dist.training import fsdp
from grpo_dist.training.micro_batches import plan_micro_batches, take_rows
from grpo_dist.training.policy import (
    batched_logprobs,
    forward_logprobs,
    load_causal_lm,
    require_keys,
    resolve_attn_implementation,
    resolve_device,
)

__all__ = ["ActorSettings", "FSDPActor", "resolve_warmup_steps", "lr_lambda", "LR_SCHEDULER_TYPES"]

LR_SCHEDULER_TYPES: tuple[str, ...] = ("constant", "cosine")
UPDATE_KEYS: tuple[str, ...] = (
    "input_ids",
    "attention_mask",
    "position_ids",
    "responses",
    "response_mask",
    "advantages",
)
"""Keys update_policy needs; ``old_log_probs`` too unless the update is on-policy (see update_policy)."""


@dataclass
class ActorSettings:
    """The numbers the actor uses (the worker maps ``actor_rollout_ref.actor.*`` onto these)."""

    # --- batching -------------------------------------------------------------------------------
    ppo_mini_batch_size_per_gpu: int | None = None
    """Responses of ONE rank in one mini-batch (= one optimizer step); None: all of the rank's rows
    are one mini-batch. verl's normalisation: ``ppo_mini_batch_size * rollout.n // world_size``."""
    ppo_micro_batch_size_per_gpu: int | None = None
    """Responses per forward/backward on one rank (memory knob); None: the whole mini-batch."""
    use_dynamic_bsz: bool = False
    """Cut micro-batches by token budget (``ppo_max_token_len_per_gpu``) instead of by count."""
    ppo_max_token_len_per_gpu: int = 16384
    """Token budget (prompt + response real tokens) of one micro-batch when ``use_dynamic_bsz``."""
    ppo_epochs: int = 1
    """Passes over the step's mini-batches."""
    shuffle: bool = False
    """Shuffle the rows WITHIN each of this rank's mini-batch chunks before cutting micro-batches, with
    a generator seeded by ``(seed, update count)``: the same permutation on every rank; it changes
    only which rows share a micro-batch, so (by micro-batch invariance) not the update."""
    seed: int = 0

    # --- loss -----------------------------------------------------------------------------------
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    norm_constant: float | None = None
    """Divisor of ``seq-mean-token-sum-norm`` (Dr. GRPO): the max response length; None: padded width."""
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    """kl (k1) | abs | mse (k2) | low_var_kl (k3); ``full`` needs logits of both models: not supported."""
    temperature: float = 1.0
    """Rollout sampling temperature: logits are divided by it in every forward of the update."""

    # --- optimizer and schedule -----------------------------------------------------------------
    grad_clip: float | None = 1.0
    """Clip the global gradient norm to this; None or <= 0: no clipping (the norm is still reported)."""
    lr: float = 1e-6
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    lr_warmup_steps: int | None = -1
    """Linear warm-up steps; -1 or None: ``int(lr_warmup_steps_ratio * total_training_steps)``."""
    lr_warmup_steps_ratio: float = 0.0
    total_training_steps: int = -1
    """Optimizer schedule length in training steps (update_policy calls); needed for cosine and ratio."""
    lr_scheduler_type: str = "constant"
    min_lr_ratio: float = 0.0

    # --- model and FSDP2 ------------------------------------------------------------------------
    model_dtype: str = "float32"
    """dtype of the sharded master weights (and of the optimizer state)."""
    param_dtype: str = "float32"
    """Compute dtype of the gathered parameters (FSDP2 MixedPrecisionPolicy)."""
    reduce_dtype: str = "float32"
    """dtype of the gradient reduce-scatter."""
    attn_implementation: str = "auto"
    """auto (sdpa; flash_attention_2 on CUDA when installed) | sdpa | eager | flash_attention_2."""
    enable_gradient_checkpointing: bool = False
    reshard_after_forward: bool = True
    param_offload: bool = False
    """FSDP2 CPUOffloadPolicy: sharded params, grads and the optimizer step live on the CPU."""
    optimizer_offload: bool = False
    """Keep the optimizer state in CPU memory between updates (implied by param_offload)."""
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        def positive(name: str, allow_none: bool = False) -> None:
            v = getattr(self, name)
            if v is None and allow_none:
                return
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"ActorSettings.{name} must be an integer >= 1, got {v!r}")

        positive("ppo_mini_batch_size_per_gpu", allow_none=True)
        positive("ppo_micro_batch_size_per_gpu", allow_none=True)
        positive("ppo_max_token_len_per_gpu")
        positive("ppo_epochs")
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(f"ActorSettings.loss_agg_mode {self.loss_agg_mode!r} unknown; valid: {list(LOSS_AGG_MODES)}")
        kind = canonical_kl_kind(self.kl_loss_type)
        if kind == "full":
            raise ValueError("kl_loss_type='full' needs the reference logits; use low_var_kl (k3), kl, abs or mse")
        if not self.clip_ratio_c > 1.0:
            raise ValueError(f"clip_ratio_c must be > 1, got {self.clip_ratio_c}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.lr_scheduler_type not in LR_SCHEDULER_TYPES:
            raise ValueError(f"lr_scheduler_type {self.lr_scheduler_type!r} unknown; valid: {list(LR_SCHEDULER_TYPES)}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.lr_scheduler_type == "cosine" and self.total_training_steps <= 0:
            raise ValueError("lr_scheduler_type='cosine' needs total_training_steps > 0")
        if len(tuple(self.betas)) != 2:
            raise ValueError(f"betas must be two floats, got {self.betas!r}")
        self.betas = (float(self.betas[0]), float(self.betas[1]))
        for name in ("model_dtype", "param_dtype", "reduce_dtype"):
            fsdp.to_dtype(getattr(self, name))
        resolve_warmup_steps(self.lr_warmup_steps, self.lr_warmup_steps_ratio, self.total_training_steps)


def resolve_warmup_steps(lr_warmup_steps: int | None, ratio: float, total_training_steps: int) -> int:
    """verl: ``lr_warmup_steps`` when >= 0, else ``int(ratio * total_training_steps)``."""
    if lr_warmup_steps is not None and lr_warmup_steps >= 0:
        return int(lr_warmup_steps)
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"lr_warmup_steps_ratio must be in [0, 1], got {ratio}")
    if ratio > 0 and total_training_steps <= 0:
        raise ValueError("lr_warmup_steps_ratio > 0 needs total_training_steps > 0 (or set lr_warmup_steps)")
    return int(ratio * max(total_training_steps, 0))


def lr_lambda(step: int, *, kind: str, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """LR multiplier at scheduler step ``step`` (verl's ``get_{constant,cosine}_schedule_with_warmup``).

    constant: ``step / max(1, warmup)`` while ``step < warmup``, then 1.
    (As in verl, the scheduler steps AFTER each update, so with ``warmup > 0`` the first update runs
    at multiplier 0 and ``actor/lr`` reports the LR the update used.)
    cosine: warm-up ``min_lr_ratio + (1 - min_lr_ratio) * step / max(1, warmup)``, then
    ``max(min_lr_ratio, c * cos(pi * progress) + i)`` with ``c = (1 - min_lr_ratio) / 2``,
    ``i = (1 + min_lr_ratio) / 2``, ``progress = (step - warmup) / max(1, total - warmup)``.
    """
    if kind == "constant":
        return float(step) / float(max(1, warmup_steps)) if step < warmup_steps else 1.0
    assert kind == "cosine", kind
    if step < warmup_steps:
        return min_lr_ratio + (1.0 - min_lr_ratio) * float(step) / float(max(1, warmup_steps))
    progress = float(step - warmup_steps) / float(max(1, total_steps - warmup_steps))
    coef, intercept = (1.0 - min_lr_ratio) * 0.5, (1.0 + min_lr_ratio) * 0.5
    return max(min_lr_ratio, math.cos(math.pi * progress) * coef + intercept)


class _LRLambda:
    """Picklable ``LambdaLR`` multiplier (a plain closure would not be)."""

    def __init__(self, kind: str, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> None:
        self.kind, self.warmup_steps, self.total_steps, self.min_lr_ratio = kind, warmup_steps, total_steps, min_lr_ratio

    def __call__(self, step: int) -> float:
        return lr_lambda(
            step, kind=self.kind, warmup_steps=self.warmup_steps, total_steps=self.total_steps, min_lr_ratio=self.min_lr_ratio
        )


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


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
        if not dist.is_initialized():
            raise RuntimeError("FSDPActor needs torch.distributed initialised (init_process_group) first")
        if dist.get_rank() != rank or dist.get_world_size() != world_size:
            raise ValueError(
                f"rank/world_size {rank}/{world_size} differ from the process group's "
                f"{dist.get_rank()}/{dist.get_world_size()}"
            )
        self.settings = settings
        self.model_path = str(model_path)
        self.rank, self.world_size = rank, world_size
        self.device = resolve_device(device)
        self.mesh = make_device_mesh(world_size, self.device.type)

        attn = resolve_attn_implementation(
            settings.attn_implementation, self.device, fsdp.to_dtype(settings.param_dtype)
        )
        model = load_causal_lm(
            model_path,
            dtype=fsdp.to_dtype(settings.model_dtype),
            attn_implementation=attn,
            trust_remote_code=settings.trust_remote_code,
        )
        if settings.enable_gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        from transformers import AutoConfig

        # the model's own config (dropout as shipped) is what export_hf writes
        self.config = AutoConfig.from_pretrained(self.model_path, trust_remote_code=settings.trust_remote_code)
        self.model = fsdp.apply_fsdp2(
            model,
            self.mesh,
            param_dtype=settings.param_dtype,
            reduce_dtype=settings.reduce_dtype,
            reshard_after_forward=settings.reshard_after_forward,
            cpu_offload=settings.param_offload,
        )
        self.model.eval()
        # foreach: one multi-tensor op per update step instead of a Python loop of DTensor ops per
        # parameter (torch picks the loop for CPU tensors; measured ~3 % of a small model's update)
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=settings.lr,
            betas=settings.betas,
            weight_decay=settings.weight_decay,
            foreach=True,
        )
        warmup = resolve_warmup_steps(settings.lr_warmup_steps, settings.lr_warmup_steps_ratio, settings.total_training_steps)
        self.lr_scheduler = LambdaLR(
            self.optimizer,
            _LRLambda(settings.lr_scheduler_type, warmup, settings.total_training_steps, settings.min_lr_ratio),
        )
        self.update_count = 0
        """update_policy calls so far (= scheduler steps); seeds the within-mini-batch shuffle."""
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

    def _move_optimizer_state(self, device: torch.device | str) -> None:
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and key != "step":
                    state[key] = value.to(device, non_blocking=True)

    def _all_reduce_sum(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self._comm_device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.tolist()

    @property
    def _comm_device(self) -> torch.device:
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")

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

        Micro-batches by count (``micro_batch_size``) or token budget (``max_token_len``); neither: the
        whole batch at once. ``temperature`` defaults to ``settings.temperature``. CPU float32 tensors,
        in the input row order; positions outside the response are 0 or arbitrary (mask them).
        """
        if micro_batch_size is not None and max_token_len is not None:
            raise ValueError("give micro_batch_size or max_token_len, not both")
        self.model.eval()
        return batched_logprobs(
            self.model,
            data,
            device=self.device,
            micro_batch_size=micro_batch_size,
            max_token_len=max_token_len,
            temperature=self.settings.temperature if temperature is None else temperature,
            compute_entropy=compute_entropy,
        )

    def update_policy(self, data: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """One training step: ``ppo_epochs`` x mini-batches of optimizer steps, then one LR-schedule step.

        ``data``: this rank's rows, laid out as described in the module docstring (keys
        input_ids, attention_mask, position_ids, responses, response_mask, old_log_probs, advantages,
        and ref_log_prob when ``use_kl_loss``). Returns verl-named metrics, identical on all ranks.
        """
        s = self.settings
        keys = UPDATE_KEYS + (("ref_log_prob",) if s.use_kl_loss else ())
        require_keys(data, keys, "update_policy")
        keys += ("old_log_probs",) if "old_log_probs" in data else ()
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
        num_mini = n // mini
        cpu_data = {k: data[k] for k in keys}
        gen = torch.Generator().manual_seed(s.seed * 1_000_003 + self.update_count)
        micro_kwargs = (
            {"max_token_len": s.ppo_max_token_len_per_gpu}
            if s.use_dynamic_bsz
            else {"micro_batch_size": s.ppo_micro_batch_size_per_gpu or mini}
        )

        if self._offload_optimizer:
            self._move_optimizer_state(self.device)
        # train mode (Hugging Face gradient checkpointing only runs in it); dropout was zeroed at load,
        # so the update's log-probs are the ones compute_log_prob gives
        self.model.train()
        lr = self.lr_scheduler.get_last_lr()[0]
        history: dict[str, list[float]] = {}
        nonfinite = 0
        for _epoch in range(s.ppo_epochs):
            for k in range(num_mini):
                rows = torch.arange(k * mini, (k + 1) * mini)
                if s.shuffle:
                    rows = rows[torch.randperm(mini, generator=gen)]
                metrics, finite = self._mini_batch_step(take_rows(cpu_data, rows), micro_kwargs)
                nonfinite += 0 if finite else 1
                for name, value in metrics.items():
                    history.setdefault(name, []).append(value)
        with warnings.catch_warnings():
            # torch warns when the schedule steps although every optimizer step was skipped
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
            self.lr_scheduler.step()
        self.model.eval()
        self.update_count += 1
        self.nonfinite_grad_norm_total += nonfinite
        if self._offload_optimizer:
            self._move_optimizer_state("cpu")

        out = {name: float(np.mean(values)) for name, values in history.items()}
        out["actor/lr"] = float(lr)
        out["actor/grad_norm_nonfinite_count"] = float(nonfinite)
        if s.use_kl_loss:
            out["actor/kl_coef"] = float(s.kl_loss_coef)
        return out

    def _mini_batch_step(
        self, mb_data: dict[str, torch.Tensor], micro_kwargs: dict[str, int]
    ) -> tuple[dict[str, float], bool]:
        """Forward/backward over the micro-batches of one mini-batch, then clip and step."""
        s = self.settings
        tokens, seqs = global_counts(mb_data["response_mask"])
        g_tokens, g_seqs = self._all_reduce_sum([tokens, seqs])
        spec = AggSpec(mode=s.loss_agg_mode, global_tokens=g_tokens, global_seqs=g_seqs, norm_constant=s.norm_constant)
        R = mb_data["responses"].shape[1]
        # local sums (0-dim tensors on the device, read once per mini-batch: no sync per micro-batch):
        # pg_loss, entropy, kl_loss are pieces of the global aggregates; the per-micro-batch masked-mean
        # metrics are summed weighted by their token counts
        names = ("pg_loss", "entropy", "kl_loss", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl")
        sums = {name: torch.zeros((), dtype=torch.float64, device=self.device) for name in names}
        micro = plan_micro_batches(mb_data["attention_mask"], **micro_kwargs)
        for i, idx in enumerate(micro):
            if self.defer_grad_sync:
                self.model.set_requires_gradient_sync(i == len(micro) - 1)
            mb = {k: v.to(self.device, non_blocking=True) for k, v in take_rows(mb_data, idx).items()}
            mask = mb["response_mask"]
            logp, entropy = forward_logprobs(
                self.model,
                mb["input_ids"],
                mb["attention_mask"],
                mb["position_ids"],
                response_length=R,
                temperature=s.temperature,
                compute_entropy=True,
                entropy_requires_grad=s.entropy_coeff != 0,
            )
            pg_loss, pg_metrics = ppo_clip_policy_loss(
                logp,
                mb["old_log_probs"].float() if "old_log_probs" in mb else logp.detach(),
                mb["advantages"].float(),
                mask,
                clip_ratio_low=s.clip_ratio_low,
                clip_ratio_high=s.clip_ratio_high,
                clip_ratio_c=s.clip_ratio_c,
                agg=spec,
            )
            assert entropy is not None
            entropy_agg = agg_loss(entropy, mask, spec)
            loss = pg_loss - s.entropy_coeff * entropy_agg if s.entropy_coeff != 0 else pg_loss
            if s.use_kl_loss:
                kl_agg = agg_loss(kl_penalty(logp, mb["ref_log_prob"].float(), s.kl_loss_type), mask, spec)
                loss = loss + s.kl_loss_coef * kl_agg
                sums["kl_loss"] += kl_agg.detach().double()
            (loss * self.world_size).backward()
            n_tok = mask.detach().double().sum()
            sums["pg_loss"] += pg_loss.detach().double()
            sums["entropy"] += entropy_agg.detach().double()
            for name in ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"):
                sums[name] += pg_metrics[name].double() * n_tok

        local = torch.stack([sums[n] for n in names]).tolist()
        totals = dict(zip(names, self._all_reduce_sum(local), strict=True))
        for name in ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"):
            totals[name] = totals[name] / g_tokens if g_tokens > 0 else 0.0
        grad_norm = self._clip_grad_norm()
        finite = math.isfinite(grad_norm)
        if finite:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

        metrics = {f"actor/{name}": value for name, value in totals.items() if name != "kl_loss" or s.use_kl_loss}
        metrics["actor/grad_norm"] = grad_norm
        return metrics, finite

    def _clip_grad_norm(self) -> float:
        """Global L2 norm of the (sharded, DTensor) gradients; clip to ``grad_clip`` when it is > 0."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        if not params:
            return 0.0
        clip = self.settings.grad_clip
        if clip is not None and clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm=clip)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        return float(norm)

    # ------------------------------------------------------------------------------------------
    def state_dict_for_sync(self, dtype: str | torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """Collective: the full unsharded weights on CPU (rank 0); ``{}`` on other ranks.

        ``dtype`` casts floating tensors (e.g. ``"bfloat16"`` for the rollout engine).
        """
        sd = fsdp.full_state_dict(self.model)
        if dtype is not None and sd:
            target = fsdp.to_dtype(dtype)
            sd = {k: v.to(target) if v.is_floating_point() else v for k, v in sd.items()}
        return sd

    def weight_buckets(self, dtype: str | torch.dtype | None, bucket_bytes: int) -> list[Bucket]:
        """Layout of the weights for the rollout engine (Hugging Face names, full shapes), in flat
        buckets of at most ``bucket_bytes``; floating tensors are cast to ``dtype`` when given.
        The same on every rank; no communication."""
        target = fsdp.to_dtype(dtype) if dtype is not None else None
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
        """Collective: sharded model + optimizer (DCP) and per-rank scheduler/RNG/counters."""
        extra = {
            "lr_scheduler": self.lr_scheduler.state_dict(),
            "rng": _rng_state(),
            "update_count": self.update_count,
            "nonfinite_grad_norm_total": self.nonfinite_grad_norm_total,
        }
        fsdp.save_sharded(directory, self.model, self.optimizer, extra=extra)

    def load_checkpoint(self, directory: str | os.PathLike) -> None:
        """Collective: restore what :meth:`save_checkpoint` wrote (the world size may differ)."""
        extra = fsdp.load_sharded(directory, self.model, self.optimizer)
        if extra is None:
            rank0 = os.path.join(os.fspath(directory), "extra_rank0.pt")
            if not os.path.exists(rank0):
                raise FileNotFoundError(f"no scheduler/RNG state in {directory}")
            extra = torch.load(rank0, weights_only=False)
            extra.pop("rng", None)  # another rank's RNG stream: keep this rank's own
        self.lr_scheduler.load_state_dict(extra["lr_scheduler"])
        self.update_count = int(extra["update_count"])
        self.nonfinite_grad_norm_total = int(extra["nonfinite_grad_norm_total"])
        if "rng" in extra:
            _set_rng_state(extra["rng"])
        if self._offload_optimizer:
            self._move_optimizer_state("cpu")

    def export_hf(
        self, directory: str | os.PathLike, tokenizer_path: str | os.PathLike | None = None, dtype: str | None = None
    ) -> None:
        """Collective: rank 0 writes a Hugging Face model directory (safetensors + config + tokenizer)."""
        fsdp.export_hf(
            directory,
            self.model,
            config=self.config,
            tokenizer_path=tokenizer_path,
            generation_config_path=self.model_path,
            dtype=dtype,
        )
