"""verl's validation metrics (grpo_dist.trainer.val_metrics): hand-computed values, a plain loop over the
bootstrap draws as the reference, and the names (which variable is core, which metrics are val-core)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from grpo_dist.trainer.val_metrics import BOOTSTRAP_DRAWS, BOOTSTRAP_SEED, prompt_metrics, validation_metrics


def reference(values, k, preds=None):
    """best / worst / maj over the draws, one draw at a time (verl's definition, written as loops)."""
    rng = np.random.RandomState(BOOTSTRAP_SEED)
    best, worst, maj = [], [], []
    for _ in range(BOOTSTRAP_DRAWS):
        draw = [int(j) for j in rng.choice(len(values), size=k, replace=True)]
        best.append(max(values[j] for j in draw))
        worst.append(min(values[j] for j in draw))
        if preds is not None:
            votes = [repr(preds[j]) for j in draw]
            counts = Counter(votes)
            top = max(counts.values())
            winner = next(v for v in votes if counts[v] == top)  # first seen among the most common
            maj.append(values[draw[votes.index(winner)]])
    out = {f"best@{k}/mean": np.mean(best), f"best@{k}/std": np.std(best), f"worst@{k}/mean": np.mean(worst),
           f"worst@{k}/std": np.std(worst)}
    if preds is not None:
        out.update({f"maj@{k}/mean": np.mean(maj), f"maj@{k}/std": np.std(maj)})
    return out


def test_one_response_per_prompt_is_its_mean_only():
    assert prompt_metrics([0.25]) == {"mean@1": 0.25}


def test_hand_computed_mean_std_and_the_bootstrap_sizes():
    m = prompt_metrics([1.0, 0.0, 0.0, 1.0, 1.0])
    assert m["mean@5"] == pytest.approx(0.6) and m["std@5"] == pytest.approx(np.sqrt(0.24))  # population std
    assert sorted({k.split("/")[0] for k in m if "@" in k and k.split("@")[0] in ("best", "worst")}) == [
        "best@2", "best@4", "best@5", "worst@2", "worst@4", "worst@5"]  # powers of two below 5, then 5
    same = prompt_metrics([0.5] * 4)  # every draw's best and worst is 0.5
    assert same["best@4/mean"] == same["worst@2/mean"] == 0.5 and same["best@4/std"] == 0.0


@pytest.mark.parametrize("values,preds", [
    ([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.3, 0.9], None),
    ([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.3, 0.9], ["7", "3", "3", "7", "7", "3", "5", "7"]),
    ([0.0, 1.0, 0.0], ["a", "b", "c"]),  # every draw of distinct answers: ties, the first seen wins
    ([0.0, 1.0, 1.0, 0.5], [[1], [2], [2], [1]]),  # answers that cannot be dict keys vote by their text
])
def test_bootstrap_metrics_equal_the_plain_loop(values, preds):
    from grpo_dist.trainer.val_metrics import majority_picks

    got = prompt_metrics(values, majority_picks(preds) if preds else None)
    for k in {8: (2, 4, 8), 3: (2, 3), 4: (2, 4)}[len(values)]:
        for name, want in reference(values, k, preds).items():
            assert got[name] == pytest.approx(want, abs=1e-12), name
    assert any(k.startswith("maj@") for k in got) == (preds is not None)


def test_names_core_and_aux_per_data_source_averaged_over_prompts():
    # two sources; source a: prompts p1 (2 responses) and p2 (2), source b: prompt p3 (2); acc given by the function
    sources = ["a", "a", "a", "a", "b", "b"]
    uids = ["p1", "p1", "p2", "p2", "p3", "p3"]
    reward = [1.0, 0.0, 1.0, 1.0, 0.2, 0.4]
    acc = [1, 0, 1, 1, 0, 0]
    out = validation_metrics(sources, uids, {"reward": reward, "acc": acc, "pred": ["x"] * 6, "note": ["t"] * 6})
    assert out["val-core/a/acc/mean@2"] == pytest.approx((0.5 + 1.0) / 2)
    assert out["val-core/b/acc/mean@2"] == 0.0
    assert out["val-aux/a/reward/mean@2"] == pytest.approx(0.75) and out["val-aux/b/reward/mean@2"] == pytest.approx(0.3)
    assert out["val-aux/a/acc/std@2"] == pytest.approx((0.5 + 0.0) / 2)
    assert {"val-core/a/acc/best@2/mean", "val-core/a/acc/maj@2/mean", "val-aux/a/acc/worst@2/mean",
            "val-core/a/acc/best@2/std", "val-aux/a/reward/best@2/mean"} <= set(out)  # (verl: best@n/std is core too)
    assert not any("/pred/" in k or "/note/" in k for k in out)  # text values are not reduced
    # without acc the reward is the core variable; a value a sample lacks (None) is left out of its variable
    out = validation_metrics(["a"] * 3, ["p", "p", "q"], {"reward": [0.5, 1.0, 0.0], "hits": [3, None, 1]})
    assert out["val-core/a/reward/mean@2"] == pytest.approx(0.75)  # prompt p; prompt q had one response, ...
    assert out["val-aux/a/reward/mean@1"] == 0.0  # ... so its mean@1 is a metric of its own (verl's names)
    assert out["val-aux/a/hits/mean@1"] == pytest.approx(2.0)  # p: 3 (its None left out), q: 1


def test_the_summary_and_the_console_line_show_the_val_core_means(capsys):
    """Their spreads (std) and the val-aux metrics stay in metrics.jsonl; the progress bar takes mean@n."""
    from grpo_dist.trainer.run import _print_summary
    from grpo_dist.trainer.summary import RunSummary
    from grpo_dist.trainer.tracking import ConsoleLogger, is_headline_validation

    val = {"val-core/s/acc/mean@4": 0.5, "val-core/s/acc/best@4/mean": 0.75, "val-core/s/acc/best@4/std": 0.1,
           "val-aux/s/reward/mean@4": 0.4}
    _print_summary(RunSummary(steps=2, out_dir="/o", val_before=val, val_after=val), 10.0)
    out = capsys.readouterr().out
    assert "val-core/s/acc/mean@4 0.500 -> 0.500" in out and "val-core/s/acc/best@4/mean 0.750 -> 0.750" in out
    assert "/std" not in out and "val-aux" not in out
    ConsoleLogger(quiet_when_progress_bar=False).log(val, step=3)
    line = capsys.readouterr().out
    assert "val-core/s/acc/mean@4=0.5" in line and "best@4/mean=0.75" in line and "/std" not in line and "val-aux" not in line
    assert [k for k in val if is_headline_validation(k)] == ["val-core/s/acc/mean@4"]


def test_the_reports_accuracy_panel_draws_the_val_core_values_without_their_spreads():
    from grpo_dist.report import _series

    rows = [{"step": 0, "val-core/s/acc/mean@4": 0.25, "val-core/s/acc/best@4/mean": 0.5, "val-core/s/acc/best@4/std": 0.1,
             "val-aux/s/reward/mean@4": 0.2}, {"step": 5, "val-core/s/acc/mean@4": 0.5}]
    series = _series(rows, ["val-core/"])
    assert sorted(series) == ["val-core/s/acc/best@4/mean", "val-core/s/acc/mean@4"]
    assert series["val-core/s/acc/mean@4"] == ([0, 5], [0.25, 0.5])
