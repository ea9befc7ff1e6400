"""Three reward sources end to end on CPU (real Ray, vLLM, FSDP2): the rule score and two reward models
declared as entries of ``reward.sources``, one of them on a pool of its own, the other in the training
ranks' model processes; iterative RL trains the one on its own pool.

Both reward models start from the same weights (the embedded task's starting reward model), so until
the first reward-model update they score every response alike wherever they run; the reward is the one
weighted sum of the three sources.
"""

from __future__ import annotations

import math

import pytest

from tests.e2e.helpers import base_args, read_metrics, run_main

pytestmark = pytest.mark.slow
STEPS = 3
WEIGHTS = {"verifier": 0.5, "helpful": 1.0, "judge": 0.25}


@pytest.fixture(scope="module")
def run(embedded_model, reverse_data, tmp_path_factory):
    from grpo_dist.tasks import reverse

    rm = reverse.ensure_reward_model(embedded_model.parent)
    out = tmp_path_factory.mktemp("reward_sources") / "run"
    sources = [
        "+reward.sources.verifier.kind=rule", f"+reward.sources.verifier.weight={WEIGHTS['verifier']}",
        "+reward.sources.helpful.kind=outcome_model", f"+reward.sources.helpful.path={rm}",
        "+reward.sources.judge.kind=outcome_model", f"+reward.sources.judge.path={rm}",
        f"+reward.sources.judge.weight={WEIGHTS['judge']}", "+reward.sources.judge.enable_resource_pool=true",
        "+reward.sources.judge.nnodes=1", "+reward.sources.judge.n_gpus_per_node=1",
        "reward_model.iterative.enable=true", "reward_model.iterative.source=judge",
        "reward_model.iterative.steps_per_iteration=2", "reward_model.iterative.lr=1e-3",
        f"trainer.save_freq={STEPS}", f"trainer.test_freq={STEPS}",
    ]
    proc = run_main(base_args(embedded_model, reverse_data, out, steps=STEPS) + sources)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return out, proc, read_metrics(out)


def test_the_reward_is_the_weighted_sum_of_the_three_sources(run):
    _, _, m = run
    for step in range(1, STEPS + 1):
        r = m[step]
        parts = (WEIGHTS["helpful"] * r["reward_model/helpful/score/mean"]
                 + WEIGHTS["judge"] * r["reward_model/judge/score/mean"]
                 + WEIGHTS["verifier"] * r["reward_model/rule_score/mean"])
        assert r["critic/score/mean"] == pytest.approx(parts, abs=1e-4), (step, r["critic/score/mean"], parts)
        assert r["timing_s/reward_model/helpful"] > 0 and r["timing_s/reward_model/judge"] > 0


def test_the_same_reward_model_scores_alike_on_its_own_pool_until_it_is_trained(run):
    _, _, m = run
    for step in (1, 2):  # the first update ends step 2
        a, b = m[step]["reward_model/helpful/score/mean"], m[step]["reward_model/judge/score/mean"]
        assert math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-5), (step, a, b)
    assert [s for s in m if "reward_model/train_loss" in m[s]] == [2]  # only the source iterative RL names
    assert m[3]["reward_model/judge/score/mean"] != pytest.approx(m[3]["reward_model/helpful/score/mean"], abs=1e-5)


def test_each_reward_model_runs_where_its_entry_says_and_only_the_trained_one_is_checkpointed(run):
    from grpo_dist.utils import startup

    out, proc, _ = run
    processes = sorted(p for p in startup.read(out)[0]["processes"] if p.startswith("models"))
    assert processes == ["models (reward_model.judge pool) rank 0", "models rank 0", "models rank 1"]
    ckpt = out / f"global_step_{STEPS}"
    assert (ckpt / "reward_model.judge").is_dir() and not (ckpt / "reward_model.helpful").exists()
    assert "Traceback" not in proc.stderr
