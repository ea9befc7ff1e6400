"""The reward sections: ``reward_model.*`` (the learned outcome or process reward model, its
iterative retraining, the reward manager and its scoring processes), ``reward.*`` (verl's newer
spelling of several of those keys) and ``custom_reward_function.*``. The overlong shaping
(``reward_kwargs``) is declared once for both spellings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from omegaconf import II

from grpo_dist.config.fields import F, Honoured, NoOp, Refused, S
from grpo_dist.config.schema.common import ONE_TIMEOUT
from grpo_dist.config.schema.model import EXTERNAL_LIB_HELP
from grpo_dist.config.sections.engine import (
    FSDP_INTERNAL,
    SPEED_ONLY,
    ULYSSES,
    load_weight_field,
    megatron_section,
    off_feature,
)
from grpo_dist.config.sections.features import (
    MANAGER_NAME,
    MANAGER_SOURCE,
    RewardCustomFunctionConfig,
    RewardManagerConfig,
    SandboxFusionConfig,
    sandbox_section,
)
from grpo_dist.config.sections.profiler import ProfilerConfig, profiler_section


@dataclass
class OverlongBufferConfig:
    enable: bool = F(False, "DAPO's overlong reward shaping: a linear penalty for responses within len tokens of max_resp_len")
    len: int = F(0, "length of the buffer in tokens")
    penalty_factor: float = F(0.0, "the penalty at max_resp_len (falls linearly from 0 inside the buffer)")
    log: bool = F(False, "log reward/overlong_reward/{mean,min} and reward/overlong/mean")


@dataclass
class RewardKwargsConfig:
    overlong_buffer_cfg: OverlongBufferConfig = S(OverlongBufferConfig, "overlong reward shaping (verl's reward_kwargs spelling)")
    max_resp_len: int = II("data.max_response_length")


_RM_FSDP_ONLY = NoOp("the reward model is an FSDP2 forward on each of its ranks here, not served by an inference engine")
_CUSTOM_REWARD_LOOP = off_feature(
    "loading a custom reward-loop class", "use custom_reward_function.path for a custom score, "
    "reward_model.reward_manager for naive / prime / dapo")


@dataclass
class RMWrapPolicyConfig:
    min_num_params: int = F(0, "verl's FSDP1 auto-wrap threshold", FSDP_INTERNAL)


@dataclass
class RMFSDPConfig:
    param_offload: bool = F(False, "keep the reward model's parameters in CPU memory between uses")
    reshard_after_forward: bool = F(True, "free gathered parameters after the forward pass (ZeRO-3 style)")
    fsdp_size: int = F(-1, "devices per FSDP shard group", Refused(
        "hybrid sharding of the reward model is not built here; -1 shards it over all its ranks (the training ranks, "
        "or its own pool's)", accept=(-1,)))
    forward_prefetch: bool = F(False, "prefetch the next layer's parameters in the forward", FSDP_INTERNAL)
    wrap_policy: RMWrapPolicyConfig = S(RMWrapPolicyConfig, "verl's FSDP1 wrap policy")
    model_dtype: str = F("float32", "dtype of the reward model's master weights: float32 | bfloat16 (grpo_dist)")
    dtype: str = F("auto", "compute dtype of the reward model: auto (bfloat16 on CUDA, float32 on CPU) | float32 | bfloat16 | float16 (grpo_dist)")


@dataclass
class RewardModelModelConfig:
    input_tokenizer: Optional[str] = F(
        II("actor_rollout_ref.model.path"),
        "the policy's tokenizer as the reward model sees it: when the reward model's own tokenizer differs "
        "(vocabulary or chat template), responses are decoded with this one and re-encoded with the reward "
        "model's chat template (outcome reward models only); null = feed the policy's token ids as they are",
    )
    path: str = F(
        "~/models/FsfairX-LLaMA3-RM-v0.1",
        "reward model: a Hugging Face directory saved with AutoModelForSequenceClassification or "
        "AutoModelForTokenClassification and one label, read as a token classifier; its weights must hold "
        "that head (a causal LM, or a head under a name the token classifier does not read, is refused at "
        "start-up); the current spelling is reward.reward_model.model_path (set either)",
    )
    trust_remote_code: bool = F(False, "allow the reward model directory's own Python code to run when loading it")
    use_remove_padding: bool = F(False, "pack sequences without padding", NoOp(
        "the reward model's forwards take the padded path, whose scores are the same"))
    override_config: Dict[str, Any] = F({}, "fields set on the reward model's Hugging Face config before it is built")
    fsdp_config: RMFSDPConfig = S(RMFSDPConfig, "FSDP2 settings of the reward model")
    external_lib: Any = F(II("actor_rollout_ref.model.external_lib"), EXTERNAL_LIB_HELP + "; default: the policy's")
    use_shm: bool = F(False, "copy the reward model to shared memory before loading", SPEED_ONLY)
    use_fused_kernels: bool = F(II("actor_rollout_ref.model.use_fused_kernels"), "verl's fused kernels in the reward model; default: the policy's", NoOp(
        "the reward model's forward ends in its one-label score head, not in the vocabulary: there are no "
        "log-probs to fuse"))


@dataclass
class RMProcessConfig:
    enable: bool = F(
        False,
        "process reward model: a score at the end of every reasoning step (the tokens whose text holds "
        "step_separator, and the last response token) instead of one at the last token; needs "
        "algorithm.adv_estimator=grpo_process",
    )
    step_separator: str = F("\n", "the text that ends a reasoning step (a token whose decoded text contains it ends one)")


@dataclass
class RMIterativeConfig:
    enable: bool = F(
        False,
        "iterative RL (DeepSeekMath's Algorithm 1): every steps_per_iteration steps, train the reward model further "
        "on the policy's new samples labelled by the rule-based verifier (with a replay of older samples), then "
        "reset the reference model to the policy",
    )
    steps_per_iteration: int = F(10, "training steps per iteration: the reward model is updated after every this many steps")
    replay_fraction: float = F(0.1, "share of historical samples in the reward model's training mix (the paper's 10%)")
    buffer_size: int = F(8192, "most samples the replay buffer keeps (the oldest go first)")
    heldout_fraction: float = F(
        0.1, "share of each iteration's fresh samples held out of training to measure reward_model/accuracy before and after the update"
    )
    label_threshold: Optional[float] = F(
        0.5,
        "the verifier's label of a response (or step) is 1 when its rule score is >= this value and 0 otherwise "
        "(0.5: a full score of 1 is correct; a format-only 0.1, 0 or a negative score are not); null = the rule "
        "score clamped to [0, 1] as a soft label",
    )
    epochs: int = F(1, "passes over the training mix per iteration")
    lr: float = F(1e-5, "learning rate of the reward model's AdamW (constant)")
    weight_decay: float = F(0.01, "AdamW weight decay of the reward model")
    betas: List[float] = F([0.9, 0.999], "AdamW betas of the reward model")
    grad_clip: float = F(1.0, "clip the reward model's global gradient norm to this value")
    mini_batch_size: int = F(64, "samples per reward-model optimizer step (a global size over all ranks)")
    micro_batch_size_per_gpu: Optional[int] = F(
        None, "samples per reward-model forward/backward on one rank (a memory knob: the update does not depend on it); null = whole mini-batch"
    )
    reset_reference: bool = F(True, "after each reward-model update, set the reference model to the current policy (the KL term then starts from 0)")
    source: Optional[str] = F(None, "with reward.sources: the name of the model source iterative RL trains; null = the "
                              "run's only reward model (grpo_dist)")


@dataclass
class RewardModelConfig:
    enable: bool = F(
        False,
        "score responses with a learned reward model (FSDP2 forward on every rank); the current spelling is "
        "reward.reward_model.enable (set either)",
    )
    strategy: str = F("fsdp2", "training backend of the reward model", NoOp(
        "the reward model runs under FSDP2 either way", values=("fsdp", "fsdp2"),
        otherwise="the Megatron backend is not built here; use fsdp or fsdp2"))
    model: RewardModelModelConfig = S(RewardModelModelConfig, "the reward model (verl's legacy layout)")
    micro_batch_size: Optional[int] = F(None, "verl's deprecated global micro-batch size: divided over the ranks when micro_batch_size_per_gpu is null")
    micro_batch_size_per_gpu: Optional[int] = F(None, "responses per reward-model forward on one rank; null = all at once")
    max_length: Optional[int] = F(
        None, "longest re-encoded input (with input_tokenizer): longer ones keep their last max_length tokens; null = no limit"
    )
    use_dynamic_bsz: bool = F(II("critic.use_dynamic_bsz"), "cut reward-model forwards by token budget; default: the critic's")
    forward_max_token_len_per_gpu: int = F(
        II("critic.forward_max_token_len_per_gpu"), "token budget of one reward-model forward when use_dynamic_bsz is on; default: the critic's"
    )
    use_reward_loop: bool = F(True, "verl's switch between its reward-loop server and its FSDP worker", _RM_FSDP_ONLY)
    rollout: Dict[str, Any] = F({}, "verl's inference-engine settings for serving the reward model", _RM_FSDP_ONLY)
    enable_resource_pool: bool = F(
        False, "give the reward model devices of its own: nnodes x n_gpus_per_node ranks (on CPU: rank processes) with "
        "their own process group, instead of a share of every training rank's device; scores are the same")
    n_gpus_per_node: int = F(8, "devices per node of the reward model's own pool (read with enable_resource_pool)")
    nnodes: int = F(0, "nodes of the reward model's own pool (read with enable_resource_pool; at least 1 then)")
    combine: str = F(
        "verl",
        "how reward-model and rule scores make the reward: verl (the reward model's score, or the custom function's "
        "when custom_reward_function.path is set) | weighted (rm_weight x reward model + rule_weight x rule/custom score)",
    )
    rm_weight: float = F(1.0, "weight of the reward model's score with combine=weighted")
    rule_weight: float = F(1.0, "weight of the rule-based (or custom function's) score with combine=weighted")
    process: RMProcessConfig = S(RMProcessConfig, "process reward model (a score per reasoning step)")
    iterative: RMIterativeConfig = S(RMIterativeConfig, "iterative RL: reward-model retraining with replay and reference reset")
    reward_manager: str = F("naive", "how responses are scored: naive | prime | dapo", MANAGER_NAME)
    num_workers: int = F(2, "processes scoring responses in parallel")
    timeout_s: float = F(10.0, "time limit for scoring one response, in seconds")
    on_error: str = F("raise", "a scorer that raises, hangs or returns a non-number: raise (stop, naming the sample) | zero (score 0, counted)")
    overlong_buffer: OverlongBufferConfig = S(OverlongBufferConfig, "DAPO's overlong reward shaping (its recipe's spelling; max_resp_len = data.max_response_length)")
    reward_kwargs: RewardKwargsConfig = S(RewardKwargsConfig, "reward-manager arguments (verl's spelling of the overlong shaping)")
    reward_loop_source: str = F("register", "where verl's reward loop comes from: register (by reward_manager) | importlib", MANAGER_SOURCE)
    reward_loop_module_path: Optional[str] = F(None, "Python file of a custom reward loop", _CUSTOM_REWARD_LOOP)
    reward_loop_class_name: Optional[str] = F(None, "class name of a custom reward loop", _CUSTOM_REWARD_LOOP)
    launch_reward_fn_async: bool = F(False, "score responses while the old log-probs are computed", NoOp(
        "scoring runs in parallel scoring processes after the rollout and before the log-prob forwards; the "
        "scores and the update are the same either way"))
    sandbox_fusion: SandboxFusionConfig = sandbox_section("verl's early-2026 layout")
    profiler: ProfilerConfig = profiler_section("reward model")
    ulysses_sequence_parallel_size: int = F(1, "Ulysses sequence-parallel ranks of the reward model", ULYSSES)
    nccl_timeout: int = F(II("actor_rollout_ref.nccl_timeout"),
                          "seconds a collective of the reward model may wait (verl's Megatron layout)", ONE_TIMEOUT)
    megatron: Dict[str, Any] = megatron_section("reward model")
    load_weight: bool = load_weight_field("reward model")


@dataclass
class RewardRewardModelConfig:
    enable: bool = F(False, "score with a learned reward model (verl's current spelling of reward_model.enable; set either)")
    model_path: Optional[str] = F(None, "the reward model's directory (verl's current spelling of reward_model.model.path; set either)")
    enable_resource_pool: bool = F(False, "verl's current spelling of reward_model.enable_resource_pool (set either)")
    n_gpus_per_node: int = F(8, "verl's current spelling of reward_model.n_gpus_per_node (set either)")
    nnodes: int = F(0, "verl's current spelling of reward_model.nnodes (set either)")
    rollout: Dict[str, Any] = F({}, "verl's inference-engine settings for serving the reward model", _RM_FSDP_ONLY)


@dataclass
class RewardConfig:
    reward_kwargs: RewardKwargsConfig = S(RewardKwargsConfig, "reward-manager arguments (verl's current spelling of the overlong shaping)")
    num_workers: Optional[int] = F(None, "processes scoring responses; null = reward_model.num_workers (the same setting)",
                                   Honoured(alias_of="reward_model.num_workers"))
    reward_manager: RewardManagerConfig = S(RewardManagerConfig, "the reward manager (verl's current layout)")
    custom_reward_function: RewardCustomFunctionConfig = S(
        RewardCustomFunctionConfig, "a user-supplied reward function (verl's current layout of custom_reward_function)")
    sandbox_fusion: SandboxFusionConfig = sandbox_section("verl's current layout")
    reward_model: RewardRewardModelConfig = S(RewardRewardModelConfig, "the learned reward model (verl's current layout)")
    sources: Dict[str, Any] = F(
        {}, "the run's reward sources by name, each {kind: rule | outcome_model | process_model, weight, path, "
        "step_separator, enable_resource_pool, nnodes, n_gpus_per_node, micro_batch_size_per_gpu}; the reward is the "
        "weighted sum of their scores; empty = the one reward model of reward_model.* and the rule score, weighted by "
        "reward_model.combine (grpo_dist; docs/algorithms.md, reward sources)")


@dataclass
class CustomRewardFunctionConfig:
    path: Optional[str] = F(None, "Python file defining the reward function (runs with the trainer's rights); null = built-in scorers")
    name: Optional[str] = F(
        "compute_score", "function in that file: fn(data_source, solution_str, ground_truth, extra_info=None) -> float; "
        "null = compute_score")
