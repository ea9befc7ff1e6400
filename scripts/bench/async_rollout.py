"""Rollout throughput of the asynchronous server (``rollout.mode=async``) against the synchronous engine call.

    python scripts/bench/async_rollout.py [--shape large|tiny] [--prompts 32] [--n 8] [--response-length 64]
                                          [--repeats 3] [--concurrency 1,8,64] [--turns 3]

One vLLM engine in this process (the CPU build on CPU; the GPU path where there is one), the same random
Qwen2-shaped model the main benchmark uses (``--shape large``: ~22.7 M parameters) with its character
tokenizer, ``max_model_len`` = prompt + response. It prints two tables:

1. **Single-turn GRPO**: the same prompts (``--prompts`` x ``--n`` responses, temperature 1, each response
   with its own seed as the trainer seeds them) through ``VLLMEngine.generate`` (the sync path) and through
   ``AsyncRolloutServer`` (one request per response, all at once, as the single-turn agent loop sends them).
   Both sample the same tokens (checked), so the generated-token rate compares like with like; and through
   the ``single_turn_agent`` loops themselves (``run_trajectories``, each loop handed the run configuration
   as a training run hands it: what ``rollout.mode=async`` costs end to end), same tokens again. Target:
   async >= 0.95x sync.
2. **Multi-turn**: trajectories of ``--turns`` model turns; after each turn a fixed 12-token "tool response"
   is appended and the trajectory generates again (a tool that answers at once), with 1, 8 and 64
   trajectories at a time. Reported: model tokens per second and trajectories per second.

Each figure is the median of ``--repeats`` runs after one warm-up run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench_common import LARGE_SHAPE  # noqa: E402

TOOL_TOKENS = [20 + (i * 7) % 60 for i in range(12)]


def build_model(shape: str, where: Path) -> Path:
    from grpo_dist.utils.tiny_model import build_tiny_model

    kwargs = LARGE_SHAPE if shape == "large" else dict(hidden_size=128, num_layers=4, num_heads=2, num_kv_heads=2,
                                                       head_dim=64, intermediate_size=256, max_position_embeddings=512)
    return build_tiny_model(where / f"model-{shape}", seed=0, **kwargs)


def prompts_of(count: int, seed: int = 0) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[2] + [rng.randint(10, 90) for _ in range(rng.randint(8, 24))] for _ in range(count)]


def median_time(fn, repeats: int) -> tuple[float, object]:
    fn()  # warm-up
    times, result = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), result


def single_turn(engine, server, prompts, n, response_length, repeats):
    from grpo_dist.rollout.base import SamplingSettings

    seed = 1000
    sampling = SamplingSettings(n=n, temperature=1.0, max_tokens=response_length, seed=seed, logprobs=True)
    sync_s, sync_out = median_time(lambda: engine.generate(prompts, sampling), repeats)
    params = {"temperature": 1.0, "logprobs": True, "max_tokens": response_length}

    async def all_requests():
        return await asyncio.gather(*(server.generate(f"s{i}-{j}", prompt_ids=p,
                                                      sampling_params={**params, "seed": seed + i * n + j})
                                      for i, p in enumerate(prompts) for j in range(n)))

    async_s, async_out = median_time(lambda: asyncio.run(all_requests()), repeats)
    loops_s, loops_out = median_time(lambda: through_loops(server, prompts, sampling, response_length), repeats)
    same = ([o.token_ids for o in async_out] == sync_out.response_ids
            and [o.response_ids for o in loops_out] == sync_out.response_ids)
    tokens = sum(len(r) for r in sync_out.response_ids)
    return [("sync (engine.generate)", sync_s, tokens), ("async server", async_s, tokens),
            ("single-turn agent loops", loops_s, tokens)], same


def through_loops(server, prompts, sampling, response_length):
    """The trajectories through ``single_turn_agent``, with the default run configuration as every loop's
    ``self.config`` (what a training run with ``rollout.mode=async`` does)."""
    from grpo_dist.agents.runner import run_trajectories_sync
    from grpo_dist.agents.settings import AgentSettings
    from grpo_dist.config.agents import _plain
    from grpo_dist.config.schema import GRPOConfig

    settings = AgentSettings(prompt_length=32, response_length=response_length, trainer_config=_plain(GRPOConfig()))
    rows = [{"prompt_ids": p, "index": i} for i, p in enumerate(prompts)]
    return run_trajectories_sync(rows, sampling, server=server, tokenizer=None, settings=settings)


def multi_turn(server, prompts, turns, response_length, concurrency, repeats):
    per_turn = max(1, response_length // turns)

    async def trajectory(k: int, prompt: list[int]) -> int:
        ids, model_tokens = list(prompt), 0
        for t in range(turns):
            out = await server.generate(f"m{k}-{t}", prompt_ids=ids, sampling_params={
                "temperature": 1.0, "max_tokens": per_turn, "seed": 77 + k * 31 + t, "logprobs": True})
            ids += out.token_ids + TOOL_TOKENS
            model_tokens += len(out.token_ids)
        return model_tokens

    async def run_all() -> int:
        return sum(await asyncio.gather(*(trajectory(k, prompts[k % len(prompts)]) for k in range(concurrency))))

    secs, tokens = median_time(lambda: asyncio.run(run_all()), repeats)
    return secs, tokens


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=("large", "tiny"), default="large")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--response-length", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--concurrency", default="1,8,64")
    ap.add_argument("--turns", type=int, default=3)
    a = ap.parse_args(argv)

    import torch

    from grpo_dist.rollout import make_engine
    from grpo_dist.rollout.async_server import AsyncRolloutServer

    on_gpu = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(a.shape, Path(tmp))
        max_len = 32 + a.response_length + a.turns * len(TOOL_TOKENS)
        engine = make_engine("vllm", model_path=model, dtype=None, max_model_len=max_len, max_num_seqs=256, seed=0,
                             kv_cache_gib=None if on_gpu else 1.0)
        server = AsyncRolloutServer(engine, max_model_len=max_len)
        prompts = prompts_of(a.prompts)
        device = torch.cuda.get_device_name() if on_gpu else f"CPU, {torch.get_num_threads()} threads"
        print(f"# async rollout benchmark: {a.shape} model, {device}, {a.prompts} prompts x n={a.n}, "
              f"{a.response_length} tokens at most, median of {a.repeats}")
        rows, same = single_turn(engine, server, prompts, a.n, a.response_length, a.repeats)
        print("\n| single-turn path | seconds | generated tokens | tokens/s | vs sync |")
        print("|---|---:|---:|---:|---:|")
        base = rows[0][2] / rows[0][1]
        for name, secs, tokens in rows:
            print(f"| {name} | {secs:.2f} | {tokens} | {tokens / secs:.0f} | {tokens / secs / base:.2f}x |")
        print(f"\nsame tokens on both paths: {same}")
        print(f"\n| multi-turn ({a.turns} model turns, 12-token tool answer) | seconds | model tokens | tokens/s "
              "| trajectories/s |")
        print("|---|---:|---:|---:|---:|")
        for c in (int(x) for x in a.concurrency.split(",")):
            secs, tokens = multi_turn(server, prompts, a.turns, a.response_length, c, a.repeats)
            print(f"| {c} at once | {secs:.2f} | {tokens} | {tokens / secs:.0f} | {c / secs:.2f} |")
        engine.close()


if __name__ == "__main__":
    main()
