"""``trainer.*``: the training loop (length, loggers, placement over nodes and devices, validation,
checkpoints and resume, worker deadlines, preemption), and the resolver behind the default of
``trainer.total_training_steps``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from omegaconf import OmegaConf

from grpo_dist.config.fields import F, NoOp, S
from grpo_dist.config.sections.engine import off_feature
from grpo_dist.config.sections.features import TrainerV1Config
from grpo_dist.tasks.reverse import DEFAULT_JOB_STEPS


#: The ``trainer`` fields naming folders of generation dumps (:mod:`grpo_dist.trainer.dumps`): made absolute like
#: the output folder, made at start, and never shared by sweep jobs.
DUMP_DIR_FIELDS = ("rollout_data_dir", "validation_data_dir")


@dataclass
class TrainerConfig:
    total_epochs: int = F(30, "passes over the training data (total_training_steps, when set, wins)")
    total_training_steps: Optional[int] = F(
        "${grpo_dist.default_job_steps:${data.train_files},${trainer.total_epochs}}",
        "training steps; null = total_epochs x steps per epoch (verl's rule); left unset it is null, except for the "
        f"no-argument job (the embedded task with total_epochs left at 30), which runs {DEFAULT_JOB_STEPS} steps",
    )
    project_name: str = F("grpo_dist", "project name (loggers, default output folder)")
    experiment_name: str = F("reverse_tiny", "experiment name (loggers, default output folder)")
    logger: Any = F(
        ["console", "file"],
        "loggers, a list or one name: console | file (metrics.jsonl) | tensorboard | wandb | mlflow",
    )
    log_val_generations: int = F(
        0,
        "log this many validation samples (input, output, score; the same fixed-seed choice every time) as a table: "
        "console, file (val_generations.jsonl), tensorboard, wandb, mlflow; 0 = none",
    )
    nnodes: int = F(1, "nodes in the Ray cluster used for training")
    n_gpus_per_node: int = F(1, "devices per node (with trainer.device=cpu: ranks per node)")
    device: str = F("auto", "cuda | cpu | auto (cuda when available)")
    save_freq: int = F(-1, "save a checkpoint every N steps and at the last step (-1 = only at the last step, "
                               "which the quick start's resume and final model need; verl's -1 saves none)")
    test_freq: int = F(10, "validate every N steps (-1 = never during training)")
    val_before_train: bool = F(True, "validate before the first step")
    val_only: bool = F(False, "validate (the resumed checkpoint, else the initial model), log the scores and exit without training")
    resume_mode: str = F("auto", "auto (latest checkpoint in default_local_dir) | disable | resume_path")
    resume_from_path: Optional[str] = F(None, "checkpoint folder (global_step_N) for resume_mode=resume_path")
    default_local_dir: str = F(
        "checkpoints/${trainer.project_name}/${trainer.experiment_name}",
        "output folder: checkpoints, metrics.jsonl, report",
    )
    max_actor_ckpt_to_keep: Optional[int] = F(None, "keep only the newest N checkpoints; null = all")
    seed: int = F(1, "seed of the critic's new value head")
    progress_bar: bool = F(True, "show a progress bar over training steps")
    log_level: str = F(
        "quiet",
        "what the console shows besides grpo_dist's own lines: quiet = nothing (the workers' output and the "
        "libraries' logs go to <default_local_dir>/logs/run.log, named at start) | warning | info | debug = the "
        "libraries' logs from that level up, on the console (no log file); the environment variable "
        "GRPO_DIST_LOG_LEVEL, when set, wins",
    )
    critic_warmup: int = F(
        0,
        "train only the critic until this step: the actor updates from step critic_warmup on (steps counted from 1, "
        "as verl does; 0 and 1: from the first step)",
    )
    worker_call_timeout_s: float = F(
        1800.0,
        "deadline of the first call of each worker method (it may load a model, compile, warm up); a worker that "
        "misses a deadline stops the run naming it (a frozen or deadlocked process); later calls: "
        "worker_call_timeout_min_s / _factor; 0 = no deadlines at all",
    )
    worker_call_timeout_factor: float = F(
        10.0, "a later call of a worker method may take this many times the slowest such call so far (at least "
        "worker_call_timeout_min_s)")
    worker_call_timeout_min_s: float = F(
        60.0, "the shortest deadline of a later call of a worker method: how long a worker may not answer a fast "
        "call (a busy machine, a pause) before it is named as frozen")
    preemption_grace_s: float = F(
        300.0,
        "seconds between SIGTERM and the scheduler's kill (Slurm: --signal=B:TERM@N; Kubernetes: "
        "terminationGracePeriodSeconds): SIGTERM saves a checkpoint at the next step boundary when the rest of the "
        "step and the save fit in it (estimated from the slowest step and save so far), else the run stops at once "
        "saying where the newest checkpoint is; 0 = no limit (always finish the step and save)",
    )
    balance_batch: bool = F(
        True,
        "reorder rows inside each mini-batch so that every data-parallel rank gets a similar token count "
        "(the update is unchanged: rows never move across mini-batches); logs global_seqlen/*",
    )
    max_consecutive_nonfinite_steps: int = F(
        3, "stop (after saving a checkpoint) when this many steps in a row had a non-finite loss or gradient norm; 0 = never"
    )
    max_critic_ckpt_to_keep: Optional[int] = F(None, "keep only the newest N critic checkpoints; null = all", NoOp(
        "a checkpoint folder holds every role, so trainer.max_actor_ckpt_to_keep decides how many are kept for the "
        "critic too", values=(None,), same_as="trainer.max_actor_ckpt_to_keep",
        otherwise="set trainer.max_actor_ckpt_to_keep (it keeps whole checkpoints)"))
    default_hdfs_dir: Optional[str] = F(None, "copy checkpoints to this HDFS folder", off_feature(
        "copying checkpoints to HDFS", "put trainer.default_local_dir on a file system every node sees"))
    del_local_ckpt_after_load: bool = F(False, "delete the local checkpoint after resuming from it", off_feature(
        "deleting checkpoints after resume", "leave it false"))
    rollout_data_dir: Optional[str] = F(
        None, "write the responses of each training step to <this folder>/<step>.jsonl (input, output, gts, score, "
        "step and the reward function's extra values, as verl); null = none")
    validation_data_dir: Optional[str] = F(
        None, "write the responses of each validation to <this folder>/<step>.jsonl (as rollout_data_dir; step 0: "
        "before training); null = none")
    esi_redundant_time: float = F(0, "seconds kept free before an elastic instance expires", NoOp(
        "read only on Volcano Engine's elastic instances (their expiry time comes from the environment)"))
    ray_wait_register_center_timeout: int = F(300, "seconds to wait for verl's worker registry", NoOp(
        "grpo_dist has no worker registry: worker start-up and calls are bounded by trainer.worker_call_timeout_s"))
    use_legacy_worker_impl: str = F("auto", "verl's choice between its worker implementations (early 2026)", NoOp(
        "grpo_dist has one worker implementation per role"))
    use_v1: bool = F(True, "run verl's v1 trainer loop: its trainer.v1.* keys are read (false: verl's legacy loop, "
                           "synchronous)")
    v1: TrainerV1Config = S(TrainerV1Config, "verl's v1 trainer modes: sync, or separate_async (fully asynchronous "
                            "training on the rollout's own devices)")


DEFAULT_TRAIN_FILES = "builtin:reverse/train"
VERL_TOTAL_EPOCHS = 30


def _default_job_steps(train_files: Any, total_epochs: Any) -> Optional[int]:
    """``trainer.total_training_steps`` left unset: null (verl's rule, steps from epochs), except for the
    no-argument job, the embedded task with the default epochs, whose length is the task's own."""
    if str(train_files) == DEFAULT_TRAIN_FILES and total_epochs == VERL_TOTAL_EPOCHS:
        return DEFAULT_JOB_STEPS
    return None


OmegaConf.register_new_resolver("grpo_dist.default_job_steps", _default_job_steps, replace=True)
