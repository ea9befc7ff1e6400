"""vLLM rollout engine: ``vllm.LLM`` in the calling process, weights updated in place.

The engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): inside a Ray actor no extra
engine process is spawned, weight updates pass tensors by reference (no serialisation), and scripts
need no ``if __name__ == "__main__":`` guard. vLLM is imported lazily in :class:`VLLMEngine`, so
``import grpo_dist.rollout`` stays cheap.

Measured facts about vLLM 0.32 (CPU build) that shape this module:

- KV cache size: left unset, the CPU backend reserves nearly all of the machine's memory. We pass
  ``kv_cache_memory_bytes`` (default 1 GiB on CPU). The legacy ``VLLM_CPU_KVCACHE_SPACE`` (whole
  GiB only) would override it, so it is removed from the environment when the engine starts.
- Weight sync: ``LLM.collective_rpc("reload_weights", kwargs={"weights_iterator": ...})`` calls the
  worker's public ``reload_weights``; it runs the model's ``load_weights`` (Hugging Face names,
  fused qkv/gate-up mapping) and then re-packs the weights for the CPU kernels. Calling
  ``model.load_weights`` directly is not enough on CPU (the packed copies go stale).
- Prefix cache: KV blocks cached under the old weights would be reused after a weight update and
  give wrong tokens for prompts of >= one block (128 tokens on CPU); ``update_weights`` resets the
  prefix cache.
- Log-probs: the engine is built with ``logprobs_mode="processed_logprobs"``: the log-prob of each
  sampled token under the distribution it was drawn from (after temperature, top-k, top-p). Prompt
  log-probs (``compute_logprobs``) are always of the raw distribution (``log_softmax(logits)``).
- Side effects on the hosting process (in-process engine): the CPU worker replaces
  ``torch.set_num_threads`` with a no-op for the whole process (set the thread count *before*
  starting the engine), and the engine core ``gc.freeze()``s the heap (undone by ``close``).
- Garbage collections during the build: vLLM runs five full collections while it builds the engine
  (around the weight loading, then before freezing the heap), each walking every object of the
  process, most of them the modules torch, transformers and vLLM just imported (~0.3 s each on 2
  loaded cores). The engine freezes the heap as it is before the build (:func:`freeze_heap_for_build`,
  what vLLM itself does after it), so those collections walk only what the build creates.
- LoRA adapters (``max_lora_rank`` set): the engine is built with ``enable_lora`` and samples every request
  through the one adapter loaded last (:meth:`VLLMEngine.load_adapter`). vLLM loads an adapter from a peft
  folder, so each version is written to a folder of the engine's own (in ``/dev/shm`` where it exists) and
  added under a new id; the previous one is removed. vLLM's LoRA adapts the decoder's linear layers only
  (``lm_head`` or the embeddings as targets are refused when the adapter loads).
- The first request that asks for log-probs would compile a small ``torch.compile`` (inductor) kernel
  for token ranks (~10-15 s on 2 cores with a cold inductor cache, ~1-2 s warm); on the CPU the
  engine counts them eagerly instead (:func:`count_token_ranks_eagerly`).
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from grpo_dist.rollout.base import RolloutOutput, SamplingSettings, TokenOutput

logger = logging.getLogger(__name__)

_GIB = 1 << 30
#: Arguments of ``vllm.LLM`` that the engine always sets (``extra_kwargs`` may not repeat them).
_OWN_LLM_ARGS = frozenset({"model", "dtype", "max_model_len", "gpu_memory_utilization", "tensor_parallel_size",
                           "max_num_seqs", "enforce_eager", "seed", "enable_sleep_mode", "logprobs_mode",
                           "distributed_executor_backend", "trust_remote_code", "hf_overrides",
                           "enable_lora", "max_lora_rank", "max_loras"})
#: The LoRA ranks vLLM's engine can be built for (``max_lora_rank``); an adapter may have any rank up to it.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest of :data:`VLLM_LORA_RANKS` that holds an adapter of ``rank``."""
    for r in VLLM_LORA_RANKS:
        if rank <= r:
            return r
    raise ValueError(f"vLLM serves LoRA adapters up to rank {VLLM_LORA_RANKS[-1]}, got rank {rank}")


class _DropRotaryReloadWarning(logging.Filter):
    """vLLM warns "RotaryEmbedding: Failed to load weights" on every in-place reload: the rotary
    cos/sin cache is a buffer computed from the config, not a checkpoint weight, and vLLM puts it
    back as it was. The warning is expected here and would repeat every training step."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.getMessage() == "RotaryEmbedding: Failed to load weights")


def _quiet_expected_reload_warning() -> None:
    lg = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    if not any(isinstance(f, _DropRotaryReloadWarning) for f in lg.filters):
        lg.addFilter(_DropRotaryReloadWarning())


class VLLMEngine:
    """A :class:`~grpo_dist.rollout.base.RolloutEngine` backed by ``vllm.LLM``.

    Args:
        model_path: a Hugging Face model directory (``config.json``, safetensors, tokenizer).
        dtype: weight/activation dtype; None picks "float32" on CPU and "bfloat16" on GPU.
        max_model_len: the longest prompt + response, in tokens.
        gpu_memory_utilization: fraction of GPU memory vLLM may take (weights + KV cache); on GPU
            it sizes the KV cache unless ``kv_cache_gib`` is given. Unused on CPU.
        tensor_parallel_size: processes (devices) per engine. With more than one, every process of the
            engine builds this object with the same arguments and its own ``tp_rank``; vLLM's
            external-launcher executor forms the tensor-parallel group over torch.distributed (gloo
            on CPU, NCCL on GPU) at ``tp_master``, each process holds one shard, and all of them run
            the same requests in lock step (so they must be given the same prompts and seeds).
            ``update_weights`` takes full tensors in every process; vLLM's weight loaders cut each
            process's shard.
        tp_rank: this process's place in the engine's group, ``0 .. tensor_parallel_size - 1``.
        tp_master: ``(host, port)`` of the group's rendezvous (the same for every process of the
            engine); needed when ``tensor_parallel_size > 1``.
        max_num_seqs: the most sequences decoded at once.
        enforce_eager: no CUDA graphs / compilation (faster start; the CPU path always wants True).
        seed: seed of the engine's sampling noise when ``SamplingSettings.seed`` is None.
        enable_sleep_mode: let ``sleep()`` offload weights and free the KV cache (GPU only).
        kv_cache_gib: KV cache size in GiB; None means 1 GiB on CPU, and on GPU whatever
            ``gpu_memory_utilization`` leaves.
        max_num_batched_tokens: the most tokens scheduled in one engine step (at least
            ``max_model_len``).
        enable_chunked_prefill: let vLLM prefill a long prompt in chunks. Always off on CPU (see the
            constructor).
        extra_kwargs: more keyword arguments for ``vllm.LLM`` (``rollout.engine_kwargs.vllm``); they
            may not repeat the ones set here.
        trust_remote_code: let the model folder's own Python code run (its custom model or config
            classes), as ``actor_rollout_ref.model.trust_remote_code`` asks.
        hf_overrides: fields set on the model's Hugging Face config (``model.override_config``, as the
            actor builds the policy).
        max_lora_rank: the rank of the LoRA adapters the engine will serve (:meth:`load_adapter`); None:
            no adapters (the weight sync sends whole weights).
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        dtype: str | None = None,
        max_model_len: int = 1024,
        gpu_memory_utilization: float = 0.5,
        tensor_parallel_size: int = 1,
        max_num_seqs: int = 256,
        enforce_eager: bool = True,
        seed: int = 0,
        enable_sleep_mode: bool = False,
        kv_cache_gib: float | None = None,
        max_num_batched_tokens: int = 8192,
        enable_chunked_prefill: bool = True,
        extra_kwargs: dict[str, Any] | None = None,
        tp_rank: int = 0,
        tp_master: tuple[str, int] | None = None,
        trust_remote_code: bool = False,
        hf_overrides: dict[str, Any] | None = None,
        max_lora_rank: int | None = None,
    ) -> None:
        if max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {max_model_len}")
        if not (0.0 < gpu_memory_utilization <= 1.0):
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}"
            )
        if tensor_parallel_size < 1 or not 0 <= tp_rank < tensor_parallel_size:
            raise ValueError(f"tp_rank={tp_rank} is not a rank of a tensor-parallel group of {tensor_parallel_size}")
        if tensor_parallel_size > 1 and tp_master is None:
            raise ValueError("tensor_parallel_size > 1 needs tp_master=(host, port), the group's rendezvous")
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if kv_cache_gib is not None and not kv_cache_gib > 0:
            raise ValueError(f"kv_cache_gib must be > 0 (or None), got {kv_cache_gib}")

        on_gpu = torch.cuda.is_available()
        if enable_sleep_mode and not on_gpu:
            raise ValueError(
                "enable_sleep_mode=True needs a GPU (vLLM's CPU backend has no sleep mode); "
                "set it to False on CPU"
            )
        self.dtype = dtype or ("bfloat16" if on_gpu else "float32")
        self.max_model_len = max_model_len
        self.enable_sleep_mode = enable_sleep_mode
        self._asleep = False

        # Must be in the environment before vLLM reads it (at import and engine construction):
        # the engine core in this process, and vLLM's own logging quiet unless asked for.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        engine_kwargs: dict[str, Any] = {}
        if tensor_parallel_size > 1:
            engine_kwargs.update(tp_launcher_env(tensor_parallel_size, tp_rank, tp_master, on_gpu=on_gpu))
        if not on_gpu:
            kv_cache_gib = 1.0 if kv_cache_gib is None else kv_cache_gib
            legacy = os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
            if legacy not in (None, "") and legacy.strip() != f"{kv_cache_gib:g}":
                logger.warning(
                    "VLLM_CPU_KVCACHE_SPACE=%s is ignored: the KV cache is %g GiB (kv_cache_gib)",
                    legacy,
                    kv_cache_gib,
                )
        if kv_cache_gib is not None:
            engine_kwargs["kv_cache_memory_bytes"] = int(kv_cache_gib * _GIB)
        # A prompt prefilled in chunks makes vLLM rewind the request's seeded generator
        # (Generator.set_offset), which CPU generators do not support ("CPU Generator does not
        # use offset"). Whole-prompt prefill keeps per-request seeds working on CPU.
        engine_kwargs["enable_chunked_prefill"] = bool(enable_chunked_prefill and on_gpu)
        engine_kwargs["max_num_batched_tokens"] = max(max_num_batched_tokens, max_model_len)
        clash = sorted(set(extra_kwargs or {}) & (set(engine_kwargs) | _OWN_LLM_ARGS))
        if clash:
            raise ValueError(f"extra_kwargs repeat arguments the engine sets itself: {', '.join(clash)}")
        engine_kwargs.update(extra_kwargs or {})
        self._lora = None  # the LoRARequest of the adapter every request is sampled with (load_adapter)
        self._lora_dir: str | None = None
        if max_lora_rank is not None:
            engine_kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=vllm_max_lora_rank(max_lora_rank))

        from vllm import LLM

        from grpo_dist.utils import startup

        startup.mark("vllm imported")
        _quiet_expected_reload_warning()
        if tensor_parallel_size == 1 and not on_gpu:
            share_one_rank_process_groups()
        if not on_gpu:
            count_token_ranks_eagerly()

        frozen = freeze_heap_for_build()
        try:
            self._llm = LLM(
                model=str(model_path),
                dtype=self.dtype,
                max_model_len=max_model_len,
                gpu_memory_utilization=gpu_memory_utilization,
                tensor_parallel_size=tensor_parallel_size,
                max_num_seqs=max_num_seqs,
                enforce_eager=enforce_eager,
                seed=seed,
                enable_sleep_mode=enable_sleep_mode,
                logprobs_mode="processed_logprobs",
                trust_remote_code=trust_remote_code,
                **({"hf_overrides": dict(hf_overrides)} if hf_overrides else {}),
                **engine_kwargs,
            )
        except BaseException:
            if frozen:
                gc.unfreeze()  # no engine: the heap is the process's own again
            raise

    # ------------------------------------------------------------------ generation

    def generate(
        self, prompt_token_ids: list[list[int]], sampling: SamplingSettings
    ) -> RolloutOutput:
        """Sample ``sampling.n`` responses for each of the ``B`` prompts.

        Returns ``B * n`` responses flattened prompt-major, each with the processed log-prob of
        every generated token and whether it ended on an EOS/stop token (the token is included).
        With ``sampling.seed = s``, prompt ``i`` is sampled with seed ``s + i * n`` (vLLM gives its
        ``n`` samples the seeds ``s + i*n + 0 .. n-1``), so the call is reproducible.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self._check_awake()
        _check_prompts(prompt_token_ids)
        if not prompt_token_ids:
            return RolloutOutput.empty(sampling)

        n = sampling.n
        if sampling.seed is None:
            params: SamplingParams | list[SamplingParams] = _sampling_params(sampling, None)
        else:
            params = [_sampling_params(sampling, sampling.seed + i * n) for i in range(len(prompt_token_ids))]
        prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in prompt_token_ids]
        outputs = self._llm.generate(prompts, params, use_tqdm=False, lora_request=self._lora)

        response_ids: list[list[int]] = []
        logprobs: list[list[float]] | None = [] if sampling.logprobs else None
        finished_by_eos: list[bool] = []
        for out in outputs:
            completions = sorted(out.outputs, key=lambda c: c.index)
            assert len(completions) == n, (len(completions), n)
            for c in completions:
                ids = list(c.token_ids)
                response_ids.append(ids)
                if logprobs is not None:
                    assert c.logprobs is not None and len(c.logprobs) == len(ids)
                    logprobs.append(_sampled_logprobs(c, ids))
                # "stop": an EOS / stop token (we set no stop strings); "length": max_tokens or
                # max_model_len.
                finished_by_eos.append(c.finish_reason == "stop")
        return RolloutOutput(
            response_ids=response_ids, logprobs=logprobs, finished_by_eos=finished_by_eos
        )

    # ------------------------------------------------------------------ one request at a time (async server)

    def add_request(self, request_id: str, prompt_ids: list[int], sampling: SamplingSettings, *,
                    deltas: bool = False) -> None:
        """Queue one request (``sampling.n == 1``, seeded with ``sampling.seed`` itself) for :meth:`step`
        (or, with ``deltas``, for :meth:`step_deltas`, which reports its tokens as they come); requests
        added between steps join the running batch (continuous batching)."""
        from vllm.inputs import TokensPrompt

        self._check_awake()
        if sampling.n != 1:
            raise ValueError(f"add_request samples one response per request, got n={sampling.n}")
        _check_prompts([prompt_ids])
        from vllm.sampling_params import RequestOutputKind

        params = _sampling_params(sampling, sampling.seed)
        # the finished response only, as LLM.generate asks: the default (cumulative) output rebuilds every
        # running request's whole token and log-prob lists at every engine step
        params.output_kind = RequestOutputKind.DELTA if deltas else RequestOutputKind.FINAL_ONLY
        self._llm.llm_engine.add_request(request_id, TokensPrompt(prompt_token_ids=list(prompt_ids)), params,
                                         lora_request=self._lora)

    def step(self) -> list[tuple[str, TokenOutput]]:
        """Run one engine iteration over every queued and running request; the requests it finished, by
        the id they were added with."""
        finished = []
        for out in self._llm.llm_engine.step():
            if not out.finished:
                continue
            c = out.outputs[0]
            ids = list(c.token_ids)
            lps = None if c.logprobs is None else _sampled_logprobs(c, ids)
            finished.append((out.request_id, TokenOutput(ids, lps, c.finish_reason or "abort")))
        return finished

    def step_deltas(self) -> list[tuple[str, list[int], list[float] | None, str | None]]:
        """Run one engine iteration; for each request added with ``deltas=True`` that sampled tokens in
        it: its id, the new token ids, their log-probs (None when not asked for) and its finish reason
        (``"stop"``, ``"length"``; None while it runs)."""
        new = []
        for out in self._llm.llm_engine.step():
            c = out.outputs[0]
            ids = list(c.token_ids)
            lps = None if c.logprobs is None else _sampled_logprobs(c, ids)
            new.append((out.request_id, ids, lps, (c.finish_reason or "abort") if out.finished else None))
        return new

    def has_unfinished_requests(self) -> bool:
        return self._llm.llm_engine.has_unfinished_requests()

    def abort(self, request_ids: list[str]) -> None:
        """Drop queued or running requests (their ids as added)."""
        self._llm.llm_engine.abort_request(list(request_ids))

    def compute_logprobs(
        self, prompt_ids: list[list[int]], response_ids: list[list[int]]
    ) -> list[list[float]]:
        """Log-probs of FIXED responses under the engine's current weights (teacher forcing).

        Args:
            prompt_ids: ``[B][P_i]`` prompt token ids.
            response_ids: ``[B][T_i]`` response token ids, ``T_i >= 1``.

        Returns:
            ``[B][T_i]``: ``log p(response[t] | prompt, response[:t])`` of the raw distribution
            (``log_softmax(logits)``, temperature 1, no top-k/top-p), as a trainer computes it.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self._check_awake()
        if len(prompt_ids) != len(response_ids):
            raise ValueError(
                f"{len(prompt_ids)} prompts but {len(response_ids)} responses; they must pair up"
            )
        _check_prompts(prompt_ids)
        if any(len(r) == 0 for r in response_ids):
            raise ValueError("every response must have at least one token")
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        prompts = [
            TokensPrompt(prompt_token_ids=list(p) + list(r))
            for p, r in zip(prompt_ids, response_ids)
        ]
        outputs = self._llm.generate(prompts, params, use_tqdm=False, lora_request=self._lora)
        result: list[list[float]] = []
        for out, p, r in zip(outputs, prompt_ids, response_ids):
            plp = out.prompt_logprobs
            assert plp is not None
            start = len(p)
            result.append([float(plp[start + t][tok].logprob) for t, tok in enumerate(r)])
        return result

    # ------------------------------------------------------------------ weights and memory

    accepts_partial_weights = False  # reload_weights re-processes the whole model after loading

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load ``(name, tensor)`` pairs (Hugging Face names, any float dtype, a full state dict) into
        the running engine, in place, and drop the prefix cache computed under the old weights.

        Uses the worker's public ``reload_weights(weights_iterator=...)``; on the CPU backend it
        also re-packs the weights for the CPU kernels. (GPU vLLM releases without
        ``reload_weights(weights_iterator=...)`` need ``model_runner.model.load_weights`` instead.)
        """
        self._check_awake()
        weights = list(named_tensors)  # references, no copies; vLLM copies into its parameters
        if not weights:
            raise ValueError("update_weights got no tensors")
        self._llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        if not self._llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache after a weight update")

    def load_adapter(self, named_tensors: Iterable[tuple[str, torch.Tensor]], config: dict[str, Any]) -> None:
        """Serve every later request through this LoRA adapter (replacing the one loaded before).

        ``named_tensors``: the adapter's tensors under peft's saved names
        (``base_model.model.<module>.lora_A.weight`` / ``lora_B.weight``, full tensors in every process of a
        tensor-parallel engine); ``config``: its peft ``LoraConfig`` as a dict (``adapter_config.json``).
        Needs the engine built with ``max_lora_rank`` >= the adapter's rank.
        """
        from vllm.lora.request import LoRARequest

        from grpo_dist.rollout.adapters import write_adapter

        self._check_awake()
        if not self._llm.llm_engine.vllm_config.lora_config:
            raise RuntimeError("load_adapter needs the engine built with max_lora_rank (LoRA adapters)")
        if self._lora_dir is None:
            import tempfile

            shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
            self._lora_dir = tempfile.mkdtemp(prefix="grpo_dist_lora_", dir=shm)
        previous = self._lora
        version = 1 if previous is None else previous.lora_int_id + 1
        folder = write_adapter(Path(self._lora_dir) / f"v{version}", named_tensors, config)
        request = LoRARequest(f"policy-v{version}", version, str(folder))
        try:
            self._llm.llm_engine.add_lora(request)
        except ValueError as e:
            raise ValueError(f"vLLM could not load the policy's LoRA adapter: {e}. vLLM adapts the decoder's linear "
                             "layers only; with other target modules set actor_rollout_ref.model.lora.merge=true "
                             "(the merged weights are sent instead)") from None
        self._lora = request
        if previous is not None:
            self._llm.llm_engine.remove_lora(previous.lora_int_id)
            _remove_tree(previous.lora_path)
        if not self._llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache after an adapter update")

    def sleep(self) -> None:
        """Offload the weights to host memory and free the KV cache (``enable_sleep_mode`` only;
        otherwise a no-op)."""
        if self.enable_sleep_mode and not self._asleep:
            self._llm.sleep(level=1)
            self._asleep = True

    def wake_up(self) -> None:
        """Bring back what ``sleep`` freed; a no-op when not asleep."""
        if self._asleep:
            self._llm.wake_up()
            self._asleep = False

    def close(self) -> None:
        """Shut the engine down and free its memory."""
        llm = getattr(self, "_llm", None)
        if llm is None:
            return
        self._llm = None
        if self._lora_dir is not None:
            _remove_tree(self._lora_dir)
            self._lora_dir = None
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:  # best effort: the engine is going away either way
            logger.debug("vLLM engine shutdown raised", exc_info=True)
        del llm

    def _check_awake(self) -> None:
        if getattr(self, "_llm", None) is None:
            raise RuntimeError("VLLMEngine is closed")
        if self._asleep:
            raise RuntimeError("VLLMEngine is asleep; call wake_up() first")


def _remove_tree(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def tp_launcher_env(tp: int, tp_rank: int, master: tuple[str, int], *, on_gpu: bool) -> dict[str, Any]:
    """Set up this process for vLLM's external-launcher executor (the torchrun convention: RANK,
    WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT in the environment) and return the engine
    argument that selects it. On GPU every rollout process sees only its own device (Ray's
    CUDA_VISIBLE_DEVICES), so its local rank is 0; on CPU the local rank spreads the engine's
    processes over the cores."""
    host, port = master
    os.environ.update(RANK=str(tp_rank), WORLD_SIZE=str(tp), LOCAL_RANK="0" if on_gpu else str(tp_rank),
                      LOCAL_WORLD_SIZE=str(tp), MASTER_ADDR=str(host), MASTER_PORT=str(int(port)))
    if not on_gpu:
        _name_cpu_shm_after_port(int(port))
    return {"distributed_executor_backend": "external_launcher"}


def share_one_rank_process_groups() -> None:
    """In a one-rank world, make ``torch.distributed.new_group`` return the world group itself for a
    group of that one rank (of the world group's backend), and ignore requests to destroy it
    through such a group (``destroy_process_group()`` with no group still ends everything).

    vLLM builds a device and a CPU process group for each parallel dimension (world, tensor,
    pipeline, data, expert, ...) even for a one-rank engine, and every gloo group runs an event-loop
    thread that wakes every 10 ms (gloo's fixed poll). An idle one-rank CPU engine held 13 of them,
    1,290 wake-ups a second, each taking a time slice from the compute threads of the model worker
    that runs beside it on the rank's cores. Every such group has the same single member as the
    world group, so sharing it changes no collective's result. Idempotent. Called for one-rank CPU
    engines, in the rollout worker's process (which makes no other process groups); GPU engines keep
    vLLM's own groups (their device groups are NCCL ones, and the gain was measured on the CPU only).
    """
    import torch.distributed as dist

    if getattr(dist.new_group, "_grpo_dist_one_rank", False):
        return
    new_group, destroy = dist.new_group, dist.destroy_process_group

    def shared_new_group(ranks=None, *args: Any, **kwargs: Any):
        backend = kwargs.get("backend", args[1] if len(args) > 1 else None)
        if (dist.is_initialized() and dist.get_world_size() == 1 and (ranks is None or list(ranks) == [0])
                and (backend is None or str(backend) == dist.get_backend())):
            return dist.group.WORLD
        return new_group(ranks, *args, **kwargs)

    def shared_destroy(group=None) -> None:
        if group is not None and group is dist.group.WORLD and dist.is_initialized() and dist.get_world_size() == 1:
            return  # a shared handle: the world group ends with destroy_process_group()
        destroy(group)

    shared_new_group._grpo_dist_one_rank = True  # type: ignore[attr-defined]
    dist.new_group = shared_new_group
    dist.destroy_process_group = shared_destroy


def freeze_heap_for_build() -> bool:
    """``gc.freeze()`` what the process holds now, before vLLM builds an engine in it: vLLM's full
    collections during the build then skip those objects (the imported modules, which live as long as
    the process anyway), and vLLM freezes the heap itself once the engine is built (its shutdown
    unfreezes everything). A collection decides only when unreachable objects are freed, never a
    value, so generation is unchanged. False (nothing done) where garbage collection is off."""
    if not gc.isenabled():
        return False
    gc.freeze()
    return True


def count_token_ranks_eagerly() -> None:
    """Make vLLM's sampler count each sampled token's rank with plain torch instead of its
    ``torch.compile``d ``batched_count_greater_than``.

    The rank is ``(logprobs >= sampled logprob).sum(-1)``, an integer count, the same either way, and
    grpo_dist does not even read it (only the sampled token's log-prob). On the CPU the compiled
    version costs the first generation that asks for log-probs an inductor compile (importing inductor,
    then C++ compilation: ~1-2 s with a warm inductor cache, 10-15 s cold, on 2 cores) for a count over
    a few thousand logits, which takes microseconds eagerly. Idempotent; a vLLM without the function
    keeps its own."""
    try:
        from vllm.v1.sample import sampler
    except ImportError:
        return
    fn = getattr(sampler, "batched_count_greater_than", None)
    eager = getattr(fn, "_torchdynamo_orig_callable", None)
    if callable(eager):
        sampler.batched_count_greater_than = eager


_SHM_DIR = Path("/dev/shm")


def _name_cpu_shm_after_port(port: int) -> None:
    """vLLM's CPU tensor-parallel all-reduce shares memory files named from the init method, which is
    the constant ``env://`` under the external launcher: two engines on one host would meet in the
    same file, and a file left by a killed run makes every later engine fail with ``errno 17``. Name
    the group after its master port instead (bound by the live group, so unique on the host among
    running engines) and remove this rank's file of that name if a dead run left one."""
    from vllm.distributed.device_communicators import cpu_communicator as cc

    base = cc._CPUSHMDistributed.make_group_name
    base = getattr(base, "_vllm_make_group_name", base)

    def make_group_name(communicator: Any) -> str:
        name = f"grpo-dist-{port}-" + base(communicator).lstrip("/").lstrip("-")
        stale = _SHM_DIR / f"{name}_{communicator.rank}"
        try:
            stale.unlink()
        except FileNotFoundError:
            pass
        except OSError:  # not ours to remove: vLLM's own error will name it
            logger.debug("could not remove %s", stale, exc_info=True)
        return name

    make_group_name._vllm_make_group_name = base  # type: ignore[attr-defined]
    cc._CPUSHMDistributed.make_group_name = staticmethod(make_group_name)


def _sampling_params(sampling: SamplingSettings, seed: int | None):
    """vLLM's ``SamplingParams`` for ``sampling`` with the seed ``seed``: token ids only (no detokenizing),
    the sampled token's log-prob when asked for, greedy as temperature 0 with no top-k/top-p."""
    from vllm import SamplingParams

    common: dict[str, Any] = dict(n=sampling.n, max_tokens=sampling.max_tokens, detokenize=False, seed=seed,
                                  ignore_eos=sampling.ignore_eos)
    if sampling.logprobs:
        common["logprobs"] = 0  # the sampled token's log-prob only
    if sampling.do_sample:
        common.update(temperature=sampling.temperature, top_p=sampling.top_p,
                      top_k=max(sampling.top_k, 0))  # vLLM: 0 disables top-k
    else:
        common.update(temperature=0.0, top_p=1.0, top_k=0)
    return SamplingParams(**common)


def _sampled_logprobs(completion: Any, ids: list[int]) -> list[float]:
    """The log-prob of each sampled token of a vLLM completion (``logprobs=0``: the sampled token's only)."""
    return [float(completion.logprobs[t][tok].logprob) for t, tok in enumerate(ids)]


def _check_prompts(prompt_token_ids: list[list[int]]) -> None:
    for i, p in enumerate(prompt_token_ids):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
