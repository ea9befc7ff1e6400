"""The asynchronous rollout server's scheduling (grpo_dist.rollout.async_server) on a scripted engine: continuous
batching, the request settings it accepts, and lock step for tensor-parallel engines."""

from __future__ import annotations

import asyncio
import random

import pytest

from grpo_dist.rollout.async_server import AsyncRolloutServer, sampling_from_params
from grpo_dist.rollout.base import TokenOutput


class ScriptedEngine:
    """Answers a request after ``len(prompt) % 3 + 1`` steps with the prompt's last token + 1; records the order
    requests were added in and the requests in each step."""

    def __init__(self):
        self.added, self.steps, self.running = [], [], {}

    def add_request(self, request_id, prompt_ids, sampling):
        self.added.append((request_id, sampling.seed))
        self.running[request_id] = [len(prompt_ids) % 3 + 1, prompt_ids[-1] + 1]

    def step(self):
        self.steps.append(sorted(self.running))
        done = []
        for rid, state in list(self.running.items()):
            state[0] -= 1
            if state[0] == 0:
                del self.running[rid]
                done.append((rid, TokenOutput([state[1]], [-0.5], "stop")))
        return done

    def has_unfinished_requests(self):
        return bool(self.running)

    def abort(self, ids):
        for rid in ids:
            self.running.pop(rid, None)


async def trajectory(server, k: int, turns: int, tool_s: float):
    prompt = [k] * (k + 1)  # lengths differ: the trajectories finish their turns at different steps
    for t in range(turns):
        out = await server.generate(f"t{k}-{t}", prompt_ids=prompt, sampling_params={"seed": 100 * k + t, "max_tokens": 4})
        await asyncio.sleep(tool_s)  # a tool call between turns
        prompt = prompt + out.token_ids + [7]
    if server.lockstep:
        server.trajectory_ended()
    return prompt


def run_trajectories(lockstep: bool, tool_times: list[float], turns: int = 3):
    engine = ScriptedEngine()
    server = AsyncRolloutServer(engine, max_model_len=64, lockstep=lockstep)

    async def main():
        if lockstep:
            server.trajectories_started(len(tool_times))
        return await asyncio.gather(*(trajectory(server, k, turns, s) for k, s in enumerate(tool_times)))

    return asyncio.run(main()), engine


def test_a_later_turn_joins_the_running_batch():
    """Without lock step a trajectory's next turn is added as soon as it is sent: requests of different turns
    are in the engine at once."""
    results, engine = run_trajectories(False, [0.0, 0.0, 0.0])
    assert any(len({rid.split("-")[1] for rid in step}) > 1 for step in engine.steps)
    assert results == run_trajectories(True, [0.0, 0.0, 0.0])[0]  # the same answers either way


def test_lock_step_adds_requests_in_the_same_order_whatever_the_tools_timing():
    """Two processes of a tensor-parallel engine run the same trajectories with tools that take different times:
    each engine sees the same requests in the same order at every step."""
    rng = random.Random(0)
    runs = [run_trajectories(True, [rng.uniform(0, 0.02) for _ in range(5)]) for _ in range(2)]
    (res_a, eng_a), (res_b, eng_b) = runs
    assert res_a == res_b
    assert [seed for _, seed in eng_a.added] == [seed for _, seed in eng_b.added]
    assert eng_a.steps == eng_b.steps
    # and a step never ran while a live trajectory was still in a tool call: every step after the first holds
    # the requests of every trajectory not yet finished
    assert len(eng_a.steps[0]) == 5


def test_request_settings():
    s = sampling_from_params({"temperature": 0.7, "top_p": 0.9, "top_k": 5, "seed": 3, "max_tokens": 50}, max_tokens=20)
    assert (s.temperature, s.top_p, s.top_k, s.seed, s.max_tokens, s.n) == (0.7, 0.9, 5, 3, 20, 1)
    assert not sampling_from_params({"temperature": 0.0}, max_tokens=8).do_sample
    assert sampling_from_params({"repetition_penalty": 1.0}, max_tokens=8).max_tokens == 8
    with pytest.raises(ValueError, match="repetition_penalty"):
        sampling_from_params({"repetition_penalty": 1.2}, max_tokens=8)
    with pytest.raises(ValueError, match="one response per request"):
        sampling_from_params({"n": 2}, max_tokens=8)
    with pytest.raises(ValueError, match="request-level API"):
        AsyncRolloutServer(object(), max_model_len=8, lockstep=True)
