"""``actor_rollout_ref.rollout.*``: response generation (engine, sampling, sizes, the old-log-prob
forward, weight sync), with ``val_kwargs``, ``engine_kwargs`` and verl's multi-turn and agent-loop
subsections (``rollout.mode=async``: each trajectory an agent loop; checked in :mod:`grpo_dist.config.agents`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from omegaconf import II

from grpo_dist.config.fields import F, Honoured, NoOp, Refused, S
from grpo_dist.config.sections.engine import (
    CheckpointEngineConfig,
    DisaggregationConfig,
    LayerNameMapConfig,
    MTPConfig,
    PrometheusConfig,
    QATConfig,
    TraceConfig,
    layer_name_map_section,
    mtp_section,
    off_feature,
    qat_section,
)
from grpo_dist.config.sections.profiler import RolloutProfilerConfig, rollout_profiler_section
from grpo_dist.rollout import ENGINES


ENGINE_SPEED = NoOp("a speed or memory setting of the rollout engine; the samples are the same")


@dataclass
class ValKwargsConfig:
    n: int = F(1, "samples per validation prompt")
    temperature: float = F(0.0, "validation sampling temperature (0 = greedy)")
    top_p: float = F(1.0, "validation nucleus sampling")
    top_k: int = F(-1, "validation top-k (-1 = off)")
    do_sample: bool = F(False, "sample during validation (false = greedy)")


@dataclass
class EngineKwargsConfig:
    vllm: Dict[str, Any] = F(
        {}, "keyword arguments added to vLLM's LLM(...) (e.g. swap_space, enable_prefix_caching); null values are dropped"
    )
    sglang: Dict[str, Any] = F({}, "SGLang's engine arguments", off_feature(
        "SGLang as a rollout engine", "use rollout.name=vllm (its arguments: engine_kwargs.vllm); leave it {}"))
    trtllm: Dict[str, Any] = F({}, "TensorRT-LLM's engine arguments", off_feature(
        "TensorRT-LLM as a rollout engine", "use rollout.name=vllm (its arguments: engine_kwargs.vllm); leave it {}"))


@dataclass
class MultiTurnConfig:
    """verl's multi-turn keys: the tool agent loop's limits, tools and tool-call format (read in
    ``rollout.mode=async``; :func:`grpo_dist.config.agents.agent_settings`)."""

    enable: bool = F(False, "multi-turn rollouts: trajectories with tool calls, run as agent loops (needs rollout.mode=async); "
                     "with agent.default_agent_loop left at single_turn_agent, rows without an agent_name run tool_agent "
                     "(as in verl)")
    max_assistant_turns: Optional[int] = F(None, "most model turns of a trajectory (>= 1); null = until the response budget")
    tool_config_path: Optional[str] = F(None, "verl's tool config YAML (tools: [{class_name, config, tool_schema}]); "
                                        "the tools are loaded when the configuration is validated")
    function_tool_path: Optional[str] = F(None, "a Python file of @function_tool functions (tools beside tool_config_path's); "
                                          "loaded when the configuration is validated")
    max_user_turns: Optional[int] = F(None, "most tool-response turns of a trajectory (>= 1); null = until the response budget")
    max_parallel_calls: int = F(1, "most tool calls of one model turn that run (at once); further calls of the turn are dropped")
    max_tool_response_length: int = F(256, "a tool response's text is cut to this many characters (>= 1)")
    tool_response_truncate_side: str = F("middle", "where a long tool response is cut: left | right | middle")
    interaction_config_path: Optional[str] = F(None, "verl's former multi-turn interactions (simulated users)", Refused(
        "multi-turn interactions (simulated users answering the model) are not built: verl removed them from its agent "
        "loops; tool calls are built (multi_turn.tool_config_path / function_tool_path); leave it null"))
    use_inference_chat_template: bool = F(False, "re-render a trajectory for training with the inference chat template (verl's key)", NoOp(
        "a trajectory is trained on the tokens the engine saw (the model's samples and the template tokens rendered "
        "between turns), never re-rendered for training, so training and inference share one rendering either way"))
    tokenization_sanity_check_mode: str = F("strict", "check that a trajectory's tokens match its messages re-rendered: "
                                            "strict | ignore_strippable | disable")
    format: str = F("hermes", "the tool-call format the model writes: hermes (<tool_call>{json}</tool_call>)")
    num_repeat_rollouts: Optional[int] = F(None, "repeated interaction rollouts per response (verl's CollabLLM recipe)", NoOp(
        "read only by verl's CollabLLM recipe, which samples this many simulated-user conversations per response; "
        "that recipe and its interactions are not built here", values=(None,),
        otherwise="simulated-user conversations (verl's CollabLLM recipe) are not built here; leave it null"))


@dataclass
class CustomAsyncServerConfig:
    path: Optional[str] = F(None, "file of a custom async rollout server", off_feature(
        "a custom async rollout server", "leave it null"))
    name: Optional[str] = F(None, "class of a custom async rollout server", off_feature(
        "a custom async rollout server", "leave it null"))


@dataclass
class AgentConfig:
    """verl's agent-loop keys (``rollout.mode=async``)."""

    num_workers: int = F(8, "verl's agent-loop worker processes (any value >= 1)", NoOp(
        "agent loops run as coroutines in each rollout replica's own process, and every trajectory of a step runs at "
        "once, bounded by the engine's max_num_seqs; there is no separate pool of agent workers to size"))
    default_agent_loop: str = F("single_turn_agent", "the agent loop of rows without an agent_name column: single_turn_agent "
                                "| tool_agent | a name from agent_loop_config_path; left at single_turn_agent with "
                                "multi_turn.enable=true it becomes tool_agent (as in verl)")
    agent_loop_config_path: Optional[str] = F(None, "verl's YAML of user agent loops (a list of {name, _target_: "
                                              "module.Class, ...keyword arguments}); rows pick one by agent_name")
    custom_async_server: CustomAsyncServerConfig = S(CustomAsyncServerConfig, "a custom async rollout server")


@dataclass
class RolloutConfig:
    name: str = F("vllm", "rollout engine: " + " | ".join(ENGINES) + " (" + "; ".join(f"{e.name}: {e.help}" for e in ENGINES.values()) + ")",
                  Honoured(refuse=(
                      ("sglang", "the SGLang engine is not built here; use vllm (the same sampling) or hf"),
                      ("trtllm", "the TensorRT-LLM engine is not built here; use vllm (the same sampling) or hf"))))
    mode: str = F("sync", "sync: the step's prompts are generated in one batch | async: each trajectory runs as an agent "
                  "loop (rollout.agent.*, rollout.multi_turn.*) against an asynchronous rollout server")
    n: int = F(8, "responses sampled per prompt (the GRPO group size)")
    temperature: float = F(1.0, "sampling temperature")
    top_p: float = F(1.0, "nucleus sampling")
    top_k: int = F(-1, "top-k sampling (-1 = off)")
    do_sample: bool = F(True, "sample (false = greedy)")
    prompt_length: int = II("data.max_prompt_length")
    response_length: int = II("data.max_response_length")
    dtype: str = F("auto", "engine dtype: auto (bfloat16 on CUDA, float32 on CPU) | float32 | bfloat16 | float16")
    gpu_memory_utilization: float = F(0.5, "fraction of device memory the engine may take")
    kv_cache_gib: Any = F(
        "auto", "KV-cache size in GiB of each vLLM engine on CPU (vLLM's VLLM_CPU_KVCACHE_SPACE), or auto: enough for a "
        "rank's share of a step (x1.25) within 25 % of the node's available memory shared by its engines, at most 8 GiB"
    )
    tensor_model_parallel_size: int = F(
        1,
        "ranks per rollout engine: each group of this many consecutive ranks of a node runs one vLLM engine, a "
        "shard on each (vLLM's external launcher); the step's prompts are split over the engines; 1 = an engine per rank",
    )
    max_num_seqs: int = F(1024, "most sequences the engine batches at once")
    max_num_batched_tokens: int = F(8192, "most tokens the engine schedules in one iteration")
    enable_chunked_prefill: bool = F(
        True,
        "let vLLM prefill long prompts in chunks (passed to vLLM on GPU; always off on CPU, where chunked prefill "
        "breaks per-request sampling seeds)",
    )
    max_model_len: Optional[int] = F(None, "engine context length; null = prompt_length + response_length")
    enforce_eager: bool = F(True, "disable CUDA graphs in the engine")
    free_cache_engine: bool = F(True, "release the engine's KV cache while the actor trains (where supported)")
    update_weights_bucket_megabytes: int = F(512, "weight sync: most MiB of weights gathered and sent at once (one flat buffer per bucket)")
    log_prob_micro_batch_size_per_gpu: Optional[int] = F(
        None, "responses per old-log-prob forward on one rank; null = auto: as many as the rank's memory holds (all of them on small jobs)"
    )
    log_prob_use_dynamic_bsz: bool = F(II("actor_rollout_ref.actor.use_dynamic_bsz"),
                                       "cut old-log-prob forwards by token budget; default: the actor's use_dynamic_bsz")
    log_prob_max_token_len_per_gpu: int = F(II("actor_rollout_ref.actor.ppo_max_token_len_per_gpu"),
                                            "token budget of one old-log-prob forward; default: the actor's ppo_max_token_len_per_gpu")
    log_prob_micro_batch_size: Optional[int] = F(
        None, "verl's former global size: log_prob_micro_batch_size_per_gpu = this / data-parallel ranks; null = unset")
    seed: int = F(0, "engine sampling seed (each rollout rank adds its rank)")
    calculate_log_probs: bool = F(False, "also return the rollout engine's log-prob of every sampled token (batch key rollout_log_probs) and, when the old-log-prob forward runs, log training/rollout_probs_diff_{max,mean,std} against the actor's; costs 10-20 % of vLLM's generation time on CPU, and the hf engine keeps every step's scores (responses x vocab float32 per token)")
    val_kwargs: ValKwargsConfig = S(ValKwargsConfig, "sampling for validation")
    checkpoint_engine: CheckpointEngineConfig = S(CheckpointEngineConfig, "how the engine receives new weights")
    load_format: str = F("dummy", "how the engine first loads weights: dummy (random) | auto | safetensors | ...", NoOp(
        "the engine loads the model folder and then receives the actor's weights, so the first rollout samples from "
        "the actor's weights either way"))
    layered_summon: bool = F(False, "gather the actor's weights layer by layer for the sync", NoOp(
        "the weight sync already gathers and sends in buckets (update_weights_bucket_megabytes)"))
    logprobs_mode: str = F("processed_logprobs", "which log-probs the engine returns", NoOp(
        "the engine's log-probs are those of the distribution it samples from (after temperature, top-k and top-p)",
        values=("processed_logprobs",), otherwise="raw log-probs from the engine are not built; use processed_logprobs"))
    enable_prefix_caching: bool = F(True, "let the engine reuse the KV cache of shared prompt prefixes", ENGINE_SPEED)
    cudagraph_capture_sizes: Optional[List[int]] = F(None, "batch sizes captured as CUDA graphs", ENGINE_SPEED)
    disable_log_stats: bool = F(True, "silence the engine's periodic statistics", NoOp("the engine's own logging"))
    multi_stage_wake_up: bool = F(False, "wake the engine's weights and KV cache in two stages (memory)", ENGINE_SPEED)
    scheduling_policy: str = F("fcfs", "the engine's request scheduling", ENGINE_SPEED)
    skip_tokenizer_init: bool = F(True, "start the engine without a tokenizer", NoOp(
        "prompts reach the engine as token ids and responses leave it as token ids"))
    data_parallel_size: int = F(1, "engine replicas inside one rollout group", off_feature(
        "data parallelism inside the engine", "every rank runs its own engine; leave it at 1"))
    pipeline_model_parallel_size: int = F(1, "pipeline-parallel stages of the engine", off_feature(
        "pipeline parallelism in the engine", "leave it at 1"))
    expert_parallel_size: int = F(1, "expert-parallel ranks of the engine (MoE)", off_feature(
        "expert parallelism in the engine", "leave it at 1"))
    nnodes: int = F(0, "nodes of the standalone rollout devices of verl's v1 separate_async mode (> 0 there, 0 "
                       "otherwise; the one-step-off spelling is actor_rollout_ref.hybrid_engine=false with the top-level "
                       "rollout.nnodes)")
    n_gpus_per_node: int = F(II("trainer.n_gpus_per_node"), "devices per node of the standalone rollout devices "
                             "(trainer.v1.trainer_mode=separate_async; with trainer.device=cpu: rollout ranks per node, "
                             "one core each)")
    over_sample_rate: float = F(0, "abort a step's last requests once (1 - this) of them finished (verl's SGLang SPMD "
                                "rollout, removed in December 2025)", NoOp(
        "verl's trainer reads it nowhere since its SGLang SPMD rollout was removed; no request is aborted here either"))
    ignore_eos: bool = F(False, "keep sampling past the end-of-sequence token, to the response length (fixed-length "
                               "responses, for throughput measurements; training, validation and agent loops; vllm only)")
    full_determinism: bool = F(False, "deterministic engine kernels", off_feature(
        "forcing deterministic engine kernels", "leave it false"))
    quantization: Optional[str] = F(None, "quantize the engine's weights (e.g. fp8)", off_feature(
        "a quantized rollout engine", "the engine runs in rollout.dtype; leave it null"))
    quantization_config_file: Optional[str] = F(None, "the engine's quantization settings", NoOp(
        "read only with rollout.quantization, which is accepted only off here"))
    enable_rollout_routing_replay: bool = F(False, "record the engine's MoE routing for the trainer", off_feature(
        "MoE routing replay", "leave it false"))
    moe_load_balance_metrics_interval: int = F(0, "steps between MoE load-balance metrics; 0 = off", off_feature(
        "MoE load-balance metrics", "leave it at 0"))
    skip_rollout: bool = F(False, "replay dumped rollouts instead of generating (verl early 2026)", off_feature(
        "replaying dumped rollouts", "leave it false"))
    skip_dump_dir: str = F("/tmp/rollout_dump", "folder of dumped rollouts (verl early 2026)", NoOp(
        "read only with skip_rollout, which is accepted only off here"))
    disaggregation: DisaggregationConfig = S(DisaggregationConfig, "prefill/decode disaggregation (not built here)",
                                             NoOp("read only with disaggregation.enabled, which is accepted only off here"))
    prometheus: PrometheusConfig = S(PrometheusConfig, "Prometheus export of the engine's metrics (not built here)",
                                     NoOp("read only with prometheus.enable, which is accepted only off here"))
    trace: TraceConfig = S(TraceConfig, "tracing of agent loops (not built here)", NoOp(
        "tracing of agent loops is not built; the run's metrics and the logged validation generations "
        "(trainer.log_val_generations) are the record of what was generated"))
    profiler: RolloutProfilerConfig = rollout_profiler_section()
    mtp: MTPConfig = mtp_section()
    layer_name_map: LayerNameMapConfig = layer_name_map_section()
    qat: QATConfig = qat_section()
    engine_kwargs: EngineKwargsConfig = S(EngineKwargsConfig, "extra constructor arguments of the rollout engine")
    multi_turn: MultiTurnConfig = S(MultiTurnConfig, "multi-turn (tool-calling) rollouts, run as agent loops (rollout.mode=async)")
    agent: AgentConfig = S(AgentConfig, "verl's agent loops (rollout.mode=async): which loop a row runs")
