"""Compose the configuration with Hydra and turn its errors into one clear message.

``compose(overrides)`` builds the config from ``conf/grpo_trainer.yaml`` (whose schema is
``schema.GRPOConfig``) plus command-line overrides in Hydra syntax, exactly as verl does.
Hydra's and OmegaConf's own exceptions (unknown key, wrong type) are translated into
``ConfigError`` naming the key, the value and what would be valid.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import pickle
import re
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

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


@functools.lru_cache(maxsize=1)
def _register_schema() -> None:
    """Store the schema in Hydra's config store, once per process (it outlives ``GlobalHydra.clear()``).
    Building its structured config from the dataclasses (~0.6-0.7 s on a 2-core machine: most of a first
    compose) is done once per version of the package: the result is kept pickled on disk
    (:func:`_disk_cached`, keyed by the package's sources and the libraries' versions)."""
    from hydra.core.config_store import ConfigNode, ConfigStore

    pickled, node = _disk_cached("schema", _sources_digest(), lambda: OmegaConf.structured(GRPOConfig))
    _pickled_nodes[id(node)] = (node, pickled)  # what the structured source unpickles each load from
    store = ConfigStore.instance()
    name = f"{SCHEMA_NAME}.yaml"
    if isinstance(getattr(store, "repo", None), dict):  # as ConfigStore.store does, without its copy of the node
        store.repo[name] = ConfigNode(name=name, node=node, group=None, package=None, provider=None)
    else:
        store.store(name=SCHEMA_NAME, node=node)


#: The folder of the configuration's cache (:func:`_disk_cached`), under the grpo_dist cache
#: (``$GRPO_DIST_CACHE``, else ``~/.cache/grpo_dist``).
CACHE_SUBDIR = "config"


def _versions() -> bytes:
    import sys

    import hydra
    import omegaconf
    import yaml

    return repr((sys.version, pickle.HIGHEST_PROTOCOL, omegaconf.__version__, hydra.__version__,
                 yaml.__version__)).encode()


@functools.lru_cache(maxsize=1)
def _sources_digest() -> bytes:
    """A digest of every Python source of the grpo_dist package (the schema's dataclasses, their defaults
    and whatever those read) and of the libraries' versions: a change to any of them is a new schema."""
    return tree_digest(Path(__file__).resolve().parents[1], _versions())


def tree_digest(folder: Path, salt: bytes = b"") -> bytes:
    """A digest of the names and contents of the ``*.py`` files under ``folder`` (~15 ms for grpo_dist's 200)."""
    import hashlib

    h = hashlib.blake2b(salt)
    for path in sorted(folder.rglob("*.py")):
        h.update(str(path.relative_to(folder)).encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.digest()


def _disk_cached(kind: str, key: bytes, build: Callable[[], Any]) -> tuple[bytes, Any]:
    """``build()``'s value and its pickle, kept in the configuration's cache folder as ``KIND-DIGEST.pkl``:
    read back while ``key`` is unchanged, built and written again (replacing the older ``KIND-*.pkl``) when
    it changed. The cache is only a shortcut: a folder that cannot be read or written, or a file that does
    not unpickle, is the same as no cache (the value is built)."""
    import hashlib
    import os

    from grpo_dist.tasks.cache import cache_root

    folder = Path(cache_root()) / CACHE_SUBDIR
    path = folder / f"{kind}-{hashlib.blake2b(key, digest_size=16).hexdigest()}.pkl"
    try:
        data = path.read_bytes()
        return data, pickle.loads(data)  # a file cut short or of another Python is rebuilt
    except Exception:
        pass
    value = build()
    data = pickle.dumps(value)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob(f"{kind}-*.pkl"):
            if old != path:
                old.unlink(missing_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)  # whole or not at all, also with several runs starting at once
    except OSError:
        pass
    return data, value


# Parsed YAML config files (the config, pickled, and its header), by a digest of the file's text: parsing
# conf/grpo_trainer.yaml was about half of a compose, and a process composes many times (a --multirun
# sweep, --check, the tests). Each load reads the file; a file whose text changed is parsed again.
_parsed_files: dict[bytes, tuple[bytes, dict[str, str]]] = {}
# The structured configs of Hydra's store, pickled: by the stored node's id (the node kept, so that the id
# names it for as long as the entry lives; a config stored again under its name is another node).
_pickled_nodes: dict[int, tuple[Any, bytes]] = {}


def _fresh_copy(pickled: bytes) -> Any:
    """A config of its own, equal to the one pickled: what ``copy.deepcopy`` of it gives, in half its time
    (OmegaConf's containers pickle their nodes, flags, types and parents; Hydra pickles configs itself)."""
    return pickle.loads(pickled)


def _speed_up_hydras_sources() -> None:
    """Put ``_fast_sources()`` in Hydra's registry of config sources (again, should something have
    restored the registry since)."""
    from hydra._internal.sources_registry import SourcesRegistry

    SourcesRegistry.instance().types.update(_fast_sources())


@functools.lru_cache(maxsize=1)
def _fast_sources() -> dict[str, type]:
    """Two of Hydra's config sources as subclasses that do the same work faster (under Hydra's class
    names, so that Hydra's plugin registration keeps them; a Hydra whose sources are not these classes
    keeps its own):

    - ``file://`` folders (conf/, --config-path, --config-dir) keep each parsed YAML file in
      ``_parsed_files`` (and on disk, :func:`_disk_cached`: a file's text is parsed once, not by every
      run); each load gets its own copy, as Hydra changes what it loads (Hydra's source reads the
      header from the first 512 characters and parses the file with ``OmegaConf.load``, as here);
    - the structured-config source (the schema in Hydra's ConfigStore) is not deep-copied with the
      rest of the config repository at every compose: it only reads the process-wide store, whose
      loads are copies already, so a copy that shares the store behaves the same;
    - both hand out each load's copy unpickled from bytes kept once, not ``copy.deepcopy``'d (Hydra's
      store deep-copies the schema at every load): the same config in half the time.
    """
    import copy
    import hashlib
    import io
    import os

    from hydra._internal.sources_registry import SourcesRegistry
    from hydra.core.plugins import Plugins
    from hydra.plugins.config_source import ConfigLoadError, ConfigResult

    Plugins.instance()  # Hydra registers its own sources (classes of its plugin scan, not of a plain import)
    registry = SourcesRegistry.instance()
    hydras = "hydra._internal.core_plugins."
    file_source, structured_source = registry.types.get("file"), registry.types.get("structured")
    fast: dict[str, type] = {}

    if file_source is not None and file_source.__module__ == hydras + "file_config_source":

        class FileConfigSource(file_source):  # type: ignore[misc,valid-type]
            def load_config(self, config_path: str) -> ConfigResult:
                full_path = os.path.realpath(os.path.join(self.path, self._normalize_file_name(config_path)))
                try:
                    with open(full_path, encoding="utf-8") as f:
                        text = f.read()
                except FileNotFoundError:
                    raise ConfigLoadError(f"Config not found : {full_path}") from None
                key = hashlib.blake2b(text.encode("utf-8")).digest()
                if key not in _parsed_files:  # as Hydra's own source reads a file (parsed once per text, on disk)
                    kind = "yaml-" + hashlib.blake2b(full_path.encode(), digest_size=8).hexdigest()
                    parsed, _ = _disk_cached(kind, _versions() + key, lambda: OmegaConf.load(io.StringIO(text)))
                    _parsed_files[key] = (parsed, self._get_header_dict(text[:512]))
                cfg, header = _parsed_files[key]
                return ConfigResult(config=_fresh_copy(cfg), path=f"{self.scheme()}://{self.path}",
                                    provider=self.provider, header=dict(header))

        fast["file"] = FileConfigSource

    if structured_source is not None and structured_source.__module__ == hydras + "structured_config_source":

        class StructuredConfigSource(structured_source):  # type: ignore[misc,valid-type]
            def __deepcopy__(self, memo: dict[int, Any]) -> Any:
                twin = copy.copy(self)
                memo[id(self)] = twin
                return twin

            def load_config(self, config_path: str) -> ConfigResult:  # as Hydra's, the copy from a pickle
                stored = self.store._load(self._normalize_file_name(config_path))
                if id(stored.node) not in _pickled_nodes:
                    _pickled_nodes[id(stored.node)] = (stored.node, pickle.dumps(stored.node))
                provider = stored.provider if stored.provider is not None else self.provider
                return ConfigResult(config=_fresh_copy(_pickled_nodes[id(stored.node)][1]),
                                    path=f"{self.scheme()}://{self.path}", provider=provider,
                                    header={"package": stored.package})

        fast["structured"] = StructuredConfigSource
    return fast


@functools.lru_cache(maxsize=1)
def free_form_keys() -> tuple[str, ...]:
    """Schema keys holding a free-form mapping (``Dict[...]``), whose entries are the user's own
    (e.g. ``actor_rollout_ref.rollout.engine_kwargs.vllm``)."""
    return tuple(k for k, f in iter_keys() if str(f.type).replace("typing.", "").startswith(("Dict", "dict")))


def _free_form_parent(full_key: str) -> str | None:
    return next((p for p in free_form_keys() if full_key.startswith(p + ".")), None)


def _unknown_key_message(full_key: str) -> str:
    parent = _free_form_parent(full_key)
    if parent:
        return (f"'{full_key}' is a new entry of the mapping {parent}: add it with a leading '+', "
                f"+{full_key}=VALUE (or write the whole mapping: {parent}={{name: value}} with '+' for a non-empty one)")
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
            return ConfigError(f"invalid value for {full_key}{_given(exc, full_key, overrides)}: {text}")
        return ConfigError(text)
    text = str(exc).strip().split("\n")
    return ConfigError(" ".join(t.strip() for t in text[:3]))


MERGING = "Error merging override "


def _given(exc: BaseException, full_key: str, overrides: list[str]) -> str:
    """`` = 'value'``: the value of ``full_key`` that failed, as written on the command line.

    Hydra applies the overrides in order, so each value given for a key must be valid, and the last
    one is in effect. Hydra's error names the override it was merging when it failed; without one
    (a value that fails only when the config is resolved) the failing value is the one in effect, the
    last. A key given more than once says so, with every value, so that no other value is blamed."""
    values = [o.split("=", 1)[1] for o in overrides if "=" in o and o.lstrip("+~").split("=", 1)[0] == full_key]
    if not values:
        return ""
    failed = values[-1]
    merging = str(exc).split("\n")[0]
    if merging.startswith(MERGING) and "=" in merging:
        failed = merging[len(MERGING):].split("=", 1)[1]
    shown = f" = {failed!r}"
    if failed == "":  # `key=` from a launch script's ${VAR} whose variable is not set (verl's scripts have one)
        shown += " (an empty value: is the shell variable the launch script puts here unset? give the key a value)"
    if len(values) > 1:
        shown += (f" (the key is given {len(values)} times: {', '.join(map(repr, values))}; Hydra applies them in "
                  "order, so each must be valid, and the last one is in effect)")
    return shown


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


def _check_added_keys(overrides: list[str]) -> None:
    """``+key=v`` / ``++key=v`` for a key the schema lacks would be composed and then dropped
    without a word; refuse it (entries of free-form mappings and hydra.* keys excepted)."""
    for o in overrides:
        if not o.startswith("+") or "=" not in o:
            continue
        key = o.lstrip("+").split("=", 1)[0]
        if key == "hydra" or key.startswith("hydra.") or key in _schema_keys() or _free_form_parent(key):
            continue
        raise ConfigError(_unknown_key_message(key))


@contextlib.contextmanager
def _hydra(conf_dir: Path, extra_dirs: list[str], job_name: str) -> Iterator[None]:
    """Hydra initialised as ``@hydra.main`` would be: the primary config folder, then the
    ``--config-dir`` folders on the search path (``initialize_config_dir`` takes one folder only), then
    the project's conf/ when the primary folder is another (``--config-path``): a config there may start
    from ``defaults: [grpo_trainer]``, or from verl's ``[ppo_trainer]`` (conf/ppo_trainer.yaml)."""
    from hydra import version
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    version.setbase("1.3")
    csp = create_config_search_path(search_path_dir=str(conf_dir))
    for d in extra_dirs:
        csp.append(provider="command-line", path=f"file://{Path(d).resolve()}", anchor=SearchPathQuery(provider="main"))
    if conf_dir.resolve() != CONF_DIR.resolve():
        last = SearchPathQuery(provider="command-line" if extra_dirs else "main")  # Hydra's structured schema stays last
        csp.append(provider="grpo_dist", path=f"file://{CONF_DIR}", anchor=last)
    Hydra.create_main_hydra2(task_name=job_name, config_search_path=csp)
    try:
        yield
    finally:
        GlobalHydra.instance().clear()


def _conf_dir(config_dir: str | Path | None, extra_dirs: list[str]) -> Path:
    conf_dir = Path(config_dir).resolve() if config_dir else CONF_DIR
    if not conf_dir.is_dir():
        raise ConfigError(f"config directory '{conf_dir}' does not exist (--config-path)")
    for d in extra_dirs:
        if not Path(d).is_dir():
            raise ConfigError(f"config directory '{Path(d).resolve()}' does not exist (--config-dir)")
    return conf_dir


def compose(
    overrides: list[str] | None = None,
    *,
    config_dir: str | Path | None = None,
    config_name: str = CONFIG_NAME,
    extra_dirs: list[str] | None = None,
    return_hydra_config: bool = False,
    job_name: str = "main",
) -> DictConfig:
    """Compose the config (unresolved) from the YAML, the schema and the overrides; with
    ``return_hydra_config`` the ``hydra`` node (run/sweep directories, logging, ...) is kept.
    ``config_dir`` replaces the project's conf/ folder (``--config-path``); ``extra_dirs`` join the
    search path after it (``--config-dir``)."""
    from hydra import compose as hydra_compose

    overrides = [_schema_plus(o) for o in overrides or []]
    _check_added_keys(overrides)
    _register_schema()
    _speed_up_hydras_sources()
    extra_dirs = list(extra_dirs or [])
    conf_dir = _conf_dir(config_dir, extra_dirs)
    try:
        with _hydra(conf_dir, extra_dirs, job_name):
            cfg = hydra_compose(config_name=config_name, overrides=overrides, return_hydra_config=return_hydra_config)
    except Exception as exc:  # Hydra wraps everything; translate to one message
        from hydra.errors import MissingConfigException

        if isinstance(exc, MissingConfigException):
            raise _missing_config(exc, config_name, [conf_dir, *map(Path, extra_dirs)]) from None
        if "Ambiguous value for argument" in str(exc):
            raise ConfigError(f"{str(exc).splitlines()[0]} (a comma-separated value is a sweep: add --multirun to run one "
                              "job per value, or quote the value, key='a,b')") from None
        raise _translate(exc, overrides) from None
    return cfg


_MISSING_DEFAULT = re.compile(r"^In '(?P<parent>[^']+)': Could not (?:load|find) '(?P<missing>[^']+)'")


def _missing_config(exc: Exception, config_name: str, dirs: list[Path]) -> ConfigError:
    """One message for Hydra's missing config: the primary config itself, or an entry of a defaults list
    (named with the config that lists it); with the folders searched (a ``hydra.searchpath`` folder that does
    not exist said so)."""
    text = str(exc)
    searched = [str(d) for d in dirs]
    for line in text.splitlines():
        m = re.search(r"provider=hydra\.searchpath in \w+, path=file://(\S+)", line)
        if m:
            path = Path(m.group(1))
            searched.append(str(path) + ("" if path.is_dir() else " (hydra.searchpath; no such folder)"))
    if str(CONF_DIR) not in searched:
        searched.append(str(CONF_DIR))
    where = ", ".join(searched)
    m = _MISSING_DEFAULT.match(text)
    if m:
        return ConfigError(f"config '{m.group('parent')}' lists '{m.group('missing')}' in its defaults, and no "
                           f"'{m.group('missing')}.yaml' is found in {where}; grpo_dist's conf/ provides grpo_trainer "
                           "(and ppo_trainer, verl's name for it)")
    return ConfigError(f"config '{config_name}' not found in {where} (--config-name / --config-path / --config-dir)")


def show_info(info: str, overrides: list[str], *, config_dir: str | Path | None = None,
              config_name: str = CONFIG_NAME, extra_dirs: list[str] | None = None) -> None:
    """Hydra's ``--info`` (search path, defaults list and tree, composed config, plugins), printed by Hydra."""
    from hydra.core.global_hydra import GlobalHydra

    overrides = [_schema_plus(o) for o in overrides]
    _register_schema()
    _speed_up_hydras_sources()
    extra_dirs = list(extra_dirs or [])
    conf_dir = _conf_dir(config_dir, extra_dirs)
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        with _hydra(conf_dir, extra_dirs, "main"):
            GlobalHydra.instance().hydra.show_info(info, config_name, overrides)
    except Exception as exc:
        raise _translate(exc, overrides) from None
    finally:  # Hydra points the root logger at stdout to print; leave logging as it was
        root.handlers[:], root.level = handlers, level


def to_typed(cfg: DictConfig, overrides: list[str] | None = None) -> GRPOConfig:
    """Resolve interpolations and build the typed dataclass tree (in fully asynchronous training,
    ``data.train_batch_size`` becomes the chunk's prompts: :func:`~grpo_dist.config.fully_async.normalize_fully_async`)."""
    try:
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as exc:
        raise _translate(exc, list(overrides or [])) from None
    assert isinstance(obj, GRPOConfig), type(obj)
    from grpo_dist.config.fully_async import normalize_fully_async

    return normalize_fully_async(obj)
