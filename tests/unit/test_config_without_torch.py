"""The configuration is composed and validated without importing torch, transformers, vLLM or Ray.

Those imports take seconds on a small machine (torch alone ~2 s); the configuration layer needs none of
them, so a configuration error and ``--check=config`` answer in about a second. The configuration reads
the registries' names and traits (grpo_dist/core/advantage_registry.py, policy_loss_registry.py), the
names of core's math (core/names.py), the rollout-correction settings and the dtype names from modules
that do not import torch. A module of that layer importing torch again fails here, naming the importer.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "vllm", "ray", "tensordict", "safetensors", "peft")

# Runs in a fresh Python: each command line below is composed and validated (compose_jobs, as
# ``python -m grpo_dist.main`` does) with the heavy libraries made unimportable; prints one JSON line.
PROBE = textwrap.dedent("""
    import importlib.abc, json, sys, traceback

    HEAVY = set(sys.argv[1].split(","))

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in HEAVY:
                raise ImportError(f"{name} imported")

    sys.meta_path.insert(0, Refuse())
    import grpo_dist.main as m
    from grpo_dist.config.schema import ConfigError

    results = []
    for argv in json.loads(sys.argv[2]):
        try:
            m.compose_jobs(m.parse_args(argv))
            results.append([argv, "valid", ""])
        except ImportError as e:
            frames = [f for f in traceback.extract_tb(e.__traceback__) if "grpo_dist" in f.filename]
            where = " <- ".join(f"{f.filename.split('grpo_dist/')[-1]}:{f.lineno}" for f in reversed(frames[-4:]))
            results.append([argv, "import", f"{e} ({where})"])
        except ConfigError as e:
            results.append([argv, "refused", str(e)])
    print(json.dumps(results))
""")

COMMAND_LINES = [
    ["--check=config"],
    ["--check=config", "-cn", "ppo_trainer", "algorithm.adv_estimator=gae"],
    ["--check=config", "-cn", "recipes/gsm8k_qwen2.5_0.5b"],
    ["--check=config", "-cn", "recipes/agent_calculator_cpu"],
    ["--check=config", "-cn", "recipes/larger_smollm2_135m_cpu"],
    ["--check=config", "algorithm.adv_estimator=remax", "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
     "algorithm.rollout_correction.rollout_is=token", "actor_rollout_ref.actor.fsdp_config.dtype=bf16"],
    ["--check=config", "actor_rollout_ref.actor.policy_loss.loss_mode=dro"],
    ["algorithm.adv_estimator=grpoo"],
]


def test_the_configuration_is_composed_and_validated_without_the_heavy_libraries():
    out = subprocess.run([sys.executable, "-c", PROBE, ",".join(HEAVY), json.dumps(COMMAND_LINES)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    imported = [(argv, why) for argv, what, why in results if what == "import"]
    assert not imported, f"the configuration layer imported a heavy library: {imported}"
    outcome = {tuple(argv): (what, why) for argv, what, why in results}
    assert [what for what, _ in outcome.values()].count("valid") == len(COMMAND_LINES) - 2, outcome
    # a mode's own check (dro needs dro_beta) and an unknown name are answered from the torch-free registries
    what, why = outcome[("--check=config", "actor_rollout_ref.actor.policy_loss.loss_mode=dro")]
    assert what == "refused" and "dro_beta" in why, why
    what, why = outcome[("algorithm.adv_estimator=grpoo",)]
    assert what == "refused" and "'grpoo'" in why and "grpo" in why and "gae" in why, why
