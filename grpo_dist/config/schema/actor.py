"""``actor_rollout_ref.actor.*``: the policy update (batch sizes, clipping, loss aggregation, KL
loss), with its subsections ``policy_loss`` (generated from the loss parameters), ``optim``,
``fsdp_config`` and ``checkpoint``."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields, make_dataclass
from types import UnionType
from typing import Any, Dict, List, Optional, Union, get_type_hints

from omegaconf import II

from grpo_dist.config.fields import F, Honoured, NoOp, S
from grpo_dist.config.schema.common import COPY_OF_N, FSDP2_ONLY, SCHEDULE_LENGTH
from grpo_dist.config.sections.engine import (
    ENTROPY_CHUNKED,
    SPEED_ONLY,
    ULYSSES,
    FSDPEngineKeys,
    MegatronOptimKeys,
    QATConfig,
    RouterReplayConfig,
    load_weight_field,
    megatron_section,
    off_feature,
    qat_section,
    router_replay_section,
)
from grpo_dist.config.sections.profiler import ProfilerConfig, profiler_section
from grpo_dist.core.names import ALL_LOSS_AGG_MODES
from grpo_dist.core.policy_loss_registry import BUILTIN_POLICY_LOSSES, PolicyLossParams, policy_loss_keys
from grpo_dist.core.schedules import LR_SCHEDULER_TYPES


TEXT_MODELS = NoOp("grpo_dist trains text models: there is no vision tower")


def _loss_param(name: str) -> Any:
    """The :class:`~grpo_dist.core.policy_loss.PolicyLossParams` field ``name`` of a loss parameter keyed
    in this section (``actor_rollout_ref.actor.<name>``): its default and help are declared there once."""
    return next(f for f in fields(PolicyLossParams) if f.name == name)


@dataclass
class OptimConfig(MegatronOptimKeys):
    lr: float = F(5e-4, "peak learning rate of the optimizer (AdamW by default)")
    weight_decay: float = F(0.01, "weight decay of the optimizer (AdamW's by default)")
    betas: List[float] = F([0.9, 0.999], "betas of an Adam-type optimizer")
    lr_warmup_steps: int = F(-1, "linear warm-up steps; -1 = use lr_warmup_steps_ratio")
    lr_warmup_steps_ratio: float = F(0.0, "warm-up steps as a fraction of the total training steps")
    lr_scheduler_type: str = F("constant", "schedule after warm-up: " + " | ".join(LR_SCHEDULER_TYPES))
    min_lr_ratio: float = F(0.0, "cosine schedule floor as a fraction of lr")
    total_training_steps: int = F(-1, "schedule length; verl's trainer writes the run's step count here", SCHEDULE_LENGTH)
    clip_grad: float = F(1.0, "clip the global gradient norm to this value",
                         Honoured(alias_of="actor_rollout_ref.actor.grad_clip"))
    warmup_style: Optional[str] = F(None, "verl's former name of lr_scheduler_type; null = unset",
                                    Honoured(alias_of=".lr_scheduler_type"))
    num_cycles: float = F(0.5, "waves of the cosine schedule (0.5 = one half cosine down to min_lr_ratio)")
    zero_indexed_step: bool = F(True, "the cosine schedule counts steps from 0 (false: from 1)")
    optimizer: str = F("AdamW", "optimizer class in optimizer_impl (AdamW, Adam, SGD, ...); built with lr and "
                       "weight_decay, and betas when its name contains 'adam' (verl's rule)")
    optimizer_impl: str = F("torch.optim", "module the optimizer class is imported from: torch.optim, or a package "
                            "installed where the workers run (torchao.optim, bitsandbytes.optim, ...)")
    override_optimizer_config: Dict[str, Any] = F(
        {}, "further keyword arguments of the optimizer (momentum, eps, ...; may override lr, weight_decay and "
        "betas), each set as +...override_optimizer_config.NAME=VALUE; {} = none (verl's null)")


@dataclass
class FSDPConfig(FSDPEngineKeys):
    param_offload: bool = F(False, "keep parameters in CPU memory between uses")
    optimizer_offload: bool = F(False, "keep optimizer state in CPU memory")
    reshard_after_forward: bool = F(True, "free gathered parameters after the forward pass (ZeRO-3 style)")
    model_dtype: str = F("float32", "dtype of the master weights: float32 | bfloat16 (verl's fp32 | bf16 too)")
    dtype: str = F("auto", "compute (mixed-precision) dtype: auto (bfloat16 on CUDA, float32 on CPU) | float32 | bfloat16 | float16")


@dataclass
class CheckpointConfig:
    save_contents: List[str] = F(
        ["model", "optimizer", "extra"],
        "what a checkpoint holds: model, optimizer, extra (LR schedule, RNG, counters), hf_model (a Hugging Face "
        "export too); the run's position (step, data order) is always saved",
    )
    load_contents: List[str] = F(
        II("actor_rollout_ref.actor.checkpoint.save_contents"),
        "what resume restores: model (needed), optimizer, extra; what is left out starts fresh; default: save_contents",
    )
    contents: Optional[List[str]] = F(
        None, "grpo_dist's former name of save_contents; null = unset",
        Honoured(alias_of="actor_rollout_ref.actor.checkpoint.save_contents"))
    async_save: bool = F(False, "write checkpoints in the background", NoOp(
        "checkpoints are written at the step boundary; the files are the same"))
    strict: bool = F(True, "refuse a checkpoint whose weights do not match the model", NoOp(
        "loading is always strict here", values=(True,), otherwise="a checkpoint must match the model (strict=true)"))


def _policy_loss_config() -> type:
    """``actor_rollout_ref.actor.policy_loss``, generated from the loss parameters' one declaration:
    ``loss_mode``, then one key per :func:`~grpo_dist.core.policy_loss.policy_loss_keys` field of
    :class:`~grpo_dist.core.policy_loss.PolicyLossParams` (its type, default and help, in declaration
    order). A new loss parameter declared there becomes a key here, in conf/ and in
    docs/configuration.md with no edit of this module."""
    hints = get_type_hints(PolicyLossParams)
    params = [
        (f.name, _config_type(hints[f.name]), F(f.default if f.default is not MISSING else f.default_factory(),
                                                f.metadata["help"]))
        for f in policy_loss_keys()
    ]
    loss_mode = F(
        "vanilla",
        "policy-loss mode: " + " | ".join(m for m in BUILTIN_POLICY_LOSSES if m != "bypass_mode")
        + ", or a mode registered with grpo_dist.core.policy_loss.register_policy_loss"
        + " (vanilla: the PPO clipped surrogate with clip-higher and dual clip; docs/algorithms.md)",
    )
    # verl's own SAPO scripts set the gate temperatures here (verl's loss reads the actor's keys)
    aliases = [(name, Optional[float], F(None, "SAPO's gate temperature where verl's SAPO scripts write it; null = unset",
                                         Honoured(alias_of=f"actor_rollout_ref.actor.{name}")))
               for name in ("tau_pos", "tau_neg")]
    cls = make_dataclass("PolicyLossConfig", [("loss_mode", str, loss_mode), *params, *aliases])
    cls.__module__ = __name__  # importable (pickled with the configuration) as grpo_dist.config.schema.actor.PolicyLossConfig
    return cls


def _config_type(tp: Any) -> Any:
    """``tp`` as OmegaConf reads it (``X | None`` written as ``Optional[X]``)."""
    return Union[tp.__args__] if isinstance(tp, UnionType) else tp


PolicyLossConfig = _policy_loss_config()


@dataclass
class ActorConfig:
    strategy: str = F("fsdp2", "training backend: fsdp2 (fsdp is accepted as an alias)", FSDP2_ONLY)
    ppo_mini_batch_size: int = F(16, "prompts per optimizer step (x rollout.n responses); a global size over all ranks")
    ppo_micro_batch_size_per_gpu: Optional[int] = F(
        None, "responses per forward/backward on one rank (a memory knob: the update does not depend on it); null = auto: the "
        "whole mini-batch when its estimated activations fit in the rank's memory, else cut by a token budget that fits"
    )
    use_dynamic_bsz: bool = F(False, "cut micro-batches by token budget (ppo_max_token_len_per_gpu) instead of by count")
    ppo_max_token_len_per_gpu: int = F(16384, "token budget of one micro-batch when use_dynamic_bsz is on")
    ppo_epochs: int = F(1, "passes over each step's responses")
    shuffle: bool = F(
        False, "shuffle the step's responses before cutting them into mini-batches, anew every ppo epoch (a global "
        "permutation seeded by data_loader_seed, the same for any number of ranks)")
    data_loader_seed: int = F(42, "seed of the mini-batch shuffle (actor.shuffle)")
    clip_ratio: float = F(0.2, "PPO clip range epsilon (both sides unless clip_ratio_low/high are set)")
    clip_ratio_low: Optional[float] = F(None, "lower clip range; null = clip_ratio")
    clip_ratio_high: Optional[float] = F(None, "upper clip range (clip-higher); null = clip_ratio")
    clip_ratio_c: float = F(3.0, "dual-clip constant bounding the loss of negative-advantage tokens; must be > 1")
    loss_agg_mode: str = F(
        "token-mean", "loss aggregation: " + " | ".join(ALL_LOSS_AGG_MODES) + " (seq-mean-token-sum-norm: Dr. GRPO)"
    )
    entropy_coeff: float = F(0.0, "entropy bonus coefficient")
    use_kl_loss: bool = F(True, "add beta x KL(policy || reference) to the loss (GRPO); needs the reference model")
    kl_loss_coef: float = F(0.001, "beta, the coefficient of the KL loss")
    kl_loss_type: str = F("low_var_kl", "KL estimator: kl (k1) | abs | mse (k2) | low_var_kl (k3) | k1+ | k3+ (value of k1/k3, gradient of k2)")
    kl_loss_agg_mode: Optional[str] = F(
        None,
        "aggregation of the KL loss over the mini-batch: " + " | ".join(ALL_LOSS_AGG_MODES)
        + "; null = loss_agg_mode (as verl does). Not a verl key: token-mean under a seq-mean-token-sum policy "
        "term is the GRPO paper's loss (the in-process API's default)",
    )
    grad_clip: float = F(1.0, "clip the global gradient norm to this value")
    ppo_micro_batch_size: Optional[int] = F(
        None, "verl's former global micro-batch size: ppo_micro_batch_size_per_gpu = this / data-parallel ranks; null = unset")
    use_remove_padding: bool = F(II("actor_rollout_ref.model.use_remove_padding"),
                                 "packed forwards in the actor (default: model.use_remove_padding)")
    loss_scale_factor: Optional[float] = F(
        None, "divisor of loss_agg_mode=seq-mean-token-sum-norm; null = the response length (rollout.response_length)")
    rollout_n: int = F(II("actor_rollout_ref.rollout.n"), "verl's copy of rollout.n", COPY_OF_N)
    use_fused_kernels: bool = F(False, "verl's fused log-prob/entropy kernels in the actor", ENTROPY_CHUNKED)
    use_torch_compile: bool = F(True, "torch.compile the actor's log-prob functions", SPEED_ONLY)
    ulysses_sequence_parallel_size: int = F(1, "Ulysses sequence-parallel ranks", ULYSSES)
    entropy_checkpointing: bool = F(False, "recompute the entropy in the backward", ENTROPY_CHUNKED)
    entropy_from_logits_with_chunking: bool = F(False, "compute the entropy in chunks", ENTROPY_CHUNKED)
    entropy_from_logits_chunk_size: int = F(2048, "positions per entropy chunk", ENTROPY_CHUNKED)
    calculate_entropy: bool = F(False, "compute the entropy even without an entropy bonus", NoOp(
        "actor/entropy is always computed and logged here"))
    calculate_sum_pi_squared: bool = F(False, "compute sum_v pi_v^2 per token (verl's optimal-baseline estimators)",
                                       off_feature("sum_v pi_v^2 per token", "leave it off"))
    sum_pi_squared_checkpointing: bool = F(False, "recompute sum_v pi_v^2 in the backward (verl early 2026)", NoOp(
        "read only with calculate_sum_pi_squared, which is accepted only off here"))
    use_prefix_grouper: bool = F(False, "share the prompt's forward among a group's responses", SPEED_ONLY)
    pad_to_length: bool = F(False, "pad packed sequences to fixed lengths", SPEED_ONLY)
    freeze_vision_tower: bool = F(False, "freeze a vision-language model's vision tower", TEXT_MODELS)
    tau_pos: float = F(_loss_param("tau_pos").default, _loss_param("tau_pos").metadata["help"])
    tau_neg: float = F(_loss_param("tau_neg").default, _loss_param("tau_neg").metadata["help"])
    policy_loss: PolicyLossConfig = S(PolicyLossConfig, "the policy-loss function")
    optim: OptimConfig = S(OptimConfig, "optimizer and learning-rate schedule")
    fsdp_config: FSDPConfig = S(FSDPConfig, "FSDP2 sharding and precision")
    checkpoint: CheckpointConfig = S(CheckpointConfig, "checkpoint contents")
    profiler: ProfilerConfig = profiler_section("actor")
    qat: QATConfig = qat_section()
    router_replay: RouterReplayConfig = router_replay_section()
    megatron: Dict[str, Any] = megatron_section("actor")
    load_weight: bool = load_weight_field("actor")
