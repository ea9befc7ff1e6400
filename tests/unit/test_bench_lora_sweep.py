"""scripts/bench/lora_sweep.py: run specifications, the ground truth it reads back from a prompt, and the
table of accuracy means over seeds that docs/lora.md quotes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench"
sys.path.insert(0, str(BENCH))

import lora_sweep as sweep  # noqa: E402

from grpo_dist.tasks.larger import make_prompt  # noqa: E402


def test_run_spec_defaults_alpha_to_twice_the_rank():
    assert sweep.parse_run("lora16:16:2e-4") == {"name": "lora16", "rank": 16, "lr": 2e-4, "alpha": 32.0}
    assert sweep.parse_run("r8:8:1e-3:16")["alpha"] == 16.0
    assert sweep.parse_run("full:0:1e-5")["rank"] == 0
    with pytest.raises(SystemExit, match="name:rank:lr"):
        sweep.parse_run("lora16:16")


def test_answer_is_read_from_the_templated_prompt():
    # the chat template wraps the question in a system prompt and markers; the last question counts
    text = "<|im_start|>system\nYou are helpful, 12 or 13?<|im_end|>\n<|im_start|>user\n" \
        + make_prompt(47, 74)[0]["content"] + "<|im_end|>\n<|im_start|>assistant\n"
    assert sweep.answer_in(text) == 74


def test_render_means_and_spreads_over_seeds(tmp_path):
    rows = [{"name": "lora16", "rank": 16, "lr": 2e-4, "alpha": 32.0, "seed": s, "acc": {"0": 0.5, "5": a}}
            for s, a in enumerate((0.6, 0.8))]
    rows.append({"name": "lora16", "rank": 16, "lr": 2e-4, "alpha": 32.0, "seed": 2, "error": "OOM"})
    path = tmp_path / "sweep.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    table = sweep.render(path)
    line = next(ln for ln in table.splitlines() if ln.startswith("| lora16"))
    # mean 0.7, sample std of (0.6, 0.8) = 0.1414; the failed seed is not counted
    assert line == "| lora16 | 16 | 0.0002 | 32 | 2 | 0.500 ± 0.000 | 0.700 ± 0.141 |"
