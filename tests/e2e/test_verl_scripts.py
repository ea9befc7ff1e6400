"""verl's GRPO, GSPO and REINFORCE++ example scripts (both layouts) trained for two steps on the CPU
through ``python -m grpo_dist.main`` (real Ray, vLLM, FSDP2): the module name and the paths changed, the
sizes scaled down (tests/verl_scripts.py).

One run per script, started once and shared by the tests below:

- ``early_gspo``: verl's early-2026 GSPO test script (GSPO loss, seq-mean-token-mean, token budgets,
  parameter and optimizer offload, the dapo manager, its own output folder and step count);
- ``early_reinforce_pp``: the early-2026 REINFORCE++ script (KL in the reward, a reference), with its
  rollout tensor parallelism of 2;
- ``current_grpo``: the current GRPO script (two data files each, balance_batch, the uv launcher key),
  with its rollout tensor parallelism of 2: both CPU ranks hold one vLLM engine (vLLM's external
  launcher over gloo; a GPU runs the same code over NCCL). This run also asks for the engine's
  log-probs and a table of validation generations, to check the sharded engine;
- ``fully_async_dapo``: verl's fully asynchronous DAPO script (``async_training.*``);
- ``v1_separate_async``: verl's v1 trainer in its separate_async mode (its test script)."""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.helpers import read_metrics, run_main
from tests.verl_scripts import GENERATED_AHEAD, RUN_ON_CPU, SCRIPTS, script_args

pytestmark = pytest.mark.slow
ACTOR = ["actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/lr", "critic/score/mean", "response_length/mean",
         "timing_s/gen", "timing_s/update_actor", "timing_s/update_weights"]
# generated ahead: the step waits for its chunk (wait_prev_gen) and syncs every trigger_parameter_sync_step (4) steps
AHEAD = {"timing_s/gen": "timing_s/wait_prev_gen", "timing_s/update_weights": "fully_async/queue_size"}


# and the weights go by broadcast (verl's nccl checkpoint engine: gloo on the CPU) to both ranks of the engine
TP_CHECKS = ["actor_rollout_ref.rollout.calculate_log_probs=true", "trainer.log_val_generations=2",
             "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"]


@pytest.fixture(scope="module")
def runs(reverse_data, tmp_path_factory):
    from grpo_dist.tasks.reverse import VOCAB
    from grpo_dist.utils.tiny_model import build_tiny_model
    from tests.e2e.conftest import epoch_data

    data = epoch_data(reverse_data, tmp_path_factory.mktemp("verl_script_data"))
    # two attention heads: one per rank of a tensor-parallel engine
    model = build_tiny_model(tmp_path_factory.mktemp("verl_script_model"), vocab=VOCAB, hidden_size=128, num_layers=2,
                             num_heads=2, num_kv_heads=2, head_dim=64, intermediate_size=128,
                             max_position_embeddings=256, seed=0)
    out = {}
    for name in RUN_ON_CPU:
        folder = tmp_path_factory.mktemp(f"verl_{name}") / "run"
        paths = dict(model=str(model), train=str(data["train"]), train2=str(data["small_train"]),
                     test=str(data["test"]), test2=str(data["test"]), out=str(folder))
        extra = TP_CHECKS if name == "current_grpo" else []
        t0 = time.time()
        proc = run_main(script_args(SCRIPTS[name], cpu=True, **paths) + extra)
        out[name] = (folder, proc, time.time() - t0)
        print(f"{name}: {out[name][2]:.0f} s")
    return out


@pytest.mark.parametrize("name", RUN_ON_CPU)
def test_the_script_trains_two_steps(runs, name):
    folder, proc, _ = runs[name]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    m = read_metrics(folder)
    assert [s for s in sorted(m) if s > 0] == [1, 2]
    keys = [AHEAD.get(k, k) for k in ACTOR] if name in GENERATED_AHEAD else ACTOR
    for step in (1, 2):
        missing = [k for k in keys if k not in m[step]]
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


def test_the_fully_async_script_generates_ahead_through_agent_loops_with_partial_rollouts(runs):
    """verl's fully asynchronous DAPO script (rollout.mode=async, partial_rollout=True, a sync every 4 steps):
    its chunks run through the agent loops on the rollout's own rank, generated ahead (step 2 trains a chunk
    sampled one update earlier), with partial rollouts on and verl's fully_async metrics."""
    folder, proc, _ = runs["fully_async_dapo"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "partial rollouts: a sync interrupts the responses being generated" in proc.stdout
    m = read_metrics(folder)
    assert [m[s]["training/sample_age"] for s in (1, 2)] == [0, 1]
    for s in (1, 2):
        assert "agent/model_token_ratio" in m[s] and "fully_async/partial/partial_ratio" in m[s]
        assert m[s]["fully_async/count/current_param_version"] == s - 1


def test_the_v1_separate_async_script_generates_ahead_on_its_standalone_rollout_devices(runs):
    """verl's v1 separate_async script (trainer.v1.trainer_mode=separate_async, one batch generated beyond the one
    trained, agent loops, bypass_mode=False): the rollout runs on its own rank (actor_rollout_ref.rollout.*), step 2
    trains a batch sampled one update earlier, partial rollouts are on, and the run warns that nothing corrects the
    stale samples' ratio (a run on the training rank's engine would sample every batch with the current weights)."""
    folder, proc, _ = runs["v1_separate_async"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "separate_async (verl's v1 trainer mode)" in proc.stdout
    assert "warning: samples are trained up to 1 update(s) after the weights that sampled them" in proc.stdout
    # its nccl checkpoint engine: the actor's rank 0 broadcasts to the standalone rollout rank (gloo on the CPU)
    assert json.loads((folder / "placement.json").read_text())["weight_sync"] == "broadcast"
    m = read_metrics(folder)
    assert [m[s]["training/sample_age"] for s in (1, 2)] == [0, 1]
    for s in (1, 2):
        assert "agent/model_token_ratio" in m[s] and "fully_async/partial/partial_ratio" in m[s]


def test_the_tensor_parallel_engine_holds_the_trainers_policy(runs):
    """current_grpo's rollout runs one engine over both ranks: the engine's log-probs of its samples
    equal the actor's, at step 2 after a weight sync into both shards (full tensors to each rank), which the
    actor's rank 0 broadcast to both engine ranks over a gloo group of the three (checkpoint_engine.backend=nccl)."""
    folder, proc, _ = runs["current_grpo"]
    assert proc.returncode == 0
    assert "tensor_model_parallel_size=2" in " ".join(proc.args)
    m = read_metrics(folder)
    for step in (1, 2):
        assert 0 <= m[step]["training/rollout_probs_diff_max"] < 1e-3, (step, m[step])
        assert m[step]["perf/weight_sync_bytes"] > 0
    placement = json.loads((folder / "placement.json").read_text())
    assert placement["rollout_rank_nodes"] and placement["weight_sync"] == "broadcast"
    assert "broadcast over gloo" in proc.stdout
    # validation samples come from the sharded engine too, before the first step and after the last
    rows = [json.loads(line) for line in (folder / "val_generations.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in rows}) == [0, 2] and all(len(r["input"]) > 0 for r in rows)
