"""The settings of rollout correction (``algorithm.rollout_correction.*``, verl's keys): their names,
parsing and checks, without torch, so that the configuration checks them before anything heavy is
imported. The math, and what each setting means: :mod:`grpo_dist.core.rollout_correction`.
"""

import math
from dataclasses import dataclass
from typing import Any

__all__ = [
    "SAFETY_BOUND",
    "IS_LEVELS",
    "RS_OPTIONS",
    "LOSS_TYPES",
    "RejectionCriterion",
    "RolloutCorrectionParams",
    "parse_is_threshold",
    "parse_rejection_criteria",
]

SAFETY_BOUND = 20.0
"""Log-ratios (and their sums) are clamped to [-20, 20] before exponentiating."""
IS_LEVELS: tuple[str, ...] = ("token", "sequence")
RS_OPTIONS: tuple[str, ...] = (
    "token_k1", "token_k2", "token_k3",
    "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3",
    "seq_max_k2", "seq_max_k3",
)
LOSS_TYPES: tuple[str, ...] = ("ppo_clip", "reinforce")


# --------------------------------------------------------------------------------------------------
# settings
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RejectionCriterion:
    """One rejection criterion: ``option`` (one of :data:`RS_OPTIONS`) and its bounds.

    For k1 options ``lower``/``upper`` bound the ratio ``pi_rollout / pi_old`` (compared in log
    space); for the others ``lower`` is None and ``upper`` bounds the divergence.
    """

    option: str
    lower: float | None
    upper: float


@dataclass(frozen=True)
class RolloutCorrectionParams:
    """The parsed ``algorithm.rollout_correction.*`` settings (build them with :meth:`from_config`).

    Attributes:
        is_level: None (no weights), ``"token"`` or ``"sequence"``.
        is_lower, is_upper: the band of the ratio: TIS truncates at ``is_upper`` (``is_lower`` =
            ``1/is_upper`` is only used by the metrics); IcePop keeps ``[is_lower, is_upper]``.
        is_band: True for IcePop masking (the threshold was ``"lo_hi"``), False for truncation.
        is_batch_normalize: divide the weights by their batch mean.
        rejection: the rejection criteria (empty: none).
        bypass: use the rollout log-probs as the old log-probs (no old-log-prob forward); the loss
            then computes the weights and the rejection from the policy being trained.
        loss_type: in bypass mode, ``"ppo_clip"`` (the PPO clip against the rollout policy) or
            ``"reinforce"`` (``-sg(w) * A * logp``).
    """

    is_level: str | None = None
    is_lower: float = 0.5
    is_upper: float = 2.0
    is_band: bool = False
    is_batch_normalize: bool = False
    rejection: tuple[RejectionCriterion, ...] = ()
    bypass: bool = False
    loss_type: str = "ppo_clip"

    def __post_init__(self) -> None:
        if self.is_level is not None and self.is_level not in IS_LEVELS:
            raise ValueError(f"rollout_is must be null or one of {list(IS_LEVELS)}, got {self.is_level!r}")
        if not 0 < self.is_lower < self.is_upper:
            raise ValueError(f"the importance-weight band must satisfy 0 < lower < upper, got "
                             f"({self.is_lower}, {self.is_upper})")
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {list(LOSS_TYPES)}, got {self.loss_type!r}")

    @property
    def changes_training(self) -> bool:
        """Whether the correction changes the update (weights, rejection or bypass), not only metrics."""
        return self.is_level is not None or bool(self.rejection) or self.bypass

    @classmethod
    def from_config(
        cls,
        *,
        rollout_is: str | None,
        rollout_is_threshold: Any,
        rollout_rs: str | None,
        rollout_rs_threshold: Any,
        bypass_mode: bool,
        loss_type: str,
        rollout_is_batch_normalize: bool,
    ) -> "RolloutCorrectionParams":
        """Parse verl's keys; ``ValueError`` naming the key and what would be valid."""
        if rollout_is is not None and rollout_is not in IS_LEVELS:
            raise ValueError(f"rollout_is = {rollout_is!r}: expected null, token or sequence")
        lower, upper, band = parse_is_threshold(rollout_is_threshold)
        if loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type = {loss_type!r}: expected one of {', '.join(LOSS_TYPES)}")
        rejection = parse_rejection_criteria(rollout_rs, rollout_rs_threshold) if rollout_rs else ()
        return cls(is_level=rollout_is, is_lower=lower, is_upper=upper, is_band=band,
                   is_batch_normalize=bool(rollout_is_batch_normalize), rejection=rejection,
                   bypass=bool(bypass_mode), loss_type=loss_type)


def _band(spec: str, key: str) -> tuple[float, float]:
    lo_s, _, hi_s = spec.partition("_")
    try:
        lo, hi = float(lo_s), float(hi_s)
    except ValueError:
        raise ValueError(f"{key} = {spec!r}: a band is written 'lo_hi' with two numbers, e.g. '0.5_2.0'") from None
    if not 0 < lo < hi:
        raise ValueError(f"{key} = {spec!r}: the band 'lo_hi' needs 0 < lo < hi")
    return lo, hi


def parse_is_threshold(value: Any) -> tuple[float, float, bool]:
    """``(lower, upper, band)`` from ``rollout_is_threshold``: a number ``u > 1`` (truncation at u;
    lower = 1/u) or a string ``"lo_hi"`` (IcePop band). ``ValueError`` otherwise."""
    key = "rollout_is_threshold"
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{key} = {value!r}: expected a number > 1 (truncation) or a band 'lo_hi' (masking)")
    if isinstance(value, (int, float)):
        u = float(value)
        if not (math.isfinite(u) and u > 1.0):
            raise ValueError(f"{key} = {value!r}: a truncation threshold must be a finite number > 1, e.g. 2.0")
        return 1.0 / u, u, False
    if isinstance(value, str):
        text = value.strip()
        if "_" in text:
            lo, hi = _band(text, key)
            return lo, hi, True
        try:
            return parse_is_threshold(float(text))
        except ValueError:
            raise ValueError(f"{key} = {value!r}: expected a number > 1 (truncation) or a band 'lo_hi' (masking)") from None
    raise ValueError(f"{key} = {value!r}: expected a number > 1 (truncation) or a band 'lo_hi' (masking)")


def parse_rejection_criteria(rollout_rs: str, threshold: Any) -> tuple[RejectionCriterion, ...]:
    """The criteria of ``rollout_rs`` (comma-separated options) with their thresholds
    (``rollout_rs_threshold``: one shared or one per option, comma-separated)."""
    options = []
    for opt in (o.strip() for o in str(rollout_rs).split(",")):
        if not opt:
            continue
        if opt not in RS_OPTIONS:
            raise ValueError(f"rollout_rs = {rollout_rs!r}: unknown option {opt!r}; valid: {', '.join(RS_OPTIONS)}")
        if opt not in options:
            options.append(opt)
    if not options:
        raise ValueError(f"rollout_rs = {rollout_rs!r}: expected one or more of {', '.join(RS_OPTIONS)}")
    if threshold is None or isinstance(threshold, bool):
        raise ValueError(f"rollout_rs_threshold = {threshold!r}: rollout_rs={rollout_rs!r} needs a threshold "
                         "(one per option, comma-separated, or one shared)")
    specs = [s.strip() for s in str(threshold).split(",") if s.strip()] if isinstance(threshold, str) else [str(threshold)]
    if len(specs) == 1:
        specs = specs * len(options)
    if len(specs) != len(options):
        raise ValueError(f"rollout_rs_threshold = {threshold!r}: {len(specs)} thresholds for {len(options)} "
                         f"options ({', '.join(options)}); give one per option or one shared")
    criteria = []
    for opt, spec in zip(options, specs):
        key = f"rollout_rs_threshold (for {opt})"
        if opt.endswith("k1"):
            if "_" in spec:
                lo, hi = _band(spec, key)
            else:
                hi = _positive_number(spec, key)
                lo = 1.0 / hi
                if not lo < hi:
                    raise ValueError(f"{key} = {spec!r}: one number u means the band [1/u, u], so u must be > 1")
            criteria.append(RejectionCriterion(opt, lo, hi))
        else:
            if "_" in spec:
                raise ValueError(f"{key} = {spec!r}: {opt} takes one upper bound, not a band")
            criteria.append(RejectionCriterion(opt, None, _positive_number(spec, key)))
    return tuple(criteria)


def _positive_number(spec: str, key: str) -> float:
    try:
        x = float(spec)
    except ValueError:
        raise ValueError(f"{key} = {spec!r}: expected a positive number") from None
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"{key} = {spec!r}: expected a positive number")
    return x
