"""Partial rollouts through agent loops: the interruptible asynchronous server (grpo_dist/rollout/async_server.py)
and the background chunks of agent loops (grpo_dist/agents/chunks.py), on the stand-in engine of
test_partial_rollouts.py (a token's value and log-prob say which weights sampled it). The real vLLM engine runs
the same checks in tests/e2e/test_rollout_vllm.py."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from grpo_dist.agents.base import AgentLoopBase, AgentLoopOutput, register
from grpo_dist.agents.chunks import AgentChunks
from grpo_dist.agents.collect import align_versions
from grpo_dist.agents.settings import AgentSettings
from grpo_dist.rollout.async_server import AsyncRolloutServer
from grpo_dist.rollout.base import SamplingSettings
from grpo_dist.rollout.partial import continuation_seed
from tests.unit.test_partial_rollouts import SteppedEngine, wait_until


class ServedEngine(SteppedEngine):
    """The stand-in with what the server checks for besides ``step_deltas``."""

    def step(self):
        raise AssertionError("an interruptible server steps with step_deltas")

    def has_unfinished_requests(self):
        return bool(self.requests)


PARAMS = {"temperature": 1.0, "logprobs": True, "seed": 50, "max_tokens": 6}


def test_align_versions_model_tokens_in_order_tool_tokens_take_the_previous():
    assert align_versions([1, 1, 0, 0, 1, 1], [0, 0, 1, 1], default=9) == [0, 0, 0, 0, 1, 1]
    assert align_versions([0, 1, 1], [2, 3], default=9) == [2, 2, 3]  # a tool token first: the first model token's
    assert align_versions([1, 1], [4, 5, 6], default=9) == [4, 5]  # the loop cut its last turn: fewer used
    assert align_versions([1, 1, 1], [4], default=9) == [4, 4, 4]  # more model tokens than sampled: the last repeats
    assert align_versions([0, 0], [], default=9) == [9, 9]
    assert align_versions([], [1], default=9) == []


def test_a_paused_request_resumes_as_prompt_plus_its_tokens_each_token_keeping_its_version():
    engine = ServedEngine()

    async def main():
        server = AsyncRolloutServer(engine, max_model_len=64, interruptible=True, version=0)
        task = asyncio.ensure_future(server.generate("a", prompt_ids=[7, 8], sampling_params=PARAMS))
        while sum(len(r.tokens) for r in server._unanswered.values()) < 2:
            await asyncio.sleep(0)
        assert server.pause() == 1 and server.paused
        assert not engine.requests  # aborted in the engine: it is free for the weight sync
        late = asyncio.ensure_future(server.generate("b", prompt_ids=[3], sampling_params={**PARAMS, "seed": 60}))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not task.done() and [rid for rid, _, _ in engine.added] == ["a"]  # "b" held back while paused
        engine.weights = 1
        server.resume(1)
        return await task, await late, server

    out, late, server = asyncio.run(main())
    first, cont, b = engine.added
    assert first[0] == "a" and cont[0].startswith("a#") and b[0] == "b"
    assert cont[1] == [7, 8] + out.token_ids[:2]  # the prompt and the tokens so far, recomputed with the new weights
    assert cont[2].max_tokens == 4 and cont[2].seed == continuation_seed(50, 2)
    assert out.token_ids == [2, 3, 104, 105, 106, 107] and out.stop_reason == "length"
    assert out.versions == [0, 0, 1, 1, 1, 1] and out.log_probs == [-1.0, -1.0, -2.0, -2.0, -2.0, -2.0]
    assert late.versions == [1] * 6 and b[2].seed == 60  # a request held while paused starts afresh
    assert server.requests == 2 and server.busy_s >= 0


def test_a_plain_server_refuses_pause_and_an_engine_without_deltas_refuses_interruptible():
    with pytest.raises(RuntimeError, match="interruptible=True"):
        AsyncRolloutServer(ServedEngine(), max_model_len=64).pause()

    class NoDeltas:
        def add_request(self): ...
        def step(self): ...
        def has_unfinished_requests(self): ...

    with pytest.raises(ValueError, match="step_deltas"):
        AsyncRolloutServer(NoDeltas(), max_model_len=64, interruptible=True)


@register("two_turn_test_agent")
class TwoTurnLoop(AgentLoopBase):
    """Two model turns of 3 tokens with 2 "tool" tokens (mask 0) between them; no tokenizer needed."""

    async def run(self, sampling_params, **kwargs):
        prompt = [int(t) for t in kwargs["prompt_ids"]]
        ids, mask, lps = [], [], []
        for turn in range(2):
            out = await self.server_manager.generate(f"{kwargs['index']}-{sampling_params['seed']}-{turn}",
                                                     prompt_ids=prompt + ids,
                                                     sampling_params={**sampling_params, "max_tokens": 3})
            ids += out.token_ids
            mask += [1] * len(out.token_ids)
            lps += out.log_probs
            if turn == 0:
                await asyncio.sleep(0.01)  # the tool
                ids += [0, 0]
                mask += [0, 0]
                lps += [0.0, 0.0]
        return AgentLoopOutput(prompt_ids=prompt, response_ids=ids, response_mask=mask, response_logprobs=lps,
                               num_turns=4)


SETTINGS = AgentSettings(default_agent_loop="two_turn_test_agent", prompt_length=8, response_length=8)
ROWS = [{"prompt_ids": [1, 2], "index": 0}, {"prompt_ids": [5], "index": 1}]


def test_agent_chunks_survive_a_sync_mid_trajectory_with_every_tokens_version():
    gate = threading.Semaphore(0)
    engine = ServedEngine(gate=gate)
    chunks = AgentChunks(engine, max_model_len=16, tokenizer=None, version=0)
    try:
        chunks.start("c0", ROWS, SamplingSettings(n=2, temperature=1.0, max_tokens=8, seed=10), SETTINGS)
        gate.release(2)  # the first turns sample 2 of their 3 tokens, then the weights change
        wait_until(lambda: engine.steps == 2)
        assert chunks.pause() == 4 and not engine.requests
        with pytest.raises(RuntimeError, match="waits for a resume"):
            chunks.collect("c0", timeout_s=5)
        engine.weights = 1
        chunks.resume(1)
        gate.release(1000)
        out, busy_s = chunks.collect("c0", timeout_s=10)
        assert not chunks.active and busy_s > 0
    finally:
        chunks.close()
    assert out.response_masks == [[1, 1, 1, 0, 0, 1, 1, 1]] * 4
    assert out.token_versions == [[0, 0, 1, 1, 1, 1, 1, 1]] * 4  # the tool tokens take the token before them
    assert out.logprobs == [[-1.0, -1.0, -2.0, 0.0, 0.0, -2.0, -2.0, -2.0]] * 4
    assert [ids[:3] for ids in out.response_ids] == [[2, 3, 104]] * 2 + [[1, 2, 103]] * 2
    assert out.prompt_ids == [[1, 2]] * 2 + [[5]] * 2


def test_an_uninterrupted_agent_chunk_has_one_version_and_a_failing_loop_is_named():
    engine = ServedEngine()
    chunks = AgentChunks(engine, max_model_len=16, tokenizer=None, version=3)
    try:
        chunks.start("c0", ROWS[:1], SamplingSettings(n=1, temperature=1.0, max_tokens=8, seed=1), SETTINGS)
        out, _ = chunks.collect("c0", timeout_s=10)
        assert out.token_versions == [[3] * 8]
        with pytest.raises(ValueError, match="started already"):
            chunks.start("c1", ROWS[:1], SamplingSettings(n=1, temperature=1.0, max_tokens=8), SETTINGS)
            chunks.start("c1", ROWS[:1], SamplingSettings(n=1, temperature=1.0, max_tokens=8), SETTINGS)
        chunks.collect("c1", timeout_s=10)
        chunks.start("bad", [{"index": 0}], SamplingSettings(n=1, temperature=1.0, max_tokens=8), SETTINGS)  # no prompt_ids
        with pytest.raises(RuntimeError, match="'two_turn_test_agent' failed on row 0"):
            chunks.collect("bad", timeout_s=10)
        assert not chunks.active  # a failed chunk is handed over too: nothing is left generating
    finally:
        chunks.close()


class LongTurnLoop(AgentLoopBase):
    """A model turn of ``budgets[0]`` tokens, a tool (``tool_tokens``, mask 0) taking ``tool_s``, a model turn of
    ``budgets[1]`` tokens. (Also run on the real engine: tests/e2e/test_rollout_vllm.py.)"""

    budgets = (10, 4)
    tool_tokens = [0, 0]
    tool_s = 0.001

    async def run(self, sampling_params, **kwargs):
        prompt = [int(t) for t in kwargs["prompt_ids"]]
        ids, mask, lps = [], [], []
        for turn, budget in enumerate(self.budgets):
            out = await self.server_manager.generate(f"{kwargs['index']}-{sampling_params['seed']}-{turn}",
                                                     prompt_ids=prompt + ids,
                                                     sampling_params={**sampling_params, "max_tokens": budget})
            ids += out.token_ids
            mask += [1] * len(out.token_ids)
            lps += out.log_probs
            if turn == 0:
                await asyncio.sleep(self.tool_s)
                ids += self.tool_tokens
                mask += [0] * len(self.tool_tokens)
                lps += [0.0] * len(self.tool_tokens)
        return AgentLoopOutput(prompt_ids=prompt, response_ids=ids, response_mask=mask, response_logprobs=lps,
                               num_turns=4)


@register("long_turn_slow_tool_test_agent")
class SlowToolLoop(LongTurnLoop):
    tool_s = 0.03  # the same answers, at other moments: the other process's loops send their requests later


register("long_turn_test_agent")(LongTurnLoop)


def _tp_pair(seed: int):
    """Two processes of a tensor-parallel engine (stand-ins): each its own engine and background loops, agreeing
    through an in-memory word queue (tests/unit/test_partial_rollouts.QueueAgreement)."""
    import queue

    from tests.unit.test_partial_rollouts import QueueAgreement

    words = queue.Queue()
    engines = [ServedEngine(gate=threading.Semaphore(0)), ServedEngine(gate=threading.Semaphore(0))]
    pair = [AgentChunks(e, max_model_len=32, tokenizer=None, version=0, agreement=QueueAgreement(i == 0, words))
            for i, e in enumerate(engines)]
    sampling = SamplingSettings(n=2, temperature=1.0, max_tokens=16, seed=seed)
    settings = [AgentSettings(default_agent_loop=name, prompt_length=8, response_length=16)
                for name in ("long_turn_test_agent", "long_turn_slow_tool_test_agent")]
    return engines, pair, sampling, settings


def test_a_tensor_parallel_engines_agent_loops_pause_at_one_iteration_and_finish_alike():
    """With rollout tensor parallelism every process of the engine runs the same loops (lock step) and must add,
    step, abort and resume the same requests at the same iterations, whenever the driver's calls and its own
    loops' requests reach it. Here the other process gets the chunk first (it adds nothing before the leader's
    word), its tools answer later (it waits until its loops sent what the leader added), its pause is called
    first (it returns once the leader paused, with the same count) and its resume too; and it starts the next chunk
    while the first still runs there, before the leader does (its requests wait for the leader's word for them)."""
    engines, (leader, other), sampling, (fast, slow) = _tp_pair(seed=10)
    try:
        other.start("c0", ROWS, sampling, slow)
        time.sleep(0.05)
        assert engines[1].added == []  # not before the leader's word
        leader.start("c0", ROWS, sampling, fast)
        for e in engines:  # the first turns sample 3 of their 10 tokens, then the weights change
            e.gate.release(3)
        wait_until(lambda: engines[0].steps == engines[1].steps == 3)
        paused_other = []
        waiter = threading.Thread(target=lambda: paused_other.append(other.pause()))
        waiter.start()
        time.sleep(0.02)
        assert not paused_other  # the other pauses where the leader does, not on its own
        interrupted = leader.pause()
        waiter.join(timeout=10)
        assert paused_other == [interrupted] and interrupted == 4
        assert not engines[0].requests and not engines[1].requests  # both engines free for the weight sync
        for e in engines:
            e.weights = 1
            e.gate.release(1000)
        other.resume(1)
        other.start("c1", ROWS[1:], sampling, slow)
        time.sleep(0.02)
        leader.resume(1)
        time.sleep(0.02)
        leader.start("c1", ROWS[1:], sampling, fast)
        outs = [g.collect("c0", timeout_s=20)[0] for g in (leader, other)]
        nexts = [g.collect("c1", timeout_s=20)[0] for g in (leader, other)]
    finally:
        for g in (leader, other):
            g.close()
    assert engines[0].added == engines[1].added and engines[0].steps == engines[1].steps
    # every broadcast of a server ran on its one sharing thread (not a thread per engine iteration)
    assert [len(g.server.agreement.threads) for g in (leader, other)] == [1, 1], engines[0].steps
    mine, theirs = outs
    for key in ("response_ids", "response_masks", "token_versions", "logprobs", "prompt_ids"):
        assert getattr(mine, key) == getattr(theirs, key), key
    assert mine.token_versions == [[0] * 3 + [1] * 13] * 4  # each trajectory interrupted after 3 tokens
    assert nexts[0].response_ids == nexts[1].response_ids and nexts[0].token_versions == [[1] * 16] * 2


def test_the_leaders_pause_reaching_the_other_process_first_returns_the_same_count_there():
    engines, (leader, other), sampling, (fast, slow) = _tp_pair(seed=20)
    try:
        for g, s in ((leader, fast), (other, slow)):
            g.start("c0", ROWS, sampling, s)
        for e in engines:
            e.gate.release(2)
        wait_until(lambda: engines[0].steps == engines[1].steps == 2)
        interrupted = leader.pause()
        wait_until(lambda: other.paused)  # the other's loop paused on the word, before its own call
        assert interrupted == 4 and other.pause() == interrupted
        assert (leader.pause(), other.pause()) == (0, 0)  # paused already
        for e in engines:
            e.gate.release(1000)
        for g in (leader, other):
            g.resume(1)
        outs = [g.collect("c0", timeout_s=20)[0] for g in (leader, other)]
    finally:
        for g in (leader, other):
            g.close()
    assert outs[0].response_ids == outs[1].response_ids and engines[0].added == engines[1].added


def test_agent_rows_are_handed_over_as_their_trajectories_end_the_same_as_the_whole_chunk():
    """Streaming: a row's trajectories are handed over as soon as they all ended, each row once, and together
    they are the chunk that ``collect`` returns whole (the same seeds); a failing loop reaches the taker."""
    sampling = SamplingSettings(n=2, temperature=1.0, max_tokens=8, seed=10)
    whole = AgentChunks(ServedEngine(), max_model_len=16, tokenizer=None, version=2)
    streamed = AgentChunks(ServedEngine(), max_model_len=16, tokenizer=None, version=2)
    try:
        whole.start("c0", ROWS, sampling, SETTINGS)
        out, _ = whole.collect("c0", timeout_s=10)
        streamed.start("c0", ROWS, sampling, SETTINGS)
        rows: dict[int, object] = {}
        deadline = time.monotonic() + 10
        while len(rows) < len(ROWS) and time.monotonic() < deadline:
            taken, _ = streamed.take_groups(wait_s=1.0)
            for chunk_id, i, group in taken:
                assert chunk_id == "c0" and i not in rows
                rows[i] = group
        assert sorted(rows) == [0, 1] and not streamed.active
        for i, group in rows.items():
            assert group.response_ids == out.response_ids[2 * i:2 * i + 2]
            assert group.token_versions == out.token_versions[2 * i:2 * i + 2] == [[2] * 8] * 2
            assert group.logprobs == out.logprobs[2 * i:2 * i + 2]
        streamed.start("bad", [{"index": 0}], SamplingSettings(n=1, temperature=1.0, max_tokens=8), SETTINGS)
        with pytest.raises(RuntimeError, match="'two_turn_test_agent' failed on row 0"):
            streamed.take_groups(wait_s=10)
    finally:
        whole.close()
        streamed.close()
