"""scripts/bench/lora.py: the command line it builds per configuration is a valid run of the SmolLM2
recipe (float32, KL loss on, LoRA only where asked), and its table reads a run's metrics rows."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench"
sys.path.insert(0, str(BENCH))

import lora as bench  # noqa: E402

from grpo_dist.config.loader import compose, to_typed  # noqa: E402
from grpo_dist.config.validate import lora_settings, validate_config  # noqa: E402


def typed(name: str, *argv: str):
    cmd = bench.overrides(bench.CONFIGS[name], bench.parser().parse_args(list(argv)), Path("/tmp/grpo_dist_lora_bench"))
    assert cmd[:2] == ["--config-name", bench.RECIPE]
    keys = [o for o in cmd[2:] if not o.startswith("hydra.")]
    cfg = to_typed(compose(keys, config_name=bench.RECIPE), keys)
    validate_config(cfg, check_paths=False)
    return cfg


@pytest.mark.parametrize("name, rank, lr", [("full", 0, 1e-5), ("lora16", 16, 1e-4), ("lora64", 64, 1e-4)])
def test_each_configuration_is_the_recipe_with_kl_in_float32(name, rank, lr):
    cfg = typed(name)
    a = cfg.actor_rollout_ref
    assert a.actor.use_kl_loss and a.actor.optim.lr == lr and a.rollout.dtype == "float32"
    assert cfg.data.train_batch_size == 8 and a.rollout.n == 8  # the recipe's batch and group, unchanged
    lora = lora_settings(cfg)
    assert (lora.rank, lora.target_modules) == (rank, "all-linear")
    assert cfg.trainer.val_before_train and cfg.trainer.test_freq == cfg.trainer.total_training_steps == 30


def test_flags_reach_the_command_line():
    cfg = typed("lora64", "--steps", "3", "--lr-lora", "2e-4", "--merge", "true", "--val-samples", "16", "--alpha", "64")
    lora = lora_settings(cfg)
    assert (lora.alpha, lora.merge, cfg.actor_rollout_ref.actor.optim.lr) == (64.0, True, 2e-4)
    assert cfg.trainer.total_training_steps == cfg.trainer.test_freq == 3 and cfg.data.val_max_samples == 16


def test_summary_takes_medians_after_the_first_step_peaks_and_accuracy():
    val = "val-core/larger/acc/mean@1"
    rows = [
        {"step": 0, val: 0.25},
        {"step": 1, "timing_s/step": 9.0, "timing_s/gen": 3.0, "timing_s/update_actor": 5.0, "timing_s/ref": 2.0,
         "timing_s/update_weights": 1.0, "perf/weight_sync_bytes": 4e6, "perf/max_memory_gb/actor_rollout": 3.0},
        {"step": 2, "timing_s/step": 4.0, "timing_s/gen": 0.5, "timing_s/update_actor": 2.0, "timing_s/ref": 1.0,
         "timing_s/update_weights": 0.5, "perf/weight_sync_bytes": 4e6, "perf/max_memory_gb/actor_rollout": 2.5},
        {"step": 3, "timing_s/step": 5.0, "timing_s/gen": 1.0, "timing_s/update_actor": 3.0, "timing_s/ref": 1.5,
         "timing_s/update_weights": 0.25, "perf/weight_sync_bytes": 4e6, "perf/max_memory_gb/actor_rollout": 2.0,
         val: 0.5},
    ]
    s = bench.summarise(rows)
    assert s["steps"] == 3 and s["timing_s/update_actor"] == 2.5 and s["timing_s/ref"] == 1.25
    assert s["timing_s/update_weights"] == 0.375 and s["perf/weight_sync_bytes"] == 4e6
    assert s["max_memory_gb"] == {"actor_rollout": 3.0}
    assert (s["acc_before"], s["acc_after"]) == (0.25, 0.5)
    s["config"], s["lr"] = "lora16", 1e-4
    row = bench.table([s]).splitlines()[-1]
    assert row.startswith("| lora16 | 0.0001 | 3 | 4.50 | 0.75 | 2.50 | 1.25 | 0.38 | 4.0 | actor_rollout 3.00 | 0.250 | 0.500 |")


def test_unknown_configuration_is_refused():
    with pytest.raises(SystemExit):
        bench.main(["--configs", "lora8"])
