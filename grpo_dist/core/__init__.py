"""Pure GRPO/PPO math: advantage estimators, policy losses (and their registry), loss aggregation,
the critic's value loss, KL estimators, rollout correction, group filtering, learning-rate
schedules, diagnostics (the rollout-vs-actor probability gap), and the reward model's loss and
replay share.

Depends on torch only (no torch.distributed, Ray, vLLM or Hydra) and on nothing else in grpo_dist.
The registries (:mod:`~grpo_dist.core.advantage_registry`, :mod:`~grpo_dist.core.policy_loss_registry`),
the names (:mod:`~grpo_dist.core.names`), the rollout-correction settings
(:mod:`~grpo_dist.core.rollout_correction_params`) and the schedules do not import torch: the
configuration reads them before anything heavy is imported. So this package exports its names lazily:
``from grpo_dist.core import X`` imports the one submodule that defines ``X``.
"""

import importlib
from pathlib import Path
from typing import Any

# a submodule with its own __all__ is exported whole; of the others the package exports the names listed
_WHOLE = ("advantages", "losses", "policy_loss", "value", "kl", "group_filter")
_NAMED: dict[str, tuple[str, ...]] = {
    "rollout_correction": ("RolloutCorrectionParams", "RejectionCriterion", "importance_weights", "rejection_mask",
                           "mismatch_metrics", "correct"),
    "schedules": ("LR_SCHEDULER_TYPES", "LRMultiplier", "lr_lambda", "resolve_warmup_steps"),
    "diagnostics": ("rollout_probs_diff",),
    "reward_model": ("labelled_bce", "verifier_agreement", "replay_count"),
}
_OWNER = {name: module for module, names in _NAMED.items() for name in names}


def _submodule(module: str) -> Any:
    return importlib.import_module(f"{__name__}.{module}")


def __getattr__(name: str) -> Any:
    if name == "__all__":  # asked for by ``from grpo_dist.core import *`` and documentation tools
        value = [n for m in _WHOLE for n in _submodule(m).__all__] + list(_OWNER)
    elif name in _OWNER:
        value = getattr(_submodule(_OWNER[name]), name)
    elif name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    elif (Path(__file__).parent / f"{name}.py").is_file():  # grpo_dist.core.<submodule>, not imported yet
        value = _submodule(name)
    else:
        for module in _WHOLE:
            if name in _submodule(module).__all__:
                value = getattr(_submodule(module), name)
                break
        else:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value
