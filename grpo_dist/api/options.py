"""The constructor's arguments: their checks, and the objective (the update's loss) they define.

Every check raises a ``ValueError`` that names the argument, the value and what would be valid
(docs/python_api.md, "Errors"); :class:`~grpo_dist.api.GRPO` runs them all before it touches a model.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from grpo_dist.core.advantages import AdvEstimatorSpec, get_adv_estimator, list_adv_estimators
from grpo_dist.core.kl import canonical_kl_kind
from grpo_dist.core.losses import LOSS_AGG_MODES
from grpo_dist.core.policy_loss import PolicyLossParams, get_policy_loss, list_policy_losses
from grpo_dist.training.objective import PolicyObjective
from grpo_dist.training.settings import LoraSettings

# loss modes that only the distributed trainer can feed (bypass mode takes the rollout engine's
# log-probs as the old policy, set up by algorithm.rollout_correction)
TRAINER_ONLY_LOSS_MODES = frozenset({"bypass_mode"})


def _api_estimator(spec: AdvEstimatorSpec) -> bool:
    return not (spec.needs_values or spec.needs_step_rewards or spec.needs_baseline_rollout)


def api_loss_modes() -> list[str]:
    """The registered policy-loss modes :class:`~grpo_dist.api.GRPO` accepts."""
    return [m for m in list_policy_losses() if m not in TRAINER_ONLY_LOSS_MODES]


def api_estimators() -> list[str]:
    """The registered advantage estimators :class:`~grpo_dist.api.GRPO` accepts (no critic, step rewards or
    baseline rollout)."""
    return [n for n in list_adv_estimators() if _api_estimator(get_adv_estimator(n))]


def check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"GRPO {name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_float(name: str, value: Any, *, minimum: float, strict: bool = False) -> float:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > minimum if strict else value >= minimum)
    if not ok:
        raise ValueError(f"GRPO {name} must be a finite number {'>' if strict else '>='} {minimum}, got {value!r}")
    return float(value)


def check_optional_int(name: str, value: Any, minimum: int) -> int | None:
    """``check_int``, with None passed through (``mini_batch_size``, ``micro_batch_size``)."""
    return None if value is None else check_int(name, value, minimum)


def check_models(model: Any, ref_model: Any) -> None:
    """The policy is a module; the reference is another module that shares no parameter with it (it is
    frozen, and must not move with the policy), or None (the API makes one)."""
    if not isinstance(model, nn.Module):
        raise ValueError(f"GRPO model must be a torch.nn.Module, got {type(model).__name__}")
    if ref_model is not None and not isinstance(ref_model, nn.Module):
        raise ValueError(f"GRPO ref_model must be a torch.nn.Module or None, got {type(ref_model).__name__}")
    if ref_model is model:
        raise ValueError("GRPO ref_model is the policy itself; pass a separate copy, or omit it to get a frozen copy")
    if ref_model is not None:
        policy_params = {id(p) for p in model.parameters()}
        shared = [name for name, p in ref_model.named_parameters() if id(p) in policy_params]
        if shared:
            raise ValueError(f"GRPO ref_model shares {len(shared)} parameters with the model (e.g. {shared[0]!r}; a "
                             "peft model's own base model does, and runs through its adapters): pass a separate "
                             "copy, or omit ref_model (a peft model's reference is then its base, adapters off)")


def check_lora(*, rank: Any, alpha: Any, dropout: Any, target_modules: Any, seed: int) -> LoraSettings:
    """The LoRA arguments as the distributed actor's :class:`~grpo_dist.training.settings.LoraSettings`
    (``rank == 0``: no adapters are added). ``target_modules``: ``"all-linear"`` (every linear layer
    but the output layer), a regular expression over the full module names, or a non-empty list of
    module names (a name matches a module whose dotted name ends with it). ``seed`` draws ``A``."""
    rank = check_int("lora_rank", rank, 0)
    alpha = check_float("lora_alpha", alpha, minimum=0.0, strict=True)
    if not (isinstance(dropout, numbers.Real) and not isinstance(dropout, bool) and 0.0 <= dropout < 1.0):
        raise ValueError(f"GRPO lora_dropout must be a number in [0, 1), got {dropout!r}")
    names_ok = (isinstance(target_modules, Sequence) and not isinstance(target_modules, str) and len(target_modules) > 0
                and all(isinstance(n, str) and n for n in target_modules))
    if not ((isinstance(target_modules, str) and target_modules) or names_ok):
        raise ValueError("GRPO lora_target_modules must be 'all-linear', a regular expression over module names, or "
                         f"a non-empty list of module names (e.g. ['q_proj', 'v_proj']), got {target_modules!r}")
    targets = target_modules if isinstance(target_modules, str) else tuple(target_modules)
    return LoraSettings(rank=rank, alpha=alpha, dropout=float(dropout), target_modules=targets, seed=seed)


def check_reward_fn(reward_fn: Any) -> None:
    if reward_fn is None or not callable(reward_fn):
        raise ValueError(f"GRPO reward_fn must be a function reward_fn(completions, prompts) -> list[float], got {reward_fn!r}")


def check_estimator(adv_estimator: str) -> AdvEstimatorSpec:
    """The registered estimator ``adv_estimator``, refused when it needs what this API does not produce."""
    spec = get_adv_estimator(adv_estimator)
    if not _api_estimator(spec):
        need = ("a critic's values" if spec.needs_values else "per-step rewards"
                if spec.needs_step_rewards else "a greedy baseline rollout")
        raise ValueError(f"GRPO adv_estimator {adv_estimator!r} needs {need}, which this API does not produce; "
                         f"valid: {api_estimators()}")
    return spec


def check_group_size(group_size: Any, adv_estimator: str, spec: AdvEstimatorSpec) -> int:
    """At least 2 completions per prompt for a group-based estimator, at least 1 otherwise."""
    if not spec.group_based:
        return check_int("group_size", group_size, 1)
    try:
        return check_int("group_size", group_size, 2)
    except ValueError as e:
        singles = [n for n in api_estimators() if not get_adv_estimator(n).group_based]
        raise ValueError(f"{e}: adv_estimator {adv_estimator!r} compares the completions of a prompt with each "
                         f"other; group_size=1 needs an estimator that is not group-based: {singles}") from None


def build_objective(
    *,
    loss_mode: str,
    loss_agg_mode: str,
    kl_loss_type: str,
    kl_loss_agg_mode: str | None,
    kl_coef: float,
    entropy_coeff: Any,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float,
    policy_loss_params: Mapping[str, Any] | None,
    max_new_tokens: int,
    temperature: float,
) -> PolicyObjective:
    """The update's loss (:class:`~grpo_dist.training.objective.PolicyObjective`, the distributed actor's)
    from the loss arguments, each checked: aggregation modes, the KL estimator, ``policy_loss_params``,
    the clip ratios, ``loss_mode`` and ``entropy_coeff``. ``kl_coef``, ``max_new_tokens`` (the
    normalising constant of ``seq-mean-token-sum-norm``) and ``temperature`` come checked."""
    for name, mode in (("loss_agg_mode", loss_agg_mode), ("kl_loss_agg_mode", kl_loss_agg_mode)):
        if not (mode in LOSS_AGG_MODES or (mode is None and name == "kl_loss_agg_mode")):
            raise ValueError(f"GRPO {name} {mode!r} is not an aggregation mode; valid: {list(LOSS_AGG_MODES)}")
    try:
        if canonical_kl_kind(kl_loss_type) == "full":
            raise ValueError("needs the reference logits")
    except ValueError as e:
        raise ValueError(f"GRPO kl_loss_type {kl_loss_type!r} is not usable ({e}); "
                         "valid: kl (k1), abs, mse (k2), low_var_kl (k3)") from None
    known = {f.name for f in dataclasses.fields(PolicyLossParams)}
    extra = dict(policy_loss_params or {})
    unknown = sorted(set(extra) - known)
    if unknown:
        raise ValueError(f"GRPO policy_loss_params {unknown} are not fields of PolicyLossParams; valid: {sorted(known)}")
    clips = dict(clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high, clip_ratio_c=clip_ratio_c)
    try:
        params = PolicyLossParams(**(clips | extra))
    except ValueError as e:
        raise ValueError(f"GRPO clip ratios / policy_loss_params: {e}") from None
    if loss_mode in TRAINER_ONLY_LOSS_MODES:
        raise ValueError(f"GRPO loss_mode {loss_mode!r} needs the rollout engine's log-probs and rollout-correction "
                         f"settings, which this API does not have; valid: {api_loss_modes()}")
    spec = get_policy_loss(loss_mode)
    try:
        spec.check_params(params)
    except ValueError as e:
        raise ValueError(f"GRPO loss_mode {loss_mode!r}: policy_loss_params {e}") from None
    return PolicyObjective(
        policy_loss=spec,
        params=params,
        loss_agg_mode=loss_agg_mode,
        norm_constant=float(max_new_tokens),
        entropy_coeff=check_float("entropy_coeff", entropy_coeff, minimum=-math.inf),
        use_kl_loss=True,  # always computed: ``kl`` is reported even with kl_coef=0
        kl_loss_coef=kl_coef,
        kl_loss_type=kl_loss_type,
        kl_loss_agg_mode=kl_loss_agg_mode,
        temperature=temperature,
    )
