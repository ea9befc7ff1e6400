"""PPO with a critic end to end (real Ray, vLLM, FSDP2): learning on the embedded task, the critic's
metrics and warm-up, the adaptive KL controller's step, checkpoints with the critic, a critic that
dies, an exact resume, and verl's own PPO example scripts.

Four runs, each started once and shared by the tests that assert on it:

- ``ppo_run``: 4 steps of ``algorithm.adv_estimator=gae`` on the embedded task and base model (one
  rank), KL in the reward with the adaptive controller, 2 critic-only warm-up steps; checkpoints
  every 2 steps.
- ``killed_and_resumed``: the same command, whose model worker (the process holding actor, reference
  and critic) is killed once the step-2 checkpoint is published; then the same command again, to step 4.
- ``script_runs``: verl's PPO scripts (early 2026 and current layout) at CPU sizes, two steps each.
"""

from __future__ import annotations

import math
import re
import signal
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.e2e.helpers import read_metrics, run_main, start_main, worker_process
from tests.verl_ppo_scripts import SCRIPTS, script_args

pytestmark = pytest.mark.slow
VAL = "val-core/grpo_dist/reverse/acc/mean@1"
STEPS, RESPONSES, HORIZON, TARGET_KL = 4, 32 * 8, 1000, 0.05
CRITIC_METRICS = ["critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm", "critic/lr",
                  "critic/vf_explained_var", "critic/values/mean", "critic/values/max", "critic/values/min",
                  "critic/returns/mean", "critic/returns/max", "critic/returns/min", "timing_s/values",
                  "timing_s/update_critic", "timing_s/values/worker", "timing_s/update_critic/worker"]


def ppo_args(model: Path, data: dict, out: Path, steps: int = STEPS) -> list[str]:
    """PPO on the embedded task: 32 prompts x 8 responses per step, 2 mini-batches, one rank. The
    critic's lr is raised from verl's 1e-5 as the actor's is for the tiny model."""
    return [
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={data['train']}",
        f"data.val_files={data['test']}",
        "algorithm.adv_estimator=gae",
        "algorithm.use_kl_in_reward=true",
        "algorithm.kl_ctrl.type=adaptive",
        "algorithm.kl_ctrl.kl_coef=0.01",
        f"algorithm.kl_ctrl.target_kl={TARGET_KL}",
        f"algorithm.kl_ctrl.horizon={HORIZON}",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.checkpoint.contents=[model,optimizer,extra,hf_model]",
        "critic.optim.lr=1e-3",
        "critic.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
        "trainer.critic_warmup=2",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=4",
        "trainer.save_freq=2",
        "trainer.n_gpus_per_node=1",
        "trainer.device=cpu",
        "trainer.logger=[console,file]",
        "trainer.progress_bar=false",
        f"trainer.default_local_dir={out}",
    ]


@pytest.fixture(scope="module")
def ppo_run(embedded_model, reverse_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("ppo") / "run"
    t0 = time.time()
    proc = run_main(ppo_args(embedded_model, reverse_data, out))
    return out, proc, time.time() - t0


def test_ppo_learns_on_the_embedded_task(ppo_run):
    out, proc, _ = ppo_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    m = read_metrics(out)
    assert sorted(m) == list(range(STEPS + 1))
    # measured on the 2-core machine: 0.125 -> 0.344 at step 4 (0.418 at step 8 of a longer run; the runs are
    # deterministic: a 4-step run's metrics equal the first 4 steps of an 8-step run's, bit for bit)
    assert m[STEPS][VAL] > m[0][VAL] + 0.15, (m[0][VAL], m[STEPS][VAL])
    for step in range(1, STEPS + 1):
        missing = [k for k in CRITIC_METRICS if k not in m[step]]
        assert not missing, f"step {step} lacks {missing}"
        assert all(math.isfinite(m[step][k]) for k in CRITIC_METRICS)
        assert m[step]["critic/lr"] == pytest.approx(1e-3)
        assert m[step]["critic/values/min"] <= m[step]["critic/values/mean"] <= m[step]["critic/values/max"]


def test_the_critic_learns_to_explain_the_returns(ppo_run):
    """Its first values come from a new head (noise: the explained variance is negative); trained, they
    explain part of the returns' variance."""
    out, proc, _ = ppo_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    ev = [read_metrics(out)[s]["critic/vf_explained_var"] for s in range(1, STEPS + 1)]
    assert ev[0] < 0, ev
    assert sum(ev[-3:]) / 3 > ev[0] + 0.15, ev  # measured: -0.283 -> -0.004 (mean of steps 2-4; 0.10 of 6-8)
    assert max(ev[1:]) > ev[0]


def test_critic_warmup_trains_only_the_critic_first(ppo_run):
    """trainer.critic_warmup=2: step 1 updates the critic only (verl: the actor from step 2 on)."""
    out, proc, _ = ppo_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = read_metrics(out)
    assert "critic/vf_loss" in m[1] and "timing_s/update_critic" in m[1]
    for k in ("actor/pg_loss", "timing_s/update_actor", "timing_s/update_weights"):
        assert k not in m[1], k
        assert k in m[2], k


def test_adaptive_kl_controller_advances_by_the_responses(ppo_run):
    """coef' = coef * (1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon), n_steps = the step's
    responses (prompts x rollout.n), as verl's controller does."""
    out, proc, _ = ppo_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = read_metrics(out)
    for s in range(1, STEPS):
        kl, coef, nxt = m[s]["actor/reward_kl_penalty"], m[s]["actor/reward_kl_penalty_coeff"], m[s + 1]["actor/reward_kl_penalty_coeff"]
        err = max(-0.2, min(0.2, kl / TARGET_KL - 1))
        assert nxt == pytest.approx(coef * (1 + err * RESPONSES / HORIZON), rel=1e-9), s
    first, second = m[1]["actor/reward_kl_penalty_coeff"], m[2]["actor/reward_kl_penalty_coeff"]
    assert abs(second / first - 1) > 0.02  # by prompts (32 / 1000) it would move 8 x less


def test_checkpoints_hold_the_critic(ppo_run):
    from transformers import AutoConfig

    out, proc, _ = ppo_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    ckpt = out / "global_step_2" / "critic"
    assert (ckpt / "dcp").is_dir() and (ckpt / "extra_rank0.pt").exists()
    config = AutoConfig.from_pretrained(ckpt / "huggingface")
    assert config.num_labels == 1 and config.architectures[0].endswith("ForTokenClassification")


@pytest.fixture(scope="module")
def killed_and_resumed(ppo_run, embedded_model, reverse_data, tmp_path_factory):
    """The learning run's command in another folder: its model worker (the process holding actor,
    reference and critic) is killed once checkpoint 2 is published (the run must stop, naming the
    roles it held); then the same command to step 4."""
    out = tmp_path_factory.mktemp("ppo_killed") / "run"
    args = ppo_args(embedded_model, reverse_data, out)
    proc = start_main(args)
    try:
        deadline = time.time() + 600
        while time.time() < deadline and not (out / "global_step_2").exists():
            time.sleep(0.2)
            assert proc.poll() is None, proc.communicate()[1][-3000:]
        worker_process(out, "ray::ModelWorker").send_signal(signal.SIGKILL)
        t_kill = time.time()
        _, err = proc.communicate(timeout=180)
        stop_s = time.time() - t_kill
    finally:
        if proc.poll() is None:
            proc.kill()
    killed = {"returncode": proc.returncode, "stderr": err, "stop_s": stop_s,
              "checkpoints": sorted(p.name for p in out.glob("global_step_*"))}
    resumed = run_main(ppo_args(embedded_model, reverse_data, out, steps=4))
    return out, killed, resumed


def test_a_dead_model_worker_stops_the_run_naming_its_roles(killed_and_resumed):
    _, killed, _ = killed_and_resumed
    assert killed["returncode"] == 1, killed["stderr"][-3000:]
    err = killed["stderr"]
    # the first role called after the kill names itself, and the others its process held
    assert re.search(r"(actor|reference|critic) worker rank 0 failed", err), err[-3000:]
    assert "critic" in err and "rerun the same command" in err
    assert "Traceback" not in err
    assert killed["stop_s"] < 180


def test_resume_after_two_steps_reproduces_the_run(ppo_run, killed_and_resumed):
    full, proc, _ = ppo_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    part, killed, resumed = killed_and_resumed
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert killed["checkpoints"] == ["global_step_2"], killed["checkpoints"]
    assert "resumed from" in resumed.stdout and "global_step_2" in resumed.stdout
    a, b = read_metrics(full), read_metrics(part)
    assert sorted(b) == [0, 1, 2, 3, 4]
    compare = ["critic/score/mean", "critic/vf_loss", "critic/vf_explained_var", "critic/values/mean", "critic/grad_norm",
               "critic/vpred_mean", "actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/reward_kl_penalty",
               "actor/reward_kl_penalty_coeff", "critic/advantages/max", "response_length/mean"]
    for step in (3, 4):
        for k in compare:
            assert math.isclose(a[step][k], b[step][k], rel_tol=1e-4, abs_tol=1e-6), (step, k, a[step][k], b[step][k])
    assert abs(b[4][VAL] - a[4][VAL]) <= 1 / 256 + 1e-9  # greedy answers: at most one of 256 flips on rounding
    for role in ("huggingface", "critic/huggingface"):  # the policy and the value model after step 4
        wa = load_file(str(full / "global_step_4" / role / "model.safetensors"))
        wb = load_file(str(part / "global_step_4" / role / "model.safetensors"))
        assert set(wa) == set(wb)
        for k in wa:
            torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=1e-5)  # float rounding (measured: 1.7e-6 on 1 of 32768)


# ------------------------------------------------------------------------------ verl's PPO scripts
@pytest.fixture(scope="module")
def script_runs(tiny_model_dir, reverse_data, tmp_path_factory):
    """verl's PPO example scripts, module name and paths changed, sizes scaled down: two steps each."""
    from tests.e2e.conftest import epoch_data

    data = epoch_data(reverse_data, tmp_path_factory.mktemp("script_data"))
    paths = dict(model=str(tiny_model_dir), train=str(data["train"]), train2=str(data["small_train"]),
                 test=str(data["test"]), test2=str(data["test"]))
    runs = {}
    for name, script in sorted(SCRIPTS.items()):
        out = tmp_path_factory.mktemp(f"verl_{name}") / "run"
        plumbing = [f"trainer.default_local_dir={out}", "trainer.logger=[console,file]", "trainer.progress_bar=false"]
        t0 = time.time()
        runs[name] = (out, run_main(script_args(script, cpu=True, **paths) + plumbing), time.time() - t0)
    return runs


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_verl_ppo_script_trains_two_steps(script_runs, name):
    out, proc, _ = script_runs[name]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    m = read_metrics(out)
    assert [s for s in sorted(m) if s > 0] == [1, 2]
    for step in (1, 2):
        missing = [k for k in CRITIC_METRICS + ["actor/pg_loss", "actor/grad_norm"] if k not in m[step]]
        assert not missing, f"step {step} lacks {missing}"
    assert (out / "global_step_2" / "critic" / "dcp").is_dir()
    assert (out / "global_step_2" / "huggingface" / "model.safetensors").exists()
