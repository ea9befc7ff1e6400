"""Running the agent loops of a batch: ``len(rows) * n`` trajectories at once, prompt-major.

Trajectory ``i * n + j`` is sample ``j`` of row ``i`` (the order of :class:`~grpo_dist.rollout.base.RolloutOutput`,
so ``outputs[i * n : (i + 1) * n]`` is row ``i``'s GRPO group). Its loop is the row's ``agent_name``, else
``settings.default_agent_loop``; its seed is ``sampling.seed + i * n + j`` (None when ``sampling.seed`` is None).
Every trajectory gets a fresh loop instance and the row's fields as keywords of ``run``.

With ``versions_out`` (partial rollouts), each trajectory's loop calls the server through a recorder that notes
the policy version of every token the server answered it with, in order: ``versions_out[k]`` is trajectory
``k``'s list.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from grpo_dist.agents.base import (AgentLoopEntry, AgentLoopOutput, Server, TrainerConfigRef, get_agent_loop_entry,
                                   load_agent_loop_config)
from grpo_dist.agents.settings import AgentSettings
from grpo_dist.rollout.base import SamplingSettings

_loaded_configs: set[str] = set()


def sampling_params_of(sampling: SamplingSettings, seed: int | None) -> dict[str, Any]:
    """verl's per-request ``sampling_params`` dict for one trajectory (greedy: temperature 0)."""
    return {"temperature": sampling.temperature if sampling.do_sample else 0.0, "top_p": sampling.top_p,
            "top_k": sampling.top_k, "do_sample": sampling.do_sample, "logprobs": sampling.logprobs,
            "seed": seed, "max_tokens": sampling.max_tokens, "ignore_eos": sampling.ignore_eos}


def _ensure_user_loops(settings: AgentSettings) -> None:
    path = settings.agent_loop_config_path
    if path and str(Path(path).expanduser().resolve()) not in _loaded_configs:
        load_agent_loop_config(path)
        _loaded_configs.add(str(Path(path).expanduser().resolve()))


class _Recording:
    """The server as one trajectory's loop sees it: answers pass through, the versions of their tokens are noted."""

    def __init__(self, server: Server, versions: list[int]) -> None:
        self._server = server
        self._versions = versions

    async def generate(self, request_id: str, **kwargs: Any) -> Any:
        out = await self._server.generate(request_id, **kwargs)
        if getattr(out, "versions", None) is not None:
            self._versions.extend(out.versions)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


async def _one(index: int, row_index: int, name: str, entry: AgentLoopEntry, row: dict[str, Any],
               params: dict[str, Any], *, server: Server, tokenizer: Any, trainer_config: TrainerConfigRef,
               settings: AgentSettings, versions: list[int] | None = None) -> AgentLoopOutput:
    loop_server = server if versions is None else _Recording(server, versions)
    try:
        loop = entry.cls(trainer_config, loop_server, tokenizer, None, **{"settings": settings, **entry.kwargs})
        out = await loop.run(params, **row)
        if not isinstance(out, AgentLoopOutput):
            raise TypeError(f"run() returned {type(out).__name__}, expected AgentLoopOutput")
        return out
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        raise RuntimeError(f"agent loop {name!r} failed on row {row_index} (trajectory {index}): "
                           f"{type(exc).__name__}: {exc}") from exc
    finally:
        ended = getattr(server, "trajectory_ended", None)
        if ended is not None:  # a lock-step server waits for every live trajectory before an engine step
            ended()


async def run_trajectories(rows: list[dict[str, Any]], sampling: SamplingSettings, *, server: Server,
                           tokenizer: Any, settings: AgentSettings,
                           versions_out: list[list[int]] | None = None,
                           group_done: Callable[[int, list[AgentLoopOutput]], None] | None = None
                           ) -> list[AgentLoopOutput]:
    """All trajectories of ``rows`` (``len(rows) * sampling.n``, prompt-major), run concurrently; with
    ``versions_out`` (an empty list), it gets each trajectory's token versions (see the module doc); with
    ``group_done``, ``group_done(i, outputs)`` is called (on the event loop) as soon as row ``i``'s ``n``
    trajectories have all ended well.

    Raises:
        ValueError: a row names an unregistered loop, or the agent-loop config cannot be used (before any
            trajectory starts).
        RuntimeError: a loop raised; the message names the loop, the row index and the error; the other
            trajectories are cancelled.
    """
    _ensure_user_loops(settings)
    n = sampling.n
    names = [row.get("agent_name") or settings.default_agent_loop for row in rows]
    entries = {name: get_agent_loop_entry(name) for name in names}
    # one DictConfig for every loop of the call, as verl shares one config object: building it is the costly part
    # of a loop's constructor (milliseconds for a full run configuration, per trajectory otherwise)
    trainer_config = TrainerConfigRef(OmegaConf.create(settings.trainer_config or {}))
    tasks = []
    if versions_out is not None:
        versions_out[:] = [[] for _ in range(len(rows) * n)]
    for i, (row, name) in enumerate(zip(rows, names)):
        for j in range(n):
            seed = None if sampling.seed is None else sampling.seed + i * n + j
            tasks.append(asyncio.ensure_future(_one(
                i * n + j, i, name, entries[name], row, sampling_params_of(sampling, seed), server=server,
                tokenizer=tokenizer, trainer_config=trainer_config, settings=settings,
                versions=None if versions_out is None else versions_out[i * n + j])))
    if not tasks:
        return []
    if group_done is not None:
        for i in range(len(rows)):
            _on_group_done(tasks[i * n:(i + 1) * n], lambda outs, i=i: group_done(i, outs))
    started = getattr(server, "trajectories_started", None)
    if started is not None:
        started(len(tasks))
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
    failed = [t for t in tasks if t in done and t.exception() is not None]
    if failed:
        raise failed[0].exception()
    return [t.result() for t in tasks]


def _on_group_done(group: list[asyncio.Future], call: Callable[[list[Any]], None]) -> None:
    """``call(results)`` once every task of ``group`` ended without an error (never when one failed or was
    cancelled)."""
    left = [len(group)]

    def one_ended(_: asyncio.Future) -> None:
        left[0] -= 1
        if left[0] == 0 and all(not t.cancelled() and t.exception() is None for t in group):
            call([t.result() for t in group])

    for task in group:
        task.add_done_callback(one_ended)


def run_trajectories_sync(rows: list[dict[str, Any]], sampling: SamplingSettings, *, server: Server,
                          tokenizer: Any, settings: AgentSettings) -> list[AgentLoopOutput]:
    """:func:`run_trajectories` from synchronous code (its own event loop: ``asyncio.run``)."""
    return asyncio.run(run_trajectories(rows, sampling, server=server, tokenizer=tokenizer, settings=settings))
