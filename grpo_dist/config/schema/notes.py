"""What the fields cannot carry themselves, for the generated reference (no key subtree of its own):
the help of interpolated keys, and the keys whose default differs from verl's, with why."""

from __future__ import annotations

from grpo_dist.tasks.reverse import DEFAULT_JOB_STEPS


# Interpolated keys have no help metadata of their own (II cannot carry it); documented here.
INTERPOLATED_HELP = {
    "actor_rollout_ref.rollout.prompt_length": "longest prompt the engine sees (= data.max_prompt_length)",
    "actor_rollout_ref.rollout.response_length": "longest response the engine samples (= data.max_response_length)",
    "reward_model.reward_kwargs.max_resp_len": "the length the overlong penalty reaches penalty_factor at (= data.max_response_length)",
    "reward.reward_kwargs.max_resp_len": "the length the overlong penalty reaches penalty_factor at (= data.max_response_length)",
}

# Keys whose default differs from verl's, and why. Shown in docs/configuration.md.
VERL_DEFAULT_DIFFERENCES = {
    "data.train_files": "the embedded task, so that the no-argument run works offline",
    "data.val_files": "the embedded task's test split",
    "data.max_prompt_length": "sized for the embedded task (verl: 512)",
    "data.max_response_length": "sized for the embedded task (verl: 512)",
    "data.train_batch_size": "sized for a 2-core CPU (verl: 1024)",
    "actor_rollout_ref.model.path": "the embedded tiny model",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "sized for the embedded task (verl: 256)",
    "actor_rollout_ref.actor.use_kl_loss": "on, as in the GRPO recipe (verl: false)",
    "actor_rollout_ref.actor.optim.lr": "a tiny model needs a large step (verl: 1e-6)",
    "actor_rollout_ref.actor.strategy": "FSDP2 is the only backend (verl: fsdp)",
    "critic.strategy": "FSDP2 is the only backend (verl: fsdp)",
    "reward_model.strategy": "FSDP2 is the only backend (verl: fsdp)",
    "critic.model.path": "the actor's model (verl: ~/models/deepseek-llm-7b-chat)",
    "actor_rollout_ref.model.enable_gradient_checkpointing": (
        "auto: on only when the estimated activations would not fit (verl: true); the update is the same either way, "
        "only memory and time differ; set true for verl's behaviour"
    ),
    "critic.model.enable_gradient_checkpointing": "auto, as the actor's (verl: true)",
    "actor_rollout_ref.rollout.n": "a GRPO group (verl: 1)",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "one rank per engine (verl: 2)",
    "algorithm.adv_estimator": "GRPO (verl: gae)",
    "trainer.device": "auto-detect (verl: cuda)",
    "trainer.n_gpus_per_node": "one device (verl: 8)",
    "rollout.n_gpus_per_node": "one device (verl's one-step-off recipe: 8)",
    "trainer.logger": "console and metrics.jsonl (verl: console, wandb)",
    "trainer.total_training_steps": f"null, as verl's, except for the no-argument job (embedded task, total_epochs left at 30): {DEFAULT_JOB_STEPS} steps",
    "data.seed": "a fixed seed, so that runs repeat (verl: null, a fresh seed)",
    "actor_rollout_ref.ref.fsdp_config.dtype": "the actor's compute dtype (verl: bfloat16)",
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes": "rollout.update_weights_bucket_megabytes, 512 (verl: 2048)",
    "reward.num_workers": "null: reward_model.num_workers, 2 scoring processes (verl: 8)",
    "reward.reward_manager.name": "null: reward_model.reward_manager, naive (verl: naive)",
    "reward_manager.name": "null: reward_model.reward_manager (verl: the same, by interpolation)",
    "trainer.test_freq": "validate every 10 steps (verl: -1)",
    "algorithm.filter_groups.metric": "acc, used once filter_groups is switched on (verl: null)",
    "custom_reward_function.name": "compute_score (verl's current layout: null, read as compute_score)",
    "trainer.project_name": "(verl: verl_examples)",
    "trainer.experiment_name": "(verl: gsm8k)",
}
