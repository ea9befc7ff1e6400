"""Entry point: ``python -m grpo_dist.main [key=value ...]``.

Parse, compose and validate the configuration, build the trainer, train, close.
Command-line overrides use Hydra's syntax and verl's keys. Flags:

  --cfg job          print the composed configuration and exit (add --resolve to resolve ${...})
  --config-path DIR  folder of the primary config (default: the project's conf/)
  --config-name NAME primary config name (default: grpo_trainer)
  -h, --help         this text
"""

from __future__ import annotations

import sys

USAGE = __doc__


class UsageError(ValueError):
    pass


def parse_argv(argv: list[str]) -> tuple[dict, list[str]]:
    """Split flags (--cfg, --resolve, --config-path, --config-name, --help) from overrides."""
    flags: dict = {"cfg": None, "resolve": False, "config_path": None, "config_name": "grpo_trainer", "help": False}
    overrides: list[str] = []
    it = iter(argv)
    for arg in it:
        name, eq, val = arg.partition("=")
        if arg in ("-h", "--help"):
            flags["help"] = True
        elif name in ("--cfg", "-c", "--config-path", "-cp", "--config-name", "-cn"):
            if not eq:
                val = next(it, None)
                if val is None:
                    raise UsageError(f"{name} needs a value")
            key = {"--cfg": "cfg", "-c": "cfg", "--config-path": "config_path", "-cp": "config_path"}.get(name, "config_name")
            flags[key] = val
        elif arg == "--resolve":
            flags["resolve"] = True
        elif arg.startswith("-"):
            raise UsageError(f"unknown flag {arg!r}; valid flags: --cfg job, --resolve, --config-path, --config-name, --help")
        elif "=" not in arg:
            raise UsageError(f"argument {arg!r} is not an override; write key=value, e.g. data.train_batch_size=64")
        else:
            overrides.append(arg)
    if flags["cfg"] not in (None, "job", "all"):
        raise UsageError(f"--cfg {flags['cfg']!r}: valid values are job, all")
    if flags["config_name"].endswith((".yaml", ".yml")):
        flags["config_name"] = flags["config_name"].rsplit(".", 1)[0]
    return flags, overrides


def main(argv: list[str] | None = None) -> int:
    from grpo_dist.config.loader import compose, to_typed
    from grpo_dist.config.schema import ConfigError
    from grpo_dist.config.validate import validate_config

    argv = sys.argv[1:] if argv is None else argv
    try:
        flags, overrides = parse_argv(argv)
        if flags["help"]:
            print(USAGE)
            return 0
        raw = compose(overrides, config_dir=flags["config_path"], config_name=flags["config_name"])
        if flags["cfg"]:
            from omegaconf import OmegaConf

            print(OmegaConf.to_yaml(raw, resolve=flags["resolve"]), end="")
            return 0
        cfg = to_typed(raw, overrides)
        validate_config(cfg)
    except (ConfigError, UsageError) as exc:
        print(f"grpo_dist: configuration error: {exc}", file=sys.stderr)
        return 2

    from grpo_dist.trainer.run import run

    return run(cfg)


if __name__ == "__main__":
    sys.exit(main())
