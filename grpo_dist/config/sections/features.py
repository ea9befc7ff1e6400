"""verl's top-level sections for features grpo_dist does not build, accepted only off, and the small
sections of other features (Ray's runtime environment, custom data classes, the reward manager's
current spelling).

A feature's switch (``distillation.enabled``, ``skip.*.enable``, ``sandbox_fusion.url``) is refused unless
off; the keys under it are read only by the feature, so they have no effect at any value. verl's transfer queue
(``transfer_queue.enable``) is accepted on as well, with no effect (batches move through the driver; its v1
asynchronous scripts switch it on). Of verl's v1 trainer modes (``trainer.v1.trainer_mode``) ``sync`` and
``separate_async`` run (:mod:`grpo_dist.config.fully_async`); ``colocate_async`` is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from grpo_dist.config.fields import F, Honoured, NoOp, S
from grpo_dist.config.sections.engine import UNUSED_WITHOUT, off_feature


# ---- distillation (verl's current layout) ---------------------------------------------------------
@dataclass
class DistillationLossConfig:
    loss_mode: str = F("k3", "distillation divergence")
    topk: int = F(32, "teacher top-k tokens")
    use_task_rewards: bool = F(True, "also train on the task's rewards")
    use_policy_gradient: bool = F(False, "distil through the policy gradient")
    distillation_loss_coef: float = F(1.0, "weight of the distillation loss")
    policy_loss_mode: str = F("vanilla", "policy loss used alongside")
    clip_ratio: float = F(0.2, "clip range")
    clip_ratio_low: float = F(0.2, "lower clip range")
    clip_ratio_high: float = F(0.2, "upper clip range")
    log_prob_min_clamp: Optional[float] = F(None, "lower clamp of teacher log-probs")
    loss_max_clamp: Optional[float] = F(None, "upper clamp of the loss")


TEACHER_DEFAULT = {"teacher_model": {
    "key": None, "model_path": None, "num_replicas": 0,
    "inference": {
        # verl's defaults for these five are the rollout's own values (null here: distillation is off)
        "name": None, "dtype": None, "prompt_length": None, "response_length": None, "temperature": None,
        "tensor_model_parallel_size": 2,
        "data_parallel_size": 1, "expert_parallel_size": 1, "gpu_memory_utilization": 0.5, "free_cache_engine": True,
        "enforce_eager": True, "enable_chunked_prefill": True, "enable_prefix_caching": True, "load_format": "auto",
        "max_model_len": None, "max_num_batched_tokens": 8192, "max_num_seqs": 1024, "limit_images": None,
        "cudagraph_capture_sizes": None, "disable_log_stats": True, "skip_tokenizer_init": True, "engine_kwargs": {},
    },
}}


@dataclass
class DistillationConfig:
    enabled: bool = F(False, "on-policy distillation from teacher models", off_feature(
        "on-policy distillation", "leave it off"))
    nnodes: int = F(0, "nodes of the teacher pool")
    n_gpus_per_node: int = F(8, "devices per teacher node")
    teacher_key: str = F("data_source", "column choosing a row's teacher")
    distillation_loss: DistillationLossConfig = S(DistillationLossConfig, "the distillation loss")
    teacher_models: Dict[str, Any] = F(TEACHER_DEFAULT, "teachers by name: model_path, replicas and inference engine")


# ---- transfer queue ---------------------------------------------------------------------------------
@dataclass
class SimpleStorageConfig:
    num_data_storage_units: int = F(8, "storage units")
    total_storage_size: int = F(100000, "storage size")


@dataclass
class MooncakeStoreConfig:
    auto_init: bool = F(False, "start the store")
    device_name: str = F("", "RDMA device")
    global_segment_size: int = F(4294967296, "global segment bytes")
    local_buffer_size: int = F(1073741824, "local buffer bytes")
    local_hostname: str = F("localhost", "this host's name")
    master_server_address: str = F("localhost:50124", "master server")
    metadata_server: str = F("localhost:50123", "metadata server")
    protocol: str = F("tcp", "transport")


@dataclass
class TransferQueueBackendConfig:
    storage_backend: str = F("SimpleStorage", "storage backend")
    SimpleStorage: SimpleStorageConfig = S(SimpleStorageConfig, "in-memory storage")  # noqa: N815 - verl's key
    MooncakeStore: MooncakeStoreConfig = S(MooncakeStoreConfig, "Mooncake store")  # noqa: N815 - verl's key


@dataclass
class TransferQueueMetricsConfig:
    enabled: bool = F(False, "export the queue's metrics")
    port: int = F(0, "metrics port")


@dataclass
class TransferQueueConfig:
    enable: bool = F(False, "move batches between roles through verl's transfer queue", NoOp(
        "the driver hands every batch to the workers (Ray's object store); the queue would change where batches "
        "wait, not what is trained"))
    backend: TransferQueueBackendConfig = S(TransferQueueBackendConfig, "storage backend (verl's current layout)")
    metrics: TransferQueueMetricsConfig = S(TransferQueueMetricsConfig, "queue metrics (verl's current layout)")


# ---- verl's v1 trainer ----------------------------------------------------------------------------------
@dataclass
class CustomClassConfig:
    path: Optional[str] = F(None, "Python file of the class")
    name: Optional[str] = F(None, "class name")


NO_EVICTION = ("no group is evicted here: the rollout starts no batch that would be trained beyond "
               "max_off_policy_threshold versions, and dynamic sampling is refused with the rollout on its own devices")


@dataclass
class V1SamplerConfig:
    custom_sampler: CustomClassConfig = S(CustomClassConfig, "a custom sampler class", off_feature(
        "a custom v1 sampler", "leave it null (batches are taken in the data's order)"))
    max_off_policy_strategy: str = F("drop", "what to do with too-stale samples: drop | wait", NoOp(
        NO_EVICTION, values=("drop", "wait"), otherwise="use drop or wait"))
    max_off_policy_threshold: int = F(8, "most policy versions a sample may lag (separate_async: the batches generated "
                                         "ahead may not exceed it; checked again for every trained batch)")
    sampler_kwargs: Dict[str, Any] = F({}, "sampler arguments", NoOp("read only by a custom sampler"))
    sync_refill_failed_groups: bool = F(False, "refill dropped groups synchronously", NoOp(NO_EVICTION))


@dataclass
class HybridRolloutConfig:
    enable_switch: bool = F(False, "lend the trainer's idle devices to generation between steps", off_feature(
        "lending the trainer's devices to generation (separate_async's step switch)",
        "leave it false (the rollout's own devices generate)"))
    adaptive_switch_threshold: bool = F(True, "adapt the switch threshold")
    switch_cost_window_size: int = F(3, "steps averaged for the switch cost")
    switch_threshold_ratio: float = F(0.4, "switch threshold")
    switch_threshold_release_steps: int = F(2, "steps before switching back")
    switch_threshold_step_up: float = F(0.05, "threshold increase")
    switch_threshold_step_down: float = F(0.03, "threshold decrease")


@dataclass
class SeparateAsyncConfig:
    num_warmup_batches: int = F(1, "batches generated ahead of the one being trained (separate_async): a batch is "
                                   "trained at most this many updates after the weights that started it")
    parameter_sync_step: int = F(4, "mini-batches per step, one weight sync after each step (separate_async: "
                                    "data.train_batch_size = this x actor.ppo_mini_batch_size)")
    hybrid_rollout: HybridRolloutConfig = S(HybridRolloutConfig, "the step switch", NoOp(
        UNUSED_WITHOUT.format("trainer.v1.separate_async.hybrid_rollout.enable_switch")))


@dataclass
class ColocateAsyncConfig:
    num_warmup_batches: int = F(1, "batches generated ahead")


@dataclass
class TrainerV1Config:
    trainer_mode: str = F("sync", "verl's v1 trainer loop: sync | separate_async (colocate_async is not built here)",
                          Honoured(refuse=(("colocate_async", (
                              "generating ahead on the training devices with partial rollouts is not built; for "
                              "generation ahead on devices of its own use separate_async (with "
                              "actor_rollout_ref.rollout.nnodes / n_gpus_per_node)")),)))
    sync: Dict[str, Any] = F({}, "settings of the synchronous mode", NoOp("the synchronous mode has no settings"))
    colocate_async: ColocateAsyncConfig = S(ColocateAsyncConfig, "colocated asynchronous mode", NoOp(
        "read only by trainer_mode=colocate_async, which is refused here"))
    separate_async: SeparateAsyncConfig = S(SeparateAsyncConfig, "separated asynchronous mode: the rollout on devices "
                                            "of its own, generating ahead")
    sampler: V1SamplerConfig = S(V1SamplerConfig, "the v1 sample buffer")


# ---- skip (cached rollouts) ---------------------------------------------------------------------------
@dataclass
class SkipStageConfig:
    enable: bool = F(False, "replace this stage by cached results", off_feature(
        "replaying cached rollouts", "leave it off"))
    action: str = F("cache", "cache | replay")
    dump_dir: str = F("~/.verl/rollout_dump", "folder of the cached results")
    steps: List[int] = F([], "steps to cache or replay")


@dataclass
class SkipConfig:
    rollout: SkipStageConfig = S(SkipStageConfig, "the rollout")
    async_rollout: SkipStageConfig = S(SkipStageConfig, "the asynchronous rollout")
    rollout_tq: SkipStageConfig = S(SkipStageConfig, "the transfer-queue rollout")


# ---- reward extras ----------------------------------------------------------------------------------
SANDBOX_OFF = off_feature("sandbox code execution (Sandbox Fusion)",
                          "score code with a custom_reward_function that runs it, or leave url null")


@dataclass
class SandboxFusionConfig:
    url: Optional[str] = F(None, "Sandbox Fusion service that runs code answers", SANDBOX_OFF)
    max_concurrent: Optional[int] = F(64, "most concurrent sandbox requests")
    memory_limit_mb: Optional[int] = F(1024, "memory limit of a sandbox run")


def sandbox_section(where: str) -> Any:
    return S(SandboxFusionConfig, f"Sandbox Fusion code execution ({where}; not built here: url null only)",
             NoOp(UNUSED_WITHOUT.format("sandbox_fusion.url")))


@dataclass
class RewardManagerModuleConfig:
    path: Optional[str] = F(None, "Python file of a custom reward manager", off_feature(
        "loading a custom reward manager class", "use custom_reward_function.path for a custom score, "
        "reward_model.reward_manager for naive | prime | dapo"))
    name: str = F("custom_reward_manager", "class name in that file", NoOp(UNUSED_WITHOUT.format("module.path")))


MANAGER_NAME = NoOp(
    "naive, prime and dapo score the same way here (one score per response, in parallel scoring processes); DAPO's "
    "overlong shaping has its own keys (reward.reward_kwargs.overlong_buffer_cfg.*)",
    values=(None, "naive", "prime", "dapo"), otherwise="use naive, prime or dapo (reward_model.reward_manager)")
MANAGER_SOURCE = NoOp("grpo_dist's reward managers are registered by name (naive | prime | dapo)", values=("register",),
                      otherwise="a reward manager loaded from a module (source=importlib) is not built; use "
                      "custom_reward_function.path for a custom score")


@dataclass
class RewardManagerConfig:
    """``reward.reward_manager`` (verl's current layout)."""

    name: Optional[str] = F(None, "reward manager: naive | prime | dapo; null = reward_model.reward_manager", MANAGER_NAME)
    source: str = F("register", "where the manager comes from: register (by name) | importlib", MANAGER_SOURCE)
    module: RewardManagerModuleConfig = S(RewardManagerModuleConfig, "a custom reward manager class")


@dataclass
class EarlyRewardManagerConfig:
    """``reward_manager`` (verl's early-2026 top-level section)."""

    name: Optional[str] = F(None, "reward manager: naive | prime | dapo; null = reward_model.reward_manager", MANAGER_NAME)
    source: str = F("register", "where the manager comes from: register (by name) | importlib", MANAGER_SOURCE)
    module: RewardManagerModuleConfig = S(RewardManagerModuleConfig, "a custom reward manager class")


@dataclass
class RewardCustomFunctionConfig:
    """``reward.custom_reward_function`` (verl's current layout of ``custom_reward_function``)."""

    path: Optional[str] = F(None, "Python file of the reward function; the same setting as custom_reward_function.path",
                            Honoured(alias_of="custom_reward_function.path"))
    name: str = F("compute_score", "function in that file; the same setting as custom_reward_function.name",
                  Honoured(alias_of="custom_reward_function.name"))


# ---- data extras --------------------------------------------------------------------------------------
def custom_class_section(what: str, instead: str) -> Any:
    return S(CustomClassConfig, f"a custom {what} class (not built here: null only)", off_feature(
        f"loading a custom {what} class", instead))


@dataclass
class SamplerClassConfig:
    class_path: Optional[str] = F(None, "Python file of the sampler class")
    class_name: Optional[str] = F(None, "sampler class name")


# ---- Ray --------------------------------------------------------------------------------------------------
@dataclass
class RuntimeEnvConfig:
    """``ray_kwargs.ray_init.runtime_env``: handed to ``ray.init(runtime_env=...)``."""

    py_executable: Optional[str] = F(
        None, "command that starts the Ray workers' Python (e.g. 'uv run ...'); null = Ray's own"
    )
    env_vars: Dict[str, str] = F({}, "environment variables of every Ray worker")
    working_dir: Optional[str] = F(None, "folder shipped to every Ray worker as its working directory")
