"""LoRA in the in-process API: ``GRPO(..., lora_rank=r)`` wraps a Hugging Face model with peft, a peft
model is trained as it is, only the adapters move, the reference is the base model (the policy with its
adapters off, no copy), and the update is the document's formula computed by hand on the peft model."""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from grpo_dist.api.models import policy_module
from grpo_dist.training.lora import base_name
from grpo_dist.training.policy import forward_logprobs
from tests.unit.test_api import TinyLM

ROOT = Path(__file__).resolve().parents[2]
VOCAB = list("abcdefgh ")  # ids 4..12; 0 pads, 1 and 3 end a completion (the generation config's EOS)
QWEN2_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: the model is tiny and the machine may be busy."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from grpo_dist.utils.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("api_lora"), vocab=VOCAB, hidden_size=32, head_dim=32,
                            intermediate_size=64)


def load(model_dir, seed: int = 0) -> nn.Module:
    """The tiny Qwen2 model from ``model_dir``; ``seed != 0``: every weight redrawn (another model)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if seed:
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return model


def count_e(completions, prompts):
    """Reward: the fraction of a completion's tokens that are 'e' (id 8)."""
    return [float((c == 8).float().mean()) for c in completions]


def prompts(n: int, seed: int) -> torch.Tensor:
    return torch.randint(4, 4 + len(VOCAB), (n, 3), generator=torch.Generator().manual_seed(seed))


def rewards_for(rollout, seed: int) -> torch.Tensor:
    return torch.rand(len(rollout), generator=torch.Generator().manual_seed(seed))


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def adapters(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state(model).items() if ".lora_" in k}


def base_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The base model's weights of a peft model, under the base model's own names."""
    return {base_name(k): v for k, v in state(model).items() if ".lora_" not in k}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b) and a
    return max((a[k] - b[k]).abs().max().item() for k in a)


# ---------------------------------------------------------------------------------------------
# the same step, by hand
# ---------------------------------------------------------------------------------------------
def response_logprobs(model, rollout) -> torch.Tensor:
    """log p(response token) [B, R] under ``model`` called plainly on the whole batch; 0 off the mask."""
    R = rollout.responses.shape[1]
    out = model(input_ids=rollout.input_ids, attention_mask=rollout.attention_mask,
                position_ids=rollout.position_ids, use_cache=False)
    logits_BRV = out.logits[:, -R - 1:-1].float()
    logp_BR = torch.log_softmax(logits_BRV, -1).gather(-1, rollout.responses.unsqueeze(-1)).squeeze(-1)
    return logp_BR * rollout.response_mask


def hand_step(model, optimizer, rollout, rewards, *, ref_logp_BR, G=4, kl_coef=0.1, max_grad_norm=1.0) -> float:
    """The API's default step written out: group z-score advantages, then
    ``loss = -mean_i(A_i * sum_t logp_i,t) + kl_coef * mean_i,t(logp_i,t - ref_logp_i,t)``, gradient
    clipping over the trainable parameters and one optimizer step. Returns the KL term."""
    mask_BR = rollout.response_mask
    r_NG = rewards.view(-1, G)
    adv_B = ((r_NG - r_NG.mean(-1, keepdim=True)) / (r_NG.std(-1, keepdim=True) + 1e-6)).view(-1)
    logp_BR = response_logprobs(model, rollout)
    kl = ((logp_BR - ref_logp_BR) * mask_BR).sum() / mask_BR.sum()
    loss = -(adv_B * logp_BR.sum(-1)).mean() + kl_coef * kl
    optimizer.zero_grad()
    loss.backward()
    trainable = [p for p in model.parameters() if p.requires_grad]
    torch.nn.utils.clip_grad_norm_(trainable, max_grad_norm)
    optimizer.step()
    return float(kl.detach())


# ---------------------------------------------------------------------------------------------
# lora_rank=r: peft wraps the model, the adapters alone train, the reference is the base
# ---------------------------------------------------------------------------------------------
def test_lora_rank_trains_only_the_adapters_and_matches_the_step_by_hand(model_dir):
    from peft import PeftModel

    from grpo_dist import GRPO

    plain_base = load(model_dir)  # untouched: the base weights and the reference forward
    rng_before = torch.get_rng_state()
    trainer = GRPO(load(model_dir), reward_fn=count_e, lora_rank=4, lora_alpha=8, learning_rate=1e-3, progress=False)
    assert torch.equal(torch.get_rng_state(), rng_before), "drawing the adapters must leave the caller's RNG alone"

    # peft wraps every linear layer but the output layer; Adam holds the adapters and nothing else
    assert isinstance(trainer.model, PeftModel)
    names = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    assert {re.search(r"\.(\w+)\.lora_", n).group(1) for n in names} == set(QWEN2_LINEAR)
    assert len(names) == 2 * len(QWEN2_LINEAR) * 2  # A and B, every projection, two layers
    in_adam = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert in_adam == {id(p) for n, p in trainer.model.named_parameters() if n in names}
    # no second copy: the reference is the policy with its adapters off
    assert trainer.ref_model is None and trainer.reference.policy is trainer.model

    want = copy.deepcopy(trainer.model)
    want_opt = torch.optim.Adam([p for p in want.parameters() if p.requires_grad], lr=1e-3)
    start = adapters(trainer.model)
    kls = []
    for step in range(2):  # the first step moves only B (B = 0 gives A no gradient); the second moves A too
        rollout = trainer.generate(prompts(3, seed=step))
        rewards = rewards_for(rollout, seed=step)
        with torch.no_grad():
            ref_logp_BR = response_logprobs(plain_base, rollout)
        metrics = trainer.update(rollout, rewards)
        kls.append(hand_step(want, want_opt, rollout, rewards, ref_logp_BR=ref_logp_BR))
        assert metrics["kl"] == pytest.approx(kls[-1], rel=1e-4, abs=1e-7)
        assert max_diff(adapters(trainer.model), adapters(want)) < 1e-5, step
    assert kls[0] == pytest.approx(0.0, abs=1e-7) and abs(kls[1]) > 1e-6  # the adapted policy left the base (k1 may be < 0)
    moved = {k: (v - start[k]).abs().max().item() for k, v in adapters(trainer.model).items()}
    assert min(v for k, v in moved.items() if ".lora_A." in k) > 0
    assert min(v for k, v in moved.items() if ".lora_B." in k) > 0
    # the base weights are bit-identical to the model as loaded
    assert max_diff(base_weights(trainer.model), state(plain_base)) == 0.0


def test_adapters_are_drawn_from_seed(model_dir):
    from grpo_dist import GRPO

    a0, b0, c1 = (adapters(GRPO(load(model_dir), reward_fn=count_e, lora_rank=2, seed=s, progress=False).model)
                  for s in (0, 0, 1))
    assert max_diff(a0, b0) == 0.0
    assert max_diff(a0, c1) > 0.0


def test_micro_batch_size_does_not_change_the_lora_update(model_dir):
    from grpo_dist import GRPO

    common = dict(reward_fn=count_e, lora_rank=4, learning_rate=1e-5, progress=False, loss_agg_mode="token-mean",
                  kl_loss_type="low_var_kl", ppo_epochs=2, mini_batch_size=2)
    whole = GRPO(load(model_dir), **common)
    micro = GRPO(load(model_dir), micro_batch_size=3, **common)
    start = adapters(whole.model)
    assert max_diff(start, adapters(micro.model)) == 0.0
    rollout = whole.generate(prompts(4, seed=5))
    lengths = rollout.response_mask.sum(-1)
    assert lengths.min() < lengths.max(), "the test needs completions of different lengths"
    rewards = rewards_for(rollout, seed=5)
    m_whole, m_micro = whole.update(rollout, rewards), micro.update(rollout, rewards)
    assert max_diff(adapters(whole.model), adapters(micro.model)) < 1e-6
    assert max_diff(adapters(whole.model), start) > 5e-6, "the update should move the adapters"
    for key in ("loss", "kl", "grad_norm", "actor/ppo_kl"):
        assert m_micro[key] == pytest.approx(m_whole[key], rel=1e-4, abs=1e-7), key
    assert m_whole["kl"] != 0.0, "the second pass's adapters differ from the base: the KL term is not 0"


def test_an_explicit_reference_is_used_under_lora(model_dir):
    from grpo_dist import GRPO

    other = load(model_dir, seed=7)  # a different model as the reference
    other_before = state(other)
    trainer = GRPO(load(model_dir), ref_model=other, reward_fn=count_e, lora_rank=4, progress=False)
    assert trainer.ref_model is other and trainer.reference is other
    rollout = trainer.generate(prompts(2, seed=3))
    with torch.no_grad():  # at the first step the policy is the base model (B = 0)
        want_kl = ((response_logprobs(load(model_dir), rollout) - response_logprobs(other, rollout)).sum()
                   / rollout.response_mask.sum())
    metrics = trainer.update(rollout, rewards_for(rollout, seed=3))
    assert abs(float(want_kl)) > 1e-3
    assert metrics["kl"] == pytest.approx(float(want_kl), rel=1e-4)
    assert max_diff(state(other), other_before) == 0.0


# ---------------------------------------------------------------------------------------------
# a peft model, trained as it is
# ---------------------------------------------------------------------------------------------
def test_a_peft_model_trains_its_adapters_and_its_reference_is_the_base(model_dir):
    from peft import LoraConfig, get_peft_model

    from grpo_dist import GRPO

    plain_base = load(model_dir)
    with torch.random.fork_rng():
        torch.manual_seed(0)  # B drawn at random too: the adapted model is not the base from the start
        peft_model = get_peft_model(load(model_dir), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"],
                                                                init_lora_weights=False))
    trainer = GRPO(peft_model, reward_fn=count_e, learning_rate=1e-3, progress=False)
    assert trainer.model is peft_model and trainer.ref_model is None
    want, start = copy.deepcopy(peft_model), adapters(peft_model)
    want_opt = torch.optim.Adam([p for p in want.parameters() if p.requires_grad], lr=1e-3)

    rollout = trainer.generate(prompts(3, seed=1))
    rewards = rewards_for(rollout, seed=1)
    with torch.no_grad():
        base_logp_BR = response_logprobs(plain_base, rollout)
        # the reference forward (adapters off) is a plain base-model forward
        ref_logp_BR, _ = forward_logprobs(policy_module(trainer.reference, trainer.is_hf), rollout.input_ids,
                                          rollout.attention_mask, rollout.position_ids,
                                          response_length=rollout.responses.shape[1], temperature=1.0,
                                          compute_entropy=False)
    assert (ref_logp_BR - base_logp_BR).abs().max().item() < 1e-5
    metrics = trainer.update(rollout, rewards)
    want_kl = hand_step(want, want_opt, rollout, rewards, ref_logp_BR=base_logp_BR)
    assert abs(want_kl) > 1e-4, "the test needs adapters that change the model"
    assert metrics["kl"] == pytest.approx(want_kl, rel=1e-4)
    assert max_diff(adapters(trainer.model), adapters(want)) < 1e-5
    assert max_diff(adapters(trainer.model), start) > 1e-4, "the update should move the adapters"
    assert max_diff(base_weights(trainer.model), state(plain_base)) == 0.0
    assert trainer.model.active_adapters == ["default"]  # the reference forward switched them back on


def test_a_peft_model_around_a_plain_module_trains_with_the_base_as_reference():
    from peft import LoraConfig, get_peft_model

    from grpo_dist import GRPO

    torch.manual_seed(0)
    plain = TinyLM(hidden=16)
    base_copy = copy.deepcopy(plain)
    peft_model = get_peft_model(plain, LoraConfig(r=2, target_modules=["head"], init_lora_weights=False))
    trainer = GRPO(peft_model, reward_fn=lambda c, p: [float((x == 3).float().mean()) for x in c],
                   learning_rate=1e-3, eos_token_id=1, progress=False)
    assert not trainer.is_hf and trainer.ref_model is None
    before = adapters(peft_model)
    rollout = trainer.generate(torch.randint(2, 8, (2, 3)))
    with torch.no_grad():
        want_ref, _ = forward_logprobs(policy_module(base_copy, False), rollout.input_ids, rollout.attention_mask,
                                       rollout.position_ids, response_length=rollout.responses.shape[1],
                                       temperature=1.0, compute_entropy=False)
        got_ref, _ = forward_logprobs(policy_module(trainer.reference, False), rollout.input_ids,
                                      rollout.attention_mask, rollout.position_ids,
                                      response_length=rollout.responses.shape[1], temperature=1.0,
                                      compute_entropy=False)
    assert torch.allclose(got_ref, want_ref, atol=1e-6)
    metrics = trainer.update(rollout, torch.arange(len(rollout), dtype=torch.float32))
    assert math.isfinite(metrics["loss"]) and metrics["kl"] != 0.0
    assert max_diff(adapters(peft_model), before) > 0
    assert max_diff(base_weights(peft_model), state(base_copy)) == 0.0


# ---------------------------------------------------------------------------------------------
# refusals, one message each, before any work
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "message"), [
    ({"lora_rank": -1}, "GRPO lora_rank must be an integer >= 0, got -1"),
    ({"lora_rank": 4, "lora_alpha": 0}, "GRPO lora_alpha must be a finite number > 0.0, got 0"),
    ({"lora_rank": 4, "lora_alpha": -2.0}, "GRPO lora_alpha must be a finite number > 0.0, got -2.0"),
    ({"lora_rank": 4, "lora_dropout": 1.0}, "GRPO lora_dropout must be a number in [0, 1), got 1.0"),
    ({"lora_rank": 4, "lora_dropout": -0.1}, "GRPO lora_dropout must be a number in [0, 1), got -0.1"),
    ({"lora_rank": 4, "lora_target_modules": []}, "GRPO lora_target_modules must be 'all-linear'"),
    ({"lora_rank": 4, "lora_target_modules": ["q_proj", "nope"]},
     "GRPO lora_target_modules ['nope'] match no linear layer of the model"),
])
def test_bad_lora_values_are_refused(model_dir, kwargs, message):
    from grpo_dist import GRPO

    model = load(model_dir)
    before = state(model)
    with pytest.raises(ValueError) as e:
        GRPO(model, reward_fn=count_e, progress=False, **kwargs)
    assert message in str(e.value)
    assert state(model).keys() == before.keys(), "the model must be left as it was"


def test_lora_needs_a_hugging_face_or_peft_model():
    from grpo_dist import GRPO

    with pytest.raises(ValueError) as e:
        GRPO(TinyLM(hidden=16), reward_fn=count_e, lora_rank=4, progress=False)
    assert "GRPO lora_rank=4 needs a Hugging Face causal LM (a transformers PreTrainedModel) or a peft model, " \
           "got TinyLM" in str(e.value)


def test_a_peft_model_takes_no_lora_rank_its_base_is_no_reference_and_it_needs_trainable_adapters(model_dir):
    from peft import LoraConfig, get_peft_model

    from grpo_dist import GRPO

    base = load(model_dir)
    peft_model = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"]))
    with pytest.raises(ValueError, match="with a model that already is a peft model: its adapters are trained as they"):
        GRPO(peft_model, reward_fn=count_e, lora_rank=4, progress=False)
    with pytest.raises(ValueError, match="ref_model shares .* parameters with the model"):
        GRPO(peft_model, ref_model=base, reward_fn=count_e, progress=False)
    peft_model.requires_grad_(False)  # as PeftModel.from_pretrained loads a folder by default
    with pytest.raises(ValueError, match="nothing to train .*needs is_trainable=True"):
        GRPO(peft_model, reward_fn=count_e, progress=False)


# ---------------------------------------------------------------------------------------------
# the user guide's LoRA example runs
# ---------------------------------------------------------------------------------------------
def test_the_user_guides_lora_example_runs(monkeypatch, tmp_path):
    import tempfile

    text = (ROOT / "docs" / "python_api.md").read_text()
    section = text.split("\n## LoRA adapters\n", 1)[1].split("\n## ", 1)[0]
    code = "\n".join(part.split("```", 1)[0] for part in section.split("```py\n")[1:])
    assert "lora_rank=" in code
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    scope: dict = {}
    exec(compile(code, "python_api.md", "exec"), scope)
    trainer, merged = scope["trainer"], scope["merged"]
    assert trainer.ref_model is None and len(trainer.history) == 2
    saved = next(Path(tmp_path).rglob("adapter_config.json")).parent
    assert (saved / "adapter_model.safetensors").is_file()
    base = load(scope["folder"])
    layer = "model.layers.0.self_attn."
    merged_state, base_state = merged.state_dict(), base.state_dict()
    assert set(merged_state) == set(base_state)  # a plain model again, under the base model's names
    assert not torch.equal(merged_state[layer + "q_proj.weight"], base_state[layer + "q_proj.weight"])
    assert torch.equal(merged_state[layer + "k_proj.weight"], base_state[layer + "k_proj.weight"])  # not a target
