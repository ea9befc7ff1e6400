"""The in-process API (``from grpo_dist import GRPO``): the quick start, the document's formula, the
registries, Hugging Face models with a tokenizer, and the errors raised before any work.

The equivalence with the distributed actor is tests/distributed/test_api_equivalence.py.
"""

from __future__ import annotations

import copy
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from grpo_dist.core.advantages import get_adv_estimator, list_adv_estimators
from grpo_dist.core.losses import agg_loss, masked_mean
from grpo_dist.core.policy_loss_registry import _REGISTRY, PolicyLossSpec, list_policy_losses

ROOT = Path(__file__).resolve().parents[2]
V, H, TARGET = 8, 256, 3


class TinyLM(nn.Module):
    """A causal language model: embedding, GRU, linear head; ``forward(input_ids) -> logits [B, T, V]``."""

    def __init__(self, vocab: int = V, hidden: int = H) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        self.rnn = nn.GRU(hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.emb(input_ids))
        return self.head(h)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: these models are tiny, and on a busy 2-core machine two threads that
    spin-wait for each other made the quick start ~25x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b) and a
    return max((a[k] - b[k]).abs().max().item() for k in a)


def target_fraction(completions, prompts):
    return [float((c == TARGET).float().mean()) for c in completions]


# ---------------------------------------------------------------------------------------------
# the quick start of the document, verbatim, run once for the tests below
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def quick_start():
    torch.manual_seed(0)
    model = TinyLM()
    ref_model = copy.deepcopy(model)
    ref_model.eval()
    reward_fn = target_fraction  # reward for emitting token TARGET
    prompt_tensor = torch.randint(0, V, (64, 4))
    before, ref_before = params(model), params(ref_model)

    from grpo_dist import GRPO
    trainer = GRPO(model=model, ref_model=ref_model, reward_fn=reward_fn, group_size=4, kl_coef=0.1,
                   learning_rate=1e-4, max_new_tokens=8)
    metrics = trainer.train(prompts=prompt_tensor, n_epochs=3)
    print(metrics["mean_reward"], metrics["kl"])

    return SimpleNamespace(trainer=trainer, metrics=metrics, model=model, ref_model=ref_model,
                           before=before, ref_before=ref_before)


def test_quick_start_mean_reward_rises(quick_start):
    history = quick_start.trainer.history
    per_epoch = [statistics.mean(h["mean_reward"] for h in history if h["epoch"] == e) for e in range(3)]
    assert per_epoch[2] > per_epoch[0] + 0.08, per_epoch  # chance level is 1/8
    assert quick_start.metrics["mean_reward"] == pytest.approx(per_epoch[2])


def test_quick_start_returns_last_epoch_means_and_keeps_the_history(quick_start):
    m, history = quick_start.metrics, quick_start.trainer.history
    for key in ("mean_reward", "kl", "loss", "entropy", "response_length", "pg_loss", "grad_norm"):
        assert key in m and math.isfinite(m[key]), key
    assert len(history) == 3 * 8  # 64 prompts in batches of 8, 3 epochs
    assert [h["step"] for h in history] == list(range(1, 25))
    last = [h for h in history if h["epoch"] == 2]
    for key in ("kl", "loss", "entropy"):
        assert m[key] == pytest.approx(statistics.mean(h[key] for h in last))
    assert m["response_length"] == 8.0  # no end-of-sequence token: every completion is max_new_tokens long
    assert 0 < m["entropy"] < math.log(V)  # a token mean of the per-token entropy
    assert "actor/pg_clipfrac" in m  # the policy loss's own metrics, named as the distributed trainer does


def test_quick_start_trains_the_model_and_never_the_reference(quick_start):
    assert max_diff(params(quick_start.model), quick_start.before) > 1e-3
    assert max_diff(params(quick_start.ref_model), quick_start.ref_before) == 0.0
    assert quick_start.trainer.history[0]["kl"] == pytest.approx(0.0, abs=1e-7)  # same weights at the first step


# ---------------------------------------------------------------------------------------------
# the defaults are the document's pseudocode
# ---------------------------------------------------------------------------------------------
def pseudocode_update(model, ref_model, rollout, rewards, *, G, kl_coef, lr, max_grad_norm):
    """The document's GRPO step written out with loops: group z-score advantages, then
    ``loss = -mean_i(A_i * sum_t logp_i,t) + kl_coef * mean_i,t(logp_i,t - ref_logp_i,t)``,
    gradient clipping and one Adam step."""
    B, R = rollout.responses.shape
    P = rollout.input_ids.shape[1] - R
    lengths = [int(x) for x in rollout.response_mask.sum(-1)]
    advantages = []
    for i in range(B):
        group = [float(r) for r in rewards[(i // G) * G:(i // G + 1) * G]]
        mean = sum(group) / G
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / (G - 1))
        advantages.append((float(rewards[i]) - mean) / (std + 1e-6))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    policy_terms, kl_terms = [], []
    for i in range(B):
        row = rollout.input_ids[i:i + 1]
        logits = model(row)[0]
        with torch.no_grad():
            ref_logits = ref_model(row)[0]
        seq_logp = 0.0
        for t in range(lengths[i]):
            token = row[0, P + t]
            logp = torch.log_softmax(logits[P - 1 + t], -1)[token]
            ref_logp = torch.log_softmax(ref_logits[P - 1 + t], -1)[token]
            seq_logp = seq_logp + logp
            kl_terms.append(logp - ref_logp)
        policy_terms.append(advantages[i] * seq_logp)
    loss = -sum(policy_terms) / B + kl_coef * sum(kl_terms) / len(kl_terms)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    opt.step()
    return float(loss.detach())


def test_default_update_is_the_documents_pseudocode():
    from grpo_dist import GRPO

    torch.manual_seed(1)
    model = TinyLM(hidden=32)
    reference_copy = copy.deepcopy(model)
    # an end-of-sequence token, so that completions have different lengths and padding
    trainer = GRPO(model, reward_fn=target_fraction, eos_token_id=1, learning_rate=1e-3, progress=False)
    rollout = trainer.generate(torch.randint(2, V, (3, 5)))
    lengths = rollout.response_mask.sum(-1)
    assert lengths.min() < lengths.max(), "the test needs completions of different lengths"
    rewards = torch.rand(len(rollout), generator=torch.Generator().manual_seed(0))

    metrics = trainer.update(rollout, rewards)
    want_model = copy.deepcopy(reference_copy)
    want_loss = pseudocode_update(want_model, reference_copy, rollout, rewards, G=4, kl_coef=0.1, lr=1e-3,
                                  max_grad_norm=1.0)
    assert max_diff(params(model), params(want_model)) < 1e-6
    assert max_diff(params(model), params(reference_copy)) > 1e-4, "the update should move the weights"
    # the value differs (ratio 1 instead of logp) but not the KL term: at the first step it is 0
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-7)
    assert math.isfinite(want_loss)


def test_micro_batch_size_does_not_change_the_update():
    from grpo_dist import GRPO

    torch.manual_seed(2)
    base = TinyLM(hidden=32)
    # a small learning rate: Adam turns float rounding of a near-zero gradient into a step of up to lr
    common = dict(reward_fn=target_fraction, eos_token_id=1, learning_rate=1e-5, progress=False,
                  loss_agg_mode="token-mean", kl_loss_type="low_var_kl", ppo_epochs=2, mini_batch_size=2)
    whole = GRPO(copy.deepcopy(base), **common)
    micro = GRPO(copy.deepcopy(base), micro_batch_size=3, **common)
    rollout = whole.generate(torch.randint(2, V, (4, 3)))
    rewards = torch.rand(len(rollout), generator=torch.Generator().manual_seed(1))
    m_whole = whole.update(rollout, rewards)
    m_micro = micro.update(rollout, rewards)
    assert max_diff(params(whole.model), params(micro.model)) < 1e-6
    assert max_diff(params(whole.model), params(base)) > 5e-6, "the update should move the weights"
    for key in ("loss", "kl", "entropy", "grad_norm", "actor/ppo_kl"):
        assert m_micro[key] == pytest.approx(m_whole[key], rel=1e-4, abs=1e-7), key
    assert m_whole["actor/ppo_kl"] != 0.0, "the second pass is off-policy: the ratio is no longer 1"


def test_micro_batches_keep_the_defaults_kl_aggregation_over_the_whole_mini_batch():
    """The defaults aggregate the KL term by a token mean and the policy term by sequence sums: both
    must use the mini-batch's counts, not a micro-batch's, or micro-batching changes the update."""
    from grpo_dist import GRPO

    torch.manual_seed(4)
    base = TinyLM(hidden=32)
    common = dict(reward_fn=target_fraction, eos_token_id=1, learning_rate=1e-5, progress=False)
    whole = GRPO(copy.deepcopy(base), **common)
    assert whole.objective.kl_loss_agg_mode != whole.objective.loss_agg_mode, "the test needs two aggregations"
    micro = GRPO(copy.deepcopy(base), micro_batch_size=3, **common)
    rollout = whole.generate(torch.randint(2, V, (4, 3)))
    lengths = rollout.response_mask.sum(-1)
    assert lengths.min() < lengths.max(), "the test needs completions of different lengths"
    rewards = torch.rand(len(rollout), generator=torch.Generator().manual_seed(1))
    m_whole, m_micro = whole.update(rollout, rewards), micro.update(rollout, rewards)
    assert max_diff(params(whole.model), params(micro.model)) < 1e-6
    assert max_diff(params(whole.model), params(base)) > 5e-6, "the update should move the weights"
    for key in ("loss", "pg_loss", "kl", "grad_norm"):
        assert m_micro[key] == pytest.approx(m_whole[key], rel=1e-4, abs=1e-7), key


# ---------------------------------------------------------------------------------------------
# any registered loss mode and advantage estimator, by name
# ---------------------------------------------------------------------------------------------
def test_trainer_only_modes_and_estimators_are_refused_by_name():
    from grpo_dist import GRPO
    from grpo_dist.api import api_estimators, api_loss_modes

    assert "bypass_mode" not in api_loss_modes() and "vanilla" in api_loss_modes()
    assert "gae" not in api_estimators() and "grpo" in api_estimators()
    with pytest.raises(ValueError, match="loss_mode 'bypass_mode' needs the rollout engine's log-probs"):
        GRPO(TinyLM(hidden=16), reward_fn=target_fraction, loss_mode="bypass_mode", progress=False)
    for name in set(list_adv_estimators()) - set(api_estimators()):
        with pytest.raises(ValueError, match=f"adv_estimator {name!r} needs"):
            GRPO(TinyLM(hidden=16), reward_fn=target_fraction, adv_estimator=name, progress=False)


def _api_modes():
    from grpo_dist.api import api_estimators, api_loss_modes

    return api_loss_modes(), api_estimators()


@pytest.mark.parametrize("loss_mode", _api_modes()[0])
@pytest.mark.parametrize("adv_estimator", _api_modes()[1])
def test_every_registered_loss_mode_and_estimator_trains(loss_mode, adv_estimator):
    from grpo_dist import GRPO

    torch.manual_seed(3)
    model = TinyLM(hidden=16)
    before = params(model)
    extra = {"policy_loss_params": {"dro_beta": 0.5}} if loss_mode == "dro" else {}  # (dro has no default beta)
    trainer = GRPO(model, reward_fn=target_fraction, loss_mode=loss_mode, adv_estimator=adv_estimator,
                   learning_rate=1e-3, max_new_tokens=4, batch_size=2, progress=False, **extra)
    rollout = trainer.generate(torch.randint(0, V, (2, 3)))
    metrics = trainer.update(rollout, torch.arange(len(rollout), dtype=torch.float32))
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert max_diff(params(model), before) > 0


def test_a_loss_mode_registered_outside_the_package_is_used_and_reported(monkeypatch):
    from grpo_dist import GRPO

    calls = []

    def toy(inputs, *, agg, params):
        calls.append(agg.mode)
        logp_BT, mask_BT = inputs.logp_BT, inputs.mask_BT
        return agg_loss(-inputs.advantages_BT * logp_BT, mask_BT, agg), {"toy_logp": masked_mean(logp_BT.detach(), mask_BT)}

    monkeypatch.setitem(_REGISTRY, "api_test_toy", PolicyLossSpec(name="api_test_toy", fn=toy))
    trainer = GRPO(TinyLM(hidden=16), reward_fn=target_fraction, loss_mode="api_test_toy", progress=False)
    metrics = trainer.step(torch.randint(0, V, (2, 3)))
    assert calls == ["seq-mean-token-sum"]
    assert metrics["actor/toy_logp"] < 0


# ---------------------------------------------------------------------------------------------
# a Hugging Face causal LM with a tokenizer and string prompts
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_model_dir(tmp_path_factory):
    from grpo_dist.utils.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("api_tiny"), vocab=list("abcdefgh "))


def test_hugging_face_model_with_tokenizer_and_string_prompts(hf_model_dir, capfd):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_dist import GRPO

    model = AutoModelForCausalLM.from_pretrained(hf_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(hf_model_dir)
    seen = []

    def count_a(completions, prompts):
        seen.append((completions, prompts))
        return [c.count("a") for c in completions]

    prompts = ["abc", "h", "de fg", "b"]
    trainer = GRPO(model, reward_fn=count_a, tokenizer=tokenizer, group_size=2, batch_size=4, learning_rate=1e-3)
    assert trainer.eos_token_ids == [3, 1]  # the generation config's, which generate stops on
    before = params(model)
    metrics = trainer.train(prompts, n_epochs=1)
    assert "GRPO" in capfd.readouterr().err  # the progress bar

    completions, got_prompts = seen[0]
    assert all(isinstance(c, str) for c in completions) and len(completions) == 8
    assert sorted(got_prompts) == sorted(p for p in prompts for _ in range(2))
    assert metrics["mean_reward"] == pytest.approx(statistics.mean(c.count("a") for c in completions))
    assert max_diff(params(model), before) > 0

    rollout = trainer.generate(["h", "abc"])
    # left padding is masked for a Hugging Face model, and position ids start at the first real token
    assert rollout.attention_mask[:2, :2].tolist() == [[0, 0], [0, 0]]
    assert rollout.position_ids[0, 2].item() == 0
    assert [tokenizer.decode(p) for p in rollout.prompts()[::2]] == ["h", "abc"]


def test_progress_bar_can_be_turned_off(capfd):
    from grpo_dist import GRPO

    GRPO(TinyLM(hidden=16), reward_fn=target_fraction, progress=False).train(torch.randint(0, V, (2, 3)))
    assert "GRPO" not in capfd.readouterr().err


# ---------------------------------------------------------------------------------------------
# clear errors before any work
# ---------------------------------------------------------------------------------------------
class BadShape(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(1, V)

    def forward(self, input_ids):
        return self.lin(input_ids[:, -1:].float())  # [B, V]: no time dimension


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"group_size": 1}, "group_size must be an integer >= 2"),
        ({"model": BadShape()}, "must return float logits [2, 3, V]"),
        ({"loss_mode": "nope"}, "unknown policy loss mode 'nope'"),
        ({"adv_estimator": "nope"}, "unknown advantage estimator 'nope'"),
        ({"adv_estimator": "gae"}, "needs a critic's values"),
        ({"loss_agg_mode": "mean"}, "loss_agg_mode 'mean' is not an aggregation mode"),
        ({"kl_loss_type": "full"}, "kl_loss_type 'full' is not usable"),
        ({"reward_fn": None}, "reward_fn must be a function"),
        ({"learning_rate": 0}, "learning_rate must be a finite number > 0"),
        ({"policy_loss_params": {"clip": 1}}, "policy_loss_params ['clip'] are not fields"),
    ],
)
def test_bad_arguments_are_refused_at_construction(kwargs, message):
    from grpo_dist import GRPO

    args = dict(model=TinyLM(hidden=16), reward_fn=target_fraction) | kwargs
    with pytest.raises(ValueError) as e:
        GRPO(**args)
    assert message in str(e.value)


def test_group_size_one_is_refused_for_group_estimators_and_trains_without_groups():
    from grpo_dist import GRPO
    from grpo_dist.api import api_estimators

    group_based = [n for n in api_estimators() if get_adv_estimator(n).group_based]
    single = [n for n in api_estimators() if not get_adv_estimator(n).group_based]
    assert "grpo" in group_based and "reinforce_plus_plus" in single
    for name in group_based:
        with pytest.raises(ValueError) as e:
            GRPO(TinyLM(hidden=16), reward_fn=target_fraction, group_size=1, adv_estimator=name, progress=False)
        assert f"adv_estimator {name!r} compares the completions of a prompt" in str(e.value)
        assert "group_size must be an integer >= 2, got 1" in str(e.value) and "'reinforce_plus_plus'" in str(e.value)
    torch.manual_seed(5)
    model = TinyLM(hidden=16)
    before = params(model)
    trainer = GRPO(model, reward_fn=target_fraction, group_size=1, adv_estimator="reinforce_plus_plus",
                   learning_rate=1e-3, progress=False)
    metrics = trainer.step(torch.randint(0, V, (4, 3)))
    assert len(trainer.generate(torch.randint(0, V, (4, 3)))) == 4  # one completion per prompt
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert max_diff(params(model), before) > 0


def test_the_reference_may_not_be_the_policy():
    from grpo_dist import GRPO

    model = TinyLM(hidden=16)
    with pytest.raises(ValueError, match="ref_model is the policy itself"):
        GRPO(model, model, target_fraction)


@pytest.mark.parametrize(
    ("prompts", "message"),
    [
        (torch.rand(2, 3), "must be a LongTensor of token ids [N, P], got dtype torch.float32"),
        (torch.zeros(3, dtype=torch.long), "must be a 2-D tensor [N, P]"),
        (torch.full((2, 3), V), f"the model's vocabulary is [0, {V - 1}]"),
        (["a prompt"], "pass tokenizer=..."),
        (42, "must be a LongTensor [N, P] of token ids or (with a tokenizer) a non-empty list of strings"),
    ],
)
def test_bad_prompts_are_refused_before_any_work(prompts, message):
    from grpo_dist import GRPO

    calls = []
    trainer = GRPO(TinyLM(hidden=16), reward_fn=lambda c, p: calls.append(1) or [0.0] * len(c), progress=False)
    with pytest.raises(ValueError) as e:
        trainer.train(prompts)
    assert message in str(e.value)
    assert calls == [] and trainer.history == []


def test_all_padding_prompt_is_refused():
    from grpo_dist import GRPO

    trainer = GRPO(TinyLM(hidden=16), reward_fn=target_fraction, pad_token_id=0, progress=False)
    with pytest.raises(ValueError, match=r"rows \[1\] are all padding \(pad_token_id=0\)"):
        trainer.train(torch.tensor([[0, 5, 6], [0, 0, 0]]))


@pytest.mark.parametrize(
    ("reward_fn", "message"),
    [
        (lambda c, p: [1.0] * (len(c) - 1), "returned 7 rewards for 8 completions"),
        (lambda c, p: [float("nan")] * len(c), "returned nan for completion 0: rewards must be finite"),
        (lambda c, p: ["1.0"] * len(c), "returned '1.0' (str) for completion 0: rewards must be numbers"),
        (lambda c, p: None, "must return a list of 8 numbers, got NoneType"),
        (lambda c, p: torch.zeros(len(c), 1), "got a tensor of shape (8, 1)"),
    ],
)
def test_bad_rewards_are_refused_before_the_update(reward_fn, message):
    from grpo_dist import GRPO

    model = TinyLM(hidden=16)
    before = params(model)
    trainer = GRPO(model, reward_fn=reward_fn, progress=False)
    with pytest.raises(ValueError) as e:
        trainer.train(torch.randint(0, V, (2, 3)))
    assert message in str(e.value)
    assert max_diff(params(model), before) == 0.0 and trainer.history == []


def test_rewards_may_be_numpy_tensors_or_bools():
    import numpy as np

    from grpo_dist import GRPO

    for fn in (lambda c, p: np.ones(len(c)), lambda c, p: torch.ones(len(c)), lambda c, p: [True] * len(c)):
        metrics = GRPO(TinyLM(hidden=16), reward_fn=fn, progress=False).step(torch.randint(0, V, (2, 3)))
        assert metrics["mean_reward"] == 1.0


# ---------------------------------------------------------------------------------------------
# importing
# ---------------------------------------------------------------------------------------------
def test_import_is_light_and_the_api_loads_no_ray_vllm_or_hydra():
    code = (
        "import sys, json\n"
        "import grpo_dist\n"
        "bare = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'grpo_dist'))\n"
        "from grpo_dist import GRPO\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'ray', 'vllm', 'hydra', 'omegaconf', 'transformers'})\n"
        "print(json.dumps({'bare': bare, 'heavy': heavy, 'name': GRPO.__module__}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["bare"] == ["grpo_dist"]  # `import grpo_dist` imports nothing, not even torch
    assert out["heavy"] == []
    assert out["name"] == "grpo_dist.api"


# ---------------------------------------------------------------------------------------------
# the user guide's examples run
# ---------------------------------------------------------------------------------------------
def doc_examples() -> dict[str, str]:
    """The python code blocks of docs/python_api.md, by the title of their section."""
    text = (ROOT / "docs" / "python_api.md").read_text()
    blocks = {}
    for section in text.split("\n## ")[1:]:
        title, _, body = section.partition("\n")
        code = [part.split("```", 1)[0] for part in body.split("```python\n")[1:]]
        if code:
            blocks[title] = "\n".join(code)
    return blocks


def test_the_user_guide_examples_run(monkeypatch, tmp_path, capsys):
    import tempfile

    examples = doc_examples()
    assert set(examples) == {"A complete example", "A Hugging Face model with a tokenizer"}
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the example builds its model folder
    plain: dict = {}
    exec(compile(examples["A complete example"], "python_api.md", "exec"), plain)
    per_epoch = [statistics.mean(h["mean_reward"] for h in plain["trainer"].history if h["epoch"] == e)
                 for e in range(3)]
    assert per_epoch[2] > per_epoch[0] + 0.08, per_epoch  # as the guide says: from chance toward a third
    hf: dict = {}
    exec(compile(examples["A Hugging Face model with a tokenizer"], "python_api.md", "exec"), hf)
    assert 0 < hf["metrics"]["response_length"] <= 8
    out = capsys.readouterr().out
    assert "mean reward" in out and "first epoch" in out
