"""verl's gsm8k multi-turn launch scripts (verl as of early 2026, examples/sglang_multiturn/), as the
command line they pass, and the files they read.

``config/`` holds verl's ``examples/sglang_multiturn/config/gsm8k_multiturn_grpo.yaml`` (``hydra.searchpath``
on verl's config folder, ``defaults: [ppo_trainer, _self_]``, ``multi_turn.enable``) and
``config/tool_config/gsm8k_tool_config.yaml`` (``verl.tools.gsm8k_tool.Gsm8kTool``, schema
``calc_gsm8k_reward(answer: str)``), both as verl ships them.

Each script keeps its overrides in verl's order with only these made placeholders: ``{config_path}``
(``$PROJECT_DIR/examples/sglang_multiturn/config``), ``{tool_config}`` (the tool config under it),
``{model}``, ``{train}``, ``{test}``, ``{out}``, and ``{use_kl_loss}``: the vLLM script passes
``actor_rollout_ref.actor.use_kl_loss=${use_kl_loss}`` and never sets that shell variable, so as shipped
the value is empty. The tool-agent script's ``rollout.name=sglang`` is ``vllm`` here (the one engine built).

``CPU_SIZES`` scales a script down for a CPU run and ``ENVIRONMENT`` replaces what names this machine's
setup rather than the training (the loggers); both are appended (later overrides win, as on verl's
command line). Both scripts ask for a rollout tensor parallelism of 2, which they get: agent loops run on
tensor-parallel engines in lock step (grpo_dist/rollout/async_server.py).
"""

from __future__ import annotations

from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent / "config"
TOOL_CONFIG = CONFIG_DIR / "tool_config" / "gsm8k_tool_config.yaml"
CONFIG_NAME = "gsm8k_multiturn_grpo"
TP = "actor_rollout_ref.rollout.tensor_model_parallel_size"
ENVIRONMENT = ["trainer.logger=[console,file]", "trainer.progress_bar=false", "trainer.default_local_dir={out}"]
CPU_SIZES = ["data.train_batch_size=4", "data.max_prompt_length=144", "data.max_response_length=32",
             "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
             "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
             "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4", "actor_rollout_ref.rollout.n=2",
             "actor_rollout_ref.rollout.gpu_memory_utilization=0.5", "trainer.n_gpus_per_node=2", "trainer.nnodes=1",
             "trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.val_before_train=false",
             "actor_rollout_ref.model.enable_gradient_checkpointing=false", "trainer.device=cpu"]

# examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn_vllm_fsdp.sh, early 2026 ("run on Ascend 910";
# TRAIN_BATCH_SIZE=32, MICRO_BATCH_SIZE=8)
VLLM_FSDP = {
    "config_path": "{config_path}",
    "config_name": CONFIG_NAME,
    "overrides": [
        "actor_rollout_ref.rollout.name=vllm",
        "algorithm.adv_estimator=grpo",
        "data.train_batch_size=32",
        "data.max_prompt_length=1024",
        "data.max_response_length=1024",
        "data.filter_overlong_prompts=True",
        "data.truncation=error",
        "data.return_raw_chat=True",
        "actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.ppo_mini_batch_size=32",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.use_kl_loss={use_kl_loss}",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        f"{TP}=2",
        "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.9",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
        "algorithm.use_kl_in_reward=False",
        "trainer.critic_warmup=0",
        "trainer.project_name=gsm8k_async_rl",
        "trainer.experiment_name=qwen2.5-3b_function_rm-gsm8k-sgl-multi-w-tool-verify-n16",
        "trainer.n_gpus_per_node=16",
        "trainer.nnodes=1",
        "trainer.save_freq=-1",
        "trainer.test_freq=20",
        'trainer.logger=["console"]',
        "data.train_files={train}",
        "data.val_files={test}",
        "trainer.total_epochs=15",
        "actor_rollout_ref.rollout.trace.token2text=False",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.enforce_eager=True",
        "actor_rollout_ref.actor.use_torch_compile=False",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path={tool_config}",
        "actor_rollout_ref.rollout.free_cache_engine=True",
    ],
}

# examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_tool_agent_mlflow.sh, early 2026 ("run on 8xH100")
TOOL_AGENT_MLFLOW = {
    "config_path": "{config_path}",
    "config_name": CONFIG_NAME,
    "overrides": [
        "algorithm.adv_estimator=grpo",
        "data.train_batch_size=256",
        "data.max_prompt_length=1024",
        "data.max_response_length=1024",
        "data.filter_overlong_prompts=True",
        "data.truncation=error",
        "data.return_raw_chat=True",
        "actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.actor.ppo_mini_batch_size=256",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
        f"{TP}=2",
        "actor_rollout_ref.rollout.name=vllm",  # sglang in verl's script
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.5",
        "actor_rollout_ref.rollout.n=16",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32",
        "actor_rollout_ref.ref.fsdp_config.param_offload=True",
        "actor_rollout_ref.rollout.trace.backend=mlflow",
        "actor_rollout_ref.rollout.trace.token2text=True",
        "algorithm.use_kl_in_reward=False",
        "trainer.critic_warmup=0",
        'trainer.logger=["console","mlflow"]',
        "trainer.project_name=gsm8k_tool-agent",
        "trainer.experiment_name=qwen2.5-3b_function_rm-gsm8k-sgl-tool-agent-verify-n16",
        "trainer.n_gpus_per_node=8",
        "trainer.nnodes=1",
        "trainer.save_freq=-1",
        "trainer.test_freq=20",
        "trainer.total_training_steps=2",
        "data.train_files={train}",
        "data.val_files={test}",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path={tool_config}",
        "trainer.total_epochs=15",
    ],
}

SCRIPTS = {"vllm_fsdp": VLLM_FSDP, "tool_agent_mlflow": TOOL_AGENT_MLFLOW}


def fill(script: dict, **paths: str) -> list[str]:
    """The script's overrides with the placeholders filled in (``config_path`` and ``tool_config`` default to
    the files kept here, ``use_kl_loss`` to empty, as the script leaves it)."""
    values = {"config_path": str(CONFIG_DIR), "tool_config": str(TOOL_CONFIG), "use_kl_loss": "", **paths}
    return [o.format(**values) for o in script["overrides"]]


def script_argv(script: dict, *, cpu: bool, **paths: str) -> list[str]:
    """The script's command line after the module name: ``--config-path``, ``--config-name``, its overrides;
    with ``cpu`` the CPU sizes and the environment appended."""
    values = {"config_path": str(CONFIG_DIR), **paths}
    args = [f"--config-path={script['config_path'].format(**values)}", f"--config-name={script['config_name']}",
            *fill(script, **paths)]
    if cpu:
        args += CPU_SIZES + [o.format(**paths) for o in ENVIRONMENT]
    return args
