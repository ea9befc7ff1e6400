"""Hydra's command line, as verl's ``@hydra.main`` entry point gives it, with one-message errors.

grpo_dist emulates ``hydra.main`` rather than using it, so that a mistake is one message naming the
key (Hydra's own runner prints its exception and a hint about ``HYDRA_FULL_ERROR``) and the whole
sweep is checked before its first job starts. What it takes from Hydra: the flags
(:func:`parse_args`), the override grammar and sweep syntax (Hydra's override parser), composition
(the compose API with the ``hydra`` node), the ``hydra.*`` keys that make sense for a training run
(:data:`HONOURED_HYDRA`), and what a job leaves in its output directory (``.hydra/config.yaml``,
``hydra.yaml``, ``overrides.yaml``, the job log ``<hydra.job.name>.log``). The differences are listed
in docs/command_line.md.

Output directories (docs/command_line.md, "Output directories"):

- a single run writes Hydra's files to ``hydra.run.dir`` when it is set, else to
  ``trainer.default_local_dir`` (Hydra's default would be ``outputs/<date>/<time>``); when
  ``hydra.run.dir`` is set and ``trainer.default_local_dir`` is not, the run's checkpoints and
  metrics go to ``hydra.run.dir`` too;
- a sweep (``--multirun``) gives job ``k`` the folder ``hydra.sweep.dir/hydra.sweep.subdir``
  (``multirun/<date>/<time>/k``), which is also its ``trainer.default_local_dir`` unless that key
  is set; set for the sweep, it must differ between jobs (sweep it, or interpolate a swept key),
  since jobs sharing it would resume each other's checkpoints.
"""

from __future__ import annotations

import copy
import itertools
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from grpo_dist.config.schema import ConfigError, GRPOConfig
from grpo_dist.config.schema.trainer import DUMP_DIR_FIELDS
from grpo_dist.utils.disk import StartFiles, write_failure, write_text_atomic

JOB_NAME = "main"
#: Hydra's own default of hydra.run.dir; a run that leaves it unchanged writes to trainer.default_local_dir.
HYDRA_DEFAULT_RUN_DIR = "outputs/${now:%Y-%m-%d}/${now:%H-%M-%S}"
DEFAULT_LOCAL_DIR = GRPOConfig().trainer.default_local_dir

#: ``hydra.*`` keys (prefixes) and ``hydra/<group>`` choices honoured on the command line, with what they do.
HONOURED_HYDRA = {
    "hydra.run.dir": "the run's output directory (.hydra/ files, the job log; also trainer.default_local_dir unless set)",
    "hydra.sweep.dir": "the sweep's directory (--multirun)",
    "hydra.sweep.subdir": "a sweep job's folder inside hydra.sweep.dir (default: the job number)",
    "hydra.job.chdir": "run each job inside its output directory",
    "hydra.job.name": "the job's name (its log file <name>.log)",
    "hydra.job.env_set": "environment variables set for the job",
    "hydra.job.config.override_dirname": "how ${hydra.job.override_dirname} is spelled",
    "hydra.verbose": "DEBUG level for the root logger (true) or the named loggers",
    "hydra.job_logging": "Python logging of the job (dictConfig), e.g. hydra/job_logging=disabled",
    "hydra.hydra_logging": "Python logging of the sweep's own messages",
    "hydra.output_subdir": "where the .hydra/ files go inside the output directory; null: not written",
    "hydra.searchpath": "more places to find configs (as --config-dir)",
    "hydra.mode": "RUN or MULTIRUN (as --multirun)",
    "hydra.sweeper.params": "sweeps declared in a config or on the command line",
}
HONOURED_GROUPS = {"hydra/job_logging", "hydra/hydra_logging"}
BASIC_ONLY_GROUPS = {"hydra/launcher": "basic", "hydra/sweeper": "basic"}
#: Fields of the schema holding paths; with hydra.job.chdir they are anchored to the launch directory.
PATH_KEYS = (
    "actor_rollout_ref.model.path", "data.tokenizer", "data.train_files", "data.val_files",
    "custom_reward_function.path", "trainer.resume_from_path", "critic.model.path",
)

INFO_CHOICES = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")


class UsageError(ConfigError):
    """A mistake on the command line (a flag, its value); printed as one message."""


@dataclass
class Args:
    """The parsed command line: Hydra's flags, grpo_dist's ``--check``, and the overrides."""

    overrides: list[str] = field(default_factory=list)
    help: bool = False
    hydra_help: bool = False
    version: bool = False
    cfg: str | None = None
    resolve: bool = False
    package: str | None = None
    multirun: bool = False
    info: str | None = None
    config_path: str | None = None
    config_name: str = "grpo_trainer"
    config_dir: str | None = None
    check: bool | str = False  # True: everything; "config": the configuration only (no file checks)


_VALUED = {
    "--cfg": "cfg", "-c": "cfg", "--package": "package", "-p": "package",
    "--config-path": "config_path", "-cp": "config_path", "--config-name": "config_name", "-cn": "config_name",
    "--config-dir": "config_dir", "-cd": "config_dir",
}
_SWITCHES = {
    "-h": "help", "--help": "help", "--hydra-help": "hydra_help", "--version": "version", "--resolve": "resolve",
    "-m": "multirun", "--multirun": "multirun", "-r": None, "--run": None, "--check": "check",
}
_REFUSED_FLAGS = {
    "--shell-completion": "shell completion is not installed for grpo_dist",
    "-sc": "shell completion is not installed for grpo_dist",
    "--experimental-rerun": "rerunning from a pickled config is not supported; rerun the command (it resumes)",
}
FLAGS = "--check[=config], --cfg job|hydra|all, --resolve, --package, -m/--multirun, --info, --config-path, --config-name, --config-dir, --help, --hydra-help, --version"


def parse_args(argv: list[str]) -> Args:
    """Hydra's flags (``--cfg job``, ``--cfg=job``, ``-m``, ``-cn NAME`` ...) anywhere among the overrides."""
    args = Args()
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        name, eq, val = arg.partition("=")
        if arg in _SWITCHES:
            if _SWITCHES[arg]:
                setattr(args, _SWITCHES[arg], True)
        elif name in _VALUED:
            if not eq:
                if i >= len(argv):
                    raise UsageError(f"{name} needs a value")
                val, i = argv[i], i + 1
            setattr(args, _VALUED[name], val)
        elif name in ("--info", "-i"):
            if not eq:  # as with Hydra, the next argument is the topic only when it is one
                val = "all"
                if i < len(argv) and argv[i] in INFO_CHOICES:
                    val, i = argv[i], i + 1
            if val not in INFO_CHOICES:
                raise UsageError(f"--info {val!r}: valid topics are {', '.join(INFO_CHOICES)}")
            args.info = val
        elif name == "--check" and eq:
            if val != "config":
                raise UsageError(f"--check={val}: valid forms are --check (everything) and --check=config "
                                 "(the configuration only: no file-existence checks, no data row counts)")
            args.check = "config"
        elif name in _REFUSED_FLAGS:
            raise UsageError(f"{name}: {_REFUSED_FLAGS[name]}")
        elif arg.startswith("-"):
            raise UsageError(f"unknown flag {arg!r}; valid flags: {FLAGS}")
        elif "=" not in arg and not arg.startswith("~"):
            raise UsageError(f"argument {arg!r} is not an override; write key=value, e.g. data.train_batch_size=64")
        else:
            args.overrides.append(arg)
    if args.cfg not in (None, "job", "hydra", "all"):
        raise UsageError(f"--cfg {args.cfg!r}: valid values are job, hydra, all")
    if args.config_name.endswith((".yaml", ".yml")):
        args.config_name = args.config_name.rsplit(".", 1)[0]
    return args


# ------------------------------------------------------------------------------------- overrides
def parse_overrides(overrides: list[str]) -> list[Any]:
    """Hydra's parse of the overrides (``hydra.core.override_parser``); a syntax error is one message."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    try:
        return parser.parse_overrides(overrides)
    except OverrideParseException as exc:
        msg = " ".join(t.strip() for t in str(exc).strip().splitlines() if t.strip() and not t.startswith("See https"))
        raise UsageError(f"cannot parse the override {exc.override!r}: {msg} (Hydra's override grammar: "
                         "https://hydra.cc/docs/advanced/override_grammar/basic)") from None


def check_hydra_overrides(parsed: list[Any]) -> None:
    """Refuse the ``hydra.*`` overrides and ``hydra/<group>`` choices that grpo_dist does not honour."""
    for o in parsed:
        key = o.key_or_group
        if key.startswith("hydra/"):
            if key in HONOURED_GROUPS:
                continue
            if key in BASIC_ONLY_GROUPS and not o.is_sweep_override() and o.value() == BASIC_ONLY_GROUPS[key]:
                continue
            if key in BASIC_ONLY_GROUPS:
                raise UsageError(f"{o.input_line}: grpo_dist runs a sweep's jobs one after another in this process "
                                 f"(Hydra's basic {key.split('/')[1]}); other {key.split('/')[1]}s are not supported")
            raise UsageError(f"{o.input_line}: the config group {key} is not used by grpo_dist; "
                             f"honoured: {', '.join(sorted(HONOURED_GROUPS))}")
        if key == "hydra" or key.startswith("hydra."):
            if any(key == h or key.startswith(h + ".") for h in HONOURED_HYDRA):
                continue
            raise UsageError(f"{o.input_line}: {key} has no effect in grpo_dist, so it is refused; honoured hydra keys: "
                             + ", ".join(HONOURED_HYDRA) + " (python -m grpo_dist.main --hydra-help says what each does)")


SWEEP_PARAMS = "hydra.sweeper.params."


def is_sweep_param(o: Any) -> bool:
    """``hydra.sweeper.params.KEY=VALUES`` on the command line: a sweep of KEY declared the sweeper's way."""
    return o.key_or_group.startswith(SWEEP_PARAMS)


def sweep_params(base: DictConfig, parsed: list[Any]) -> dict[str, str]:
    """The sweeper's params: ``hydra.sweeper.params`` of the composed config (a config file's), then
    those given on the command line (which win)."""
    params = OmegaConf.to_container(base.hydra.sweeper, resolve=False).get("params") or {}
    out = {str(k): str(v) for k, v in params.items()}
    for o in parsed:
        if is_sweep_param(o):
            value = o.input_line.split("=", 1)[1]
            out[o.key_or_group[len(SWEEP_PARAMS):]] = value
    return out


def expand_sweeps(parsed: list[Any], params: dict[str, str] | None = None) -> list[list[str]]:
    """The jobs of a sweep, as Hydra's basic sweeper makes them: every comma-separated / ``range()`` /
    ``choice()`` override (and ``hydra.sweeper.params``) gives one value per job, and the jobs are all
    combinations, in command-line order (the last key varies fastest)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    extra = [f"{k}={v}" for k, v in (params or {}).items()]
    parsed = [o for o in parsed if not is_sweep_param(o)]
    if extra:
        parsed = OverridesParser.create().parse_overrides(extra) + parsed
    lists: list[list[str]] = []
    seen: dict[str, int] = {}
    for o in parsed:
        key = o.get_key_element()
        if o.is_sweep_override():
            if o.is_interval_sweep():
                raise UsageError(f"{o.input_line}: interval sweeps need a search plugin (e.g. Optuna); "
                                 "the basic sweeper takes lists: key=a,b,c or key=range(1,4)")
            values = [f"{key}={v}" for v in o.sweep_string_iterator()]
        else:
            values = [o.input_line]
        if key in seen:  # a later override of the same key wins (the params' come first)
            lists[seen[key]] = values
        else:
            seen[key] = len(lists)
            lists.append(values)
    return [list(c) for c in itertools.product(*lists)]


# ------------------------------------------------------------------------------------- jobs
@dataclass
class Job:
    """One composed, validated job of a run or a sweep."""

    num: int
    overrides: list[str]
    full: DictConfig  # with the hydra node, runtime.output_dir set
    cfg: GRPOConfig
    output_dir: str
    chdir: bool
    sweep: tuple[str, DictConfig] | None = None  # (hydra.sweep.dir, the sweep's own config) in a sweep

    @property
    def label(self) -> str:
        from hydra.core.utils import filter_overrides

        return " ".join(filter_overrides(self.overrides))


def _raw(node: DictConfig, key: str) -> Any:
    """The value of ``key`` as written (interpolations unresolved)."""
    parent, _, leaf = key.rpartition(".")
    container = OmegaConf.select(node, parent) if parent else node
    return OmegaConf.to_container(container, resolve=False).get(leaf)


def _abs(path: str, base: str) -> str:
    p = os.path.expanduser(str(path))
    return p if os.path.isabs(p) else os.path.normpath(os.path.join(base, p))


def anchor_paths(job_raw: DictConfig, base: str) -> None:
    """Relative paths of :data:`PATH_KEYS` made absolute against ``base`` (the launch directory)."""
    from grpo_dist.tasks import BUILTIN_PREFIX, is_hub_id

    def fix(v: Any) -> Any:
        if not isinstance(v, str) or v.startswith(BUILTIN_PREFIX) or is_hub_id(v) or os.path.isabs(os.path.expanduser(v)):
            return v
        return _abs(v, base)

    for key in PATH_KEYS:
        val = OmegaConf.select(job_raw, key)
        if val is None:
            continue
        if OmegaConf.is_list(val):
            OmegaConf.update(job_raw, key, [fix(v) for v in val], merge=False)
        else:
            OmegaConf.update(job_raw, key, fix(val), merge=False)


def set_output_dir(full: DictConfig, *, num: int | None, sweep_dir: str | None) -> str:
    """The job's output directory (module docstring), absolute, written to ``hydra.runtime.output_dir``
    (and, in a sweep, the job's number and the sweep's folder to ``hydra.job`` / ``hydra.sweep``)."""
    hc = full.hydra
    with read_write(hc), open_dict(hc):
        if num is not None:
            hc.mode = "MULTIRUN"
            hc.job.num = num
            hc.job.id = f"{num}"
            assert sweep_dir is not None
            hc.sweep.dir = sweep_dir  # one sweep folder for all jobs (its ${now:...} is fixed once)
    try:
        if num is not None:
            output_dir = os.path.join(str(sweep_dir), str(OmegaConf.select(full, "hydra.sweep.subdir")))
        elif _raw(full.hydra.run, "dir") != HYDRA_DEFAULT_RUN_DIR:
            output_dir = str(OmegaConf.select(full, "hydra.run.dir"))
        else:
            output_dir = str(OmegaConf.select(full, "trainer.default_local_dir"))
    except Exception as exc:  # an interpolation that does not resolve
        raise ConfigError(f"cannot work out the output directory: {str(exc).splitlines()[0]}") from None
    output_dir = os.path.abspath(output_dir)
    with read_write(hc), open_dict(hc):
        hc.runtime.output_dir = output_dir
    return output_dir


def prepare_job(full: DictConfig, overrides: list[str], *, num: int | None, sweep_dir: str | None,
                to_typed: Callable[[DictConfig, list[str]], GRPOConfig]) -> Job:
    """Fix a composed job's output directory (see the module docstring), make the ``hydra:``
    resolver see it, and build the typed configuration (not yet validated)."""
    from hydra.core.hydra_config import HydraConfig

    set_default_local_dir = _raw(full, "trainer.default_local_dir") != DEFAULT_LOCAL_DIR
    output_dir = set_output_dir(full, num=num, sweep_dir=sweep_dir)
    HydraConfig.instance().set_config(full)
    chdir = bool(full.hydra.job.chdir)
    job_raw = copy.deepcopy(full)
    with read_write(job_raw), open_dict(job_raw):
        del job_raw["hydra"]
        if not set_default_local_dir:
            job_raw.trainer.default_local_dir = output_dir
        if chdir:
            anchor_paths(job_raw, os.getcwd())
            # a relative trainer.default_local_dir lands inside the job's directory, as with Hydra
            if set_default_local_dir:
                job_raw.trainer.default_local_dir = _abs(str(OmegaConf.select(job_raw, "trainer.default_local_dir")), output_dir)
    cfg = to_typed(job_raw, overrides)
    if not chdir:
        cfg.trainer.default_local_dir = os.path.abspath(cfg.trainer.default_local_dir)
    for name in DUMP_DIR_FIELDS:  # relative: where the command was typed, or with hydra.job.chdir the job's directory
        if getattr(cfg.trainer, name):
            setattr(cfg.trainer, name, _abs(getattr(cfg.trainer, name), output_dir if chdir else os.getcwd()))
    return Job(num=num or 0, overrides=list(overrides), full=full, cfg=cfg, output_dir=output_dir, chdir=chdir)


def check_distinct_outputs(jobs: list[Job]) -> None:
    """Sweep jobs must not share ``trainer.default_local_dir`` (the second would resume the first's run), nor a
    folder of generation dumps (the second would overwrite the first's files)."""
    seen: dict[str, Job] = {}
    for job in jobs:
        d = job.cfg.trainer.default_local_dir
        if d in seen:
            raise ConfigError(
                f"trainer.default_local_dir = {d!r} is the same for sweep jobs #{seen[d].num} ({seen[d].label}) and "
                f"#{job.num} ({job.label}): the later job would resume the earlier one's checkpoints. Leave it unset "
                "(each job then writes to its own folder under hydra.sweep.dir) or make it depend on a swept key, "
                "e.g. trainer.default_local_dir=runs/${trainer.experiment_name}")
        seen[d] = job
    for name in DUMP_DIR_FIELDS:
        writers: dict[str, Job] = {}
        for job in jobs:
            d = getattr(job.cfg.trainer, name)
            if d and d in writers:
                raise ConfigError(
                    f"trainer.{name} = {d!r} is the same for sweep jobs #{writers[d].num} ({writers[d].label}) and "
                    f"#{job.num} ({job.label}): the later job would overwrite the earlier one's <step>.jsonl files. Put "
                    f"it inside each job's folder, e.g. trainer.{name}=${{trainer.default_local_dir}}/{name}")
            writers[d] = job


def start_sweep(sweep_dir: str, base: DictConfig) -> None:
    """What Hydra's basic sweeper and launcher do before the first job: the sweep folder with the
    sweep's configuration (``multirun.yaml``), and Python logging for the sweep's own messages
    (``hydra.hydra_logging``)."""
    from hydra.core.utils import configure_log

    Path(sweep_dir).mkdir(parents=True, exist_ok=True)
    with read_write(base.hydra), open_dict(base.hydra):
        base.hydra.sweep.dir = sweep_dir
    OmegaConf.save(base, Path(sweep_dir) / "multirun.yaml")
    configure_log(base.hydra.hydra_logging, base.hydra.verbose)


def write_hydra_files(job: Job) -> None:
    """``<output_dir>/<hydra.output_subdir>/{config,hydra,overrides}.yaml``, as Hydra writes them
    (nothing when ``hydra.output_subdir`` is null)."""
    full = job.full
    subdir = full.hydra.output_subdir
    if subdir is None:
        return
    out = Path(job.output_dir) / str(subdir)
    out.mkdir(parents=True, exist_ok=True)
    job_cfg = copy.deepcopy(full)
    with read_write(job_cfg), open_dict(job_cfg):
        del job_cfg["hydra"]
    # whole or not at all: a full disk leaves a resumed run's earlier files as they were
    write_text_atomic(out / "config.yaml", OmegaConf.to_yaml(job_cfg))
    write_text_atomic(out / "hydra.yaml", OmegaConf.to_yaml(OmegaConf.masked_copy(full, "hydra")))
    write_text_atomic(out / "overrides.yaml", OmegaConf.to_yaml(full.hydra.overrides.task))


def start_files(job: Job) -> StartFiles:
    """What the start of ``job`` may create: its output directory and ``trainer.default_local_dir``
    (with the parents they need), the job log, ``config.yaml``, the lock's guard file, the run's log file
    (``logs/run.log``, which the workers write into while the driver reads the data) and the ``.hydra/``
    files."""
    from grpo_dist.utils.run_lock import GUARD_NAME

    out, run_dir = Path(job.output_dir), Path(job.cfg.trainer.default_local_dir)
    dirs = [out, run_dir, run_dir / "logs"]
    files = [out / f"{job.full.hydra.job.name}.log", run_dir / "config.yaml", run_dir / GUARD_NAME,
             run_dir / "logs" / "run.log"]
    if job.full.hydra.output_subdir is not None:
        sub = out / str(job.full.hydra.output_subdir)
        dirs.append(sub)
        files += [sub / f"{n}.yaml" for n in ("config", "hydra", "overrides")]
    return StartFiles(dirs, files)


def _restore_root_logger(handlers: list[logging.Handler], level: int) -> None:
    """Give the root logger back ``handlers`` and ``level``, closing the handlers a job added (its job log's
    file), so that a process that calls ``main`` itself (a notebook, a sweep driver of its own) logs as before
    and holds no file of a finished job open."""
    root = logging.getLogger()
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
            h.close()
    root.handlers[:] = handlers
    root.setLevel(level)


def run_job(job: Job, task: Callable[[Any, Callable[[], None]], int]) -> int:
    """Run one job as Hydra's ``run_job`` does: create its output directory, change into it when
    ``hydra.job.chdir``, configure logging (``hydra.job_logging``, ``hydra.verbose``), set
    ``hydra.job.env_set`` and call ``task(spec, write_files)`` (``spec``: the job's run specification,
    :func:`grpo_dist.config.spec.resolve`d there, in the job's folder and environment); the task calls
    ``write_files`` (the ``.hydra/`` files) once it owns the output directory (after taking its lock), so a refused run
    never overwrites a running one's files. The working directory and the root logger (its handlers and level)
    are restored afterwards.

    A start that fails before ``write_files`` has written the files (a full disk, bad data, another
    run's lock) removes what it created (:func:`start_files`): the folders, the job log, the files."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import configure_log, env_override

    full = job.full
    HydraConfig.instance().set_config(full)
    old_cwd = os.getcwd()
    created, started = start_files(job), []
    root_before = list(logging.getLogger().handlers), logging.getLogger().level

    def write_files() -> None:
        write_hydra_files(job)
        started.append(True)

    rc = 2
    try:
        try:
            Path(job.output_dir).mkdir(parents=True, exist_ok=True)
            if job.chdir:
                os.chdir(job.output_dir)
            configure_log(full.hydra.job_logging, full.hydra.verbose)
        except (OSError, ValueError) as exc:  # dictConfig wraps the file handler's OSError in a ValueError
            key = ("trainer.default_local_dir" if job.output_dir == job.cfg.trainer.default_local_dir
                   else "hydra.sweep.dir" if job.sweep else "hydra.run.dir")
            err = exc if isinstance(exc, OSError) else (exc.__cause__ or exc)
            if isinstance(err, OSError):
                msg = write_failure(key, job.output_dir, err)
            else:
                msg = (f"cannot write to {key}={job.output_dir}: {err} ({job.output_dir}); give a directory this user "
                       "can create and write")
            print(f"grpo_dist: error: {msg}", file=sys.stderr, flush=True)
            return rc
        with env_override(dict(full.hydra.job.env_set)):
            from grpo_dist.config.spec import resolve

            rc = task(resolve(job.cfg), write_files)
            return rc
    finally:
        for h in logging.getLogger().handlers:
            try:
                h.flush()
            except (OSError, ValueError):  # a handler whose stream is already closed: nothing left to flush
                pass
        os.chdir(old_cwd)
        _restore_root_logger(*root_before)  # (closes the job log, so a failed start may remove it)
        if rc and not started:  # the start failed before the run owned its folder: leave nothing of it
            created.remove_created()


def print_config(full: DictConfig, what: str, package: str | None, resolve: bool) -> str:
    """``--cfg job|hydra|all`` (``--package`` selects a node, ``--resolve`` resolves interpolations)."""
    cfg = copy.deepcopy(full)
    with read_write(cfg), open_dict(cfg):
        if what == "job":
            del cfg["hydra"]
        elif what == "hydra":
            for k in list(cfg.keys()):
                if k != "hydra":
                    del cfg[k]
    if package:
        node = OmegaConf.select(cfg, package)
        if node is None:
            raise UsageError(f"--package {package}: no such node in the {what} config")
        cfg = node if isinstance(node, DictConfig) else OmegaConf.create({package.rsplit(".", 1)[-1]: node})
        prefix = f"# @package {package}\n"
    else:
        prefix = ""
    try:
        text = OmegaConf.to_yaml(cfg, resolve=resolve)
    except Exception as exc:
        raise ConfigError(f"--resolve: {str(exc).splitlines()[0]}") from None
    return prefix + text
