"""The driver builds the actor's settings and shards batches without loading the FSDP machinery."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch.distributed.fsdp", "transformers", "grpo_dist.training.actor", "grpo_dist.training.fsdp")


@pytest.mark.parametrize(
    ("statement", "module"),
    [
        (
            "from grpo_dist.training.settings import ActorSettings, ReferenceSettings, FORWARD_KEYS, UPDATE_KEYS; "
            "ActorSettings(loss_mode='vanilla', lr_scheduler_type='cosine', total_training_steps=3); ReferenceSettings()",
            "grpo_dist.training.settings",
        ),
        (
            "from grpo_dist.training.micro_batches import rank_shard_indices; "
            "rank_shard_indices(8, num_mini_batches=2, rank=1, world_size=2)",
            "grpo_dist.training.micro_batches",
        ),
        ("import grpo_dist.training", "grpo_dist.training"),
    ],
)
def test_light_training_modules_do_not_import_fsdp_or_transformers(statement, module):
    code = (
        f"import sys, json\n{statement}\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'grpo_dist'))))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    loaded = set(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert module in loaded  # the listing sees what the statement imported
    heavy = sorted(m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert heavy == [], f"{statement!r} imported {heavy}"


def test_the_driver_process_does_not_load_the_fsdp_training_modules():
    """The driver builds every role's settings (role table) and shards the update batch, in a process
    that never holds a model: importing it must not load FSDP or the training modules that use it."""
    code = (
        "import sys, json\n"
        "import grpo_dist.trainer.driver, grpo_dist.trainer.roles, grpo_dist.main\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'grpo_dist'))))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    loaded = set(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert "grpo_dist.trainer.roles" in loaded
    # (torch.distributed.fsdp itself is loaded by tensordict, the batch container, on import)
    fsdp = ("grpo_dist.training.actor", "grpo_dist.training.fsdp", "grpo_dist.training.reference",
            "grpo_dist.training.model_builder", "grpo_dist.training.checkpoint_io", "grpo_dist.training.policy")
    heavy = sorted(m for m in loaded if any(m == h or m.startswith(h + ".") for h in fsdp))
    assert heavy == [], heavy


def test_validating_a_configuration_does_not_load_torchs_compiler():
    """Validation builds the optimizer once on a dummy parameter; torch's compiler (torch._dynamo, 1.5-3 s of a CPU,
    once the largest part of a run's configuration phase) stays unloaded, and torch is left as it was."""
    code = (
        "import sys, torch\n"
        "from tests.configs import cfg_of, refused\n"
        "cfg_of('actor_rollout_ref.actor.optim.lr=3e-4')\n"
        "assert 'refuses the arguments' in refused('+actor_rollout_ref.actor.optim.override_optimizer_config.foo=1')\n"
        "print('torch._dynamo' in sys.modules, hasattr(torch.optim.Optimizer.add_param_group.__wrapped__, "
        "'__dynamo_disable'))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["False", "False"]
