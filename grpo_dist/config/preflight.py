"""The checks before (and while) a run starts that need more than the configuration: the model and the
tokenizer against it, the ranks against this machine's cores, and what ``--check`` says about the machine."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable

from grpo_dist.config.facts import compute_dtype
from grpo_dist.config.role_settings import critic_model_path, reward_model_path, reward_model_reencodes
from grpo_dist.config.reward_sources import RewardSource, model_sources
from grpo_dist.config.roles import rollout_pool_ranks
from grpo_dist.config.schema import GRPOConfig
from grpo_dist.config.states import setting
from grpo_dist.config.validate import (
    CRITIC_MODEL,
    POLICY_MODEL,
    critic_enabled,
    data_parallel_size,
    lora_settings,
    lora_spellings,
    rollout_pool_keys,
)
from grpo_dist.utils.devices import cuda_available


def cpu_half_precision_warning(cfg: GRPOConfig, device: str) -> str | None:
    """A warning when a CPU run computes in bfloat16/float16 on a CPU without native support for it.

    On CPUs with AVX512-BF16 or AMX, bfloat16 compute is the fast path (matmuls ~4x float32 on the
    2-core benchmark machine, the large benchmark's step ~2x; docs/benchmarks.md); elsewhere oneDNN
    emulates it and it is slower than float32. Checked on the driver's machine, which for a CPU run is
    one of the workers' (clusters are assumed to be of one CPU type).
    """
    if device != "cpu":
        return None
    dtypes = {compute_dtype(cfg.actor_rollout_ref.actor.fsdp_config.dtype, device),
              compute_dtype(cfg.actor_rollout_ref.rollout.dtype, device)}
    half = sorted(d for d in dtypes if d in ("bfloat16", "float16"))
    if not half:
        return None
    import torch  # only for a half-precision CPU run

    native = {"bfloat16": torch.ops.mkldnn._is_mkldnn_bf16_supported(),
              "float16": torch.ops.mkldnn._is_mkldnn_fp16_supported()}
    slow = [d for d in half if not native[d]]
    if not slow:
        return None
    return (f"this CPU has no native {'/'.join(slow)} arithmetic (torch CPU capability "
            f"{torch.backends.cpu.get_cpu_capability()}): it is emulated and slower than float32; "
            f"actor_rollout_ref.actor.fsdp_config.dtype=float32 actor_rollout_ref.rollout.dtype=float32 "
            f"(or auto) would be faster")


def check_model_fits(cfg: GRPOConfig, model_path: str, tokenizer) -> None:
    """Checks that need the model's config and the tokenizer (cheap: no weights are loaded)."""
    from transformers import AutoConfig

    mc = AutoConfig.from_pretrained(model_path, trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code)
    for key, value in cfg.actor_rollout_ref.model.override_config.items():  # as the actor and engine build it
        setattr(mc, key, value)
    _check_lora_targets(cfg, mc, model_path)
    r = cfg.actor_rollout_ref.rollout
    ctx = getattr(mc, "max_position_embeddings", None)
    need = r.prompt_length + r.response_length
    if ctx is not None and need > ctx:
        raise ValueError(
            f"data.max_prompt_length + data.max_response_length = {need} is longer than the model's context "
            f"(max_position_embeddings = {ctx} in {model_path}/config.json); lower one of them"
        )
    rope = getattr(mc, "rope_scaling", None) or getattr(mc, "rope_parameters", None) or {}
    scaled = (rope.get("rope_type") or rope.get("type") or "default") != "default"  # vLLM stretches the context
    allowed = os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0") not in ("", "0")  # vLLM's own override
    if (r.name == "vllm" and r.max_model_len is not None and ctx is not None and r.max_model_len > ctx
            and not scaled and not allowed):
        raise ValueError(
            f"actor_rollout_ref.rollout.max_model_len = {r.max_model_len} is longer than the model's context "
            f"(max_position_embeddings = {ctx} in {model_path}/config.json), which vLLM refuses; lower it or leave it "
            f"null (data.max_prompt_length + data.max_response_length = {need})"
        )
    vocab = getattr(mc, "vocab_size", None)
    if vocab is not None and len(tokenizer) > vocab:
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {vocab}: they do not belong "
            f"together (data.tokenizer = {cfg.data.tokenizer!r}, actor_rollout_ref.model.path = {model_path!r})"
        )
    tp = r.tensor_model_parallel_size
    heads, kv_heads = getattr(mc, "num_attention_heads", None), getattr(mc, "num_key_value_heads", None)
    if tp > 1 and heads is not None and (heads % tp or (kv_heads and kv_heads % tp and tp % kv_heads)):
        raise ValueError(
            f"actor_rollout_ref.rollout.tensor_model_parallel_size = {tp} does not divide the model's attention heads "
            f"(num_attention_heads = {heads}, num_key_value_heads = {kv_heads} in {model_path}/config.json): each of "
            f"an engine's {tp} ranks holds a whole number of heads; use a divisor of {heads}"
        )
    for source in model_sources(cfg):
        check_reward_model_fits(cfg, source, model_path, tokenizer, need)
    if critic_enabled(cfg):
        path = critic_model_path(cfg, model_path)
        cc = AutoConfig.from_pretrained(path, trust_remote_code=cfg.critic.model.trust_remote_code)
        _check_critic_lora_targets(cfg, cc, path)
        ctx, vocab = getattr(cc, "max_position_embeddings", None), getattr(cc, "vocab_size", None)
        if ctx is not None and need > ctx:
            raise ValueError(
                f"data.max_prompt_length + data.max_response_length = {need} is longer than the value model's context "
                f"(max_position_embeddings = {ctx} in {path}/config.json, critic.model.path); lower one of them"
            )
        if vocab is not None and len(tokenizer) > vocab:
            raise ValueError(
                f"the tokenizer has {len(tokenizer)} tokens but the value model's vocab_size is {vocab}: the critic reads "
                f"the actor's token ids, so critic.model.path = {cfg.critic.model.path!r} must share the actor's vocabulary"
            )


def _check_lora_targets(cfg: GRPOConfig, model_config, model_path: str) -> None:
    """With LoRA: ``ValueError`` naming the key when a target module matches no linear layer of the policy
    (its module names come from the config, on the meta device: no weights). A saved adapter brings its
    own modules (peft checks them when it loads)."""
    lora = lora_settings(cfg)
    if not lora.enabled or lora.adapter_path is not None:
        return
    from grpo_dist.training.lora import linear_module_names

    names = linear_module_names(model_config, trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code)
    _refuse_unmatched(cfg, POLICY_MODEL, lora, names, model_path)


def _check_critic_lora_targets(cfg: GRPOConfig, value_config, model_path: str) -> None:
    """The value model's LoRA, as the policy's (:func:`_check_lora_targets`): its linear layers are the
    value model's (``AutoModelForTokenClassification``), the value head left out (it gets no adapter)."""
    lora = lora_settings(cfg, CRITIC_MODEL)
    if not lora.enabled or lora.adapter_path is not None:
        return
    from grpo_dist.training.critic import VALUE_HEAD_CONFIG
    from grpo_dist.training.critic_lora import value_linear_names

    value_config = copy.deepcopy(value_config)
    for key, value in {**cfg.critic.model.override_config, **VALUE_HEAD_CONFIG}.items():  # as the critic builds it
        if key != "attn_implementation":
            setattr(value_config, key, value)
    names = value_linear_names(value_config, trust_remote_code=cfg.critic.model.trust_remote_code)
    _refuse_unmatched(cfg, CRITIC_MODEL, lora, names, model_path)


def _refuse_unmatched(cfg: GRPOConfig, model: str, lora, names: list[str], model_path: str) -> None:
    """``ValueError`` naming the key (of the model section ``model``) when an entry of ``lora``'s target
    modules matches none of the linear layers ``names`` of ``model_path``."""
    from grpo_dist.training.lora import unmatched_targets

    missing = unmatched_targets(names, lora)
    if missing:
        key, value = lora_spellings(cfg, model)["target_modules"]
        leaves = sorted({n.rsplit(".", 1)[-1] for n in names})
        raise ValueError(f"{key} = {value!r}: {', '.join(map(str, missing))} matches no linear layer of {model_path} "
                         f"(after exclude_modules); its linear layers are named {', '.join(leaves)}; or use all-linear")


def check_reward_model_fits(cfg: GRPOConfig, spec: RewardSource, policy_path: str, tokenizer, need: int) -> None:
    """A model source's folder can be read and fits the run: its context holds prompt + response;
    when it reads the policy's token ids, its vocabulary covers the policy's tokenizer; a process
    reward model, and iterative RL, read the policy's tokens; its weights hold the trained head it is
    read with (:func:`grpo_dist.training.reward_model.check_reward_head`: names only, no weights are
    read). ``ValueError`` naming the reward model."""
    from transformers import AutoConfig

    path = reward_model_path(spec)
    try:
        mc = AutoConfig.from_pretrained(path, trust_remote_code=cfg.reward_model.model.trust_remote_code)
    except (OSError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ValueError(f"the reward model {path} ({spec.path_key}) cannot be loaded: {type(exc).__name__}: {first}") from None
    reencode = reward_model_reencodes(cfg, path, getattr(tokenizer, "name_or_path", None) or policy_path)
    ctx, vocab = getattr(mc, "max_position_embeddings", None), getattr(mc, "vocab_size", None)
    if ctx is not None and not reencode and need > ctx:
        raise ValueError(
            f"data.max_prompt_length + data.max_response_length = {need} is longer than the reward model's context "
            f"(max_position_embeddings = {ctx} in {path}/config.json, {spec.path_key}); lower one of them"
        )
    if reencode is None and vocab is not None and len(tokenizer) > vocab:
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens but the reward model's vocab_size is {vocab}: the reward model "
            f"reads the actor's token ids, so {spec.path_key} = {spec.path!r} must share the actor's vocabulary "
            "(or give its own tokenizer in its folder and keep reward_model.model.input_tokenizer set)"
        )
    if reencode is not None and (spec.is_process or spec.trained):
        what = "a process reward model" if spec.is_process else "iterative RL"
        raise ValueError(
            f"{what} reads the policy's own tokens, but the reward model {path} has a tokenizer of its own; use a reward "
            "model built on the policy's tokenizer, or set reward_model.model.input_tokenizer=null to feed it the policy's ids"
        )
    from grpo_dist.training.reward_model import check_reward_head

    override = {k: v for k, v in cfg.reward_model.model.override_config.items() if k != "attn_implementation"}
    check_reward_head(path, overrides=override,
                      trust_remote_code=cfg.reward_model.model.trust_remote_code, key=spec.path_key)


#: Each model role's verl keys for Ulysses sequence parallelism (accepted, not built: see their notice).
SEQUENCE_PARALLEL_KEYS = {
    "actor": ("actor_rollout_ref.actor.ulysses_sequence_parallel_size",
              "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size"),
    "reference": ("actor_rollout_ref.ref.ulysses_sequence_parallel_size",
                  "actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size"),
    "critic": ("critic.ulysses_sequence_parallel_size", "critic.model.fsdp_config.ulysses_sequence_parallel_size",
               "critic.fsdp.ulysses_sequence_parallel_size"),
}


def whole_sequence_note(cfg: GRPOConfig, role: str) -> str:
    """What a role's memory note adds when one of its ``ulysses_sequence_parallel_size`` keys is above
    1: the memory choices are sized for whole sequences on every rank (nothing is divided by sp); ""
    otherwise."""
    given = [(key, int(setting(cfg, key) or 1)) for key in SEQUENCE_PARALLEL_KEYS.get(role, ())]
    given = [(key, sp) for key, sp in given if sp > 1]
    if not given:
        return ""
    key, sp = given[0]
    r = cfg.actor_rollout_ref.rollout
    return (f" (sized for whole sequences of up to {r.prompt_length + r.response_length} tokens on every rank: "
            f"{key} = {sp} does not split them here, so a rank needs the memory verl would spread over {sp})")


def machine_cores() -> int | None:
    """The cores this process may run on (its CPU affinity, which a batch scheduler or taskset narrows),
    else the machine's count."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def local_cpu_run(cfg: GRPOConfig) -> bool:
    """A run on this machine's CPUs: ``trainer.device=cpu`` (or ``auto`` without a GPU here) and no Ray
    cluster to join (``ray_kwargs.ray_init.address``)."""
    t = cfg.trainer
    on_cpu = t.device == "cpu" or (t.device == "auto" and not cuda_available())
    return on_cpu and not cfg.ray_kwargs.ray_init.address


def usable_cores(cfg: GRPOConfig) -> int | None:
    """The cores a single-machine run may use: this process's CPU affinity (a batch scheduler or taskset
    narrows it), else the machine's count; at most ``ray_kwargs.ray_init.num_cpus`` when that is set (the
    local Ray cluster gets that many). The one count both ``--check`` and the run use."""
    cores = machine_cores()
    limit = cfg.ray_kwargs.ray_init.num_cpus
    if limit:
        cores = min(cores, int(limit)) if cores else int(limit)
    return cores


def threads_per_rank(cores: int | None, ranks: int) -> int:
    """Intra-op threads of each rank's processes on a single-machine CPU run: the usable cores shared
    out evenly (at least one)."""
    return max(1, (cores or 1) // max(ranks, 1))


def worker_threads(cfg: GRPOConfig, device: str, world: int, cluster_cpus: Callable[[], float]) -> int:
    """Intra-op threads of every worker process: 4 on GPUs (they only launch kernels); on this machine's
    CPUs the rule ``--check`` applies (:func:`usable_cores`, :func:`threads_per_rank`); on a Ray cluster's
    CPUs (``ray_kwargs.ray_init.address``) its CPUs shared out over the ranks."""
    if device != "cpu":
        return 4
    world += rollout_pool_ranks(cfg)  # the rollout's own ranks take cores too
    if cfg.ray_kwargs.ray_init.address:
        return max(1, int(cluster_cpus() // max(world, 1)))
    return threads_per_rank(usable_cores(cfg), world)


def check_cpu_ranks(cfg: GRPOConfig, cores: int | None) -> None:
    """A single-machine CPU run starts one training process per rank, each computing with
    :func:`threads_per_rank` threads of the ``cores`` usable (:func:`usable_cores`): more ranks than
    cores would leave a rank less than one core, which only oversubscribes them and multiplies the
    memory (64 ranks on 2 cores ran the machine out of memory in minutes). ``ValueError`` naming the keys
    and the largest setting that fits. Runs on a Ray cluster (``ray_kwargs.ray_init.address``), on GPUs,
    or with an unknown core count are not checked here."""
    t = cfg.trainer
    if not local_cpu_run(cfg) or not cores:
        return
    ranks = data_parallel_size(cfg)
    own, keys = rollout_pool_ranks(cfg), rollout_pool_keys(cfg)
    if own and ranks + own > cores:
        raise ValueError(
            f"trainer.nnodes x trainer.n_gpus_per_node = {ranks} training rank(s) and {keys}.nnodes x "
            f"{keys}.n_gpus_per_node = {own} rollout rank(s) (the rollout's own devices) need "
            f"{ranks + own} cores, but this machine has {cores} this process may use (its CPU affinity); lower one of them")
    if ranks > cores:
        gpu_hint = ("; for a GPU cluster, set trainer.device=cuda: `--check` then validates for its GPUs on any machine"
                    if t.device == "auto" else "")
        raise ValueError(
            f"trainer.nnodes x trainer.n_gpus_per_node = {t.nnodes} x {t.n_gpus_per_node} = {ranks} CPU ranks, but this "
            f"machine has {cores} cores this process may use (its CPU affinity): every rank is a training process with at least one "
            f"thread of its own and its own memory; use at most trainer.n_gpus_per_node={max(1, cores // max(t.nnodes, 1))}"
            " here (the batch sizes must stay divisible by it), or run on a Ray cluster (ray_kwargs.ray_init.address)"
            + gpu_hint
        )


def machine_notes(cfg: GRPOConfig, cores: int | None) -> list[str]:
    """What ``--check`` says about this machine besides the plan: the threads of a single-machine CPU run,
    or, for ``trainer.device=cuda`` on a machine without a GPU, that it checked for the GPUs the
    configuration names (the run itself must start where they are)."""
    t = cfg.trainer
    if local_cpu_run(cfg) and cores:
        ranks, own = data_parallel_size(cfg), rollout_pool_ranks(cfg)
        what = f"{ranks} CPU rank(s)" + (f" + {own} rollout rank(s)" if own else "")
        return [f"{what} x {threads_per_rank(cores, ranks + own)} thread(s) on the {cores} core(s) this process "
                "may use (its CPU affinity)"]
    if t.device == "cuda" and not cuda_available():
        return [f"this machine has no GPU: checked for the cluster the config names (trainer.nnodes x "
                f"trainer.n_gpus_per_node = {t.nnodes} x {t.n_gpus_per_node} GPUs); the run must start where they are "
                "(on a Ray cluster with GPUs: ray_kwargs.ray_init.address)"]
    return []
