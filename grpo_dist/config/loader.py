"""Compose the configuration with Hydra and turn its errors into one clear message.

``compose(overrides)`` builds the config from ``conf/grpo_trainer.yaml`` (whose schema is
``schema.GRPOConfig``) plus command-line overrides in Hydra syntax, exactly as verl does.
Hydra's and OmegaConf's own exceptions (unknown key, wrong type) are translated into
``ConfigError`` naming the key, the value and what would be valid.
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, Iterator

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from grpo_dist.config.schema import ConfigError, GRPOConfig

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
CONFIG_NAME = "grpo_trainer"
SCHEMA_NAME = "grpo_schema"


def iter_keys(cls: type = GRPOConfig, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Yield (dotted key, dataclass field) for every leaf key of the schema."""
    for f in fields(cls):
        key = f"{prefix}{f.name}"
        sub = f.default_factory() if callable(f.default_factory) else None  # type: ignore[misc]
        if is_dataclass(sub):
            yield from iter_keys(type(sub), key + ".")
        else:
            yield key, f


def all_keys() -> list[str]:
    return [k for k, _ in iter_keys()]


def _register_schema() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=SCHEMA_NAME, node=GRPOConfig)


def _unknown_key_message(full_key: str) -> str:
    keys = all_keys()
    close = difflib.get_close_matches(full_key, keys, n=3, cutoff=0.75)
    if not close:  # match the last component anywhere in the tree
        leaf = full_key.rsplit(".", 1)[-1]
        close = [k for k in keys if k.rsplit(".", 1)[-1] == leaf][:3]
    msg = f"unknown config key '{full_key}'."
    if close:
        msg += " Did you mean: " + ", ".join(close) + "?"
    parent = full_key.rsplit(".", 1)[0] if "." in full_key else ""
    siblings = [k for k in keys if parent and k.startswith(parent + ".") and k.count(".") == full_key.count(".")]
    if siblings:
        msg += f"\n  keys under '{parent}': " + ", ".join(s.rsplit(".", 1)[-1] for s in siblings)
    msg += "\n  (python -m grpo_dist.main --cfg job lists every key; docs/configuration.md documents them)"
    return msg


def _translate(exc: BaseException, overrides: list[str]) -> ConfigError:
    """Turn a Hydra/OmegaConf exception into a ConfigError with one readable message."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, OmegaConfBaseException):
        cause = cause.__cause__ or cause.__context__
    if cause is not None:
        full_key = getattr(cause, "full_key", None) or ""
        text = str(cause).split("\n")[0]
        if "not in struct" in text or ("Key '" in text and "not in" in text):
            keys = [o.lstrip("+~").split("=", 1)[0] for o in overrides]
            full_key = next((k for k in keys if full_key and k.startswith(full_key + ".")), full_key)
            return ConfigError(_unknown_key_message(full_key or text))
        if full_key:
            given = next((o.split("=", 1)[1] for o in overrides if o.lstrip("+~").split("=", 1)[0] == full_key), None)
            shown = f" = {given!r}" if given is not None else ""
            return ConfigError(f"invalid value for {full_key}{shown}: {text}")
        return ConfigError(text)
    text = str(exc).strip().split("\n")
    return ConfigError(" ".join(t.strip() for t in text[:3]))


def _schema_plus(override: str) -> str:
    """``+key=value`` for a key the schema already has -> ``key=value``. verl's launch scripts add
    keys verl's YAML lacks with ``+`` (e.g. ``+reward_model.reward_kwargs.overlong_buffer_cfg.len=...``);
    here they exist, and Hydra refuses to "append" an existing key."""
    if override.startswith("+") and not override.startswith("++"):
        key = override[1:].split("=", 1)[0]
        if key in _schema_keys():
            return override[1:]
    if not override.startswith(("+", "~")):
        # a key inside a free-form mapping of the schema (e.g. reward.reward_model.rollout.name, which
        # verl's YAML spells out): add it or replace it, as verl's command line does without a '+'
        key = override.split("=", 1)[0]
        if any(key.startswith(m + ".") for m in _mapping_keys()):
            return "++" + override
    return override


@functools.lru_cache(maxsize=1)
def _mapping_keys() -> tuple[str, ...]:
    """Schema keys whose value is a free-form mapping (``Dict[str, Any]``)."""
    return tuple(k for k, f in iter_keys() if callable(f.default_factory) and isinstance(f.default_factory(), dict))


@functools.lru_cache(maxsize=1)
def _schema_keys() -> frozenset[str]:
    return frozenset(all_keys())


def compose(
    overrides: list[str] | None = None,
    *,
    config_dir: str | Path | None = None,
    config_name: str = CONFIG_NAME,
) -> DictConfig:
    """Compose the config (unresolved) from the YAML, the schema and the overrides."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = [_schema_plus(o) for o in overrides or []]
    _register_schema()
    conf_dir = Path(config_dir).resolve() if config_dir else CONF_DIR
    if not conf_dir.is_dir():
        raise ConfigError(f"config directory '{conf_dir}' does not exist (--config-path)")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            cfg = hydra_compose(config_name=config_name, overrides=overrides)
    except Exception as exc:  # Hydra wraps everything; translate to one message
        from hydra.errors import MissingConfigException

        if isinstance(exc, MissingConfigException):
            raise ConfigError(f"config '{config_name}' not found in {conf_dir} (--config-name / --config-path)") from None
        raise _translate(exc, overrides) from None
    finally:
        GlobalHydra.instance().clear()
    return cfg


def to_typed(cfg: DictConfig, overrides: list[str] | None = None) -> GRPOConfig:
    """Resolve interpolations and build the typed dataclass tree."""
    try:
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as exc:
        raise _translate(exc, list(overrides or [])) from None
    assert isinstance(obj, GRPOConfig), type(obj)
    return obj
