"""verl's GRPO, GSPO and REINFORCE++ example scripts (both layouts) trained for two steps on the CPU
through ``python -m grpo_dist.main`` (real Ray, vLLM, FSDP2): the module name and the paths changed, the
sizes scaled down, the overrides that wait on other features left out (tests/verl_scripts.py).

One run per script, started once and shared by the tests below:

- ``early_gspo``: verl's early-2026 GSPO test script (GSPO loss, seq-mean-token-mean, token budgets,
  parameter and optimizer offload, the dapo manager, its own output folder and step count);
- ``early_reinforce_pp``: the early-2026 REINFORCE++ script (KL in the reward, a reference);
- ``current_grpo``: the current GRPO script (two data files each, balance_batch, the uv launcher key).
"""

from __future__ import annotations

import time

import pytest

from tests.e2e.helpers import read_metrics, run_main
from tests.verl_scripts import RUN_ON_CPU, SCRIPTS, script_args

pytestmark = pytest.mark.slow
ACTOR = ["actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/lr", "critic/score/mean", "response_length/mean",
         "timing_s/gen", "timing_s/update_actor", "timing_s/update_weights"]


@pytest.fixture(scope="module")
def runs(tiny_model_dir, reverse_data, tmp_path_factory):
    from tests.e2e.conftest import epoch_data

    data = epoch_data(reverse_data, tmp_path_factory.mktemp("verl_script_data"))
    out = {}
    for name in RUN_ON_CPU:
        folder = tmp_path_factory.mktemp(f"verl_{name}") / "run"
        paths = dict(model=str(tiny_model_dir), train=str(data["train"]), train2=str(data["small_train"]),
                     test=str(data["test"]), test2=str(data["test"]), out=str(folder))
        t0 = time.time()
        proc = run_main(script_args(SCRIPTS[name], cpu=True, **paths))
        out[name] = (folder, proc, time.time() - t0)
        print(f"{name}: {out[name][2]:.0f} s")
    return out


@pytest.mark.parametrize("name", RUN_ON_CPU)
def test_the_script_trains_two_steps(runs, name):
    folder, proc, _ = runs[name]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    m = read_metrics(folder)
    assert [s for s in sorted(m) if s > 0] == [1, 2]
    for step in (1, 2):
        missing = [k for k in ACTOR if k not in m[step]]
        assert not missing, f"step {step} lacks {missing}"
    assert (folder / "global_step_2" / "huggingface" / "model.safetensors").exists()


def test_gspo_script_runs_its_own_settings(runs):
    folder, proc, _ = runs["early_gspo"]
    m = read_metrics(folder)
    assert 0 not in m, "val_before_train=false"
    assert any(k.startswith("val-core/") for k in m[2]), "the last step validates"
    assert "actor/kl_loss" not in m[1]  # use_kl_loss=false
    # what has no effect here is said once, at start-up
    assert "note: actor_rollout_ref.actor.entropy_checkpointing = True has no effect here" in proc.stdout
    assert "note: data.return_raw_chat" not in proc.stdout  # true is verl's default: nothing to say


def test_reinforce_pp_script_puts_the_kl_in_the_reward(runs):
    folder, _, _ = runs["early_reinforce_pp"]
    m = read_metrics(folder)
    assert "actor/reward_kl_penalty" in m[1] and "timing_s/ref" in m[1]


def test_current_grpo_script_balances_and_uses_the_kl_loss(runs):
    folder, _, _ = runs["current_grpo"]
    m = read_metrics(folder)
    assert "global_seqlen/balanced_max" in m[1] and "actor/kl_loss" in m[1]
    # log-prob forwards by token budget, derived from the actor's as in verl: the reference ran
    assert "timing_s/ref" in m[1]
