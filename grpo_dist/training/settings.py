"""What the trainable and frozen models are given: their settings and the batch keys they read.

Light on purpose: importing this module pulls in neither ``torch.distributed.fsdp`` nor
transformers nor :mod:`grpo_dist.training.actor`, so the driver process can build these dataclasses
(and pick batch keys) without loading the FSDP machinery. Ray pickles the settings to the workers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from grpo_dist.core.names import ALL_LOSS_AGG_MODES, LOSS_AGG_MODES, canonical_kl_kind
from grpo_dist.core.policy_loss_registry import PolicyLossParams, get_policy_loss, list_policy_losses
from grpo_dist.core.schedules import check_schedule, resolve_warmup_steps
from grpo_dist.training.dtypes import to_dtype
from grpo_dist.training.optimizer_choice import optimizer_class

__all__ = ["FORWARD_KEYS", "UPDATE_KEYS", "update_keys", "CRITIC_UPDATE_KEYS", "RM_UPDATE_KEYS", "UpdateBatching",
           "OptimizerSettings", "ScheduleSettings", "FSDPModelSettings", "MemorySettings", "CheckpointSettings", "LoraSettings",
           "ActorSettings",
           "ReferenceSettings", "CriticSettings", "RewardModelSettings"]

ATTN_IMPLEMENTATIONS: tuple[str, ...] = ("auto", "sdpa", "eager", "flash_attention_2")
"""Values of ``actor_rollout_ref.model.attn_implementation`` (auto: flash_attention_2 on CUDA when
installed and computing in half precision, else sdpa)."""

FORWARD_KEYS: tuple[str, ...] = ("input_ids", "attention_mask", "position_ids", "responses")
"""Batch keys a log-prob forward reads (``FSDPActor.compute_log_prob``,
``FSDPReference.compute_ref_log_prob``): the prompt + response tokens, their attention mask and
position ids, and the responses (whose width is the response length). Rows sent to these calls need
no other key."""

UPDATE_KEYS: tuple[str, ...] = (
    "input_ids",
    "attention_mask",
    "position_ids",
    "responses",
    "response_mask",
    "advantages",
)
"""Batch keys ``FSDPActor.update_policy`` always reads. It also reads ``old_log_probs`` (which may be
left out only when the update makes a single optimizer step: on-policy), ``ref_log_prob`` when
``ActorSettings.use_kl_loss``, and ``rollout_is_weights`` (rollout importance weights, [B, R]) when
present, which it hands to the policy loss as ``rollout_is_weights_BT`` (:func:`update_keys`)."""


def update_keys(*, use_kl_loss: bool, old_log_probs: bool, rollout_is_weights: bool) -> tuple[str, ...]:
    """The batch keys one actor update reads (``FSDPActor.update_policy``), in this order:
    :data:`UPDATE_KEYS`; ``ref_log_prob`` with the KL loss (``use_kl_loss``); ``old_log_probs`` unless
    the update is on-policy (a single optimizer step, where the current log-probs stand in for them);
    ``rollout_is_weights`` when the step has rollout importance weights. The driver sends these keys
    and the actor takes these keys."""
    return (UPDATE_KEYS + (("ref_log_prob",) if use_kl_loss else ()) + (("old_log_probs",) if old_log_probs else ())
            + (("rollout_is_weights",) if rollout_is_weights else ()))


CRITIC_UPDATE_KEYS: tuple[str, ...] = (
    "input_ids",
    "attention_mask",
    "position_ids",
    "responses",
    "response_mask",
    "values",
    "returns",
)
"""Batch keys ``FSDPCritic.update_critic`` reads: the tokens, the response mask, the values the
critic gave when the step's advantages were computed (the clip's anchor) and the returns (targets)."""

RM_UPDATE_KEYS: tuple[str, ...] = (
    "input_ids",
    "attention_mask",
    "position_ids",
    "responses",
    "response_mask",
    "rm_targets",
)
"""Batch keys ``FSDPRewardModel.update`` reads: the tokens, the response mask, and ``rm_targets``
[B, R] (the verifier's label, in [0, 1], on the response tokens the reward model is scored at; NaN
elsewhere)."""


def check_auto_settings(cls: str, s) -> None:
    """``ValueError`` for a value that is neither a bool nor ``"auto"``, or an auto choice without the
    sequence length it needs."""
    if not (s.enable_gradient_checkpointing is True or s.enable_gradient_checkpointing is False
            or s.enable_gradient_checkpointing == "auto"):
        raise ValueError(f"{cls}.enable_gradient_checkpointing must be true, false or 'auto', got {s.enable_gradient_checkpointing!r}")
    auto = s.enable_gradient_checkpointing == "auto" or s.ppo_micro_batch_size_per_gpu == "auto"
    if auto and not (isinstance(s.max_seq_len, int) and s.max_seq_len >= 1):
        raise ValueError(f"{cls}: the 'auto' memory choices need max_seq_len (prompt + response length), got {s.max_seq_len!r}")


def check_counts(settings: object, names: tuple[str, ...], *, allow_none: bool) -> None:
    """``ValueError`` naming the settings class and the field unless each of ``names`` is an integer
    >= 1 (or None with ``allow_none``; ``"auto"`` passes for the auto micro-batch size)."""
    cls = type(settings).__name__
    for name in names:
        v = getattr(settings, name)
        if (v is None and allow_none) or (name == "ppo_micro_batch_size_per_gpu" and v == "auto"):
            continue
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{cls}.{name} must be an integer >= 1{' or None' if allow_none else ''}, got {v!r}")


# ---- the parts the trained models' settings share ------------------------------------------------
# Each part is a group of fields with defaults and the checks of those fields; a role's settings class
# lists the parts it is made of (its fields are theirs plus its own, the constructor keywords are all
# of them) and calls each part's check from its ``__post_init__``. The FSDP scaffold
# (:mod:`grpo_dist.training.fsdp_role`) reads a role's model, optimizer, schedule and checkpoint
# numbers through these parts.


@dataclass
class UpdateBatching:
    """How a PPO-style update cuts a rank's rows (the actor's and the critic's)."""

    ppo_mini_batch_size_per_gpu: int | None = None
    """Responses of ONE rank in one mini-batch (= one optimizer step); None: all of the rank's rows
    are one mini-batch. verl's normalisation: ``ppo_mini_batch_size * rollout.n // world_size``."""
    ppo_micro_batch_size_per_gpu: int | None | str = None
    """Responses per forward/backward on one rank (memory knob); None: the whole mini-batch; ``"auto"``:
    the whole mini-batch when its estimated activations fit in the rank's memory, else cut by a token
    budget that fits (:mod:`grpo_dist.training.memory`; needs ``max_seq_len``)."""
    use_dynamic_bsz: bool = False
    """Cut micro-batches by token budget (``ppo_max_token_len_per_gpu``) instead of by count."""
    ppo_max_token_len_per_gpu: int = 16384
    """Token budget (prompt + response real tokens) of one micro-batch when ``use_dynamic_bsz``."""
    ppo_epochs: int = 1
    """Passes over the step's mini-batches."""
    epochs_in_rows: bool = False
    """The rows already hold all ``ppo_epochs`` passes, one after the other, each a global permutation of
    the step's responses cut into mini-batches (``actor.shuffle``/``critic.shuffle``; the caller lays
    them out with :func:`grpo_dist.training.micro_batches.epoch_orders`): the update runs over them once."""

    def check_update_batching(self) -> None:
        check_counts(self, ("ppo_mini_batch_size_per_gpu", "ppo_micro_batch_size_per_gpu"), allow_none=True)
        check_counts(self, ("ppo_max_token_len_per_gpu", "ppo_epochs"), allow_none=False)

    @property
    def update_epochs(self) -> int:
        """Passes the update makes over the rows it is given (1 when they hold every epoch)."""
        return 1 if self.epochs_in_rows else self.ppo_epochs

    def micro_batch_cut(self, mini: int) -> dict[str, int]:
        """``plan_micro_batches``' keyword for an update's micro-batches of a ``mini``-row mini-batch:
        the token budget with ``use_dynamic_bsz``, else the micro-batch size (None: the whole mini-batch)."""
        if self.use_dynamic_bsz:
            return {"max_token_len": self.ppo_max_token_len_per_gpu}
        return {"micro_batch_size": self.ppo_micro_batch_size_per_gpu or mini}


@dataclass
class OptimizerSettings:
    """The optimizer (AdamW unless said otherwise) and gradient clipping of a trained model."""

    lr: float = 1e-5
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float | None = 1.0
    """Clip the global gradient norm to this; None or <= 0: no clipping (the norm is still reported)."""
    optimizer: str = "AdamW"
    """The optimizer class (verl's ``optim.optimizer``) in :attr:`optimizer_impl`."""
    optimizer_impl: str = "torch.optim"
    """The module it is imported from (verl's ``optim.optimizer_impl``)."""
    optimizer_kwargs: dict[str, Any] = field(default_factory=dict)
    """Further keyword arguments of the optimizer (verl's ``optim.override_optimizer_config``); they may
    override ``lr``, ``weight_decay`` and ``betas`` (:func:`grpo_dist.training.optim.optimizer_arguments`)."""

    def check_optimizer(self) -> None:
        if len(tuple(self.betas)) != 2:
            raise ValueError(f"betas must be two floats, got {self.betas!r}")
        self.betas = (float(self.betas[0]), float(self.betas[1]))
        if not isinstance(self.optimizer_kwargs, dict):
            raise ValueError(f"optimizer_kwargs must be a dict of keyword arguments, got {self.optimizer_kwargs!r}")
        optimizer_class(self.optimizer_impl, self.optimizer)  # ValueError naming the valid classes


@dataclass
class ScheduleSettings:
    """The learning-rate schedule, stepped once per update call (:func:`grpo_dist.training.optim.make_lr_scheduler`)."""

    lr_warmup_steps: int | None = -1
    """Linear warm-up steps; -1 or None: ``int(lr_warmup_steps_ratio * total_training_steps)``."""
    lr_warmup_steps_ratio: float = 0.0
    total_training_steps: int = -1
    """Optimizer schedule length in training steps (update calls); needed for cosine and ratio."""
    lr_scheduler_type: str = "constant"
    min_lr_ratio: float = 0.0
    num_cycles: float = 0.5
    """Waves of the cosine schedule (0.5: one half cosine down; :func:`grpo_dist.core.schedules.lr_lambda`)."""
    zero_indexed_step: bool = True
    """The cosine schedule counts steps from 0 (False: from 1, as torchtitan)."""

    def check_lr_schedule(self) -> None:
        check_schedule(self.lr_scheduler_type, total_steps=self.total_training_steps, min_lr_ratio=self.min_lr_ratio)
        resolve_warmup_steps(self.lr_warmup_steps, self.lr_warmup_steps_ratio, self.total_training_steps)


@dataclass
class FSDPModelSettings:
    """How a trained model is loaded and sharded with FSDP2 (:func:`grpo_dist.training.model_builder.build_fsdp_model`)."""

    model_dtype: str = "float32"
    """dtype of the sharded master weights (and of the optimizer state)."""
    param_dtype: str = "float32"
    """Compute dtype of the gathered parameters (FSDP2 MixedPrecisionPolicy)."""
    reduce_dtype: str = "float32"
    """dtype of the gradient reduce-scatter."""
    attn_implementation: str = "auto"
    """auto (sdpa; flash_attention_2 on CUDA when installed) | sdpa | eager | flash_attention_2."""
    override_config: dict | None = None
    """Fields set on the model's Hugging Face config before it is built (``model.override_config``);
    the Hugging Face export writes them too."""
    reshard_after_forward: bool = True
    param_offload: bool = False
    """FSDP2 CPUOffloadPolicy: sharded params, grads and the optimizer step live on the CPU."""
    optimizer_offload: bool = False
    """Keep the optimizer state in CPU memory between updates (implied by param_offload)."""
    trust_remote_code: bool = False

    def check_fsdp_model(self) -> None:
        for name in ("model_dtype", "param_dtype", "reduce_dtype"):
            to_dtype(getattr(self, name))


@dataclass
class MemorySettings:
    """The update's memory knobs and the sequence lengths its ``"auto"`` choices read (the actor's and
    the critic's; :mod:`grpo_dist.training.memory`)."""

    enable_gradient_checkpointing: bool | str = False
    """Recompute activations in the backward; ``"auto"``: only when a micro-batch's estimated
    activations would not fit in the rank's memory (:mod:`grpo_dist.training.memory`)."""
    max_seq_len: int | None = None
    """Longest prompt + response the run produces (what the auto choices bound a row by)."""
    max_response_len: int | None = None
    """Longest response (the share of a row whose logits are formed)."""
    use_remove_padding: bool = False
    """Run every forward on the real tokens only, packed into one row with per-sequence position ids
    (verl's ``use_remove_padding``; grpo_dist/training/model_forward.py): same results, less compute."""


@dataclass
class CheckpointSettings:
    """The parts of a trained model's state its checkpoints hold (:func:`grpo_dist.training.checkpoint_io.save_train_state`)."""

    save_contents: tuple[str, ...] = ("model", "optimizer", "extra")
    """What ``save_checkpoint`` writes (``<role>.checkpoint.save_contents`` without hf_model)."""
    load_contents: tuple[str, ...] = ("model", "optimizer", "extra")
    """What ``load_checkpoint`` restores (``<role>.checkpoint.load_contents``)."""

    def check_checkpoint_contents(self) -> None:
        for name in ("save_contents", "load_contents"):
            parts = tuple(getattr(self, name))
            if "model" not in parts or not set(parts) <= {"model", "optimizer", "extra"}:
                raise ValueError(f"{type(self).__name__}.{name} must hold model and any of optimizer, extra; got {parts!r}")
            setattr(self, name, parts)


@dataclass
class LoraSettings:
    """A model's LoRA adapters (peft; the policy's: :mod:`grpo_dist.training.lora`, the value model's:
    :mod:`grpo_dist.training.critic_lora`): each target ``nn.Linear``
    ``y = W x`` becomes ``y = W x + (alpha / rank) * B A x`` with ``A`` [rank, in] and ``B`` [out, rank]
    trained and ``W`` frozen. ``rank == 0``: no adapters, the whole model is trained."""

    rank: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    """Dropout on the adapters' input (peft's ``lora_dropout``; the base path has none)."""
    target_modules: str | tuple[str, ...] = "all-linear"
    """``"all-linear"`` (every linear layer but the output layer), a tuple of module names (a name
    matches a module whose dotted name ends with it), or a regular expression over the full names."""
    exclude_modules: str | tuple[str, ...] | None = None
    """Modules that get no adapter (names or a regular expression, as ``target_modules``)."""
    adapter_path: str | None = None
    """A saved peft adapter folder to start from (its rank, alpha and modules win over the above)."""
    seed: int = 0
    """Seeds the adapters' initialisation (``A`` is drawn the same on every rank)."""
    export_merged: bool = False
    """The Hugging Face export holds the merged model beside the adapter folder (``hf_model`` in
    ``actor.checkpoint.save_contents``); the adapter folder is always written."""
    merge: bool = False
    """The weight sync: False sends the adapter factors alone (the engine serves them as a LoRA adapter on its
    base weights); True sends the merged weights ``W + (alpha / rank) B A`` under the base model's names."""

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    def check_lora(self) -> None:
        if not isinstance(self.rank, int) or self.rank < 0:
            raise ValueError(f"LoraSettings.rank must be an integer >= 0, got {self.rank!r}")
        if self.enabled and not self.alpha > 0:
            raise ValueError(f"LoraSettings.alpha must be > 0, got {self.alpha!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoraSettings.dropout must be in [0, 1), got {self.dropout!r}")
        if isinstance(self.target_modules, list):
            self.target_modules = tuple(self.target_modules)
        if isinstance(self.exclude_modules, list):
            self.exclude_modules = tuple(self.exclude_modules)


def module_matches(name: str, pattern: str | Iterable[str]) -> bool:
    """peft's rule: a string is a regular expression over the full name; a list entry matches a module
    whose name is the entry or ends with ``.<entry>``."""
    if isinstance(pattern, str):
        return re.fullmatch(pattern, name) is not None
    return any(name == key or name.endswith("." + key) for key in pattern)


@dataclass
class ActorSettings(UpdateBatching, OptimizerSettings, ScheduleSettings, FSDPModelSettings, MemorySettings,
                    CheckpointSettings):
    """The numbers the actor uses (the trainer maps ``actor_rollout_ref.actor.*`` onto these): the shared
    parts' fields, the loss section and the policy forward's own knobs below."""

    # --- loss -----------------------------------------------------------------------------------
    loss_mode: str = "vanilla"
    """Policy-loss mode, a name registered in :mod:`grpo_dist.core.policy_loss`
    (``actor_rollout_ref.actor.policy_loss.loss_mode``)."""
    policy_loss: PolicyLossParams = field(default_factory=PolicyLossParams)
    """The numbers the policy loss is given (``params=``): clip ranges, the ``actor.policy_loss.*``
    keys, the rollout-correction settings of ``bypass_mode`` (:class:`PolicyLossParams`)."""
    loss_agg_mode: str = "token-mean"
    norm_constant: float | None = None
    """Divisor of ``seq-mean-token-sum-norm`` (Dr. GRPO): the max response length; None: padded width."""
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    """kl (k1) | abs | mse (k2) | low_var_kl (k3); ``full`` needs logits of both models: not supported."""
    kl_loss_agg_mode: str | None = None
    """Aggregation of the KL loss (over the whole mini-batch, like the policy term); None: ``loss_agg_mode``
    (verl). ``token-mean`` under a ``seq-mean-token-sum`` policy term is the in-process API's default."""
    temperature: float = 1.0
    """Rollout sampling temperature: logits are divided by it in every forward of the update."""

    # --- the actor's own values of the shared parts, and its forward's knobs ----------------------
    lr: float = 1e-6
    use_fused_kernels: bool = False
    """Log-probs and entropy straight from the hidden states and the output layer, a chunk of
    positions at a time, without forming the logits (grpo_dist/core/logprobs.py)."""
    logprob_chunk_size: int | None = None
    """Positions per chunk of the output layer's log-softmax (per matmul when fused); None: from the
    vocabulary size."""
    lora: LoraSettings = field(default_factory=LoraSettings)
    """LoRA adapters on a frozen base (``lora.rank > 0``), else full fine-tuning."""

    def __post_init__(self) -> None:
        self.check_update_batching()
        check_auto_settings("ActorSettings", self)
        if not isinstance(self.lora, LoraSettings):
            raise ValueError(f"ActorSettings.lora must be a LoraSettings, got {type(self.lora).__name__}")
        self.lora.check_lora()
        check_counts(self, ("logprob_chunk_size",), allow_none=True)
        if self.loss_mode not in list_policy_losses():
            raise ValueError(
                f"ActorSettings.loss_mode {self.loss_mode!r} is not a registered policy loss; "
                f"valid: {list_policy_losses()}"
            )
        try:
            get_policy_loss(self.loss_mode).check_params(self.policy_loss)
        except ValueError as e:
            raise ValueError(f"ActorSettings.policy_loss: {e}") from None
        if self.loss_agg_mode not in ALL_LOSS_AGG_MODES:
            raise ValueError(f"ActorSettings.loss_agg_mode {self.loss_agg_mode!r} unknown; valid: {list(ALL_LOSS_AGG_MODES)}")
        if self.kl_loss_agg_mode is not None and self.kl_loss_agg_mode not in ALL_LOSS_AGG_MODES:
            raise ValueError(f"ActorSettings.kl_loss_agg_mode {self.kl_loss_agg_mode!r} unknown; "
                             f"valid: None (= loss_agg_mode) or one of {list(ALL_LOSS_AGG_MODES)}")
        kind = canonical_kl_kind(self.kl_loss_type)
        if kind == "full":
            raise ValueError("kl_loss_type='full' needs the reference logits; use low_var_kl (k3), kl, abs or mse")
        if not isinstance(self.policy_loss, PolicyLossParams):
            raise ValueError(f"ActorSettings.policy_loss must be a PolicyLossParams, got {type(self.policy_loss).__name__}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        self.check_lr_schedule()
        self.check_optimizer()
        self.check_fsdp_model()
        self.check_checkpoint_contents()


@dataclass
class ReferenceSettings:
    """The frozen reference model's settings (``actor_rollout_ref.ref.*`` and the shared model keys).

    The field names are ``FSDPReference``'s constructor keywords:
    ``FSDPReference(path, rank=..., world_size=..., device=..., **dataclasses.asdict(settings))``.
    """

    param_dtype: str = "float32"
    """dtype the weights are loaded and computed in (nothing is trained: no separate master copy)."""
    param_offload: bool = False
    """FSDP2 CPUOffloadPolicy: the sharded parameters live in CPU memory between uses."""
    reshard_after_forward: bool = True
    """Free the gathered parameters after each forward."""
    attn_implementation: str = "auto"
    """auto (sdpa; flash_attention_2 on CUDA when installed) | sdpa | eager | flash_attention_2."""
    trust_remote_code: bool = False
    override_config: dict | None = None
    """Fields set on the policy's Hugging Face config before it is built (``model.override_config``)."""
    use_remove_padding: bool = False
    """Run every forward on the real tokens only, packed into one row with per-sequence position ids
    (verl's ``use_remove_padding``; grpo_dist/training/policy.py): same results, less compute."""
    use_fused_kernels: bool = False
    """Log-probs without forming the logits (as :class:`ActorSettings`)."""
    logprob_chunk_size: int | None = None
    """Positions per chunk of the output layer's log-softmax; None: from the vocabulary size."""

    def __post_init__(self) -> None:
        to_dtype(self.param_dtype)
        if self.logprob_chunk_size is not None and (not isinstance(self.logprob_chunk_size, int) or self.logprob_chunk_size < 1):
            raise ValueError(f"ReferenceSettings.logprob_chunk_size must be an integer >= 1 or None, got {self.logprob_chunk_size!r}")


@dataclass
class CriticSettings(UpdateBatching, OptimizerSettings, ScheduleSettings, FSDPModelSettings, MemorySettings,
                     CheckpointSettings):
    """The numbers the critic uses (the trainer maps ``critic.*`` onto these).

    Batching works as the actor's (:class:`UpdateBatching`): a rank's rows are ``ppo_epochs`` passes
    over mini-batch chunks of ``ppo_mini_batch_size_per_gpu`` rows, each cut into micro-batches by
    count or by token budget; the value loss uses the counts of the whole mini-batch, so the cut and
    the number of ranks do not change the update.
    """

    # --- the critic's own values of the shared parts --------------------------------------------
    ppo_max_token_len_per_gpu: int = 32768

    # --- value forwards -------------------------------------------------------------------------
    forward_micro_batch_size_per_gpu: int | None = None
    """Responses per value forward (``compute_values``); None: all rows at once (unless dynamic)."""
    forward_max_token_len_per_gpu: int = 32768
    """Token budget of one value forward when ``use_dynamic_bsz``."""
    seed: int = 0
    """Seeds the value head's initialisation (a new head is drawn the same on every rank)."""

    # --- loss -----------------------------------------------------------------------------------
    cliprange_value: float = 0.5
    loss_agg_mode: str = "token-mean"
    norm_constant: float | None = None
    """Divisor of ``seq-mean-token-sum-norm``: the max response length; None: padded width."""

    # --- checkpoints ----------------------------------------------------------------------------
    export_hf: bool = False
    """Every checkpoint also writes a Hugging Face export of the value model (``<dir>/huggingface``)."""

    # --- adapters -------------------------------------------------------------------------------
    lora: LoraSettings = field(default_factory=LoraSettings)
    """LoRA adapters on the frozen backbone, the value head trained in full (``lora.rank > 0``), else
    the whole value model is trained (``merge`` is not read: the critic syncs no weights)."""

    def __post_init__(self) -> None:
        if not isinstance(self.lora, LoraSettings):
            raise ValueError(f"CriticSettings.lora must be a LoraSettings, got {type(self.lora).__name__}")
        self.lora.check_lora()
        self.check_update_batching()
        check_counts(self, ("forward_micro_batch_size_per_gpu",), allow_none=True)
        check_counts(self, ("forward_max_token_len_per_gpu",), allow_none=False)
        check_auto_settings("CriticSettings", self)
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(f"CriticSettings.loss_agg_mode {self.loss_agg_mode!r} unknown; valid: {list(LOSS_AGG_MODES)}")
        if not self.cliprange_value >= 0:
            raise ValueError(f"CriticSettings.cliprange_value must be >= 0, got {self.cliprange_value}")
        self.check_lr_schedule()
        self.check_optimizer()
        self.check_fsdp_model()
        self.check_checkpoint_contents()


@dataclass
class RewardModelSettings(OptimizerSettings, FSDPModelSettings, CheckpointSettings):
    """The learned reward model's settings (the trainer maps ``reward_model.*`` onto these).

    Scoring reads the head's output at response tokens (the score of a prefix that ends with that
    token). Training (iterative RL, ``trainable``) is binary cross-entropy on those outputs as logits
    against the verifier's labels; batching works as the critic's: a rank's rows are ``epochs``
    passes over mini-batch chunks of ``mini_batch_size_per_gpu`` rows, each cut into micro-batches,
    with the loss normalised by the labelled positions of the whole mini-batch (over all ranks), so
    neither the cut nor the number of ranks changes the update. The learning rate is constant.
    """

    # --- scoring ----------------------------------------------------------------------------------
    micro_batch_size_per_gpu: int | None = None
    """Responses per scoring forward on one rank; None: all rows at once (unless dynamic)."""
    use_dynamic_bsz: bool = False
    forward_max_token_len_per_gpu: int = 32768
    """Token budget of one scoring forward when ``use_dynamic_bsz``."""
    reencode: bool = False
    """Decode the policy's tokens with ``input_tokenizer_path`` and re-encode prompt + response with the
    reward model's own chat template (its tokenizer differs from the policy's); outcome scores only."""
    input_tokenizer_path: str | None = None
    max_length: int | None = None
    """Re-encoded inputs longer than this keep their last ``max_length`` tokens."""

    # --- training (iterative RL) ------------------------------------------------------------------
    trainable: bool = False
    """Build an optimizer and allow :meth:`update`; False: a frozen scorer."""
    mini_batch_size_per_gpu: int | None = None
    """Rows of ONE rank in one optimizer step; None: all of the rank's rows."""
    update_micro_batch_size_per_gpu: int | None = None
    """Rows per forward/backward in an update; None: the whole mini-batch."""
    epochs: int = 1
    seed: int = 0
    """Seeds the load, so that anything transformers initialises is the same on every rank (the head
    itself must be in the folder: a folder without one is refused)."""

    def __post_init__(self) -> None:
        check_counts(self, ("micro_batch_size_per_gpu", "mini_batch_size_per_gpu", "update_micro_batch_size_per_gpu",
                            "max_length"), allow_none=True)
        check_counts(self, ("forward_max_token_len_per_gpu", "epochs"), allow_none=False)
        if self.reencode and not self.input_tokenizer_path:
            raise ValueError("RewardModelSettings.reencode needs input_tokenizer_path (the policy's tokenizer)")
        self.check_optimizer()
        self.check_fsdp_model()
        self.check_checkpoint_contents()
