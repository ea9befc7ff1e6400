"""``data.*``: the prompt data (files, columns, lengths, batch sizes, order), and verl's data keys
that are not read here (multimodal columns, loading speed, custom dataset classes, tools)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

from grpo_dist.config.fields import F, NoOp, Refused, S
from grpo_dist.config.sections.engine import off_feature
from grpo_dist.config.sections.features import CustomClassConfig, SamplerClassConfig, custom_class_section
from grpo_dist.data import TRUNCATION_MODES


BATCH_CONTENTS = NoOp("grpo_dist's batch always carries what its stages read (token ids, masks, the reward columns)")
DATA_SPEED = NoOp("prompts are read and tokenized once in the driver; this changes only verl's loading speed")
TEXT_ONLY = NoOp("grpo_dist trains text models: image, video and audio columns are not read")


@dataclass
class DataConfig:
    tokenizer: Optional[str] = F(None, "tokenizer path; null = actor_rollout_ref.model.tokenizer_path, else the model's own")
    train_files: Any = F(
        "builtin:reverse/train",  # DEFAULT_TRAIN_FILES (trainer.py)
        "training prompts: a parquet/jsonl path or a list of them, in verl's row format ('builtin:' = embedded task)",
    )
    val_files: Any = F(
        "builtin:reverse/test",
        "validation prompts: a parquet/jsonl path or list; null = no validation",
    )
    prompt_key: str = F("prompt", "column holding the prompt (a list of chat messages, or a string)")
    reward_fn_key: str = F(
        "data_source",
        "column handed to the reward function as its data_source (and so choosing the rule-based scorer); "
        "validation metrics are still grouped by the data_source column",
    )
    max_prompt_length: int = F(64, "longest prompt in tokens (after the chat template)")
    max_response_length: int = F(24, "longest response in tokens")
    train_batch_size: int = F(32, "prompts per training step; responses per step = train_batch_size x rollout.n")
    gen_batch_size: Optional[int] = F(
        None, "prompts per generation batch of dynamic sampling (algorithm.filter_groups); null = train_batch_size; unused without it"
    )
    val_batch_size: Optional[int] = F(None, "prompts per validation batch; null = the whole validation set at once")
    shuffle: bool = F(True, "shuffle the training prompts every epoch (seeded by data.seed)")
    seed: Optional[int] = F(42, "seed of the prompt shuffling (and of train_max_samples' choice); null = a fresh seed, kept with checkpoints")
    filter_overlong_prompts: bool = F(False, "drop prompts longer than max_prompt_length instead of applying truncation")
    truncation: str = F("error", "prompt longer than max_prompt_length: " + " | ".join(TRUNCATION_MODES))
    skip_bad_rows: bool = F(False, "skip malformed data rows (and count them) instead of stopping with an error")
    return_raw_chat: bool = F(True, "keep the raw chat messages in the batch", BATCH_CONTENTS)
    return_full_prompt: bool = F(False, "keep the templated prompt text in the batch", BATCH_CONTENTS)
    return_raw_input_ids: bool = F(False, "keep the prompt ids before the chat template", BATCH_CONTENTS)
    train_max_samples: int = F(-1, "use at most this many training rows (a seeded random choice when data.shuffle); -1 = all")
    val_max_samples: int = F(-1, "use at most this many validation rows (chosen as for train_max_samples); -1 = all")
    trust_remote_code: bool = F(False, "allow the tokenizer's own Python code to run (as does actor_rollout_ref.model.trust_remote_code)")
    apply_chat_template_kwargs: Dict[str, Any] = F(
        {}, "extra arguments of the tokenizer's apply_chat_template (e.g. +data.apply_chat_template_kwargs.enable_thinking=false)"
    )
    validation_shuffle: bool = F(False, "shuffle the validation prompts", NoOp(
        "validation scores every prompt and reports means, which do not depend on the order"))
    dataloader_num_workers: int = F(8, "processes loading batches", DATA_SPEED)
    filter_overlong_prompts_workers: int = F(1, "processes filtering long prompts", DATA_SPEED)
    use_shm: bool = F(False, "copy the data files to shared memory first", DATA_SPEED)
    image_key: str = F("images", "column of a row's images", TEXT_ONLY)
    video_key: str = F("videos", "column of a row's videos", TEXT_ONLY)
    audio_key: str = F("audios", "column of a row's audio", TEXT_ONLY)
    image_patch_size: int = F(14, "vision patch size", TEXT_ONLY)
    mm_processor_kwargs: Dict[str, Any] = F({}, "arguments of the multimodal processor", TEXT_ONLY)
    return_multi_modal_inputs: bool = F(True, "keep the processor's multimodal inputs in the batch", TEXT_ONLY)
    tool_config_path: Optional[str] = F(None, "tool definitions for multi-turn rollouts (verl's data-side spelling)", Refused(
        "tools are read from the rollout's keys here, not the data's: set "
        "actor_rollout_ref.rollout.multi_turn.tool_config_path instead and leave data.tool_config_path null"))
    function_tool_path: Optional[str] = F(None, "Python tools for multi-turn rollouts (verl's data-side spelling)", Refused(
        "tools are read from the rollout's keys here, not the data's: set "
        "actor_rollout_ref.rollout.multi_turn.function_tool_path instead and leave data.function_tool_path null"))
    custom_cls: CustomClassConfig = custom_class_section(
        "dataset", "write the data in verl's row format (parquet or jsonl with prompt, data_source, reward_model)")
    datagen: CustomClassConfig = custom_class_section(
        "data generator (verl early 2026)", "generate the data beforehand into parquet or jsonl files")
    sampler: SamplerClassConfig = S(SamplerClassConfig, "a custom batch sampler (verl early 2026; not built here: null only)",
                                    off_feature("a custom (curriculum) sampler", "data.shuffle and data.seed choose the order"))
