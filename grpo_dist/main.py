"""Entry point: ``python -m grpo_dist.main [flags] [key=value ...]``.

Compose and validate the configuration (every job of a sweep, before the first starts), then check,
print or run it. Overrides use Hydra's syntax and verl's keys; the command line is Hydra's, as
verl's ``@hydra.main`` entry point gives it (docs/command_line.md lists the differences).

  --check            validate and print the plan (ranks, placement, derived sizes, no-op keys);
                     starts nothing; exit 0, or 2 with the error. --check=config: the configuration
                     only (no file-existence checks, no data row counts; for a machine without the files)
  -m, --multirun     one job per combination of comma-separated values (key=a,b, key=range(1,4)),
                     run one after another, each in its own folder under hydra.sweep.dir
  --cfg job|hydra|all  print the composed configuration and exit (--resolve: resolve ${...};
                     --package/-p NODE: only that node)
  --info [TOPIC]     Hydra's information: all | config | defaults | defaults-tree | plugins | searchpath
  -cp, --config-path DIR   folder of the primary config (default: the project's conf/)
  -cn, --config-name NAME  primary config (default: grpo_trainer; e.g. recipes/gsm8k_qwen2.5_0.5b)
  -cd, --config-dir DIR    another folder to find configs in (Hydra's search path)
  --hydra-help       which hydra.* overrides grpo_dist honours
  --version          grpo_dist's and Hydra's versions
  -h, --help         this text

Overrides: key=value (an existing key), +key=value (add; for keys the schema has it is the same as
key=value), ++key=value (add or override), ~key (remove), hydra.run.dir=DIR, hydra.job.chdir=true, ...
"""

from __future__ import annotations

import os
import signal
import sys


def _stopped_before_the_run(signum, frame) -> None:
    """SIGTERM or Ctrl-C while Python loads the command line's modules (a second or two), before the run's
    own handlers exist: nothing was started or written, so the process ends here, with one line."""
    name = signal.Signals(signum).name
    print(f"grpo_dist: error: stopped on {name} during start-up, before the run began; nothing was started or "
          "written: rerun the same command to start it", file=sys.stderr, flush=True)
    os._exit(128 + signum)


_exit_code: int | None = None  # what main() returned, once it returned


def _leave_without_finalizing() -> None:
    """The last exit handler (registered before any other, so run after all of them): once ``main()``
    returned, end the process without the interpreter's finalization. That finalization walks every object
    the run's imports made (torch, transformers, Ray) to free memory the process is about to give back: about
    1.5 s of a 2-core machine at the end of every run. What a process must do at exit is done by then: the
    run closed its files and workers, every library's exit handler has run, the log handlers are flushed
    here. An exception on its way out (``_exit_code`` unset) exits as usual, with its traceback."""
    if _exit_code is None:
        return
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(_exit_code)


if __name__ == "__main__":  # python -m grpo_dist.main: handled from the first moment
    signal.signal(signal.SIGTERM, _stopped_before_the_run)
    signal.signal(signal.SIGINT, _stopped_before_the_run)
    import atexit

    atexit.register(_leave_without_finalizing)

from grpo_dist.config.hydra_cli import UsageError, parse_args  # noqa: E402

USAGE = __doc__


def parse_argv(argv: list[str]) -> tuple[dict, list[str]]:
    """The flags as a dict and the overrides (kept for scripts that read a command line)."""
    args = parse_args(argv)
    flags = {k: getattr(args, k) for k in args.__dataclass_fields__ if k != "overrides"}
    return flags, list(args.overrides)


def _hydra_help() -> str:
    from grpo_dist.config.hydra_cli import HONOURED_GROUPS, HONOURED_HYDRA

    lines = ["hydra.* overrides honoured by grpo_dist (any other is refused with a message):"]
    lines += [f"  {k:<36} {v}" for k, v in HONOURED_HYDRA.items()]
    lines += [f"  {g}=<choice>  (Hydra's choices: default, disabled, none, ...)" for g in sorted(HONOURED_GROUPS)]
    lines += ["  hydra/launcher=basic, hydra/sweeper=basic (the only ones: a sweep's jobs run one after another)",
              "See docs/command_line.md for the output directories and the differences from Hydra."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The command line; every error grpo_dist defines, a SIGTERM and Ctrl-C end it with one message
    (``GRPO_DIST_DEBUG=1``: an error's traceback instead)."""
    if signal.getsignal(signal.SIGINT) is _stopped_before_the_run:  # from here on, Ctrl-C is KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return _main(argv)
    except BaseException as exc:
        from grpo_dist.trainer.run import failure_message

        said = None if isinstance(exc, SystemExit) else failure_message(exc)
        if said is None:
            raise
        print(f"grpo_dist: error: {said[0]}", file=sys.stderr, flush=True)
        return said[1]


def _main(argv: list[str] | None) -> int:
    from grpo_dist.utils import startup

    startup.mark("imports")  # the command line's modules (and what they import) are loaded
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse_args(argv)
        if args.help:
            print(USAGE)
            return 0
        if args.hydra_help:
            print(_hydra_help())
            return 0
        if args.version:
            from importlib.metadata import PackageNotFoundError, version

            import hydra

            try:
                ours = version("grpo_dist")
            except PackageNotFoundError:  # run from a checkout that is not installed
                ours = "(not installed)"
            print(f"grpo_dist {ours}, Hydra {hydra.__version__}")
            return 0
        jobs = compose_jobs(args)
        if jobs is None:
            return 0
        startup.mark("configuration")
    except (UsageError, ValueError) as exc:  # ConfigError is a ValueError
        print(f"grpo_dist: configuration error: {exc}", file=sys.stderr)
        return 2

    if args.check:
        return print_plans(jobs, full=args.check is True)
    return run_jobs(jobs)


def compose_jobs(args):
    """Every job of the command line, composed and validated; None when a flag (``--cfg``,
    ``--info``) printed what was asked instead."""
    import os

    from grpo_dist.config import hydra_cli as hc
    from grpo_dist.config.loader import compose, show_info, to_typed
    from grpo_dist.config.validate import validate_config

    overrides = list(args.overrides)
    parsed = hc.parse_overrides(overrides)
    hc.check_hydra_overrides(parsed)
    where = dict(config_dir=args.config_path, config_name=args.config_name,
                 extra_dirs=[args.config_dir] if args.config_dir else [])
    if args.info:
        show_info(args.info, overrides, **where)
        return None
    multirun = args.multirun or any(o.key_or_group == "hydra.mode" and str(o.value()) == "MULTIRUN" for o in parsed)
    if multirun:
        base = compose([o.input_line for o in parsed if not o.is_sweep_override() and not hc.is_sweep_param(o)],
                       return_hydra_config=True, **where)
        job_overrides = hc.expand_sweeps(parsed, hc.sweep_params(base, parsed))
        sweep_dir = os.path.abspath(str(base.hydra.sweep.dir))
    else:
        job_overrides, sweep_dir = [overrides], None
    jobs = []
    for num, ovr in enumerate(job_overrides):
        try:
            full = compose(ovr, return_hydra_config=True, **where)
            if args.cfg:
                hc.set_output_dir(full, num=num if multirun else None, sweep_dir=sweep_dir)
                print(hc.print_config(full, args.cfg, args.package, args.resolve), end="")
                return None
            job = hc.prepare_job(full, ovr, num=num if multirun else None, sweep_dir=sweep_dir, to_typed=to_typed)
            validate_config(job.cfg, check_paths=args.check != "config")
        except ValueError as exc:
            if multirun:
                raise type(exc)(f"sweep job #{num} ({' '.join(ovr)}): {exc}") from None
            raise
        jobs.append(job)
    if multirun:
        hc.check_distinct_outputs(jobs)
        for job in jobs:
            job.sweep = (sweep_dir, base)
    return jobs


def print_plans(jobs, full: bool = True) -> int:
    """``--check``: the plan of every job, printed from its run specification (the object a run starts
    from); exit 0 (every job validated already)."""
    from grpo_dist.config.spec import resolve

    for job in jobs:
        spec = resolve(job.cfg)
        notes = []
        try:
            if full:  # the run happens on this machine's files; --check=config may be elsewhere
                cores = spec.usable_cores()  # the same count and rule as the run (spec.check_cpu_resources)
                spec.check_cpu_ranks(cores)
                notes = spec.machine_notes(cores)
        except ValueError as exc:
            print(f"grpo_dist: configuration error: {exc}", file=sys.stderr)
            return 2
        head = f"sweep job #{job.num}: {job.label or '(no overrides)'}" if job.sweep else "run"
        print(f"grpo_dist --check: {head}: the configuration is valid")
        for line in spec.check_plan(count_rows=full).lines():
            print(f"  {line}")
        for note in notes:
            print(f"  note        {note}")
        out = spec.launch.out_dir
        where = "" if out == job.output_dir else f"; Hydra's .hydra/ and log in {job.output_dir}"
        print(f"  output      {out} (checkpoints, metrics{', Hydra' + chr(39) + 's .hydra/ and log' if not where else ''}){where}")
    return 0


def run_jobs(jobs) -> int:
    """Run the jobs one after another (Hydra's basic launcher). A sweep goes on after a failed job
    and ends with the first failure's exit code; an interrupted or stopped job ends the sweep."""
    import logging

    from grpo_dist.config import hydra_cli as hc
    from grpo_dist.trainer.run import run

    if jobs[0].sweep is None:
        return hc.run_job(jobs[0], run)
    sweep_dir, base = jobs[0].sweep
    hc.start_sweep(sweep_dir, base)
    log = logging.getLogger("hydra")
    log.info(f"Launching {len(jobs)} jobs locally")
    first_failure = 0
    results = []
    for job in jobs:
        log.info(f"\t#{job.num} : {job.label}")
        rc = hc.run_job(job, run)
        results.append((job, rc))
        if rc and not first_failure:
            first_failure = rc
        if rc in (130, 143):
            break
    if first_failure:
        failed = ", ".join(f"#{j.num} ({j.label}) exit {rc}" for j, rc in results if rc)
        print(f"grpo_dist: sweep: {len(results)} of {len(jobs)} job(s) ran; failed: {failed}", file=sys.stderr)
    return first_failure


if __name__ == "__main__":
    _exit_code = main()
    sys.exit(_exit_code)
