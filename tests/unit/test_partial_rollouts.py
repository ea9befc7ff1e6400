"""Partial rollouts (grpo_dist/rollout/partial.py) on a stand-in engine whose every iteration samples one
token per running request: a token's value and log-prob say which weights sampled it, so the tests can
check each token's version against the weights loaded while it was drawn. The real vLLM engine runs the
same checks in tests/e2e/test_rollout_vllm.py."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from grpo_dist.rollout.base import SamplingSettings
from grpo_dist.core.diagnostics import off_policy_metrics, partial_metrics
from grpo_dist.rollout.partial import PartialRollouts, continuation_seed


class SteppedEngine:
    """One token per running request per ``step_deltas``; token = 100 * weights + position in the response
    (no EOS), log-prob = -(weights + 1). ``gate`` (when set) lets the test release iterations one by one:
    without a permit an iteration samples nothing."""

    def __init__(self, gate: threading.Semaphore | None = None) -> None:
        self.weights = 0
        self.gate = gate
        self.requests: dict[str, dict] = {}
        self.added: list[tuple[str, list[int], SamplingSettings]] = []
        self.peak_running = 0
        self.fail_at_step: int | None = None
        self.steps = 0
        self.step_s = 0.0

    def add_request(self, request_id, prompt_ids, sampling, *, deltas=False):
        assert deltas and sampling.n == 1
        self.added.append((request_id, list(prompt_ids), sampling))
        self.requests[request_id] = {"left": sampling.max_tokens, "done": 0, "prompt": list(prompt_ids)}

    def abort(self, request_ids):
        for rid in request_ids:
            self.requests.pop(rid, None)

    def step_deltas(self):
        time.sleep(self.step_s)
        if self.gate is not None and not self.gate.acquire(timeout=0.005):
            return []  # an iteration that sampled nothing (the caller holds the generator's lock meanwhile)
        self.steps += 1
        if self.fail_at_step == self.steps:
            raise RuntimeError("engine broke")
        self.peak_running = max(self.peak_running, len(self.requests))
        out = []
        for rid, r in list(self.requests.items()):
            position = len(r["prompt"]) + r["done"]
            r["done"] += 1
            r["left"] -= 1
            finished = r["left"] == 0
            out.append((rid, [100 * self.weights + position], [-(self.weights + 1.0)], "length" if finished else None))
            if finished:
                del self.requests[rid]
        return out


def wait_until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


SAMPLING = SamplingSettings(n=2, temperature=1.0, max_tokens=6, seed=1000)


def test_an_uninterrupted_chunk_is_prompt_major_with_the_calls_seeds_and_one_version():
    engine = SteppedEngine()
    gen = PartialRollouts(engine, version=3)
    gen.start("c", [[1, 2], [5]], SAMPLING)
    out, busy = gen.collect("c", timeout_s=10)
    gen.close()
    assert [s.seed for _, _, s in engine.added] == [1000, 1001, 1002, 1003]  # seed + i * n + j, as generate's
    assert [p for _, p, _ in engine.added] == [[1, 2], [1, 2], [5], [5]]
    assert out.response_ids == [[2, 3, 4, 5, 6, 7]] * 2 + [[1, 2, 3, 4, 5, 6]] * 2
    assert out.token_versions == [[3] * 6] * 4 and out.finished_by_eos == [False] * 4
    assert out.logprobs == [[-1.0] * 6] * 4 and busy > 0
    assert not gen.active


def test_a_caller_waiting_on_a_busy_engine_is_not_left_waiting():
    """A caller that takes the lock from the stepping thread and then waits for a chunk lets the stepping go on."""
    engine = SteppedEngine()
    engine.step_s = 0.002
    gen = PartialRollouts(engine)
    for k in range(20):
        gen.start(f"c{k}", [[1]], SamplingSettings(n=1, temperature=1.0, max_tokens=30, seed=k))
        time.sleep(0.003)  # the stepping thread is busy when collect takes the lock
        out, _ = gen.collect(f"c{k}", timeout_s=10)
        assert len(out.response_ids[0]) == 30
    gen.close()


def test_a_sync_interrupts_responses_which_the_new_weights_finish_token_by_token():
    gate = threading.Semaphore(0)
    engine = SteppedEngine(gate)
    gen = PartialRollouts(engine, version=0)
    gen.start("c", [[1, 2], [5]], SAMPLING)
    gate.release(2)  # two iterations with the old weights
    wait_until(lambda: engine.steps == 2)
    assert gen.pause() == 4  # every response was running
    assert not engine.requests  # aborted in the engine
    engine.weights = 1  # the weight sync
    gen.resume(1)
    gate.release(100)
    out, _ = gen.collect("c", timeout_s=10)
    gen.close()
    for i, (ids, lps, versions) in enumerate(zip(out.response_ids, out.logprobs, out.token_versions)):
        assert len(ids) == SAMPLING.max_tokens  # the continuation gets the tokens left, not max_tokens again
        assert versions == [0, 0, 1, 1, 1, 1]
        assert [t // 100 for t in ids] == versions  # sampled by the weights of its version
        assert lps == [-(v + 1.0) for v in versions]
    # each continuation's prompt is the prompt and the tokens so far, with a seed of its own
    continued = engine.added[4:]
    assert [p for _, p, _ in continued] == [[1, 2, 2, 3]] * 2 + [[5, 1, 2]] * 2
    assert [s.max_tokens for _, _, s in continued] == [4] * 4
    assert [s.seed for _, _, s in continued] == [continuation_seed(1000 + k, 2) for k in range(4)]
    assert len({s.seed for _, _, s in engine.added}) == 8


def test_older_chunks_run_first_and_one_chunk_s_worth_at_a_time():
    engine = SteppedEngine()
    gen = PartialRollouts(engine)
    gen.start("a", [[1], [2]], SAMPLING)  # 4 responses: the cap
    gen.start("b", [[3], [4], [6]], SAMPLING)
    a, _ = gen.collect("a", timeout_s=10)
    b, _ = gen.collect("b", timeout_s=10)
    gen.close()
    assert engine.peak_running == 4
    assert [p for _, p, _ in engine.added][:4] == [[1], [1], [2], [2]]  # a's requests went in first
    assert len(a) == 4 and len(b) == 6


def test_a_paused_generator_refuses_to_wait_and_an_engine_fault_reaches_the_caller():
    engine = SteppedEngine()
    gen = PartialRollouts(engine)
    gen.pause()
    gen.start("c", [[1]], SAMPLING)  # queued while paused: nothing runs
    assert not engine.requests
    with pytest.raises(RuntimeError, match="waits for a resume"):
        gen.collect("c", timeout_s=5)
    engine.fail_at_step = 2
    gen.resume(1)
    with pytest.raises(RuntimeError, match="background generation failed.*engine broke"):
        gen.collect("c", timeout_s=10)
    with pytest.raises(KeyError, match="no chunk 'x'"):
        gen.collect("x")
    with pytest.raises(ValueError, match="started already"):
        gen.start("c", [[1]], SAMPLING)
    gen.close()


def test_continuation_seeds_are_fresh_and_none_stays_none():
    assert continuation_seed(None, 3) is None
    seeds = {continuation_seed(s, t) for s in range(50) for t in range(1, 20)}
    assert len(seeds) == 50 * 19 and all(0 <= s < 2**31 - 1 for s in seeds)


def test_partial_metrics_by_hand():
    versions = torch.tensor([[0, 0, 1, -1],   # partial, span 1
                             [2, 2, 2, 2],    # one version
                             [0, 1, 1, 3],    # partial, span 3
                             [-1, -1, -1, -1]])  # empty: not partial
    m = partial_metrics(versions)
    assert m == {"fully_async/partial/total_partial_num": 2.0, "fully_async/partial/partial_ratio": 0.5,
                 "fully_async/partial/max_partial_span": 3.0}


def test_verls_v1_off_policy_metrics_by_hand():
    """Trained by version 4: newest versions 1, 2, 3 and (empty, its chunk started at 1) 1; oldest 0, 2, 0, 1."""
    versions = torch.tensor([[0, 0, 1, -1], [2, 2, 2, 2], [0, 1, 1, 3], [-1, -1, -1, -1]])
    m = off_policy_metrics(versions, current=4, started=1)
    spans, stale, worst = [2, 1, 4, 1], [3, 2, 1, 3], [4, 2, 4, 3]
    for name, values in (("trajectory_spans", spans), ("trajectory_staleness", stale),
                         ("trajectory_staleness_worst", worst)):
        assert m[f"training/off_policy/{name}/mean"] == sum(values) / 4
        assert (m[f"training/off_policy/{name}/max"], m[f"training/off_policy/{name}/min"]) == (max(values), min(values))
    assert len(m) == 9


class QueueAgreement:
    """The tensor-parallel agreement of two processes, in memory: the leader's words reach the other in order."""

    def __init__(self, leader: bool, words: "queue.Queue") -> None:
        self.leader, self.words = leader, words
        self.threads: set[int] = set()  # the threads the broadcasts ran on

    def share(self, decision):
        self.threads.add(threading.get_ident())
        if self.leader:
            self.words.put(decision)
            return decision
        return self.words.get(timeout=30)


def test_a_tensor_parallel_engines_processes_admit_step_and_pause_at_the_same_iterations():
    """Each process of a tensor-parallel engine runs its own scheduler: they must add, step, abort and resume the
    same requests at the same iterations, whenever the driver's calls reach each of them (in the same order on
    every process, as an actor's calls do). Here the other process gets chunk a before the leader (it waits for the
    leader's word to admit it) and chunk b after the leader admitted it (its iterations wait for it); its pause is
    called first and returns once the leader paused; both load the new weights at the pause; its resume comes
    first too. Both end with the same requests, tokens, versions and log-probs."""
    import queue

    words = queue.Queue()
    engines = [SteppedEngine(), SteppedEngine()]
    for e in engines:
        e.step_s = 0.002
    leader, other = (PartialRollouts(e, version=0, agreement=QueueAgreement(i == 0, words))
                     for i, e in enumerate(engines))
    sampling = SamplingSettings(n=2, temperature=1.0, max_tokens=200, seed=7)
    other.start("a", [[1, 2], [5]], sampling)
    time.sleep(0.05)
    assert engines[1].added == []  # not admitted: the leader has not said so
    leader.start("a", [[1, 2], [5]], sampling)
    leader.start("b", [[9]], sampling)
    wait_until(lambda: engines[0].steps >= 3)
    time.sleep(0.02)
    assert len(engines[1].added) <= 4  # b (admitted by the leader by now) waits for the other's own start of it
    other.start("b", [[9]], sampling)
    paused_other = []
    waiter = threading.Thread(target=lambda: paused_other.append(other.pause()))
    waiter.start()
    time.sleep(0.02)
    assert not paused_other  # the other process pauses where the leader does, not on its own
    interrupted = leader.pause()
    waiter.join(timeout=10)
    assert paused_other == [interrupted] and interrupted > 0
    for e in engines:
        e.weights = 1
    other.resume(1)
    time.sleep(0.02)
    leader.resume(1)
    outs = [[g.collect(c, timeout_s=20)[0] for c in ("a", "b")] for g in (leader, other)]
    for g in (leader, other):
        g.close()
    assert engines[0].added == engines[1].added and engines[0].steps == engines[1].steps
    for mine, theirs in zip(*outs):
        assert (mine.response_ids, mine.token_versions, mine.logprobs) == \
               (theirs.response_ids, theirs.token_versions, theirs.logprobs)
    versions = [v for out in outs[0] for v in out.token_versions]
    assert any(0 in v and 1 in v for v in versions)  # interrupted, finished by the new weights
    assert all(len(v) == 200 for v in versions)


def test_a_tensor_parallel_process_closes_on_the_leaders_word():
    import queue

    words = queue.Queue()
    engines = [SteppedEngine(), SteppedEngine()]
    leader, other = (PartialRollouts(e, agreement=QueueAgreement(i == 0, words)) for i, e in enumerate(engines))
    for g in (leader, other):
        g.start("a", [[1]], SAMPLING)
    assert [g.collect("a", timeout_s=10)[0].response_ids for g in (leader, other)] == [[[1, 2, 3, 4, 5, 6]] * 2] * 2
    threads = [leader._thread, other._thread]
    leader.close()
    other.close()
    assert not any(t.is_alive() for t in threads)


def test_a_pause_that_reaches_the_other_process_after_the_leaders_word_returns_the_same_count():
    """The other process's loop may pause on the leader's word before the driver's pause call reaches that
    process: its call still returns the count of that pause (and a second call, paused already, returns 0)."""
    import queue

    words = queue.Queue()
    engines = [SteppedEngine(), SteppedEngine()]
    for e in engines:
        e.step_s = 0.002
    leader, other = (PartialRollouts(e, agreement=QueueAgreement(i == 0, words)) for i, e in enumerate(engines))
    sampling = SamplingSettings(n=2, temperature=1.0, max_tokens=200, seed=3)
    for g in (leader, other):
        g.start("a", [[1, 2], [5]], sampling)
    wait_until(lambda: engines[1].steps >= 3)
    interrupted = leader.pause()
    wait_until(lambda: other.paused)  # the other's loop paused on the word, before its own call
    assert interrupted == 4 and other.pause() == interrupted
    assert (leader.pause(), other.pause()) == (0, 0)
    for g in (leader, other):
        g.resume(1)
    outs = [g.collect("a", timeout_s=20)[0] for g in (leader, other)]
    for g in (leader, other):
        g.close()
    assert outs[0].response_ids == outs[1].response_ids


def test_an_agreed_pause_hands_its_count_to_the_first_call_only():
    from grpo_dist.rollout.partial import AgreedPause

    p = AgreedPause()
    assert p.claim() == 0  # no pause yet
    p.paused(4)
    assert (p.claim(), p.claim()) == (4, 0)
    p.paused(2)
    p.resumed()  # resumed before this process's call came: that call finds the engine running, not paused
    assert p.claim() == 0


def test_groups_are_handed_over_as_they_finish_whatever_their_chunk():
    """Streaming (fully asynchronous training with partial rollouts): a short chunk started after a long one hands
    its groups over first; each group is the chunk's rows of that prompt, handed over once; a chunk whose groups
    are all taken is forgotten; a named group is waited for."""
    gate = threading.Semaphore(0)
    engine = SteppedEngine(gate=gate)
    gen = PartialRollouts(engine, max_running=8)
    try:
        gen.start("long", [[1], [2]], SamplingSettings(n=2, temperature=1.0, max_tokens=12, seed=1))
        gen.start("short", [[3], [4]], SamplingSettings(n=2, temperature=1.0, max_tokens=3, seed=2))
        gate.release(3)  # three iterations: the short chunk's responses end, the long ones have 3 of 12 tokens
        wait_until(lambda: engine.steps == 3)
        first, busy_s = gen.take_groups(wait_s=10)
        assert [(c, i) for c, i, _ in first] == [("short", 0), ("short", 1)] and busy_s > 0
        assert [out.response_ids for _, _, out in first] == [[[1, 2, 3]] * 2] * 2  # (token: position after the prompt)
        assert all(out.token_versions == [[0, 0, 0]] * 2 for _, _, out in first)
        assert gen.take_groups(wait_s=0)[0] == []  # the long chunk is not done: nothing waits
        gate.release(1000)
        named, _ = gen.take_groups([("long", 1)])  # waits for it
        assert [(c, i) for c, i, _ in named] == [("long", 1)] and named[0][2].response_ids == [list(range(1, 13))] * 2
        assert gen.active
        rest, _ = gen.take_groups(wait_s=10)
        assert [(c, i) for c, i, _ in rest] == [("long", 0)] and not gen.active
    finally:
        gen.close()
