"""A validated configuration from command-line overrides, as the tests build it."""

from __future__ import annotations

import pytest

from grpo_dist.config.loader import compose, to_typed
from grpo_dist.config.schema import ConfigError, GRPOConfig
from grpo_dist.config.validate import validate_config


def cfg_of(*overrides: str, check_paths: bool = False) -> GRPOConfig:
    """The defaults with ``overrides`` (verl's ``key=value`` strings), validated; the files named are read only
    with ``check_paths`` (as a run reads them)."""
    cfg = to_typed(compose(list(overrides)), list(overrides))
    validate_config(cfg, check_paths=check_paths)
    return cfg


def refused(*overrides: str, check_paths: bool = False) -> str:
    """The one message with which validation refuses ``overrides`` (the test fails when it accepts them)."""
    with pytest.raises(ConfigError) as info:
        cfg_of(*overrides, check_paths=check_paths)
    return str(info.value)
