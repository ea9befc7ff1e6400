"""Draw a run's report: PNG plots of its metrics.jsonl.

    python -m grpo_dist.report RUN_DIR     # writes RUN_DIR/report/*.png and prints their paths

Plots, over steps: reward, validation accuracy, KL, entropy, response length, the seconds of each
phase of a step (stacked, with the step's total as a line), and the breakdown of phases (the
workers' busy time, the parts of the weight sync). The trainer calls this at the end of every run;
the command redraws it for any run folder.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

#: Line panels: (file name, metric names or prefixes ending in "/", title).
PANELS = [
    ("reward", ["critic/score/mean"], "mean score of the step's responses"),
    ("val_accuracy", ["val-core/"], "validation accuracy"),
    ("kl", ["actor/kl_loss", "actor/ppo_kl", "actor/reward_kl_penalty"], "KL"),
    ("entropy", ["actor/entropy"], "policy entropy (nats/token)"),
    ("response_length", ["response_length/mean"], "response length (tokens)"),
]
#: Drawn only for runs with agent-loop trajectories (``rollout.mode=async``: they log ``num_turns/mean``).
AGENT_PANEL = ("agents", ["num_turns/mean", "agent/tool_calls/mean", "agent/tool_errors/mean", "agent/cut_by_budget/mean"],
               "turns and tool calls per trajectory")
TIMING_PREFIX = "timing_s/"
TIMING_TOTAL = "timing_s/step"
#: The phases of a step in the order they run (the stack's order, bottom up); other phases follow.
PHASE_ORDER = ("gen", "wait_prev_gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights", "testing",
               "save_checkpoint")


@dataclass(frozen=True)
class TimingSeries:
    """Which ``timing_s/`` metrics go where in the report.

    Attributes:
        phases: ``timing_s/<phase>`` (no further ``/``, not ``step``): stacked per step, in
            :data:`PHASE_ORDER`, then any other phase by name.
        breakdown: ``timing_s/<phase>/<part>`` (``gen/worker``, ``update_weights/gather``, ...): lines
            in a panel of their own, grouped by phase in the same order.
        total: ``timing_s/step`` when logged (a line over the stack), else None.
    """

    phases: list[str]
    breakdown: list[str]
    total: str | None


def _phase_rank(name: str) -> tuple[int, str]:
    phase = name[len(TIMING_PREFIX):].split("/")[0]
    return (PHASE_ORDER.index(phase) if phase in PHASE_ORDER else len(PHASE_ORDER), name)


def split_timing(keys: Iterable[str]) -> TimingSeries:
    """Sort metric names into the timing panels; names outside ``timing_s/`` are ignored."""
    names = {k for k in keys if k.startswith(TIMING_PREFIX)}
    total = TIMING_TOTAL if TIMING_TOTAL in names else None
    names.discard(TIMING_TOTAL)
    phases = [k for k in names if "/" not in k[len(TIMING_PREFIX):]]
    breakdown = [k for k in names if "/" in k[len(TIMING_PREFIX):]]
    return TimingSeries(phases=sorted(phases, key=_phase_rank), breakdown=sorted(breakdown, key=_phase_rank),
                        total=total)


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: is {run_dir} a grpo_dist output folder (trainer.default_local_dir)?")
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def _series(rows: list[dict], prefixes: list[str]) -> dict[str, tuple[list[int], list[float]]]:
    """The metrics named in ``prefixes`` (a name, or a prefix ending in "/" whose spreads, ``.../std``, are left
    out: verl's ``val-core/.../best@k/std`` is not an accuracy), as (steps, values) by name."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for r in rows:
        for k, v in r.items():
            if v is None or k == "step" or not any(
                    k == p or (p.endswith("/") and k.startswith(p) and not k.endswith("/std")) for p in prefixes):
                continue
            xs, ys = out.setdefault(k, ([], []))
            xs.append(int(r["step"]))
            ys.append(float(v))
    return out


def _plot_lines(ax, series: dict[str, tuple[list[int], list[float]]], names: list[str]) -> None:
    for k in names:
        xs, ys = series[k]
        ax.plot(xs, ys, marker="." if len(xs) < 30 else None, label=k)


def _plot_phase_stack(ax, series: dict[str, tuple[list[int], list[float]]], timing: TimingSeries) -> None:
    """Stacked bars of the phases' seconds per step (a phase not logged at a step counts 0), and the
    step's total as a line over them."""
    steps = sorted({x for k in timing.phases for x in series[k][0]})
    gaps = [b - a for a, b in zip(steps, steps[1:])]
    width = 0.8 * (min(gaps) if gaps else 1)
    bottom = [0.0] * len(steps)
    for k in timing.phases:
        at = dict(zip(*series[k]))
        heights = [at.get(x, 0.0) for x in steps]
        ax.bar(steps, heights, width=width, bottom=bottom, label=k[len(TIMING_PREFIX):], linewidth=0)
        bottom = [b + h for b, h in zip(bottom, heights)]
    if timing.total is not None:
        xs, ys = series[timing.total]
        ax.plot(xs, ys, color="black", marker="." if len(xs) < 30 else None, label="step (total)")


def _panels(rows: list[dict]) -> list[tuple[str, str, int, Callable[[Any], None]]]:
    """(file name, title, number of series, draw function) for every panel of the report."""
    panels = []
    for name, prefixes, title in PANELS:
        series = _series(rows, prefixes)
        panels.append((name, title, len(series), lambda ax, s=series: _plot_lines(ax, s, sorted(s))))
    if any("num_turns/mean" in r for r in rows):
        name, names, title = AGENT_PANEL
        series = _series(rows, names)
        panels.append((name, title, len(series), lambda ax, s=series: _plot_lines(ax, s, [k for k in names if k in s])))
    timing_series = _series(rows, [TIMING_PREFIX])
    timing = split_timing(timing_series)
    panels.append(("timing", "seconds per phase (stacked)", len(timing.phases) + (timing.total is not None),
                   lambda ax: _plot_phase_stack(ax, timing_series, timing)))
    panels.append(("timing_breakdown", "seconds inside phases (worker busy time, weight-sync parts)",
                   len(timing.breakdown), lambda ax: _plot_lines(ax, timing_series, timing.breakdown)))
    return panels


@contextlib.contextmanager
def _quiet_matplotlib():
    """matplotlib's ``INFO`` records (``generated new fontManager`` when its font cache is first built)
    kept at bay while the report is drawn: a run's logging (Hydra's job_logging) shows INFO on the
    console, and the report is drawn after the run's summary. A level set on matplotlib's logger is kept."""
    log = logging.getLogger("matplotlib")
    if log.level != logging.NOTSET:
        yield
        return
    log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.setLevel(logging.NOTSET)


def write_report(run_dir: str | Path) -> list[Path]:
    """Draw ``run_dir/metrics.jsonl`` as PNGs in ``run_dir/report/`` (one per panel and ``summary.png``
    with all of them); the paths written, the summary first. matplotlib logs only warnings meanwhile."""
    with _quiet_matplotlib():
        return _write_report(run_dir)


def _write_report(run_dir: str | Path) -> list[Path]:
    """One figure with every panel, drawn once: ``summary.png`` is that figure, and each panel's own PNG is its
    part of the same image (the panel with its title, labels and legend). Drawing the panels as figures of their
    own took as long again, and laying out each of them (``tight_layout``) as long as the drawing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    rows = read_metrics(run_dir)
    out_dir = Path(run_dir) / "report"
    out_dir.mkdir(parents=True, exist_ok=True)
    panels = _panels(rows)
    ncols = 4
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5 * ncols, 4 * nrows), dpi=_DPI)
    try:
        for ax in axes.flat[len(panels):]:
            ax.set_visible(False)
        for ax, (_, title, count, draw) in zip(axes.flat, panels):
            draw(ax)
            ax.set_title(title)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            if count:
                ax.legend(fontsize=7)
            else:
                ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        fig.tight_layout()
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        image = Image.frombuffer("RGBA", fig.canvas.get_width_height(), fig.canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
        image = image.convert("RGB")
        width, height = image.size
        written = [out_dir / "summary.png"]
        image.save(written[0], optimize=False)
        for ax, (name, *_) in zip(axes.flat, panels):
            box = ax.get_tightbbox(renderer)  # display pixels, origin at the bottom left
            crop = (max(0, int(box.x0) - _PAD), max(0, int(height - box.y1) - _PAD),
                    min(width, int(box.x1) + _PAD), min(height, int(height - box.y0) + _PAD))
            p = out_dir / f"{name}.png"
            image.crop(crop).save(p)
            written.append(p)
    finally:
        plt.close(fig)
    return written


_DPI = 90  # the panels' resolution (a 5 x 4 inch panel is 450 x 360 pixels)
_PAD = 6  # pixels kept around a panel's own PNG


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    try:
        for p in write_report(argv[0]):
            print(p)
    except FileNotFoundError as exc:
        print(f"grpo_dist.report: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
