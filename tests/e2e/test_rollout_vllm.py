"""The real vLLM engine (CPU build) against the Hugging Face model it serves.

One engine is started for the whole module (in-process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set
before vLLM is imported) and is never restarted, weight sync included. The model is a tiny random
Qwen2 built into a temporary directory.
"""

from __future__ import annotations

import dataclasses

import math
import os

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # before anything imports vllm

import pytest
import torch

pytest.importorskip("vllm")

from grpo_dist.rollout import SamplingSettings, make_engine  # noqa: E402
from grpo_dist.utils.tiny_model import build_tiny_model  # noqa: E402

pytestmark = pytest.mark.slow

EOS_IDS = {1, 3}  # <|endoftext|>, <|im_end|> (generation_config.eos_token_id)
MAX_MODEL_LEN = 512
# One prompt longer than a KV block (128 tokens on CPU), so the prefix cache holds blocks of it.
LONG_PROMPT = [2] + [4 + (7 * i) % 100 for i in range(150)]
PROMPTS = [[2, 34, 32, 18, 31, 100], [2, 5, 6, 7, 8], [2, 50, 60, 70, 80, 90, 11, 12], LONG_PROMPT]


def _register_test_agent() -> None:
    """``tp_partial_test_agent``: a model turn of up to 40 tokens, a tool's 2 tokens (mask 0), a turn of up to 8."""
    from grpo_dist.agents.base import register
    from tests.unit.test_agent_chunks import LongTurnLoop

    @register("tp_partial_test_agent")
    class ToolTurnLoop(LongTurnLoop):
        budgets, tool_tokens, tool_s = (40, 8), [5, 6], 0.01


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("rollout") / "model", seed=0)


@pytest.fixture(scope="module")
def vllm_engine(model_dir):
    engine = make_engine(
        "vllm",
        model_path=model_dir,
        dtype="float32",
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=64,
        seed=0,
        kv_cache_gib=0.25,
    )
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def hf_engine(model_dir):
    return make_engine("hf", model_path=model_dir, dtype="float32", device="cpu", seed=0)


def _hf_logits(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    """``[T, V]`` logits that predict each response token (teacher forcing)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0].float()
    return logits[len(prompt) - 1 : len(prompt) + len(response) - 1]


def _processed_logprobs(
    logits_TV: torch.Tensor, tokens: list[int], temperature: float, top_k: int
) -> list[float]:
    """log_softmax(top_k(logits / T)) at ``tokens``: the distribution vLLM samples from."""
    scaled = logits_TV / temperature
    if top_k > 0:
        kth = scaled.topk(top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    logp = scaled.log_softmax(-1)
    return logp.gather(-1, torch.tensor(tokens).unsqueeze(-1)).squeeze(-1).tolist()


def _check_response_shape(out, n_prompts: int, n: int, max_tokens: int) -> None:
    assert len(out.response_ids) == n_prompts * n
    for ids, lps, eos in zip(out.response_ids, out.logprobs, out.finished_by_eos):
        assert 1 <= len(ids) <= max_tokens and len(lps) == len(ids)
        assert all(math.isfinite(x) and x <= 1e-6 for x in lps)
        # EOS ends a response and is kept in it; a response without EOS ran to max_tokens.
        assert not (set(ids[:-1]) & EOS_IDS)
        assert eos == (ids[-1] in EOS_IDS)
        if not eos:
            assert len(ids) == max_tokens

def test_one_rank_cpu_engine_shares_the_world_process_group(vllm_engine):
    """vLLM's per-dimension process groups of a one-rank CPU engine are the world group itself: one
    gloo event-loop thread instead of one per group (each wakes 100 times a second beside the model
    worker's compute threads), and generation still works (the tests below). First in the module:
    a test below closes another engine of this process, which ends the process's world group."""
    import torch.distributed as dist
    from vllm.distributed import parallel_state as ps

    assert dist.is_initialized() and dist.get_world_size() == 1
    groups = [ps.get_tp_group(), ps.get_pp_group(), ps.get_world_group()]
    assert all(g.cpu_group is dist.group.WORLD and g.device_group is dist.group.WORLD for g in groups)


def test_cpu_engine_counts_token_ranks_without_torch_compile(vllm_engine):
    """The sampler's rank count (which grpo_dist never reads) runs eagerly on the CPU: the first
    generation with log-probs compiles no inductor kernel (1-2 s warm, 10-15 s with a cold cache)."""
    from vllm.v1.sample import sampler

    fn = sampler.batched_count_greater_than
    assert not hasattr(fn, "_torchdynamo_orig_callable")
    x, v = torch.tensor([[0.1, 0.5, 0.3], [0.2, 0.2, 0.9]]), torch.tensor([[0.3], [0.2]])
    assert fn(x, v).tolist() == [2, 3]


def test_vllm_generate_is_prompt_major_stops_on_eos_and_returns_sampling_logprobs(
    vllm_engine, hf_engine
):
    prompts, n, max_tokens = PROMPTS[:3], 8, 24
    out = vllm_engine.generate(prompts, SamplingSettings(n=n, temperature=1.0, max_tokens=max_tokens, seed=7))
    _check_response_shape(out, len(prompts), n, max_tokens)
    assert any(out.finished_by_eos) and not all(out.finished_by_eos)
    assert len({tuple(r) for r in out.response_ids[:n]}) > 1  # n samples, not n copies

    # Row i*n + j belongs to prompt i: its log-probs are the model's under prompt i (and not
    # under the next prompt). temperature 1, no top-k/top-p: processed == raw log-probs.
    model = hf_engine.model
    for row, (ids, lps) in enumerate(zip(out.response_ids, out.logprobs)):
        prompt = prompts[row // n]
        expected = _hf_logits(model, prompt, ids).log_softmax(-1)
        expected = expected.gather(-1, torch.tensor(ids).unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(torch.tensor(lps), expected, atol=1e-4, rtol=0)
        other = prompts[(row // n + 1) % len(prompts)]
        wrong = _hf_logits(model, other, ids).log_softmax(-1)[0, ids[0]].item()
        assert abs(wrong - lps[0]) > 1e-3

    # The same seed gives the same samples.
    again = vllm_engine.generate(prompts, SamplingSettings(n=n, temperature=1.0, max_tokens=max_tokens, seed=7))
    assert again.response_ids == out.response_ids

    # rollout.ignore_eos: every response runs to max_tokens, past its EOS token
    long = vllm_engine.generate(prompts, SamplingSettings(n=n, temperature=1.0, max_tokens=max_tokens, seed=7,
                                                          ignore_eos=True))
    assert all(len(r) == max_tokens for r in long.response_ids) and not any(long.finished_by_eos)
    eos = set(hf_engine.eos_token_ids)
    assert any(set(r[:-1]) & eos for r in long.response_ids)  # some responses go on after an EOS token


@pytest.mark.parametrize("engine_name", ["vllm", "hf"])
def test_logprobs_are_of_the_processed_distribution(engine_name, vllm_engine, hf_engine):
    engine = vllm_engine if engine_name == "vllm" else hf_engine
    temperature, top_k, n, max_tokens = 0.7, 10, 4, 12
    sampling = SamplingSettings(n=n, temperature=temperature, top_k=top_k, max_tokens=max_tokens, seed=3)
    prompts = PROMPTS[:2]
    out = engine.generate(prompts, sampling)
    _check_response_shape(out, len(prompts), n, max_tokens)
    max_raw_gap = 0.0
    for row, (ids, lps) in enumerate(zip(out.response_ids, out.logprobs)):
        logits = _hf_logits(hf_engine.model, prompts[row // n], ids)
        expected = _processed_logprobs(logits, ids, temperature, top_k)
        torch.testing.assert_close(torch.tensor(lps), torch.tensor(expected), atol=1e-4, rtol=0)
        raw = _processed_logprobs(logits, ids, 1.0, 0)
        max_raw_gap = max(max_raw_gap, max(abs(a - b) for a, b in zip(lps, raw)))
    assert max_raw_gap > 1e-2  # the raw log-probs are a different thing

    # A seed makes the call reproducible; another seed gives other samples.
    assert engine.generate(prompts, sampling).response_ids == out.response_ids
    # Asking for no log-probs (the trainer's default) leaves the samples as they were.
    bare = engine.generate(prompts, dataclasses.replace(sampling, logprobs=False))
    assert bare.logprobs is None
    assert bare.response_ids == out.response_ids and bare.finished_by_eos == out.finished_by_eos
    reseeded = SamplingSettings(n=n, temperature=temperature, top_k=top_k, max_tokens=max_tokens, seed=4)
    assert engine.generate(prompts, reseeded).response_ids != out.response_ids


def test_hf_greedy_equals_vllm_greedy_token_for_token(vllm_engine, hf_engine):
    greedy = SamplingSettings.greedy(max_tokens=32)
    v = vllm_engine.generate(PROMPTS, greedy)
    h = hf_engine.generate(PROMPTS, greedy)
    assert v.response_ids == h.response_ids
    assert v.finished_by_eos == h.finished_by_eos
    for a, b in zip(v.logprobs, h.logprobs):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-4, rtol=0)


def test_weight_sync_updates_the_running_engine_in_place(vllm_engine, hf_engine, model_dir):
    from transformers import AutoModelForCausalLM

    trainer_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    original = {k: v.clone() for k, v in trainer_model.state_dict().items()}
    llm_before = vllm_engine._llm
    prompt, response = LONG_PROMPT, [40, 41, 42, 43, 44, 45, 3]

    before = vllm_engine.compute_logprobs([prompt], [response])[0]
    trainer_before = _hf_logits(trainer_model, prompt, response).log_softmax(-1)
    trainer_before = trainer_before.gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(torch.tensor(before), trainer_before, atol=1e-4, rtol=0)
    greedy = SamplingSettings.greedy(max_tokens=16)
    vllm_engine.generate([prompt], greedy)  # puts the long prompt's KV blocks in the prefix cache

    # A few optimizer steps raise the likelihood of `response`: a real policy update.
    optim = torch.optim.AdamW(trainer_model.parameters(), lr=1e-2)
    for _ in range(3):
        logits = trainer_model(torch.tensor([prompt + response])).logits[0]
        logp = logits[len(prompt) - 1 : -1].log_softmax(-1)
        loss = -logp.gather(-1, torch.tensor(response).unsqueeze(-1)).mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
    trainer_model.eval()

    try:
        vllm_engine.update_weights(trainer_model.state_dict().items())
        hf_engine.update_weights(trainer_model.state_dict().items())

        after = vllm_engine.compute_logprobs([prompt], [response])[0]
        trainer_after = _hf_logits(trainer_model, prompt, response).log_softmax(-1)
        trainer_after = trainer_after.gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(torch.tensor(after), trainer_after, atol=1e-4, rtol=0)
        assert max(abs(a - b) for a, b in zip(after, before)) > 0.1
        assert sum(after) > sum(before)  # the update made the response more likely

        # Generation uses the new weights too (no stale prefix-cache blocks), and agrees with the
        # HF engine that received the same weights.
        v = vllm_engine.generate([prompt, PROMPTS[0]], greedy)
        h = hf_engine.generate([prompt, PROMPTS[0]], greedy)
        assert v.response_ids == h.response_ids
        assert vllm_engine._llm is llm_before  # same engine: no restart
    finally:
        vllm_engine.update_weights(original.items())
        hf_engine.update_weights(original.items())

    restored = vllm_engine.compute_logprobs([prompt], [response])[0]
    torch.testing.assert_close(torch.tensor(restored), torch.tensor(before), atol=1e-5, rtol=0)


def test_hf_engine_update_weights_rejects_unknown_names(hf_engine):
    with pytest.raises(ValueError, match="names the model does not have"):
        hf_engine.update_weights([("model.not_a_layer.weight", torch.zeros(2))])


# ---------------------------------------------------------------- the asynchronous rollout server
# (before the tests that build and close engines of their own in this process: closing one ends vLLM's
# process-wide parallel state, which the module's engine needs)


def _served(server, requests):
    """Run ``(request_id, prompt_ids, sampling_params)`` requests concurrently on ``server``."""
    import asyncio

    async def all_of():
        return await asyncio.gather(*(server.generate(rid, prompt_ids=p, sampling_params=sp)
                                      for rid, p, sp in requests))

    return asyncio.run(all_of())


def test_async_server_samples_what_the_sync_engine_samples(vllm_engine):
    """Single-turn GRPO through the server: trajectory j of prompt i, seeded with the seed the synchronous
    call gives it (``seed + i * n + j``), has the same tokens and log-probs, and the requests run in one
    continuous batch."""
    from grpo_dist.rollout.async_server import AsyncRolloutServer

    engine = vllm_engine
    n, seed, prompts = 3, 1234, PROMPTS[:3]
    sampling = SamplingSettings(n=n, temperature=1.0, max_tokens=12, seed=seed)
    sync = engine.generate(prompts, sampling)
    server = AsyncRolloutServer(engine, max_model_len=MAX_MODEL_LEN)
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True, "max_tokens": 12}
    outs = _served(server, [(f"r{i}-{j}", p, {**params, "seed": seed + i * n + j})
                            for i, p in enumerate(prompts) for j in range(n)])
    assert [o.token_ids for o in outs] == sync.response_ids
    for o, lps, eos in zip(outs, sync.logprobs, sync.finished_by_eos):
        torch.testing.assert_close(torch.tensor(o.log_probs), torch.tensor(lps), atol=1e-5, rtol=0)
        assert (o.stop_reason == "stop") == eos
    assert server.requests == len(prompts) * n
    assert server.stepping and server.peak_concurrency == len(prompts) * n
    assert not _served(server, [])  # an idle server is fine


def test_async_server_on_the_hf_engine_answers_one_request_at_a_time(hf_engine):
    """The Hugging Face engine has no request-level API (and one random stream per call, so its seeded samples
    depend on the batch): the server answers each request alone; greedy answers equal its own greedy call."""
    from grpo_dist.rollout.async_server import AsyncRolloutServer

    server = AsyncRolloutServer(hf_engine, max_model_len=MAX_MODEL_LEN)
    outs = _served(server, [(f"g{i}", p, {"temperature": 0.0, "max_tokens": 6}) for i, p in enumerate(PROMPTS[:3])])
    greedy = hf_engine.generate(PROMPTS[:3], SamplingSettings.greedy(6))
    assert [o.token_ids for o in outs] == greedy.response_ids
    assert not server.stepping and server.peak_concurrency == 1


def test_async_server_lets_a_later_turn_join_the_running_batch(vllm_engine):
    """A request sent while another decodes is answered before the long one finishes (continuous batching,
    not one batch after another), and a greedy request equals the engine's own greedy answer."""
    import asyncio

    from grpo_dist.rollout.async_server import AsyncRolloutServer

    server = AsyncRolloutServer(vllm_engine, max_model_len=MAX_MODEL_LEN)
    order = []

    async def long_one():
        out = await server.generate("long", prompt_ids=PROMPTS[0], sampling_params={
            "temperature": 1.0, "seed": 7, "max_tokens": 40, "logprobs": False})
        order.append("long")
        return out

    async def short_turns():
        outs = []
        for turn in range(3):  # three turns of one trajectory, each sent after the previous answer
            outs.append(await server.generate(f"short-{turn}", prompt_ids=PROMPTS[1], sampling_params={
                "temperature": 0.0, "max_tokens": 2}))
            order.append(f"short-{turn}")
        return outs

    async def both():
        return await asyncio.gather(long_one(), short_turns())

    long_out, shorts = asyncio.run(both())
    greedy = vllm_engine.generate([PROMPTS[1]], SamplingSettings.greedy(2))
    assert all(o.token_ids == greedy.response_ids[0] for o in shorts)
    if len(long_out.token_ids) == 40:  # the long request really decoded 40 steps
        assert order[-1] == "long", order
    with pytest.raises(ValueError, match="not supported by the rollout server"):
        _served(server, [("x", PROMPTS[1], {"repetition_penalty": 1.3})])


def test_partial_rollouts_keep_each_tokens_version_and_log_prob(vllm_engine, model_dir):
    """Partial rollouts on the real engine: a chunk no sync interrupts samples exactly what ``generate``
    samples; a chunk paused mid-way, given new weights and resumed holds tokens of both versions, and each
    token's log-prob is its own version's (the old weights' before the pause, the new weights' after,
    the prefix recomputed with the new weights)."""
    import time

    from transformers import AutoModelForCausalLM

    from grpo_dist.rollout.partial import PartialRollouts

    engine = vllm_engine
    prompts = PROMPTS[:3]
    sampling = SamplingSettings(n=2, temperature=1.0, max_tokens=12, seed=77)
    gen = PartialRollouts(engine, version=0)
    try:
        gen.start("whole", prompts, sampling)
        whole, _ = gen.collect("whole", timeout_s=120)
        direct = engine.generate(prompts, sampling)
        assert whole.response_ids == direct.response_ids and whole.finished_by_eos == direct.finished_by_eos
        torch.testing.assert_close([torch.tensor(x) for x in whole.logprobs], [torch.tensor(x) for x in direct.logprobs],
                                   atol=1e-5, rtol=0)
        assert all(set(v) == {0} for v in whole.token_versions)

        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        original = {k: v.clone() for k, v in model.state_dict().items()}
        torch.manual_seed(0)
        new = {k: v + 0.05 * torch.randn_like(v) if v.dim() == 2 else v for k, v in original.items()}
        for attempt in range(5):  # a pause that lands after every response ended interrupts nothing: again
            cut_id = f"cut{attempt}"
            gen.start(cut_id, prompts, SamplingSettings(n=2, temperature=1.0, max_tokens=200, seed=78 + attempt))
            chunk = gen._chunks[cut_id]
            deadline = time.monotonic() + 60
            while not any(r.finish_reason is None and len(r.tokens) >= 3 for r in chunk.responses):
                assert time.monotonic() < deadline
                time.sleep(0.001)
            if gen.pause() > 0:
                break
            gen.resume(0)
            gen.collect(cut_id, timeout_s=120)
        else:
            pytest.fail("five pauses in a row interrupted nothing")
        try:
            engine.update_weights(new.items())
            gen.resume(1)
            cut, _ = gen.collect(cut_id, timeout_s=300)
            partial = [i for i, v in enumerate(cut.token_versions) if v and v[0] == 0 and v[-1] == 1]
            assert partial, cut.token_versions
            for i in partial:
                ids, lps, versions = cut.response_ids[i], cut.logprobs[i], cut.token_versions[i]
                k = versions.index(1)
                assert versions == [0] * k + [1] * (len(ids) - k)
                prompt = prompts[i // 2]
                under_new = engine.compute_logprobs([prompt], [ids])[0]
                torch.testing.assert_close(torch.tensor(lps[k:]), torch.tensor(under_new[k:]), atol=1e-4, rtol=0)
                assert max(abs(a - b) for a, b in zip(lps[:k], under_new[:k])) > 1e-3  # the old weights' differ
            engine.update_weights(original.items())
            for i in partial:
                ids, lps, k = cut.response_ids[i], cut.logprobs[i], cut.token_versions[i].index(1)
                under_old = engine.compute_logprobs([prompts[i // 2]], [ids])[0]
                torch.testing.assert_close(torch.tensor(lps[:k]), torch.tensor(under_old[:k]), atol=1e-4, rtol=0)
        finally:
            engine.update_weights(original.items())
    finally:
        gen.close()


def test_interruptible_server_keeps_each_tokens_version_and_log_prob(vllm_engine, model_dir):
    """Partial rollouts through the asynchronous server (agent loops): uninterrupted, an interruptible server
    samples what the plain one samples; paused mid-request, given new weights and resumed, a request's answer
    holds tokens of both versions, each token's log-prob its own version's (the prefix recomputed)."""
    import asyncio

    from transformers import AutoModelForCausalLM

    from grpo_dist.rollout.async_server import AsyncRolloutServer

    engine = vllm_engine
    params = {"temperature": 1.0, "logprobs": True, "max_tokens": 12}
    plain = _served(AsyncRolloutServer(engine, max_model_len=MAX_MODEL_LEN),
                    [(f"p{i}", p, {**params, "seed": 5 + i}) for i, p in enumerate(PROMPTS[:3])])
    server = AsyncRolloutServer(engine, max_model_len=MAX_MODEL_LEN, interruptible=True)
    same = _served(server, [(f"i{i}", p, {**params, "seed": 5 + i}) for i, p in enumerate(PROMPTS[:3])])
    assert [o.token_ids for o in same] == [o.token_ids for o in plain]
    torch.testing.assert_close([torch.tensor(o.log_probs) for o in same], [torch.tensor(o.log_probs) for o in plain],
                               atol=1e-5, rtol=0)
    assert all(o.versions == [0] * len(o.token_ids) for o in same)

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(1)
    new = {k: v + 0.05 * torch.randn_like(v) if v.dim() == 2 else v for k, v in original.items()}

    async def interrupted(attempt: int):
        tasks = [asyncio.ensure_future(server.generate(f"c{attempt}-{i}", prompt_ids=p,
                                                       sampling_params={**params, "max_tokens": 200, "seed": 90 + i}))
                 for i, p in enumerate(PROMPTS[:3])]
        while not any(len(r.tokens) >= 3 for r in server._unanswered.values()):
            assert not all(t.done() for t in tasks)
            await asyncio.sleep(0)
        count = server.pause()
        if count:
            engine.update_weights(new.items())
        server.resume(1 if count else None)
        return count, await asyncio.gather(*tasks)

    try:
        for attempt in range(5):  # a pause after every request ended interrupts nothing: again
            count, outs = asyncio.run(interrupted(attempt))
            if count:
                break
        else:
            pytest.fail("five pauses in a row interrupted nothing")
        cut = [(i, o) for i, o in enumerate(outs) if o.versions and o.versions[0] == 0 and o.versions[-1] == 1]
        assert cut, [o.versions for o in outs]
        for i, o in cut:
            k = o.versions.index(1)
            assert o.versions == [0] * k + [1] * (len(o.token_ids) - k)
            under_new = engine.compute_logprobs([PROMPTS[i]], [o.token_ids])[0]
            torch.testing.assert_close(torch.tensor(o.log_probs[k:]), torch.tensor(under_new[k:]), atol=1e-4, rtol=0)
        engine.update_weights(original.items())
        for i, o in cut:
            k = o.versions.index(1)
            under_old = engine.compute_logprobs([PROMPTS[i]], [o.token_ids])[0]
            torch.testing.assert_close(torch.tensor(o.log_probs[:k]), torch.tensor(under_old[:k]), atol=1e-4, rtol=0)
    finally:
        engine.update_weights(original.items())


def test_seeded_sampling_of_a_batch_larger_than_one_engine_step(model_dir):
    """More prompt tokens than one scheduler step takes, each request seeded: no chunked-prefill
    generator rewind on CPU ("CPU Generator does not use offset"), and the call is reproducible."""
    engine = make_engine("vllm", model_path=model_dir, dtype="float32", max_model_len=MAX_MODEL_LEN,
                         max_num_seqs=64, max_num_batched_tokens=MAX_MODEL_LEN, seed=0, kv_cache_gib=0.25)
    try:
        prompt = list(range(10, 40))
        prompts = [prompt[: 20 + i % 10] for i in range(24)]  # ~590 prompt tokens, budget MAX_MODEL_LEN
        s = SamplingSettings(n=2, temperature=1.0, max_tokens=4, seed=7)
        a = engine.generate(prompts, s)
        b = engine.generate(prompts, s)
    finally:
        engine.close()
    assert len(a.response_ids) == 2 * len(prompts)
    assert a.response_ids == b.response_ids


def _tied_model(model_dir, out):
    """The module's tiny model with tied input and output embeddings (as SmolLM2 and Qwen2.5's small models)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.config.tie_word_embeddings = True
    model.tie_weights()
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
    return out


def _adapted(base_dir, seed: int):
    """A rank-8 LoRA policy on every linear layer but the output, its adapters random (B nonzero)."""
    from tests.adapters import random_adapter

    return random_adapter(base_dir, seed, rank=8, alpha=16, scale=0.3)


def _logprobs(model, prompt, response) -> torch.Tensor:
    return _hf_logits(model, prompt, response).log_softmax(-1).gather(-1, torch.tensor(response)[:, None])[:, 0]


def test_lora_weight_sync_both_modes_on_tied_embeddings(model_dir, tmp_path):
    """The two LoRA weight syncs into one engine built for adapters (tied embeddings): the merged weights
    (``lora.merge=true``) and the adapter alone (``merge=false``, served through vLLM's LoRA, a new adapter id
    per version). After each, the engine's log-probs of fixed tokens equal the peft policy's, and sampling
    follows the adapter; the Hugging Face engine's adapter mode agrees."""
    from grpo_dist.training.lora import merge_sources, merged_weight

    base = _tied_model(model_dir, tmp_path / "tied")
    prompt, response = PROMPTS[2], [40, 41, 42, 43, 44, 45, 3]
    engine = make_engine("vllm", model_path=base, dtype="float32", max_model_len=MAX_MODEL_LEN, max_num_seqs=16,
                         seed=0, kv_cache_gib=0.25, max_lora_rank=8)
    hf = make_engine("hf", model_path=base, dtype="float32", device="cpu", seed=0)
    try:
        base_lp = torch.tensor(engine.compute_logprobs([prompt], [response])[0])
        v1, tensors1, config = _adapted(base, seed=1)
        torch.testing.assert_close(base_lp, _logprobs(_plain(base), prompt, response),
                                   atol=1e-4, rtol=0)
        # merge=true: whole merged weights under the base model's names
        state = v1.state_dict()
        merged = {name: merged_weight(src, state) for name, src in merge_sources(v1, list(state)).items()}
        engine.update_weights(merged.items())
        want1 = _logprobs(v1, prompt, response)
        torch.testing.assert_close(torch.tensor(engine.compute_logprobs([prompt], [response])[0]), want1,
                                   atol=1e-4, rtol=0)
        assert (want1 - base_lp).abs().max() > 0.05  # the adapter changes the policy
        engine.update_weights(_plain(base).state_dict().items())  # back to the base weights

        # merge=false: the adapter alone, version after version
        engine.load_adapter(tensors1.items(), config)
        hf.load_adapter(tensors1.items(), config)
        torch.testing.assert_close(torch.tensor(engine.compute_logprobs([prompt], [response])[0]), want1,
                                   atol=1e-4, rtol=0)
        greedy = SamplingSettings.greedy(max_tokens=12)
        assert engine.generate([prompt], greedy).response_ids == hf.generate([prompt], greedy).response_ids
        v2, tensors2, _ = _adapted(base, seed=2)
        engine.load_adapter(tensors2.items(), config)
        torch.testing.assert_close(torch.tensor(engine.compute_logprobs([prompt], [response])[0]),
                                   _logprobs(v2, prompt, response), atol=1e-4, rtol=0)
        assert engine._llm.llm_engine.list_loras() == {2}  # the first version was removed
        sampled = engine.generate([prompt], SamplingSettings(n=2, temperature=1.0, max_tokens=8, seed=3))
        for ids, lps in zip(sampled.response_ids, sampled.logprobs):
            torch.testing.assert_close(torch.tensor(lps), _logprobs(v2, prompt, ids), atol=1e-4, rtol=0)
        hf.load_adapter(tensors2.items(), config)
        assert engine.generate([prompt], greedy).response_ids == hf.generate([prompt], greedy).response_ids
    finally:
        engine.close()
        hf.close()


def _plain(base_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()


def test_hf_engine_sleep_refuses_generate_until_wake_up_and_keeps_the_weights(hf_engine):
    greedy = SamplingSettings.greedy(max_tokens=8)
    before = hf_engine.generate(PROMPTS[:2], greedy)
    weights = {k: v.clone() for k, v in hf_engine.model.state_dict().items()}
    hf_engine.sleep()
    with pytest.raises(RuntimeError, match="asleep"):
        hf_engine.generate(PROMPTS[:2], greedy)
    hf_engine.wake_up()
    assert hf_engine.generate(PROMPTS[:2], greedy).response_ids == before.response_ids
    for k, v in hf_engine.model.state_dict().items():
        assert torch.equal(v, weights[k]), k


# ------------------------------------------------------------------------------ tensor parallelism
SHARDED = {"model.layers.0.self_attn.qkv_proj": "output", "model.layers.0.self_attn.o_proj": "input",
           "model.layers.0.mlp.down_proj": "input"}
"""Layers split over a tensor-parallel group, and along which side (column-parallel: output rows;
row-parallel: input columns)."""


def _held_by_this_rank(worker) -> dict:
    """Run in the engine's worker (``collective_rpc``): its tensor-parallel rank and group size, and, for
    each layer of :data:`SHARDED`, (the part of the split dimension this process holds, the whole). The
    CPU build packs the weights into its GEMM kernel's format, so the layer's own record of its partition
    is read rather than the tensor."""
    from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

    model = worker.model_runner.get_model()
    held = {}
    for name, side in SHARDED.items():
        layer = model.get_submodule(name)
        held[name] = (getattr(layer, f"{side}_size_per_partition"), getattr(layer, f"{side}_size"), layer.tp_rank)
    return {"rank": get_tensor_model_parallel_rank(), "size": get_tensor_model_parallel_world_size(), **held}


def _tp_engine_run(model_dir, tp, tp_rank, port):
    """One process of a vLLM engine (``tp`` processes in all): greedy and seeded sampling, then a weight
    sync with full tensors (the trainer's state dict, perturbed) and the same again."""
    torch.set_num_threads(1)
    from safetensors.torch import load_file

    extra = dict(tensor_parallel_size=tp, tp_rank=tp_rank, tp_master=("127.0.0.1", port)) if tp > 1 else {}
    engine = make_engine("vllm", model_path=model_dir, dtype="float32", max_model_len=MAX_MODEL_LEN, max_num_seqs=16,
                         seed=0, kv_cache_gib=0.125, **extra)
    sampled = SamplingSettings(n=2, temperature=1.0, max_tokens=12, seed=11)
    greedy = dataclasses.replace(SamplingSettings.greedy(max_tokens=12), logprobs=True)
    out = {"before": [engine.generate(PROMPTS, s) for s in (greedy, sampled)]}
    out["held_before"] = engine._llm.collective_rpc(_held_by_this_rank)
    out["engine_tp"] = engine._llm.llm_engine.vllm_config.parallel_config.tensor_parallel_size
    g = torch.Generator().manual_seed(1)
    state = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in load_file(str(model_dir / "model.safetensors")).items()}
    engine.update_weights(state.items())
    out["after"] = [engine.generate(PROMPTS, s) for s in (greedy, sampled)]
    out["held_after"] = engine._llm.collective_rpc(_held_by_this_rank)
    engine.close()
    return out


def test_tensor_parallel_engine_over_two_processes_matches_one(tmp_path):
    """``tensor_model_parallel_size=2``: two processes hold one engine (vLLM's external launcher over gloo
    on CPU; NCCL on GPU, same code), each given the same prompts and, at the weight sync, the same full
    tensors (vLLM's loaders cut each process's shard). Both return what a one-process engine returns:
    the same tokens, and log-probs equal to float rounding, before and after the sync. Equal outputs
    alone would also pass for an engine that silently ran on one rank: the engine reports a group of 2,
    and each process holds only its half of the split layers (qkv_proj's rows, o_proj's and down_proj's
    columns) as its own rank, before and after the sync."""
    from grpo_dist.distributed.process_group import free_port
    from tests.e2e.call_in_process import call_in_processes

    model = build_tiny_model(tmp_path / "model2h", seed=0, hidden_size=128, num_heads=2, num_kv_heads=2)
    port = free_port("127.0.0.1")
    which = ((1, 0), (2, 0), (2, 1))
    outs = call_in_processes([(_tp_engine_run, (model, tp, r, port)) for tp, r in which], tmp_path / "calls")
    results = dict(zip(which, outs))
    one = results[(1, 0)]
    for rank in (0, 1):
        two = results[(2, rank)]
        for phase in ("before", "after"):
            for a, b in zip(one[phase], two[phase]):
                assert a.response_ids == b.response_ids, (phase, rank)
                for la, lb in zip(a.logprobs, b.logprobs):
                    torch.testing.assert_close(torch.tensor(la), torch.tensor(lb), atol=1e-4, rtol=0)
        # the engine really runs over two ranks, each holding its half of the split layers, not a full copy
        assert two["engine_tp"] == 2 and one["engine_tp"] == 1
        for phase in ("held_before", "held_after"):
            (held,) = two[phase]  # this process's worker only (vLLM's external launcher)
            assert (held["rank"], held["size"]) == (rank, 2), held
            for name in SHARDED:
                part, whole, layer_rank = held[name]
                assert (2 * part, layer_rank) == (whole, rank), (name, held[name])
    (alone,) = one["held_before"]
    assert alone["size"] == 1 and all(alone[n][0] == alone[n][1] for n in SHARDED), alone
    assert one["before"][0].response_ids != one["after"][0].response_ids  # the sync changed the policy



def _tp_partial_run(model_dir, tp_rank, port):
    """One process of a two-process engine: partial rollouts through the engine's calls (a chunk generated in the
    background), then through agent loops (trajectories of a model turn, a tool's tokens and another turn, in lock
    step); each paused mid-way by the leader's timing, given new weights and resumed. Then a plain call on the
    same engine."""
    import time

    torch.set_num_threads(1)
    from safetensors.torch import load_file

    from grpo_dist.agents.chunks import AgentChunks
    from grpo_dist.agents.settings import AgentSettings
    from grpo_dist.rollout.partial import PartialRollouts, TensorParallelAgreement

    _register_test_agent()
    engine = make_engine("vllm", model_path=model_dir, dtype="float32", max_model_len=MAX_MODEL_LEN, max_num_seqs=16,
                         seed=0, kv_cache_gib=0.125, tensor_parallel_size=2, tp_rank=tp_rank,
                         tp_master=("127.0.0.1", port))
    original = load_file(str(model_dir / "model.safetensors"))

    def new_weights(seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        engine.update_weights({k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in original.items()}.items())

    def leader_waits_for(tokens_so_far) -> None:  # the leader's pause lands mid-way; the other's on the same iteration
        deadline = time.monotonic() + 120
        while tp_rank == 0 and tokens_so_far() < 6 and time.monotonic() < deadline:
            time.sleep(0.001)

    prompts = PROMPTS[:3]
    gen = PartialRollouts(engine, version=0, agreement=TensorParallelAgreement(tp_rank))
    gen.start("cut", prompts, SamplingSettings(n=2, temperature=1.0, max_tokens=120, seed=5))
    leader_waits_for(lambda: sum(len(r.tokens) for r in gen._chunks["cut"].responses))
    interrupted = gen.pause()
    new_weights(1)
    gen.resume(1)
    cut, _ = gen.collect("cut", timeout_s=300)
    gen.close()

    engine.update_weights(original.items())
    chunks = AgentChunks(engine, max_model_len=MAX_MODEL_LEN, tokenizer=None, version=0,
                         agreement=TensorParallelAgreement(tp_rank))
    rows = [{"prompt_ids": p, "index": i} for i, p in enumerate(prompts)]
    settings = AgentSettings(default_agent_loop="tp_partial_test_agent", prompt_length=64, response_length=128)
    chunks.start("loops", rows, SamplingSettings(n=2, temperature=1.0, max_tokens=128, seed=5, logprobs=True),
                 settings)
    leader_waits_for(lambda: sum(len(r.tokens) for r in list(chunks.server._unanswered.values())))
    interrupted_loops = chunks.pause()
    new_weights(2)
    chunks.resume(1)
    loops, _ = chunks.collect("loops", timeout_s=300)
    chunks.close()

    after = engine.generate(prompts, SamplingSettings(n=1, temperature=1.0, max_tokens=12, seed=9))
    engine.close()
    return {"interrupted": interrupted, "cut": cut, "interrupted_loops": interrupted_loops, "loops": loops,
            "after": after}


def test_partial_rollouts_on_a_tensor_parallel_engine_pause_both_processes_at_one_iteration(tmp_path):
    """``tensor_model_parallel_size=2`` with partial rollouts: each process of the engine runs its own scheduler,
    and their background generators agree on every iteration (the first process's word, a broadcast), so a pause
    the first process's timing chose lands on the same iteration in both: both interrupt the same responses,
    finish them with the new weights with the same tokens, versions and log-probs, and the engine goes on
    serving plain calls (a process that stepped once more than the other would hang in the model's collectives).
    The same through agent loops (``rollout.mode=async``), which both processes run in lock step: the same
    trajectories (tokens, the tool's masked tokens, versions, log-probs) on both."""
    from grpo_dist.distributed.process_group import free_port
    from tests.e2e.call_in_process import call_in_processes

    model = build_tiny_model(tmp_path / "model2h", seed=0, hidden_size=128, num_heads=2, num_kv_heads=2)
    port = free_port("127.0.0.1")
    results = call_in_processes([(_tp_partial_run, (model, r, port)) for r in (0, 1)], tmp_path / "calls")
    first, second = results[0], results[1]
    assert first["interrupted"] == second["interrupted"] > 0
    for key in ("response_ids", "token_versions", "logprobs", "finished_by_eos"):
        assert getattr(first["cut"], key) == getattr(second["cut"], key), key
    assert any(v and v[0] == 0 and v[-1] == 1 for v in first["cut"].token_versions)
    # through agent loops
    assert first["interrupted_loops"] == second["interrupted_loops"] > 0
    for key in ("response_ids", "response_masks", "token_versions", "logprobs", "prompt_ids"):
        assert getattr(first["loops"], key) == getattr(second["loops"], key), key
    assert any(v and v[0] == 0 and v[-1] == 1 for v in first["loops"].token_versions)
    assert all(0 in m for m in first["loops"].response_masks)  # every trajectory holds the tool's tokens
    assert first["after"].response_ids == second["after"].response_ids

