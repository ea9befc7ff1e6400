"""Sections of verl's key tree that grpo_dist accepts for compatibility: profilers, engine internals
(quantization-aware training, LoRA, multi-token prediction, verl's other FSDP engine, ...) and whole
features it does not build (distillation, the transfer queue, verl's v1 trainer modes, ...).

Each is a dataclass of the schema like the ones in :mod:`grpo_dist.config.schema`; their keys are
accepted at the values that leave the feature off and have no effect otherwise (see each field's
state and docs/configuration.md).
"""
