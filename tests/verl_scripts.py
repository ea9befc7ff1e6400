"""verl's GRPO, GSPO, RLOO, REINFORCE++ and DAPO-style example scripts for FSDP text models, as the
command-line overrides they pass (verl as of early 2026 and its current layout); the PPO ones are in
``tests/verl_ppo_scripts.py``.

Each entry holds a script's overrides in verl's order with only the model and data paths made
placeholders (``{model}``, ``{train}``, ``{test}``, ``{train2}``, ``{test2}``, ``{out}``); nothing else
is changed: every override a script passes is accepted, tensor parallelism of the rollout, the
asynchronous agent-loop mode, vLLM's pass-through keys and the table of validation generations
included.

``cpu_sizes`` scales a script down for a CPU run (two ranks, so a script's rollout tensor parallelism
of 2 runs as shipped: both ranks hold one vLLM engine), and ``environment`` replaces what names this
machine's setup rather than the training (verl's ``uv`` launcher, the wandb logger): both are appended
(later overrides win, as on verl's command line).
"""

from __future__ import annotations

TP = "actor_rollout_ref.rollout.tensor_model_parallel_size"
ENVIRONMENT = ["trainer.logger=[console,file]", "trainer.progress_bar=false", "trainer.default_local_dir={out}"]
CPU_COMMON = ["data.train_batch_size=4", "data.max_prompt_length=64", "data.max_response_length=8",
              "actor_rollout_ref.actor.ppo_mini_batch_size=2", "trainer.n_gpus_per_node=2", "trainer.nnodes=1",
              "trainer.total_training_steps=2", "data.val_max_samples=16"]

# examples/grpo_trainer/run_qwen2-7b.sh, early 2026
EARLY_GRPO = {
    "overrides": [
        "algorithm.adv_estimator=grpo",
        "data.train_files={train}",
        "data.val_files={test}",
        "data.train_batch_size=1024",
        "data.max_prompt_length=512",
        "data.max_response_length=1024",
        "data.filter_overlong_prompts=True",
        "data.truncation=error",
        "actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.actor.ppo_mini_batch_size=256",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40",
        f"{TP}=2",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
        "actor_rollout_ref.rollout.n=5",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40",
        "actor_rollout_ref.ref.fsdp_config.param_offload=True",
        "algorithm.use_kl_in_reward=False",
        "trainer.critic_warmup=0",
        'trainer.logger=["console","wandb"]',
        "trainer.project_name=verl_grpo_example_gsm8k",
        "trainer.experiment_name=qwen2_7b_function_rm",
        "trainer.n_gpus_per_node=8",
        "trainer.nnodes=1",
        "trainer.save_freq=20",
        "trainer.test_freq=5",
        "trainer.total_epochs=15",
    ],
    "cpu_sizes": ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=5",
                  "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=5",
                  "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=5"],
}

# examples/gspo_trainer/test_gspo_3b_math.sh, early 2026 (its own output folder, and data.train_files as a list)
EARLY_GSPO = {
    "overrides": [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
        "data.train_files=['{train}']",
        "data.val_files=['{test}']",
        "data.shuffle=true",
        "data.prompt_key=prompt",
        "data.truncation=error",
        "data.filter_overlong_prompts=true",
        "data.return_raw_chat=True",
        "data.train_batch_size=512",
        "data.max_prompt_length=2048",
        "data.max_response_length=8192",
        "actor_rollout_ref.rollout.n=16",
        "algorithm.use_kl_in_reward=false",
        "algorithm.kl_ctrl.kl_coef=0.0",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.kl_loss_coef=0.0",
        "actor_rollout_ref.actor.clip_ratio_low=0.0003",
        "actor_rollout_ref.actor.clip_ratio_high=0.0004",
        "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=20480",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=30720",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=30720",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=true",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.05",
        "actor_rollout_ref.actor.optim.weight_decay=0.1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=128",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.fsdp_config.param_offload=true",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.grad_clip=1.0",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.8",
        f"{TP}=1",
        "actor_rollout_ref.rollout.enable_chunked_prefill=true",
        "actor_rollout_ref.rollout.max_num_batched_tokens=10240",
        "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.top_p=1.0",
        "actor_rollout_ref.rollout.top_k=-1",
        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
        "actor_rollout_ref.rollout.val_kwargs.top_p=0.7",
        "actor_rollout_ref.rollout.val_kwargs.top_k=-1",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
        "actor_rollout_ref.rollout.val_kwargs.n=1",
        "actor_rollout_ref.ref.fsdp_config.param_offload=true",
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size=1",
        "actor_rollout_ref.actor.entropy_checkpointing=true",
        "reward_model.reward_manager=dapo",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=false",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4096",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.log=false",
        "+reward_model.reward_kwargs.max_resp_len=8192",
        'trainer.logger=["console","wandb"]',
        "trainer.project_name=RL-GSPO",
        "trainer.experiment_name=gspo-epslow-0.0003-epshigh-0.0004-Qwen2.5-3B-Instruct-RL",
        "trainer.n_gpus_per_node=8",
        "trainer.nnodes=1",
        "trainer.val_before_train=false",
        "trainer.test_freq=10",
        "trainer.save_freq=10",
        "trainer.total_epochs=10",
        "trainer.total_training_steps=500",
        "trainer.default_local_dir={out}",
        "trainer.resume_mode=auto",
        "trainer.log_val_generations=2",
    ],
    "cpu_sizes": ["actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=96",
                  "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=96",
                  "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=96"],
}

# examples/reinforce_plus_plus_trainer/run_qwen2-7b_math_rf.sh, early 2026
EARLY_REINFORCE_PP = {
    "overrides": [
        "algorithm.adv_estimator=reinforce_plus_plus",
        "data.train_files=['{train}', '{train2}']",
        "data.val_files=['{test}', '{test2}']",
        "data.train_batch_size=1024",
        "data.max_prompt_length=1024",
        "data.max_response_length=1024",
        "data.filter_overlong_prompts=True",
        "data.truncation=error",
        "actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=3e-6",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.actor.ppo_mini_batch_size=1024",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=mse",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        f"{TP}=2",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
        "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.ref.fsdp_config.param_offload=True",
        "algorithm.use_kl_in_reward=True",
        "trainer.critic_warmup=0",
        'trainer.logger=["console","wandb"]',
        "trainer.project_name=verl_grpo_example_gsm8k",
        "trainer.experiment_name=qwen2_7b_function_rm",
        "trainer.n_gpus_per_node=16",
        "trainer.nnodes=1",
        "trainer.save_freq=-1",
        "trainer.test_freq=5",
        "trainer.total_epochs=15",
    ],
    "cpu_sizes": ["actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                  "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
                  "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4"],
}


def _qwen3_8b(adv: list[str], loss: list[str], sizes: dict[str, str], kl: list[str], trainer: list[str]) -> list[str]:
    """verl's current examples/{grpo,gspo,rloo}_trainer/run_qwen3_8b_fsdp.sh share their layout; what
    differs is passed in, in each script's order."""
    return [
        *adv,
        "data.train_files=['{train}', '{train2}']",
        "data.val_files=['{test}', '{test2}']",
        f"data.train_batch_size={sizes['batch']}",
        f"data.max_prompt_length={sizes['prompt']}",
        f"data.max_response_length={sizes['response']}",
        "data.filter_overlong_prompts=True",
        "data.truncation=error",
        "actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        *loss,
        "actor_rollout_ref.actor.optim.lr=1e-6",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={sizes['mini']}",
        "actor_rollout_ref.actor.use_dynamic_bsz=True",
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={sizes['tokens']}",
        *kl,
        "actor_rollout_ref.actor.entropy_coeff=0",
        f"actor_rollout_ref.actor.fsdp_config.param_offload={sizes['offload']}",
        f"actor_rollout_ref.actor.fsdp_config.optimizer_offload={sizes['offload']}",
        "actor_rollout_ref.rollout.name=vllm",
        f"{TP}=2",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
        f"actor_rollout_ref.rollout.n={sizes['n']}",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
        f"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={sizes['tokens']}",
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
        f"actor_rollout_ref.ref.log_prob_max_token_len_per_gpu={sizes['tokens']}",
        "actor_rollout_ref.ref.fsdp_config.param_offload=True",
        "trainer.balance_batch=True",
        *trainer,
        "ray_kwargs.ray_init.runtime_env.py_executable=uv -v run --frozen --all-packages --extra vllm --extra fsdp",
    ]


def _trainer(project: str, experiment: str, test_freq: int, epochs: int, warmup: bool = True) -> list[str]:
    return [*(["trainer.critic_warmup=0"] if warmup else []), 'trainer.logger=["console","wandb"]',
            f"trainer.project_name={project}", f"trainer.experiment_name={experiment}", "trainer.n_gpus_per_node=8",
            "trainer.nnodes=1", "trainer.save_freq=20", f"trainer.test_freq={test_freq}", f"trainer.total_epochs={epochs}"]


QWEN3_CPU = ["actor_rollout_ref.actor.ppo_max_token_len_per_gpu=96", "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=96",
             "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=96", "actor_rollout_ref.rollout.n=4",
             "ray_kwargs.ray_init.runtime_env.py_executable=null"]  # no uv launcher on this machine

# examples/grpo_trainer/run_qwen3_8b_fsdp.sh, current layout (its experiment name carries the launch date)
CURRENT_GRPO = {
    "overrides": _qwen3_8b(
        ["algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=False"], [],
        dict(batch=1024, prompt=1024, response=2048, mini=256, tokens=24576, offload="False", n=5),
        ["actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.001",
         "actor_rollout_ref.actor.kl_loss_type=low_var_kl"],
        _trainer("verl_grpo_gsm8k_math", "qwen3_8b_grpo_vllm_fsdp_20261124_0532", 5, 15, warmup=False)),
    "cpu_sizes": QWEN3_CPU,
}

# examples/gspo_trainer/run_qwen3_8b_fsdp.sh, current layout
CURRENT_GSPO = {
    "overrides": _qwen3_8b(
        ["algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=False"],
        ["actor_rollout_ref.actor.policy_loss.loss_mode=gspo", "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
         "actor_rollout_ref.actor.clip_ratio_low=3e-4", "actor_rollout_ref.actor.clip_ratio_high=4e-4",
         "actor_rollout_ref.actor.clip_ratio_c=10.0"],
        dict(batch=512, prompt=2048, response=8192, mini=128, tokens=20480, offload="True", n=16),
        ["actor_rollout_ref.actor.use_kl_loss=False"],
        _trainer("verl_gspo_gsm8k_math", "qwen3_8b_vllm_fsdp", 10, 10)),
    "cpu_sizes": QWEN3_CPU,
}

# examples/rloo_trainer/run_qwen3_8b_fsdp.sh, current layout
CURRENT_RLOO = {
    "overrides": _qwen3_8b(
        ["algorithm.adv_estimator=rloo", "algorithm.use_kl_in_reward=True", "algorithm.kl_penalty=kl",
         "algorithm.kl_ctrl.kl_coef=0.001"], [],
        dict(batch=1024, prompt=1024, response=2048, mini=256, tokens=24576, offload="False", n=5),
        ["actor_rollout_ref.actor.use_kl_loss=False"],
        _trainer("verl_rloo_gsm8k_math", "qwen3_8b_vllm_fsdp", 5, 15)),
    "cpu_sizes": QWEN3_CPU,
}

# tests/special_e2e/run_dapo.sh, early 2026 (verl's DAPO recipe keys: filter_groups, gen_batch_size,
# reward_model.overlong_buffer; NUM_GPUS=8, so mini 128 prompts, batch 256, generation batch 1024)
DAPO_RECIPE = {
    "overrides": [
        "data.train_files={train}",
        "data.val_files={test}",
        "reward_model.reward_manager=dapo",
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        "algorithm.kl_ctrl.kl_coef=0.0",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.kl_loss_coef=0.0",
        "actor_rollout_ref.actor.clip_ratio_low=0.2",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "data.max_prompt_length=1024",
        "data.max_response_length=2048",
        "reward_model.overlong_buffer.enable=True",
        "reward_model.overlong_buffer.len=128",
        "reward_model.overlong_buffer.penalty_factor=1.0",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        "data.train_batch_size=256",
        "data.gen_batch_size=1024",
        "algorithm.filter_groups.enable=True",
        "algorithm.filter_groups.metric=seq_reward",
        "algorithm.filter_groups.max_num_gen_batches=10",
        "actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.model.use_fused_kernels=True",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=128",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        f"{TP}=2",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.8",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.fsdp_config.param_offload=True",
        "trainer.logger=console",
        "trainer.project_name=verl-test",
        "trainer.experiment_name=qwen2.5-0.5b-instruct-dapo-minimal",
        "trainer.n_gpus_per_node=8",
        "trainer.nnodes=1",
        "trainer.save_freq=-1",
        "trainer.total_epochs=2",
        "trainer.resume_mode=disable",
        "trainer.val_before_train=False",
        "trainer.total_training_steps=1",
    ],
    "cpu_sizes": ["data.gen_batch_size=8", "actor_rollout_ref.rollout.n=4", "reward_model.overlong_buffer.len=4"],
}

# examples/gmpo_trainer/test_dapo_7b_math.sh, early 2026 (GMPO's geometric-mean loss on DAPO's settings:
# the model's context raised by override_config, Ulysses 4, hybrid FSDP over 32 of 64 devices)
DAPO_GMPO = {
    "overrides": [
        "data.train_files={train}",
        "data.val_files={test}",
        "data.prompt_key=prompt",
        "data.truncation='left'",
        "data.max_prompt_length=2048",
        "data.max_response_length=8192",
        "data.train_batch_size=512",
        "actor_rollout_ref.rollout.n=16",
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        "algorithm.kl_ctrl.kl_coef=0.0",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.kl_loss_coef=0.0",
        "actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean",
        "actor_rollout_ref.actor.clip_ratio_low=0.4",
        "actor_rollout_ref.actor.clip_ratio_high=0.4",
        "actor_rollout_ref.model.use_remove_padding=True",
        "+actor_rollout_ref.model.override_config.max_position_embeddings=32768",
        "actor_rollout_ref.actor.use_dynamic_bsz=True",
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=20480",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=30720",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=30720",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=10",
        "actor_rollout_ref.actor.optim.weight_decay=0.1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=32",
        "actor_rollout_ref.actor.fsdp_config.param_offload=True",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.grad_clip=1.0",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=4",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.80",
        f"{TP}=4",
        "actor_rollout_ref.rollout.enable_chunked_prefill=True",
        "actor_rollout_ref.rollout.max_num_batched_tokens=10240",
        "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.top_p=1.0",
        "actor_rollout_ref.rollout.top_k=-1",
        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
        "actor_rollout_ref.rollout.val_kwargs.top_p=0.7",
        "actor_rollout_ref.rollout.val_kwargs.top_k=-1",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
        "actor_rollout_ref.rollout.val_kwargs.n=1",
        "actor_rollout_ref.ref.fsdp_config.param_offload=True",
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size=4",
        "actor_rollout_ref.actor.fsdp_config.fsdp_size=32",
        "actor_rollout_ref.actor.checkpoint.save_contents=['model', 'optimizer', 'extra']",
        "reward_model.reward_manager=dapo",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4096",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.log=False",
        "+reward_model.reward_kwargs.max_resp_len=8192",
        'trainer.logger=["console","wandb"]',
        "trainer.project_name=DAPO",
        "trainer.experiment_name=DAPO-Qwen2.5-7b-MATH-0527a1",
        "trainer.n_gpus_per_node=8",
        "trainer.nnodes=8",
        "trainer.val_before_train=True",
        "trainer.test_freq=10",
        "trainer.save_freq=10",
        "trainer.total_epochs=10",
        "trainer.total_training_steps=200",
        "trainer.default_local_dir={out}",
        "trainer.resume_mode=auto",
        "trainer.log_val_generations=10",
    ],
    "cpu_sizes": ["actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=96",
                  "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=96",
                  "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=96",
                  "actor_rollout_ref.actor.fsdp_config.fsdp_size=-1", f"{TP}=2",
                  "reward_model.reward_kwargs.max_resp_len=8",
                  "reward_model.reward_kwargs.overlong_buffer_cfg.len=4"],
}

SCRIPTS = {
    "early_grpo": EARLY_GRPO,
    "early_gspo": EARLY_GSPO,
    "early_reinforce_pp": EARLY_REINFORCE_PP,
    "current_grpo": CURRENT_GRPO,
    "current_gspo": CURRENT_GSPO,
    "current_rloo": CURRENT_RLOO,
    "dapo_recipe": DAPO_RECIPE,
    "dapo_gmpo": DAPO_GMPO,
}
"""The scripts kept here; ``RUN_ON_CPU`` are the ones the end-to-end test trains for two steps."""

RUN_ON_CPU = ("early_gspo", "early_reinforce_pp", "current_grpo")


def script_args(script: dict, *, cpu: bool, **paths: str) -> list[str]:
    """The script's overrides with the paths filled in; with ``cpu`` the common CPU sizes, the script's
    own and the environment's appended."""
    args = [o.format(**paths) for o in script["overrides"]]
    if cpu:
        args += CPU_COMMON + list(script["cpu_sizes"]) + [o.format(**paths) for o in ENVIRONMENT]
    return args
