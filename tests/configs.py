"""A validated configuration from command-line overrides, as the tests build it."""

from __future__ import annotations

from grpo_dist.config.loader import compose, to_typed
from grpo_dist.config.schema import GRPOConfig
from grpo_dist.config.validate import validate_config


def cfg_of(*overrides: str) -> GRPOConfig:
    """The defaults with ``overrides`` (verl's ``key=value`` strings), validated without checking that
    paths exist."""
    cfg = to_typed(compose(list(overrides)), list(overrides))
    validate_config(cfg, check_paths=False)
    return cfg
