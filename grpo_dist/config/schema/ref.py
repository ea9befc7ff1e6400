"""``actor_rollout_ref.ref.*``: the frozen reference policy (its log-prob forwards and
``fsdp_config``), created only when a KL term is used."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

from omegaconf import II

from grpo_dist.config.fields import F, NoOp, S
from grpo_dist.config.schema.common import COPY_OF_N, FSDP2_ONLY
from grpo_dist.config.sections.engine import (
    ENTROPY_CHUNKED,
    SPEED_ONLY,
    ULYSSES,
    FSDPEngineKeys,
    RouterReplayConfig,
    load_weight_field,
    megatron_section,
    router_replay_section,
)
from grpo_dist.config.sections.profiler import ProfilerConfig, profiler_section


@dataclass
class RefFSDPConfig(FSDPEngineKeys):
    param_offload: bool = F(False, "keep the reference model's parameters in CPU memory between uses")
    reshard_after_forward: bool = F(True, "free gathered parameters after the forward pass")
    dtype: str = F(II("actor_rollout_ref.actor.fsdp_config.dtype"),
                   "compute dtype of the reference: auto | float32 | bfloat16 | float16; default: the actor's")
    model_dtype: str = F("float32", "dtype the reference's weights are loaded in", NoOp(
        "the reference is frozen: it is held in its compute dtype (fsdp_config.dtype); a master copy only matters "
        "for training", values=("float32", "fp32", "bfloat16", "bf16", "float16", "fp16"), otherwise="use a dtype name"))
    optimizer_offload: bool = F(False, "keep optimizer state in CPU memory", NoOp("the reference has no optimizer"))
    forward_only: bool = F(True, "engine built without an optimizer (verl sets it per role)", NoOp(
        "an engine flag verl sets per role; grpo_dist's roles know whether they train", values=(True,),
        otherwise="leave it at verl's value for the reference (true)"))


@dataclass
class RefConfig:
    log_prob_micro_batch_size_per_gpu: Optional[int] = F(
        None, "responses per reference forward on one rank; null = auto: as many as the rank's memory holds (all of them on small jobs)"
    )
    log_prob_use_dynamic_bsz: bool = F(II("actor_rollout_ref.actor.use_dynamic_bsz"),
                                       "cut reference forwards by token budget; default: the actor's use_dynamic_bsz")
    log_prob_max_token_len_per_gpu: int = F(II("actor_rollout_ref.actor.ppo_max_token_len_per_gpu"),
                                            "token budget of one reference forward; default: the actor's ppo_max_token_len_per_gpu")
    log_prob_micro_batch_size: Optional[int] = F(
        None, "verl's former global size: log_prob_micro_batch_size_per_gpu = this / data-parallel ranks; null = unset")
    fsdp_config: RefFSDPConfig = S(RefFSDPConfig, "FSDP2 settings of the reference model")
    strategy: str = F(II("actor_rollout_ref.actor.strategy"), "training backend of the reference; default: the actor's", FSDP2_ONLY)
    rollout_n: int = F(II("actor_rollout_ref.rollout.n"), "verl's copy of rollout.n", COPY_OF_N)
    use_torch_compile: bool = F(True, "torch.compile the reference's log-prob functions", SPEED_ONLY)
    ulysses_sequence_parallel_size: int = F(1, "Ulysses sequence-parallel ranks", ULYSSES)
    entropy_checkpointing: bool = F(False, "recompute the entropy in the backward", ENTROPY_CHUNKED)
    entropy_from_logits_with_chunking: bool = F(False, "compute the entropy in chunks", ENTROPY_CHUNKED)
    entropy_from_logits_chunk_size: int = F(2048, "positions per entropy chunk", ENTROPY_CHUNKED)
    pad_to_length: bool = F(False, "pad packed sequences to fixed lengths", SPEED_ONLY)
    profiler: ProfilerConfig = profiler_section("reference")
    router_replay: RouterReplayConfig = router_replay_section()
    megatron: Dict[str, Any] = megatron_section("reference")
    load_weight: bool = load_weight_field("reference")
