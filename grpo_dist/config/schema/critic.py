"""``critic.*``: the value model trained alongside the policy (PPO with GAE; on when the advantage
estimator needs values), with its ``model``, ``optim``, ``fsdp`` (and verl's earlier
``model.fsdp_config``) and ``checkpoint`` subsections."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from omegaconf import II

from grpo_dist.config.fields import F, NoOp, S
from grpo_dist.config.schema.actor import FSDPConfig, OptimConfig
from grpo_dist.config.schema.common import COPY_OF_N, FSDP2_ONLY, ONE_TIMEOUT
from grpo_dist.config.schema.model import CRITIC_LORA_KEYS, EXTERNAL_LIB_HELP, engine_model_keys, hf_config_path_field
from grpo_dist.config.sections.engine import (
    SPEED_ONLY,
    ULYSSES,
    FusedKernelOptions,
    load_weight_field,
    megatron_section,
)
from grpo_dist.config.sections.profiler import ProfilerConfig, profiler_section
from grpo_dist.core.names import LOSS_AGG_MODES


CRITIC_READS_ACTOR_IDS = NoOp("the critic reads the actor's token ids (its prompts are never templated on their own)")


CriticFSDPConfig = FSDPConfig
"""The value model's FSDP2 keys are the actor's (``actor_rollout_ref.actor.fsdp_config``), read the same way."""


@dataclass
@engine_model_keys(CRITIC_LORA_KEYS)
class CriticModelConfig:
    path: str = F(
        II("actor_rollout_ref.model.path"),
        "value model: a Hugging Face directory (a causal LM gets a new scalar value head; one saved with "
        "AutoModelForTokenClassification, num_labels=1, keeps its own); default: the actor's model",
    )
    tokenizer_path: Optional[str] = F(
        II("actor_rollout_ref.model.path"),
        "the critic's tokenizer in verl; the critic reads the actor's token ids here, so its model's vocabulary "
        "must cover the actor's tokenizer (checked at start-up)", CRITIC_READS_ACTOR_IDS,
    )
    override_config: Dict[str, Any] = F(
        {}, "fields set on the value model's Hugging Face config before it is built (attn_implementation picks the attention kernel)"
    )
    use_remove_padding: bool = F(
        True, "run the value model's forwards on the real tokens only, packed into one row per micro-batch (same results, less compute)"
    )
    enable_gradient_checkpointing: Any = F(
        "auto", "recompute the value model's activations in the backward pass: true | false | auto (on only when a "
        "micro-batch's estimated activations would not fit in the rank's memory)"
    )
    trust_remote_code: bool = F(II("actor_rollout_ref.model.trust_remote_code"), "allow the value model directory's own Python code to run when loading it")
    fsdp_config: CriticFSDPConfig = S(
        CriticFSDPConfig, "FSDP2 settings of the value model, verl's early-2026 place for them (critic.fsdp is the current one; set either)"
    )
    custom_chat_template: Optional[str] = F(None, "the critic's chat template", CRITIC_READS_ACTOR_IDS)
    hf_config_path: Optional[str] = hf_config_path_field("the value model", "critic.model.path")
    external_lib: Any = F(None, EXTERNAL_LIB_HELP)
    use_fused_kernels: bool = F(False, "verl's fused kernels", SPEED_ONLY)
    fused_kernel_options: FusedKernelOptions = S(FusedKernelOptions, "options of verl's fused kernels", SPEED_ONLY)


@dataclass
class CriticOptimConfig(OptimConfig):
    """The actor's optimizer keys (same order, same reading), with the critic's learning rate and its own
    ``clip_grad`` (an alias of ``critic.grad_clip``, not of the actor's)."""

    lr: float = F(1e-5, "peak learning rate of the critic's optimizer")
    clip_grad: float = F(1.0, "clip the critic's global gradient norm to this value (verl's current key; critic.grad_clip is the early-2026 one: set either)")


@dataclass
class CriticCheckpointConfig:
    save_contents: List[str] = F(
        ["model", "optimizer", "extra"],
        "what the critic's checkpoint holds: model, optimizer, extra (schedule, RNG; all three always, for an exact "
        "resume) and hf_model (also a Hugging Face export of the value model, critic/huggingface)",
    )
    load_contents: List[str] = F(
        II("critic.checkpoint.save_contents"), "what resume loads: model, optimizer and extra (all three: resume is exact)"
    )
    async_save: bool = F(False, "write checkpoints in the background", NoOp(
        "checkpoints are written at the step boundary; the files are the same"))


@dataclass
class CriticConfig:
    enable: Optional[bool] = F(None, "train a critic (value model); null = on iff algorithm.adv_estimator needs values (gae)")
    strategy: str = F("fsdp2", "training backend of the critic: fsdp2 (fsdp is accepted as an alias)", FSDP2_ONLY)
    ppo_mini_batch_size: int = F(
        II("actor_rollout_ref.actor.ppo_mini_batch_size"),
        "prompts per critic optimizer step (x rollout.n responses), a global size; default: the actor's",
    )
    ppo_micro_batch_size_per_gpu: Optional[int] = F(
        None, "responses per critic forward/backward on one rank (a memory knob: the update does not depend on it); null = auto, "
        "as the actor's"
    )
    use_dynamic_bsz: bool = F(
        II("actor_rollout_ref.actor.use_dynamic_bsz"),
        "cut critic micro-batches by token budget (ppo_max_token_len_per_gpu); default: the actor's",
    )
    ppo_max_token_len_per_gpu: int = F(32768, "token budget of one critic micro-batch when use_dynamic_bsz is on")
    forward_micro_batch_size_per_gpu: Optional[int] = F(
        II("critic.ppo_micro_batch_size_per_gpu"), "responses per value forward on one rank; default: ppo_micro_batch_size_per_gpu"
    )
    forward_max_token_len_per_gpu: int = F(
        II("critic.ppo_max_token_len_per_gpu"), "token budget of one value forward when use_dynamic_bsz is on; default: ppo_max_token_len_per_gpu"
    )
    ppo_epochs: int = F(II("actor_rollout_ref.actor.ppo_epochs"), "passes of the critic over each step's responses; default: the actor's")
    shuffle: bool = F(
        II("actor_rollout_ref.actor.shuffle"),
        "shuffle the step's responses before cutting critic mini-batches, anew every epoch (seeded by "
        "critic.data_loader_seed); default: the actor's"
    )
    cliprange_value: float = F(0.5, "value clip range c: a prediction is also scored at clip(v, v_old - c, v_old + c)")
    loss_agg_mode: str = F(
        II("actor_rollout_ref.actor.loss_agg_mode"),
        "value-loss aggregation: " + " | ".join(LOSS_AGG_MODES) + "; default: the actor's",
    )
    grad_clip: float = F(1.0, "clip the critic's global gradient norm (verl's early-2026 key; critic.optim.clip_grad is the current one: set either)")
    model: CriticModelConfig = S(CriticModelConfig, "the value model")
    optim: CriticOptimConfig = S(CriticOptimConfig, "the critic's optimizer and learning-rate schedule")
    fsdp: CriticFSDPConfig = S(CriticFSDPConfig, "FSDP2 settings of the value model (verl's current place; critic.model.fsdp_config is the early-2026 one; set either)")
    checkpoint: CriticCheckpointConfig = S(CriticCheckpointConfig, "the critic's checkpoint contents")
    data_loader_seed: int = F(42, "seed of the critic's mini-batch shuffle (critic.shuffle)")
    ppo_micro_batch_size: Optional[int] = F(
        None, "verl's former global micro-batch size: ppo_micro_batch_size_per_gpu = this / data-parallel ranks; null = unset")
    forward_micro_batch_size: Optional[int] = F(
        None, "verl's former global size of a value forward: forward_micro_batch_size_per_gpu = this / ranks; null = unset")
    loss_scale_factor: Optional[float] = F(II("actor_rollout_ref.actor.loss_scale_factor"),
                                           "divisor of seq-mean-token-sum-norm; default: the actor's")
    rollout_n: int = F(II("actor_rollout_ref.rollout.n"), "verl's copy of rollout.n", COPY_OF_N)
    ulysses_sequence_parallel_size: int = F(1, "Ulysses sequence-parallel ranks", ULYSSES)
    profiler: ProfilerConfig = profiler_section("critic")
    nccl_timeout: int = F(II("actor_rollout_ref.nccl_timeout"), "seconds a collective of the critic may wait (verl's Megatron layout)",
                          ONE_TIMEOUT)
    megatron: Dict[str, Any] = megatron_section("critic")
    load_weight: bool = load_weight_field("critic")
