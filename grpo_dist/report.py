"""Draw a run's report: PNG plots of its metrics.jsonl.

    python -m grpo_dist.report RUN_DIR     # writes RUN_DIR/report/*.png and prints their paths

Plots: reward, validation accuracy, KL, entropy, response length, time per phase, over steps.
The trainer calls this at the end of every run; the command redraws it for any run folder.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PANELS = [
    ("reward", ["critic/score/mean"], "mean score of the step's responses"),
    ("val_accuracy", ["val-core/"], "validation accuracy"),
    ("kl", ["actor/kl_loss", "actor/ppo_kl", "actor/reward_kl_penalty"], "KL"),
    ("entropy", ["actor/entropy"], "policy entropy (nats/token)"),
    ("response_length", ["response_length/mean"], "response length (tokens)"),
    ("timing", ["timing_s/"], "seconds per phase"),
]


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
    out: dict[str, tuple[list[int], list[float]]] = {}
    for r in rows:
        for k, v in r.items():
            if v is None or k == "step" or not any(k == p or (p.endswith("/") and k.startswith(p)) for p in prefixes):
                continue
            xs, ys = out.setdefault(k, ([], []))
            xs.append(int(r["step"]))
            ys.append(float(v))
    return out


def write_report(run_dir: str | Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    out_dir = Path(run_dir) / "report"
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    fig_all, axes = plt.subplots(2, 3, figsize=(15, 8))
    for ax_all, (name, prefixes, title) in zip(axes.flat, PANELS):
        series = _series(rows, prefixes)
        fig, ax = plt.subplots(figsize=(6, 4))
        for a in (ax, ax_all):
            for k, (xs, ys) in sorted(series.items()):
                a.plot(xs, ys, marker="." if len(xs) < 30 else None, label=k)
            a.set_title(title)
            a.set_xlabel("step")
            a.grid(alpha=0.3)
            if series:
                a.legend(fontsize=7)
            else:
                a.text(0.5, 0.5, "no data", ha="center", va="center", transform=a.transAxes)
        fig.tight_layout()
        p = out_dir / f"{name}.png"
        fig.savefig(p, dpi=90)
        plt.close(fig)
        written.append(p)
    fig_all.tight_layout()
    p = out_dir / "summary.png"
    fig_all.savefig(p, dpi=80)
    plt.close(fig_all)
    written.insert(0, p)
    return written


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
