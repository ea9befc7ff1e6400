"""A real pretrained model through `python -m grpo_dist.main`: SmolLM2-135M-Instruct
(``builtin:smollm2-135m-instruct``), two training steps with responses cut short.

Its own module, so that the engines and the actor that tests/e2e/test_smollm2.py holds for its
whole module are gone (and their memory with them) before this run starts its own.
"""

from __future__ import annotations

import pytest

from tests.e2e.helpers import read_metrics, run_main
from tests.e2e.test_smollm2 import PROBS_DIFF_MAX_BOUND

pytestmark = pytest.mark.slow


def test_two_training_steps_report_cut_responses_once(smollm2_dir, tmp_path, larger_data):
    """`python -m grpo_dist.main` on the real model with responses cut short (8 tokens, where the model's
    answers are longer), handled as verl handles them: a response that reaches the limit without its EOS
    is kept as it is (every token in the response mask), its tokens are decoded with
    ``skip_special_tokens=True`` and scored like any other (verl's reward managers add no penalty of their
    own), and ``response_length/clip_ratio`` is verl's ``mean(response_length == max_response_length)``
    (``compute_data_metrics``). The warning naming data.max_response_length is printed once although
    both steps are cut, and the rollout-vs-actor gap of both steps (the second after a weight sync of the
    tied embeddings) stays within the bound."""
    out = tmp_path / "run"
    proc = run_main([
        "actor_rollout_ref.model.path=builtin:smollm2-135m-instruct",
        f"data.train_files={larger_data['train']}", "data.val_files=null",
        "data.train_batch_size=2", "data.max_prompt_length=64", "data.max_response_length=8",
        "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.calculate_log_probs=true",
        "actor_rollout_ref.actor.ppo_mini_batch_size=1", "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        "trainer.n_gpus_per_node=1", "trainer.device=cpu", "trainer.total_training_steps=2",
        "trainer.logger=[console,file]", "trainer.progress_bar=false", "trainer.save_freq=-1",
        f"trainer.default_local_dir={out}",
    ], timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = read_metrics(out)
    for step in (1, 2):
        assert metrics[step]["response_length/clip_ratio"] > 0.5
        assert metrics[step]["response_length/max"] == 8
        assert metrics[step]["training/rollout_probs_diff_max"] < PROBS_DIFF_MAX_BOUND
    assert proc.stdout.count("data.max_response_length = 8 tokens") == 1
