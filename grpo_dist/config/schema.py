"""The configuration schema: verl's key tree as typed dataclasses.

This module is the single source of every default. ``conf/grpo_trainer.yaml`` and
``docs/configuration.md`` are generated from it (``python -m grpo_dist.config.docgen``) and a
test keeps them in step, so a default can never be written in two places that drift.

Each field carries its one-line help text in ``metadata["help"]``; the generator writes it as the
YAML comment. Defaults follow verl's ``ppo_trainer.yaml`` except where the no-argument run must be
the embedded CPU job (data files, model, sizes, estimator, KL loss, device, logger); those
differences are listed in ``VERL_DEFAULT_DIFFERENCES`` and in the generated reference.

Cross-key rules (divisibility, ranges, files that must exist) live in ``validate.py``; both raise
:class:`ConfigError`, whose message is printed as is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import II

from grpo_dist.core.advantages import list_adv_estimators
from grpo_dist.core.policy_loss import BUILTIN_POLICY_LOSSES
from grpo_dist.core.schedules import LR_SCHEDULER_TYPES


class ConfigError(ValueError):
    """A user mistake in the configuration. The message is meant to be printed as is."""


def F(default: Any, help: str, **kw: Any) -> Any:  # noqa: A002 - mirrors argparse's name
    """A dataclass field with a default and its one-line help text."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


def S(cls: type, help: str) -> Any:
    """A nested config section."""
    return field(default_factory=cls, metadata={"help": help})


# --------------------------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------------------------
@dataclass
class DataConfig:
    tokenizer: Optional[str] = F(None, "tokenizer path; null = the model's own (actor_rollout_ref.model.path)")
    train_files: Any = F(
        "builtin:reverse/train",
        "training prompts: a parquet/jsonl path or a list of them, in verl's row format ('builtin:' = embedded task)",
    )
    val_files: Any = F(
        "builtin:reverse/test",
        "validation prompts: a parquet/jsonl path or list; null = no validation",
    )
    prompt_key: str = F("prompt", "column holding the prompt (a list of chat messages, or a string)")
    reward_fn_key: str = F("data_source", "column that selects the rule-based scorer for a row")
    max_prompt_length: int = F(64, "longest prompt in tokens (after the chat template)")
    max_response_length: int = F(24, "longest response in tokens")
    train_batch_size: int = F(32, "prompts per training step; responses per step = train_batch_size x rollout.n")
    gen_batch_size: Optional[int] = F(
        None, "prompts per generation batch of dynamic sampling (algorithm.filter_groups); null = train_batch_size; unused without it"
    )
    val_batch_size: Optional[int] = F(None, "prompts per validation batch; null = the whole validation set at once")
    shuffle: bool = F(True, "shuffle the training prompts every epoch (seeded by data.seed)")
    seed: int = F(42, "seed of the prompt shuffling")
    filter_overlong_prompts: bool = F(False, "drop prompts longer than max_prompt_length instead of applying truncation")
    truncation: str = F("error", "prompt longer than max_prompt_length: error | left | right | middle")
    skip_bad_rows: bool = F(False, "skip malformed data rows (and count them) instead of stopping with an error")
    return_raw_chat: bool = F(False, "keep the raw chat messages in the batch (verl compatibility; unused here)")


# --------------------------------------------------------------------------------------------
# actor_rollout_ref
# --------------------------------------------------------------------------------------------
@dataclass
class ModelConfig:
    path: str = F("builtin:tiny-reverse", "Hugging Face model directory (or hub-cache name) of the policy and reference")
    enable_gradient_checkpointing: bool = F(True, "recompute activations in the backward pass to save memory")
    use_remove_padding: bool = F(
        True,
        "run the actor's and reference's forwards on the real tokens only, packed into one row per "
        "micro-batch with per-sequence position ids (same results as the padded path, less compute)",
    )
    trust_remote_code: bool = F(False, "allow the model directory's own Python code to run when loading it")
    attn_implementation: str = F("auto", "attention kernel: auto (sdpa, or flash_attention_2 on CUDA when installed) | sdpa | eager | flash_attention_2")


@dataclass
class OptimConfig:
    lr: float = F(5e-4, "peak learning rate of AdamW")
    weight_decay: float = F(0.01, "AdamW weight decay")
    betas: List[float] = F([0.9, 0.999], "AdamW betas")
    lr_warmup_steps: int = F(-1, "linear warm-up steps; -1 = use lr_warmup_steps_ratio")
    lr_warmup_steps_ratio: float = F(0.0, "warm-up steps as a fraction of the total training steps")
    lr_scheduler_type: str = F("constant", "schedule after warm-up: " + " | ".join(LR_SCHEDULER_TYPES))
    min_lr_ratio: float = F(0.0, "cosine schedule floor as a fraction of lr")
    total_training_steps: int = F(-1, "set by the trainer from the data and trainer.total_epochs; -1 = derive")


@dataclass
class FSDPConfig:
    param_offload: bool = F(False, "keep parameters in CPU memory between uses")
    optimizer_offload: bool = F(False, "keep optimizer state in CPU memory")
    reshard_after_forward: bool = F(True, "free gathered parameters after the forward pass (ZeRO-3 style)")
    model_dtype: str = F("float32", "dtype of the master weights: float32 | bfloat16")
    dtype: str = F("auto", "compute (mixed-precision) dtype: auto (bfloat16 on CUDA, float32 on CPU) | float32 | bfloat16 | float16")


@dataclass
class CheckpointConfig:
    contents: List[str] = F(["model", "optimizer", "extra"], "what a checkpoint holds: model, optimizer, extra (schedule, RNG, data position), hf_model")


@dataclass
class PolicyLossConfig:
    loss_mode: str = F(
        "vanilla",
        "policy-loss mode: " + " | ".join(m for m in BUILTIN_POLICY_LOSSES if m != "bypass_mode")
        + ", or a mode registered with grpo_dist.core.policy_loss.register_policy_loss"
        + " (vanilla: the PPO clipped surrogate with clip-higher and dual clip; docs/algorithms.md)",
    )
    clip_cov_ratio: float = F(0.0002, "clip_cov: fraction of response tokens whose gradient may be cut")
    clip_cov_lb: float = F(1.0, "clip_cov: lower bound of the covariance of the tokens that may be cut")
    clip_cov_ub: float = F(5.0, "clip_cov: upper bound of the covariance of the tokens that may be cut")
    kl_cov_ratio: float = F(0.0002, "kl_cov: fraction of response tokens (largest covariance) that get the KL penalty")
    ppo_kl_coef: float = F(0.1, "kl_cov: coefficient of that KL penalty")


@dataclass
class ActorConfig:
    strategy: str = F("fsdp2", "training backend: fsdp2 (fsdp is accepted as an alias)")
    ppo_mini_batch_size: int = F(16, "prompts per optimizer step (x rollout.n responses); a global size over all ranks")
    ppo_micro_batch_size_per_gpu: Optional[int] = F(
        None, "responses per forward/backward on one rank (a memory knob: the update does not depend on it); null = whole mini-batch"
    )
    use_dynamic_bsz: bool = F(False, "cut micro-batches by token budget (ppo_max_token_len_per_gpu) instead of by count")
    ppo_max_token_len_per_gpu: int = F(16384, "token budget of one micro-batch when use_dynamic_bsz is on")
    ppo_epochs: int = F(1, "passes over each step's responses")
    shuffle: bool = F(False, "shuffle responses before cutting them into mini-batches (seeded)")
    clip_ratio: float = F(0.2, "PPO clip range epsilon (both sides unless clip_ratio_low/high are set)")
    clip_ratio_low: Optional[float] = F(None, "lower clip range; null = clip_ratio")
    clip_ratio_high: Optional[float] = F(None, "upper clip range (clip-higher); null = clip_ratio")
    clip_ratio_c: float = F(3.0, "dual-clip constant bounding the loss of negative-advantage tokens; must be > 1")
    loss_agg_mode: str = F(
        "token-mean", "loss aggregation: token-mean | token-sum | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm (Dr. GRPO)"
    )
    entropy_coeff: float = F(0.0, "entropy bonus coefficient")
    use_kl_loss: bool = F(True, "add beta x KL(policy || reference) to the loss (GRPO); needs the reference model")
    kl_loss_coef: float = F(0.001, "beta, the coefficient of the KL loss")
    kl_loss_type: str = F("low_var_kl", "KL estimator: kl (k1) | abs | mse (k2) | low_var_kl (k3) | k1+ | k3+ (value of k1/k3, gradient of k2)")
    grad_clip: float = F(1.0, "clip the global gradient norm to this value")
    policy_loss: PolicyLossConfig = S(PolicyLossConfig, "the policy-loss function")
    optim: OptimConfig = S(OptimConfig, "optimizer and learning-rate schedule")
    fsdp_config: FSDPConfig = S(FSDPConfig, "FSDP2 sharding and precision")
    checkpoint: CheckpointConfig = S(CheckpointConfig, "checkpoint contents")


@dataclass
class RefFSDPConfig:
    param_offload: bool = F(False, "keep the reference model's parameters in CPU memory between uses")
    reshard_after_forward: bool = F(True, "free gathered parameters after the forward pass")


@dataclass
class RefConfig:
    log_prob_micro_batch_size_per_gpu: Optional[int] = F(None, "responses per reference forward on one rank; null = all at once")
    log_prob_use_dynamic_bsz: bool = F(False, "cut reference forwards by token budget")
    log_prob_max_token_len_per_gpu: int = F(16384, "token budget of one reference forward")
    fsdp_config: RefFSDPConfig = S(RefFSDPConfig, "FSDP2 settings of the reference model")


@dataclass
class ValKwargsConfig:
    n: int = F(1, "samples per validation prompt")
    temperature: float = F(0.0, "validation sampling temperature (0 = greedy)")
    top_p: float = F(1.0, "validation nucleus sampling")
    top_k: int = F(-1, "validation top-k (-1 = off)")
    do_sample: bool = F(False, "sample during validation (false = greedy)")


@dataclass
class RolloutConfig:
    name: str = F("vllm", "rollout engine: vllm | hf (Hugging Face generate)")
    mode: str = F("sync", "rollout mode (sync only)")
    n: int = F(8, "responses sampled per prompt (the GRPO group size)")
    temperature: float = F(1.0, "sampling temperature")
    top_p: float = F(1.0, "nucleus sampling")
    top_k: int = F(-1, "top-k sampling (-1 = off)")
    do_sample: bool = F(True, "sample (false = greedy)")
    prompt_length: int = II("data.max_prompt_length")
    response_length: int = II("data.max_response_length")
    dtype: str = F("auto", "engine dtype: auto (bfloat16 on CUDA, float32 on CPU) | float32 | bfloat16 | float16")
    gpu_memory_utilization: float = F(0.5, "fraction of device memory the engine may take")
    kv_cache_gib: float = F(1.0, "KV-cache size in GiB on CPU (vLLM's VLLM_CPU_KVCACHE_SPACE)")
    tensor_model_parallel_size: int = F(1, "tensor-parallel ranks per rollout engine (only 1 for now)")
    max_num_seqs: int = F(1024, "most sequences the engine batches at once")
    max_num_batched_tokens: int = F(8192, "most tokens the engine schedules in one iteration")
    max_model_len: Optional[int] = F(None, "engine context length; null = prompt_length + response_length")
    enforce_eager: bool = F(True, "disable CUDA graphs in the engine")
    free_cache_engine: bool = F(True, "release the engine's KV cache while the actor trains (where supported)")
    update_weights_bucket_megabytes: int = F(512, "weight sync: most MiB of weights gathered and sent at once (one flat buffer per bucket)")
    log_prob_micro_batch_size_per_gpu: Optional[int] = F(None, "responses per old-log-prob forward on one rank; null = all at once")
    log_prob_use_dynamic_bsz: bool = F(False, "cut old-log-prob forwards by token budget")
    log_prob_max_token_len_per_gpu: int = F(16384, "token budget of one old-log-prob forward")
    seed: int = F(0, "engine sampling seed (each rollout rank adds its rank)")
    calculate_log_probs: bool = F(False, "also return the rollout engine's log-prob of every sampled token (batch key rollout_log_probs) and, when the old-log-prob forward runs, log training/rollout_probs_diff_{max,mean,std} against the actor's; costs 10-20 % of vLLM's generation time on CPU, and the hf engine keeps every step's scores (responses x vocab float32 per token)")
    val_kwargs: ValKwargsConfig = S(ValKwargsConfig, "sampling for validation")


@dataclass
class ActorRolloutRefConfig:
    hybrid_engine: bool = F(True, "colocate actor, reference and rollout of a rank on one device")
    model: ModelConfig = S(ModelConfig, "the policy model")
    actor: ActorConfig = S(ActorConfig, "the policy update")
    ref: RefConfig = S(RefConfig, "the frozen reference policy (created only when a KL term is used)")
    rollout: RolloutConfig = S(RolloutConfig, "response generation")


# --------------------------------------------------------------------------------------------
# critic (PPO with a value model; on when the advantage estimator needs values)
# --------------------------------------------------------------------------------------------
@dataclass
class CriticFSDPConfig:
    param_offload: bool = F(False, "keep the value model's parameters in CPU memory between uses")
    optimizer_offload: bool = F(False, "keep the critic's optimizer state in CPU memory")
    reshard_after_forward: bool = F(True, "free gathered parameters after the forward pass (ZeRO-3 style)")
    model_dtype: str = F("float32", "dtype of the value model's master weights: float32 | bfloat16")
    dtype: str = F("auto", "compute (mixed-precision) dtype: auto (bfloat16 on CUDA, float32 on CPU) | float32 | bfloat16 | float16")


@dataclass
class CriticModelConfig:
    path: str = F(
        II("actor_rollout_ref.model.path"),
        "value model: a Hugging Face directory (a causal LM gets a new scalar value head; one saved with "
        "AutoModelForTokenClassification, num_labels=1, keeps its own); default: the actor's model",
    )
    tokenizer_path: str = F(
        II("actor_rollout_ref.model.path"),
        "verl compatibility: the critic reads the actor's token ids, so its model's vocabulary must cover "
        "the actor's tokenizer (checked at start-up); nothing else reads this key",
    )
    override_config: Dict[str, Any] = F(
        {}, "fields set on the value model's Hugging Face config before it is built (attn_implementation picks the attention kernel)"
    )
    use_remove_padding: bool = F(False, "pack sequences without padding (accepted for verl compatibility; padded path used)")
    enable_gradient_checkpointing: bool = F(True, "recompute the value model's activations in the backward pass to save memory")
    trust_remote_code: bool = F(II("actor_rollout_ref.model.trust_remote_code"), "allow the value model directory's own Python code to run when loading it")
    fsdp_config: CriticFSDPConfig = S(
        CriticFSDPConfig, "FSDP2 settings of the value model, verl's early-2026 place for them (critic.fsdp is the current one; set either)"
    )


@dataclass
class CriticOptimConfig:
    lr: float = F(1e-5, "peak learning rate of the critic's AdamW")
    weight_decay: float = F(0.01, "AdamW weight decay")
    betas: List[float] = F([0.9, 0.999], "AdamW betas")
    lr_warmup_steps: int = F(-1, "linear warm-up steps; -1 = use lr_warmup_steps_ratio")
    lr_warmup_steps_ratio: float = F(0.0, "warm-up steps as a fraction of the total training steps")
    lr_scheduler_type: str = F("constant", "schedule after warm-up: " + " | ".join(LR_SCHEDULER_TYPES))
    min_lr_ratio: float = F(0.0, "cosine schedule floor as a fraction of lr")
    total_training_steps: int = F(-1, "set by the trainer from the data and trainer.total_epochs; -1 = derive")
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


@dataclass
class CriticConfig:
    enable: Optional[bool] = F(None, "train a critic (value model); null = on iff algorithm.adv_estimator needs values (gae)")
    strategy: str = F("fsdp2", "training backend of the critic: fsdp2 (fsdp is accepted as an alias)")
    ppo_mini_batch_size: int = F(
        II("actor_rollout_ref.actor.ppo_mini_batch_size"),
        "prompts per critic optimizer step (x rollout.n responses), a global size; default: the actor's",
    )
    ppo_micro_batch_size_per_gpu: Optional[int] = F(
        None, "responses per critic forward/backward on one rank (a memory knob: the update does not depend on it); null = whole mini-batch"
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
        II("actor_rollout_ref.actor.shuffle"), "shuffle responses within each critic mini-batch (seeded); default: the actor's"
    )
    cliprange_value: float = F(0.5, "value clip range c: a prediction is also scored at clip(v, v_old - c, v_old + c)")
    loss_agg_mode: str = F(
        II("actor_rollout_ref.actor.loss_agg_mode"),
        "value-loss aggregation: token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm; default: the actor's",
    )
    grad_clip: float = F(1.0, "clip the critic's global gradient norm (verl's early-2026 key; critic.optim.clip_grad is the current one: set either)")
    model: CriticModelConfig = S(CriticModelConfig, "the value model")
    optim: CriticOptimConfig = S(CriticOptimConfig, "the critic's optimizer and learning-rate schedule")
    fsdp: CriticFSDPConfig = S(CriticFSDPConfig, "FSDP2 settings of the value model (verl's current place; critic.model.fsdp_config is the early-2026 one; set either)")
    checkpoint: CriticCheckpointConfig = S(CriticCheckpointConfig, "the critic's checkpoint contents")


# --------------------------------------------------------------------------------------------
# algorithm, reward
# --------------------------------------------------------------------------------------------
@dataclass
class KLCtrlConfig:
    type: str = F("fixed", "KL-in-reward controller: fixed | adaptive")
    kl_coef: float = F(0.001, "initial coefficient of the KL penalty in the reward")
    horizon: int = F(10000, "adaptive controller horizon")
    target_kl: float = F(0.1, "adaptive controller target KL")


@dataclass
class RolloutCorrectionConfig:
    rollout_is: Optional[str] = F(None, "importance weights against the rollout engine's log-probs: null | token | sequence")
    rollout_is_threshold: Any = F(
        2.0, "a number u > 1: truncate the weights at u (TIS); a band 'lo_hi' (quoted, e.g. \"0.5_2.0\"): weight 0 outside it (IcePop)"
    )
    rollout_rs: Optional[str] = F(
        None, "rejection sampling, comma-separated: token_k1|k2|k3, seq_sum_k1|k2|k3, seq_mean_k1|k2|k3, seq_max_k2|k3; null = off"
    )
    rollout_rs_threshold: Any = F(
        None, "rejection thresholds, one per rollout_rs option or one shared: k1 options a ratio band 'lo_hi' or u (the band 1/u..u), others an upper bound"
    )
    bypass_mode: bool = F(False, "use the rollout log-probs as the old log-probs (no old-log-prob forward); correction in the loss")
    loss_type: str = F("ppo_clip", "bypass mode's loss: ppo_clip (PPO clip against the rollout policy) | reinforce (-w * A * logp)")
    rollout_is_batch_normalize: bool = F(False, "divide the importance weights by their batch mean")


@dataclass
class FilterGroupsConfig:
    enable: bool = F(False, "dynamic sampling (DAPO): drop prompts whose responses all score the same, generate more")
    metric: str = F("acc", "what must differ within a prompt's responses: acc | score (the reward function's score) | seq_reward | seq_final_reward")
    max_num_gen_batches: int = F(0, "most generation batches per step; <= 0 = no limit")
    on_exhausted: str = F("error", "at max_num_gen_batches with too few prompts: error | train (on the prompts kept, whole mini-batches)")


@dataclass
class AlgorithmConfig:
    adv_estimator: str = F("grpo", "advantage estimator: " + " | ".join(list_adv_estimators()) + " (docs/algorithms.md)")
    norm_adv_by_std_in_grpo: bool = F(True, "divide group-relative advantages by the group std (false = Dr. GRPO)")
    gamma: float = F(1.0, "discount factor (gae, reinforce_plus_plus)")
    lam: float = F(1.0, "GAE lambda")
    use_kl_in_reward: bool = F(False, "subtract a KL penalty from the reward (PPO style) instead of/besides the KL loss")
    kl_penalty: str = F("kl", "KL estimator of the in-reward penalty: kl | abs | mse | low_var_kl")
    kl_ctrl: KLCtrlConfig = S(KLCtrlConfig, "coefficient control of the in-reward KL penalty")
    rollout_correction: RolloutCorrectionConfig = S(
        RolloutCorrectionConfig, "rollout correction: importance weights and rejection against the rollout engine's log-probs"
    )
    filter_groups: FilterGroupsConfig = S(FilterGroupsConfig, "dynamic sampling (DAPO's group filtering)")


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


@dataclass
class RMWrapPolicyConfig:
    min_num_params: int = F(0, "verl's FSDP1 wrap policy: accepted, no effect (FSDP2 shards each decoder layer)")


@dataclass
class RMFSDPConfig:
    param_offload: bool = F(False, "keep the reward model's parameters in CPU memory between uses")
    reshard_after_forward: bool = F(True, "free gathered parameters after the forward pass (ZeRO-3 style)")
    fsdp_size: int = F(-1, "devices per FSDP shard group: -1 (all data-parallel ranks) is the only value supported")
    forward_prefetch: bool = F(False, "verl's FSDP1 forward prefetch: accepted, no effect under FSDP2")
    wrap_policy: RMWrapPolicyConfig = S(RMWrapPolicyConfig, "verl's FSDP1 wrap policy (accepted, no effect)")
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
        "AutoModelForTokenClassification and one label (a causal LM gets a new scalar head); the "
        "current spelling is reward.reward_model.model_path (set either)",
    )
    trust_remote_code: bool = F(False, "allow the reward model directory's own Python code to run when loading it")
    use_remove_padding: bool = F(False, "pack sequences without padding (accepted for verl compatibility; the padded path is used)")
    override_config: Dict[str, Any] = F({}, "fields set on the reward model's Hugging Face config before it is built")
    fsdp_config: RMFSDPConfig = S(RMFSDPConfig, "FSDP2 settings of the reward model")


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


@dataclass
class RewardModelConfig:
    enable: bool = F(
        False,
        "score responses with a learned reward model (FSDP2 forward on every rank); the current spelling is "
        "reward.reward_model.enable (set either)",
    )
    strategy: str = F("fsdp2", "training backend of the reward model: fsdp2 (fsdp is accepted as an alias)")
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
    use_reward_loop: bool = F(
        True, "verl's switch between its reward-loop server and its FSDP worker: accepted, no effect (the reward model is an FSDP2 forward here)"
    )
    rollout: Dict[str, Any] = F(
        {}, "verl's inference-engine settings for serving the reward model (its reward loop): accepted, no effect"
    )
    enable_resource_pool: bool = F(False, "give the reward model devices of its own: only false (it shares every rank's device) is supported")
    n_gpus_per_node: int = F(8, "devices per node of the reward model's own pool (used only with enable_resource_pool)")
    nnodes: int = F(0, "nodes of the reward model's own pool (used only with enable_resource_pool)")
    combine: str = F(
        "verl",
        "how reward-model and rule scores make the reward: verl (the reward model's score, or the custom function's "
        "when custom_reward_function.path is set) | weighted (rm_weight x reward model + rule_weight x rule/custom score)",
    )
    rm_weight: float = F(1.0, "weight of the reward model's score with combine=weighted")
    rule_weight: float = F(1.0, "weight of the rule-based (or custom function's) score with combine=weighted")
    process: RMProcessConfig = S(RMProcessConfig, "process reward model (a score per reasoning step)")
    iterative: RMIterativeConfig = S(RMIterativeConfig, "iterative RL: reward-model retraining with replay and reference reset")
    reward_manager: str = F(
        "naive", "how responses are scored: naive (one score per response) | prime (parallel, same result) | dapo (naive; overlong shaping by its keys)"
    )
    num_workers: int = F(2, "processes scoring responses in parallel")
    timeout_s: float = F(10.0, "time limit for scoring one response, in seconds")
    on_error: str = F("raise", "a scorer that raises, hangs or returns a non-number: raise (stop, naming the sample) | zero (score 0, counted)")
    overlong_buffer: OverlongBufferConfig = S(OverlongBufferConfig, "DAPO's overlong reward shaping (its recipe's spelling; max_resp_len = data.max_response_length)")
    reward_kwargs: RewardKwargsConfig = S(RewardKwargsConfig, "reward-manager arguments (verl's spelling of the overlong shaping)")


@dataclass
class RewardRewardModelConfig:
    enable: bool = F(False, "score with a learned reward model (verl's current spelling of reward_model.enable; set either)")
    model_path: Optional[str] = F(None, "the reward model's directory (verl's current spelling of reward_model.model.path; set either)")
    enable_resource_pool: bool = F(False, "verl's current spelling of reward_model.enable_resource_pool (only false is supported)")
    n_gpus_per_node: int = F(8, "verl's current spelling of reward_model.n_gpus_per_node")
    nnodes: int = F(0, "verl's current spelling of reward_model.nnodes")
    rollout: Dict[str, Any] = F(
        {}, "verl's inference-engine settings for serving the reward model: accepted, no effect (the reward model is an FSDP2 forward here)"
    )


@dataclass
class RewardConfig:
    reward_kwargs: RewardKwargsConfig = S(RewardKwargsConfig, "reward-manager arguments (verl's current spelling of the overlong shaping)")
    reward_model: RewardRewardModelConfig = S(RewardRewardModelConfig, "the learned reward model (verl's current layout)")


@dataclass
class CustomRewardFunctionConfig:
    path: Optional[str] = F(None, "Python file defining the reward function (runs with the trainer's rights); null = built-in scorers")
    name: str = F("compute_score", "function in that file: fn(data_source, solution_str, ground_truth, extra_info=None) -> float")


# --------------------------------------------------------------------------------------------
# trainer, ray
# --------------------------------------------------------------------------------------------
@dataclass
class TrainerConfig:
    total_epochs: int = F(30, "passes over the training data (total_training_steps, when set, wins)")
    total_training_steps: Optional[int] = F(60, "training steps; null = total_epochs x steps per epoch")
    project_name: str = F("grpo_dist", "project name (loggers, default output folder)")
    experiment_name: str = F("reverse_tiny", "experiment name (loggers, default output folder)")
    logger: List[str] = F(["console", "file"], "loggers: console | file (metrics.jsonl) | tensorboard | wandb")
    nnodes: int = F(1, "nodes in the Ray cluster used for training")
    n_gpus_per_node: int = F(1, "devices per node (with trainer.device=cpu: ranks per node)")
    device: str = F("auto", "cuda | cpu | auto (cuda when available)")
    save_freq: int = F(-1, "save a checkpoint every N steps (-1 = only at the end)")
    test_freq: int = F(10, "validate every N steps (-1 = never during training)")
    val_before_train: bool = F(True, "validate before the first step")
    resume_mode: str = F("auto", "auto (latest checkpoint in default_local_dir) | disable | resume_path")
    resume_from_path: Optional[str] = F(None, "checkpoint folder (global_step_N) for resume_mode=resume_path")
    default_local_dir: str = F(
        "checkpoints/${trainer.project_name}/${trainer.experiment_name}",
        "output folder: checkpoints, metrics.jsonl, report",
    )
    max_actor_ckpt_to_keep: Optional[int] = F(None, "keep only the newest N checkpoints; null = all")
    seed: int = F(1, "seed of model-side randomness (dropout, mini-batch shuffling)")
    progress_bar: bool = F(True, "show a progress bar over training steps")
    critic_warmup: int = F(
        0,
        "train only the critic until this step: the actor updates from step critic_warmup on (steps counted from 1, "
        "as verl does; 0 and 1: from the first step)",
    )
    worker_call_timeout_s: float = F(
        1800.0,
        "a worker call that takes longer than max(this, worker_call_timeout_factor x the slowest such call so far) "
        "stops the run naming the worker (a frozen or deadlocked process); 0 = no deadline",
    )
    worker_call_timeout_factor: float = F(10.0, "see worker_call_timeout_s")
    balance_batch: bool = F(
        True,
        "reorder rows inside each mini-batch so that every data-parallel rank gets a similar token count "
        "(the update is unchanged: rows never move across mini-batches); logs global_seqlen/*",
    )
    max_consecutive_nonfinite_steps: int = F(
        3, "stop (after saving a checkpoint) when this many steps in a row had a non-finite loss or gradient norm; 0 = never"
    )


@dataclass
class RayInitConfig:
    address: Optional[str] = F(None, "Ray cluster to attach to (or RAY_ADDRESS); null = start a local one")
    num_cpus: Optional[int] = F(None, "CPUs of the local Ray instance; null = all")
    include_dashboard: bool = F(False, "start Ray's dashboard (bound to 127.0.0.1) for a local instance")


@dataclass
class RayKwargsConfig:
    ray_init: RayInitConfig = S(RayInitConfig, "ray.init arguments")


@dataclass
class GRPOConfig:
    data: DataConfig = S(DataConfig, "prompt data")
    actor_rollout_ref: ActorRolloutRefConfig = S(ActorRolloutRefConfig, "policy, reference and rollout")
    critic: CriticConfig = S(CriticConfig, "the critic: a value model trained alongside the policy (PPO with GAE)")
    algorithm: AlgorithmConfig = S(AlgorithmConfig, "advantage estimation and KL in reward")
    reward_model: RewardModelConfig = S(RewardModelConfig, "reward scoring")
    reward: RewardConfig = S(RewardConfig, "reward arguments (verl's newer section)")
    custom_reward_function: CustomRewardFunctionConfig = S(CustomRewardFunctionConfig, "a user-supplied reward function")
    trainer: TrainerConfig = S(TrainerConfig, "the training loop")
    ray_kwargs: RayKwargsConfig = S(RayKwargsConfig, "Ray")


# Interpolated keys have no help metadata of their own (II cannot carry it); documented here.
INTERPOLATED_HELP = {
    "actor_rollout_ref.rollout.prompt_length": "longest prompt the engine sees (= data.max_prompt_length)",
    "actor_rollout_ref.rollout.response_length": "longest response the engine samples (= data.max_response_length)",
    "reward_model.reward_kwargs.max_resp_len": "the length the overlong penalty reaches penalty_factor at (= data.max_response_length)",
    "reward.reward_kwargs.max_resp_len": "the length the overlong penalty reaches penalty_factor at (= data.max_response_length)",
}

# Keys whose default differs from verl's, and why. Shown in docs/configuration.md.
VERL_DEFAULT_DIFFERENCES = {
    "data.train_files": "the embedded task, so that the no-argument run works offline",
    "data.val_files": "the embedded task's test split",
    "data.max_prompt_length": "sized for the embedded task (verl: 512)",
    "data.max_response_length": "sized for the embedded task (verl: 512)",
    "data.train_batch_size": "sized for a 2-core CPU (verl: 1024)",
    "actor_rollout_ref.model.path": "the embedded tiny model",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "sized for the embedded task (verl: 256)",
    "actor_rollout_ref.actor.use_kl_loss": "on, as in the GRPO recipe (verl: false)",
    "actor_rollout_ref.actor.optim.lr": "a tiny model needs a large step (verl: 1e-6)",
    "actor_rollout_ref.actor.strategy": "FSDP2 is the only backend (verl: fsdp)",
    "critic.strategy": "FSDP2 is the only backend (verl: fsdp)",
    "reward_model.strategy": "FSDP2 is the only backend (verl: fsdp)",
    "critic.model.path": "the actor's model (verl: ~/models/deepseek-llm-7b-chat)",
    "critic.model.use_remove_padding": "the padded path (verl's current layout: true)",
    "actor_rollout_ref.rollout.n": "a GRPO group (verl: 1)",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "one rank per engine (verl: 2)",
    "algorithm.adv_estimator": "GRPO (verl: gae)",
    "trainer.device": "auto-detect (verl: cuda)",
    "trainer.n_gpus_per_node": "one device (verl: 8)",
    "trainer.logger": "console and metrics.jsonl (verl: console, wandb)",
    "trainer.total_training_steps": "the embedded job's length (verl: null)",
    "trainer.test_freq": "validate every 10 steps (verl: -1)",
    "trainer.project_name": "(verl: verl_examples)",
    "trainer.experiment_name": "(verl: gsm8k)",
}
