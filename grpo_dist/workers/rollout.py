"""Ray actor shell around a rollout engine (vLLM, or Hugging Face generate), one per rank.

With tensor parallelism (``tp > 1``) the engine is built by :meth:`RolloutWorker.init_engine`, called
on every rank of an engine at once with the group's rendezvous (the constructor cannot know it);
otherwise the constructor builds it.

``generate`` and the weight-sync pieces (``wake_up``, ``load_bucket``, ``finish_load``) return
:class:`~grpo_dist.workers.common.Timed` results (value and busy seconds) for the driver's
``timing_s/gen/worker`` and ``timing_s/update_weights/...`` metrics.

Partial rollouts (fully asynchronous training, ``async_training.partial_rollout=true``): ``start_chunk``
queues a chunk on a background generator (:mod:`grpo_dist.rollout.partial`; with ``rollout.mode=async``,
``start_agent_chunk`` runs its agent loops in the background, :mod:`grpo_dist.agents.chunks`) and returns at
once, ``pause_generation`` / ``resume_generation`` bracket a weight sync, and ``take_groups`` hands over the
groups (a prompt's responses) that have finished, whatever their chunk.
A ``generate`` or ``run_agents`` call meanwhile (validation) pauses the background generation around itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import ray

from grpo_dist.utils import startup
from grpo_dist.utils.profiling import Profiled
from grpo_dist.workers.common import (current_node_id, node_ip, process_memory_gb, release_free_heap, setup_process,
                                      timed)


@ray.remote
class RolloutWorker(Profiled):
    role = "rollout"
    """(the label of its calls in a profiled step's trace)"""

    def __init__(self, *, rank: int, device: str, num_threads: int, engine: str, engine_kwargs: dict[str, Any],
                 tp: int = 1, external_libs: tuple[str, ...] = ()) -> None:
        startup.mark("constructor")
        setup_process(device, num_threads, external_libs)
        startup.mark("torch imported")
        self.rank = rank
        self._engine_args = (engine, engine_kwargs)
        self._tp = tp
        self._tp_rank = 0
        self.engine = None if tp > 1 else self._make_engine()
        startup.mark("engine built")
        self._pending: list = []  # weight-sync tensors held for an engine that loads them all at once
        self._adapter_config: dict | None = None  # set when the weight sync sends LoRA adapters only
        self._sync_group = None  # the "broadcast" weight sync's process group with the actor's rank 0
        self._server = None  # the asynchronous server of rollout.mode=async, made on first use
        self._tokenizer = None
        self._partial = None  # the background generation of partial rollouts, made on first use

    def _make_engine(self, **more: Any):
        from grpo_dist.rollout import make_engine

        name, kwargs = self._engine_args
        return make_engine(name, **kwargs, **more)

    def address(self) -> tuple[str, int]:
        """Where this rank would host a rendezvous (a tensor-parallel engine's first rank does)."""
        from grpo_dist.distributed.process_group import free_port

        return node_ip(), free_port()

    def init_engine(self, tp_rank: int, master_addr: str, master_port: int) -> None:
        """Build this rank's shard of a tensor-parallel engine; every rank of the engine calls it at once."""
        self.engine = self._make_engine(tp_rank=tp_rank, tp_master=(master_addr, master_port))
        self._tp_rank = tp_rank

    @timed
    def generate(self, prompt_ids: list[list[int]], sampling: Any):
        if not prompt_ids:  # a rank without prompts leaves its engine alone
            from grpo_dist.rollout.base import RolloutOutput

            return RolloutOutput.empty(sampling)
        return self._alone(lambda: self.engine.generate(prompt_ids, sampling))

    def _alone(self, call):
        """``call()`` with the engine to itself: partial rollouts generating in the background pause around it,
        then go on with the same weights."""
        if self._partial is None or self._partial.paused or not self._partial.active:
            return call()
        self._partial.pause()
        try:
            return call()
        finally:
            self._partial.resume()

    def start_chunk(self, chunk_id: str, prompt_ids: list[list[int]], sampling: Any, version: int) -> None:
        """Partial rollouts: queue chunk ``chunk_id`` (``sampling.n`` responses per prompt) on the background
        generator, its tokens tagged with policy ``version`` until the next resume; returns at once."""
        if self._partial is None:
            from grpo_dist.rollout.partial import PartialRollouts

            self._partial = PartialRollouts(self.engine, version=version, agreement=self._agreement())
        self._partial.start(chunk_id, prompt_ids, sampling)

    def start_agent_chunk(self, chunk_id: str, rows: list[dict], sampling: Any, settings: Any, tokenizer_path: str,
                          version: int) -> None:
        """Partial rollouts with ``rollout.mode=async``: run chunk ``chunk_id``'s agent loops (``sampling.n``
        trajectories per row) in the background, their tokens tagged with policy ``version`` until the next
        resume; returns at once."""
        if self._partial is None:
            from grpo_dist.agents.chunks import AgentChunks

            self._partial = AgentChunks(self.engine, max_model_len=settings.prompt_length + settings.response_length,
                                        tokenizer=self._load_tokenizer(tokenizer_path), version=version,
                                        agreement=self._agreement())
        self._partial.start(chunk_id, rows, sampling, settings)

    def _agreement(self):
        """A tensor-parallel engine's agreement on every iteration of the background generation (None for a
        one-process engine): made by all of the engine's processes at once, as each gets the same first chunk."""
        if self._tp == 1:
            return None
        from grpo_dist.rollout.partial import TensorParallelAgreement

        return TensorParallelAgreement(self._tp_rank)

    def pause_generation(self) -> int:
        """Partial rollouts: interrupt the background generation (before a weight sync); how many responses
        were interrupted (counted by an engine's first process only: every process of it holds the same)."""
        interrupted = 0 if self._partial is None else self._partial.pause()
        release_free_heap()  # the aborted and re-added requests fragment the heap (see the function)
        return interrupted if self._tp_rank == 0 else 0

    def resume_generation(self, version: int) -> None:
        """Partial rollouts: continue the interrupted responses with the engine's weights, policy ``version``."""
        if self._partial is not None:
            self._partial.resume(version)

    def take_groups(self, groups: list[tuple[str, int]] | None = None, wait_s: float = 0.0):
        """Streaming partial rollouts: the finished groups (a prompt's responses) of the chunks started, handed over
        as ``(chunk id, prompt index in this engine's share, output)``, with the engine's seconds since the last
        call (:meth:`grpo_dist.rollout.partial.PartialRollouts.take_groups`)."""
        from grpo_dist.workers.common import Timed

        if self._partial is None:
            raise RuntimeError("take_groups before any start_chunk")
        taken, busy_s = self._partial.take_groups(groups, wait_s=wait_s)
        return Timed(taken, busy_s)

    @timed
    def run_agents(self, rows: list[dict], sampling: Any, settings: Any, tokenizer_path: str):
        """``rollout.mode=async``: this replica's rows through their agent loops (every trajectory at once on
        the replica's asynchronous server), as a ``RolloutOutput`` with the trajectories' masks and turns."""
        from grpo_dist.agents.collect import agent_rollout

        if self._server is None:
            from grpo_dist.rollout.async_server import AsyncRolloutServer

            # a tensor-parallel engine's processes must feed it identically: lock-step (see the server)
            self._server = AsyncRolloutServer(self.engine, max_model_len=settings.prompt_length + settings.response_length,
                                              lockstep=self._tp > 1)
        tokenizer = self._load_tokenizer(tokenizer_path)
        output = self._alone(lambda: agent_rollout(rows, sampling, server=self._server, tokenizer=tokenizer,
                                                   settings=settings))
        release_free_heap()  # every turn is a new engine request: the heap fragments as with partial rollouts
        return output

    def _load_tokenizer(self, tokenizer_path: str):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(
                tokenizer_path, trust_remote_code=bool(self._engine_args[1].get("trust_remote_code", False)))
        return self._tokenizer

    def gpu_uuid(self) -> str | None:
        from grpo_dist.rollout.weight_sync import gpu_uuid

        return gpu_uuid()

    def set_adapter_config(self, config: dict) -> None:
        """From now on the weight sync sends LoRA adapters only, configured by ``config`` (peft's
        ``adapter_config.json``): :meth:`finish_load` hands them to the engine's ``load_adapter``."""
        self._adapter_config = dict(config)

    def open_sync_group(self, master_addr: str, master_port: int, rank: int, size: int, backend: str,
                        timeout_s: float) -> None:
        """Collective with the actor's rank 0: join the ``"broadcast"`` weight sync's process group as ``rank``."""
        from grpo_dist.distributed.process_group import open_side_group

        self._sync_group = open_side_group(backend=backend, rank=rank, size=size, master_addr=master_addr,
                                           master_port=master_port, timeout_s=timeout_s)

    @timed
    def load_bucket(self, bucket: Any, payload: Any) -> float:
        """Load one bucket of the weight sync (see :mod:`grpo_dist.rollout.weight_sync`); returns the seconds it
        waited for the bucket's bytes (the broadcast, which starts as the actor's rank 0 is still gathering).

        ``payload``: the flat CPU buffer's bytes (object store: Ray resolved the reference to a
        read-only numpy array mapped from the store, no copy), a CUDA IPC handle of the actor's buffer
        on this GPU, or ``BROADCAST`` (the bytes come over the sync group). Engines that cannot take part
        of the weights get them all in :meth:`finish_load`.
        """
        import time

        import torch

        from grpo_dist.rollout.weight_sync import BROADCAST, bucket_buffer, open_cuda, receive, unpack

        if self._partial is not None and self._partial.active and not self._partial.paused:
            raise RuntimeError("weights sent while partial rollouts generate: pause_generation must come first")
        t0 = time.perf_counter()
        if isinstance(payload, str) and payload == BROADCAST:
            if self._sync_group is None:
                raise RuntimeError("the broadcast weight sync needs open_sync_group first")
            flat = receive(bucket, self._sync_group)
        else:
            flat = bucket_buffer(bucket, payload) if isinstance(payload, np.ndarray) else open_cuda(payload)
        waited_s = time.perf_counter() - t0
        named = list(unpack(bucket, flat))
        if self._adapter_config is not None:
            self._pending.extend((name, t.clone()) for name, t in named)  # the actor may reuse its buffer
        elif self.engine.accepts_partial_weights:
            self.engine.update_weights(named)
            if flat.is_cuda:
                torch.cuda.synchronize()  # the actor may free or reuse its buffer once this returns
        else:
            self._pending.extend(named)
        return waited_s

    @timed
    def finish_load(self) -> None:
        import torch

        pending, self._pending = self._pending, []
        if pending and self._adapter_config is not None:
            self.engine.load_adapter(pending, self._adapter_config)
        elif pending:
            self.engine.update_weights(pending)
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()

    def sleep(self) -> None:
        self.engine.sleep()

    @timed
    def wake_up(self) -> None:
        self.engine.wake_up()

    def memory_gb(self) -> float:
        return process_memory_gb()

    def close(self) -> None:
        if self._partial is not None:
            self._partial.close()
        if self.engine is not None:
            self.engine.close()

    def node_id(self) -> str:
        return current_node_id()

    def startup_moments(self) -> dict[str, Any]:
        """This process's start-up moments (:func:`grpo_dist.utils.startup.moments`)."""
        return startup.moments()
