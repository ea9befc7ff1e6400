"""verl's PPO example scripts for FSDP text models, as the command-line overrides they pass.

Each entry holds the overrides of one of verl's ``examples/ppo_trainer`` scripts, as verl ships it,
with only the model and data paths made placeholders (``{model}``, ``{train}``, ``{test}``); the
tests change the module name (``python -m grpo_dist.main``), fill in the paths, and for a CPU run
append the size overrides of ``cpu_sizes`` (later overrides win, as on verl's command line).

``left_out`` lists the script's overrides that this project does not accept; none are left out: the
``trainer.logger`` with wandb is accepted (a CPU run logs to the console and a file instead, as it has
no wandb account), and so are ``trainer.use_legacy_worker_impl`` (no effect here: one worker
implementation), ``trainer.balance_batch`` and ``ray_kwargs.ray_init.runtime_env.py_executable`` (handed
to Ray; a CPU run here sets it back to null: this machine has no ``uv`` launcher).

``actor_rollout_ref.rollout.tensor_model_parallel_size`` is kept and scaled to 1 with the other sizes:
one engine per rank is what runs on a CPU.
"""

from __future__ import annotations

# examples/ppo_trainer/run_deepseek7b_llm.sh, verl as of January 2026 (FSDP settings under
# critic.model.fsdp_config)
EARLY_2026 = {
    "overrides": [
        "algorithm.adv_estimator=gae",
        "data.train_files={train}",
        "data.val_files={test}",
        "data.train_batch_size=1024",
        "data.max_prompt_length=512",
        "data.max_response_length=512",
        "data.filter_overlong_prompts=True",
        "data.truncation=error",
        "actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.actor.ppo_mini_batch_size=256",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        "critic.optim.lr=1e-5",
        "critic.model.use_remove_padding=True",
        "critic.model.path={model}",
        "critic.model.enable_gradient_checkpointing=True",
        "critic.ppo_micro_batch_size_per_gpu=32",
        "critic.model.fsdp_config.param_offload=False",
        "critic.model.fsdp_config.optimizer_offload=False",
        "algorithm.use_kl_in_reward=False",
        "trainer.critic_warmup=0",
        'trainer.logger=["console","wandb"]',
        "trainer.project_name=verl_example_gsm8k",
        "trainer.experiment_name=deepseek_llm_7b_function_rm",
        "trainer.n_gpus_per_node=8",
        "trainer.nnodes=1",
        "trainer.save_freq=20",
        "trainer.test_freq=1",
        "trainer.use_legacy_worker_impl=auto",
        "trainer.total_epochs=15",
    ],
    "left_out": [],
    "cpu_sizes": [
        "data.train_batch_size=4",
        "data.max_prompt_length=64",
        "data.max_response_length=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "critic.ppo_micro_batch_size_per_gpu=2",
        "trainer.n_gpus_per_node=2",
        "trainer.total_training_steps=2",
    ],
}

# examples/ppo_trainer/run_qwen3_8b_fsdp.sh, verl's current layout (FSDP settings under critic.fsdp),
# with the script's default sizes; the two data sets are its GSM8K and MATH files
CURRENT = {
    "overrides": [
        "algorithm.adv_estimator=gae",
        "data.train_files=[{train},{train2}]",
        "data.val_files=[{test},{test2}]",
        "data.train_batch_size=1024",
        "data.max_prompt_length=1024",
        "data.max_response_length=2048",
        "data.filter_overlong_prompts=True",
        "data.truncation=error",
        "actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.ppo_mini_batch_size=256",
        "actor_rollout_ref.actor.use_dynamic_bsz=True",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24576",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
        "actor_rollout_ref.rollout.n=1",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=24576",
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=24576",
        "actor_rollout_ref.ref.fsdp_config.param_offload=True",
        "critic.model.path={model}",
        "critic.model.use_remove_padding=True",
        "critic.model.enable_gradient_checkpointing=True",
        "critic.optim.lr=1e-5",
        "critic.use_dynamic_bsz=True",
        "critic.ppo_max_token_len_per_gpu=24576",
        "critic.fsdp.param_offload=False",
        "critic.fsdp.optimizer_offload=False",
        "trainer.balance_batch=True",
        "trainer.critic_warmup=0",
        'trainer.logger=["console","wandb"]',
        "trainer.project_name=verl_ppo_gsm8k_math",
        "trainer.experiment_name=qwen3_8b_ppo_vllm_fsdp",
        "trainer.n_gpus_per_node=8",
        "trainer.nnodes=1",
        "trainer.save_freq=20",
        "trainer.test_freq=5",
        "trainer.total_epochs=15",
        "ray_kwargs.ray_init.runtime_env.py_executable=uv -v run --frozen --all-packages --extra vllm --extra fsdp",
    ],
    "left_out": [],
    "cpu_sizes": [
        "data.train_batch_size=4",
        "data.max_prompt_length=64",
        "data.max_response_length=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=48",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=48",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=48",
        "critic.ppo_max_token_len_per_gpu=48",
        "trainer.n_gpus_per_node=2",
        "trainer.total_training_steps=2",
        "ray_kwargs.ray_init.runtime_env.py_executable=null",  # this machine has no uv launcher
    ],
}

SCRIPTS = {"early_2026": EARLY_2026, "current": CURRENT}


def script_args(script: dict, *, cpu: bool, **paths: str) -> list[str]:
    """The script's overrides with the paths filled in; with ``cpu`` its CPU sizes appended."""
    return [o.format(**paths) for o in script["overrides"]] + (list(script["cpu_sizes"]) if cpu else [])


# ---------------------------------------------------------------------------------------------------
# PPO with a learned reward model. ``{rm}`` is the reward model's folder. Kept apart from SCRIPTS (whose
# tests are about the critic's keys); their tests are in tests/unit/test_reward_model_config.py.

# examples/ppo_trainer/run_qwen2-7b_rm_legacy.sh, verl as of December 2025: the FSDP reward-model worker
RM_LEGACY = {
    "overrides": [
        "algorithm.adv_estimator=gae",
        "data.train_files=[{train},{train2}]",
        "data.val_files=[{test},{test2}]",
        "data.train_batch_size=1024",
        "data.max_prompt_length=1024",
        "data.max_response_length=2048",
        "data.filter_overlong_prompts=True",
        "data.truncation=error",
        "data.return_raw_chat=True",
        "actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=256",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
        "critic.optim.lr=1e-5",
        "critic.model.use_remove_padding=True",
        "critic.optim.lr_warmup_steps_ratio=0.05",
        "critic.model.path={model}",
        "critic.model.enable_gradient_checkpointing=True",
        "critic.ppo_micro_batch_size_per_gpu=32",
        "critic.model.fsdp_config.param_offload=False",
        "critic.model.fsdp_config.optimizer_offload=False",
        "reward_model.enable=True",
        "reward_model.model.path={rm}",
        "reward_model.use_reward_loop=False",
        "reward_model.model.use_remove_padding=True",
        "reward_model.model.fsdp_config.param_offload=True",
        "reward_model.micro_batch_size_per_gpu=32",
        "algorithm.use_kl_in_reward=False",
        "trainer.critic_warmup=0",
        "trainer.project_name=verl_test_qwen25_rm",
        "trainer.val_before_train=True",
        "trainer.experiment_name=legacy_fsdp_reward_model",
        "trainer.n_gpus_per_node=8",
        "trainer.nnodes=1",
        "trainer.save_freq=-1",
        "trainer.test_freq=10",
        "trainer.total_epochs=15",
    ],
    "left_out": ['trainer.logger=["console","wandb"]'],
    "cpu_sizes": [
        "data.train_batch_size=4",
        "data.max_prompt_length=64",
        "data.max_response_length=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "critic.ppo_micro_batch_size_per_gpu=2",
        "reward_model.micro_batch_size_per_gpu=2",
        "trainer.n_gpus_per_node=2",
        "trainer.total_training_steps=2",
    ],
}

# examples/ppo_trainer/run_qwen2-7b_rm.sh, verl as of January 2026: the reward model served by verl's
# reward loop (its reward_model.rollout.* engine settings are accepted and have no effect here)
RM_REWARD_LOOP = {
    "overrides": [
        "algorithm.adv_estimator=gae",
        "data.train_files=[{train},{train2}]",
        "data.val_files=[{test},{test2}]",
        "data.train_batch_size=1024",
        "data.max_prompt_length=1024",
        "data.max_response_length=512",
        "data.filter_overlong_prompts=True",
        "data.truncation=error",
        "data.return_raw_chat=True",
        "actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=256",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
        "critic.optim.lr=1e-5",
        "critic.model.use_remove_padding=True",
        "critic.optim.lr_warmup_steps_ratio=0.05",
        "critic.model.path={model}",
        "critic.model.enable_gradient_checkpointing=True",
        "critic.ppo_micro_batch_size_per_gpu=32",
        "critic.model.fsdp_config.param_offload=False",
        "critic.model.fsdp_config.optimizer_offload=False",
        "reward_model.enable=True",
        "reward_model.model.path={rm}",
        "reward_model.use_reward_loop=True",
        "reward_model.rollout.name=vllm",
        "reward_model.rollout.gpu_memory_utilization=0.8",
        "reward_model.rollout.tensor_model_parallel_size=1",
        "reward_model.rollout.prompt_length=2048",
        "reward_model.rollout.response_length=1024",
        "reward_model.num_workers=8",
        "algorithm.use_kl_in_reward=False",
        "trainer.critic_warmup=0",
        "trainer.project_name=verl_example",
        "trainer.val_before_train=False",
        "trainer.experiment_name=Qwen2-7B-Instruct_hybrid_rm",
        "trainer.n_gpus_per_node=8",
        "trainer.nnodes=1",
        "trainer.save_freq=20",
        "trainer.test_freq=5",
        "trainer.total_epochs=15",
    ],
    "left_out": ['trainer.logger=["console","wandb"]'],
    "cpu_sizes": RM_LEGACY["cpu_sizes"],
}

RM_SCRIPTS = {"rm_legacy": RM_LEGACY, "rm_reward_loop": RM_REWARD_LOOP}
