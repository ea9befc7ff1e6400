"""The policy-loss modes' registry and their parameters, without torch: each mode's name
(``actor_rollout_ref.actor.policy_loss.loss_mode``), whether it takes the rollout importance weights,
what it needs of the parameters, and its function; and :class:`PolicyLossParams`, the one declaration of
every loss parameter. The configuration checks a mode and its parameters with these before anything
heavy is imported.

The functions, and the call every mode implements, are :mod:`grpo_dist.core.policy_loss`'s; the built-in
rows below name them and that module binds them when it is imported. A user's mode is registered with
:func:`register_policy_loss` (also exported by ``grpo_dist.core.policy_loss``).
"""

from dataclasses import Field, dataclass, field, fields
from typing import Any, Callable

from grpo_dist.core.registry import BuiltinFn, add_spec, check_name, find_spec
from grpo_dist.core.rollout_correction_params import RolloutCorrectionParams

__all__ = [
    "POLICY_LOSS_KEY",
    "PolicyLossParams",
    "policy_loss_keys",
    "PolicyLossSpec",
    "BUILTIN_POLICY_LOSSES",
    "register_policy_loss",
    "get_policy_loss",
    "list_policy_losses",
]

POLICY_LOSS_KEY = "policy_loss"
"""``metadata["key"]`` of a :class:`PolicyLossParams` field whose config key is
``actor_rollout_ref.actor.policy_loss.<field name>``: the schema's ``PolicyLossConfig`` is generated
from these fields (:func:`policy_loss_keys`), and the trainer reads them by name."""


def _param(default: Any, help: str, key: str = POLICY_LOSS_KEY) -> Any:  # noqa: A002
    """A :class:`PolicyLossParams` field: its default, its one-line help (the config key's
    documentation) and where its config key lives (``metadata["key"]``): :data:`POLICY_LOSS_KEY`, or
    another section whose code maps it (``"actor"``: ``actor_rollout_ref.actor.<name>``)."""
    return field(default=default, metadata={"help": help, "key": key})


@dataclass(frozen=True)
class PolicyLossParams:
    """The numbers policy losses use; a mode reads the fields it needs. The one declaration of each
    loss parameter: its default, its help text and its config key are the field's (``_param``).

    Fields with the key :data:`POLICY_LOSS_KEY` are ``actor_rollout_ref.actor.policy_loss.<name>``
    (verl's defaults), generated into the configuration from here. The clip ratios are verl's
    ``actor_rollout_ref.actor.clip_ratio_*`` (declared in the schema with the ``clip_ratio``
    fallback); ``rollout_correction`` is built from ``algorithm.rollout_correction.*``.
    """

    clip_ratio_low: float = _param(0.2, "lower clip range: the ratio is clipped below at 1 - clip_ratio_low", "actor")
    clip_ratio_high: float = _param(0.2, "upper clip range (clip-higher): clipped above at 1 + clip_ratio_high", "actor")
    clip_ratio_c: float = _param(3.0, "dual-clip constant (> 1) bounding the loss of negative-advantage tokens", "actor")
    clip_cov_ratio: float = _param(0.0002, "clip_cov: fraction of response tokens whose gradient may be cut")
    clip_cov_lb: float = _param(1.0, "clip_cov: lower bound of the covariance of the tokens that may be cut")
    clip_cov_ub: float = _param(5.0, "clip_cov: upper bound of the covariance of the tokens that may be cut")
    kl_cov_ratio: float = _param(0.0002, "kl_cov: fraction of response tokens (largest covariance) that get the KL penalty")
    ppo_kl_coef: float = _param(0.1, "kl_cov: coefficient of that KL penalty")
    dro_beta: float | None = _param(
        None, "dro: beta of the quadratic log-ratio penalty (beta / 2) (logp - old_logp)^2; must be > 0 with loss_mode=dro")
    tau_pos: float = _param(1.0, "sapo: temperature of the soft gate on tokens with a positive advantage", "actor")
    tau_neg: float = _param(1.05, "sapo: temperature of the soft gate on tokens with a zero or negative advantage",
                            "actor")
    rollout_correction: RolloutCorrectionParams | None = _param(
        None, "the rollout-correction settings bypass_mode reads; None when none are configured",
        "algorithm.rollout_correction")

    def __post_init__(self) -> None:
        if not 0.0 < self.clip_cov_ratio <= 1.0:
            raise ValueError(f"clip_cov_ratio must be in (0, 1], got {self.clip_cov_ratio}")
        if not self.clip_cov_lb < self.clip_cov_ub:
            raise ValueError(f"clip_cov_lb must be < clip_cov_ub, got {self.clip_cov_lb} and {self.clip_cov_ub}")
        if not 0.0 < self.kl_cov_ratio <= 1.0:
            raise ValueError(f"kl_cov_ratio must be in (0, 1], got {self.kl_cov_ratio}")
        if not self.ppo_kl_coef >= 0.0:
            raise ValueError(f"ppo_kl_coef must be >= 0, got {self.ppo_kl_coef}")
        if not 0.0 <= self.clip_ratio_low <= 1.0:
            raise ValueError(f"clip_ratio_low must be in [0, 1], got {self.clip_ratio_low}")
        if not self.clip_ratio_high >= 0.0:
            raise ValueError(f"clip_ratio_high must be >= 0, got {self.clip_ratio_high}")
        if not self.clip_ratio_c > 1.0:
            raise ValueError(f"clip_ratio_c (dual-clip lower bound) must be > 1, got {self.clip_ratio_c}")
        if self.dro_beta is not None and not self.dro_beta > 0.0:
            raise ValueError(f"dro_beta must be > 0 (or None when the loss is not dro), got {self.dro_beta}")
        for name in ("tau_pos", "tau_neg"):
            if not getattr(self, name) > 0.0:
                raise ValueError(f"{name} must be > 0 (a gate temperature), got {getattr(self, name)}")

    @classmethod
    def from_section(cls, section: Any, **others: Any) -> "PolicyLossParams":
        """The params with every :func:`policy_loss_keys` field read by name from ``section`` (the
        configuration's ``actor_rollout_ref.actor.policy_loss``, or any object with those
        attributes) and the other fields from ``others`` (absent: their defaults)."""
        return cls(**{f.name: getattr(section, f.name) for f in policy_loss_keys()}, **others)


def policy_loss_keys() -> tuple[Field, ...]:
    """The fields of :class:`PolicyLossParams` that are ``actor_rollout_ref.actor.policy_loss.<name>``
    keys (``metadata["key"] == POLICY_LOSS_KEY``), in declaration order, each with its default and
    ``metadata["help"]``."""
    return tuple(f for f in fields(PolicyLossParams) if f.metadata.get("key") == POLICY_LOSS_KEY)


@dataclass(frozen=True)
class PolicyLossSpec:
    """A registered policy-loss mode.

    Attributes:
        name: the registry name (``actor_rollout_ref.actor.policy_loss.loss_mode``).
        fn: the loss, called as :mod:`grpo_dist.core.policy_loss` describes (for a built-in whose module is
            not imported yet, a :class:`~grpo_dist.core.registry.BuiltinFn` that imports it).
        accepts_rollout_is_weights: ``fn`` uses ``inputs.rollout_is_weights_BT``; the caller fills it
            in only for such a mode.
    """

    name: str
    fn: Callable[..., Any]
    accepts_rollout_is_weights: bool = False
    check: Callable[[PolicyLossParams], None] | None = None

    def check_params(self, params: PolicyLossParams) -> None:
        """``ValueError`` when ``params`` lack what this mode needs (its ``check``, from
        :func:`register_policy_loss`), naming the field; the configuration, the actor's settings and the
        in-process API call it before anything runs."""
        if self.check is not None:
            self.check(params)


def _needs_dro_beta(params: PolicyLossParams) -> None:
    if params.dro_beta is None:
        raise ValueError("dro_beta must be set (a number > 0, the weight of DRO's quadratic penalty) with "
                         "loss_mode=dro; it has no default, as in verl")


def _builtin(name: str, rollout_is_weights: bool = True, check: Callable[[PolicyLossParams], None] | None = None
             ) -> PolicyLossSpec:
    fn = BuiltinFn("grpo_dist.core.policy_loss", f"{name}_policy_loss")
    return PolicyLossSpec(name=name, fn=fn, accepts_rollout_is_weights=rollout_is_weights, check=check)


# The modes this package registers itself (verl's names); their functions are <name>_policy_loss in
# grpo_dist.core.policy_loss. Registrations by user modules (or tests) come later.
_REGISTRY: dict[str, PolicyLossSpec] = {spec.name: spec for spec in (
    _builtin("vanilla"),
    _builtin("gspo"),
    _builtin("gpg"),
    _builtin("cispo"),
    _builtin("clip_cov"),
    _builtin("kl_cov"),
    _builtin("geo_mean"),
    _builtin("sapo"),
    _builtin("dro", check=_needs_dro_beta),
    _builtin("dppo_tv"),
    _builtin("dppo_kl"),
    _builtin("bypass_mode", rollout_is_weights=False),  # it computes its own weights from the rollout log-probs
)}

BUILTIN_POLICY_LOSSES: tuple[str, ...] = tuple(sorted(_REGISTRY))
"""The modes this package registers itself (generated documentation lists these)."""


def register_policy_loss(
    name: str, *, rollout_is_weights: bool = False, check: Callable[[PolicyLossParams], None] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register ``fn`` as the policy-loss mode called ``name``; ``rollout_is_weights``:
    ``fn`` uses the rollout importance weights ``inputs.rollout_is_weights_BT`` (see
    :mod:`grpo_dist.core.policy_loss`); ``check``: raises ``ValueError`` (starting with the field's name) when the params lack
    what the mode needs beyond :class:`PolicyLossParams`' own checks (:meth:`PolicyLossSpec.check_params`).

    Registering the same function again under its name is a no-op (a module imported twice);
    registering a different function under a name already taken raises ``ValueError``.
    Returns the function unchanged.
    """
    check_name(name, "policy loss")

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(fn):
            raise ValueError(f"policy loss {name!r} must be a function, got {type(fn).__name__}")
        add_spec(_REGISTRY, name, PolicyLossSpec(name=name, fn=fn, accepts_rollout_is_weights=rollout_is_weights,
                                                 check=check), "policy loss")
        return fn

    return decorator


def get_policy_loss(name: str) -> PolicyLossSpec:
    """The registered mode ``name``; ``ValueError`` naming the valid modes if there is none."""
    return find_spec(_REGISTRY, name, "policy loss mode", "actor_rollout_ref.actor.policy_loss.loss_mode", "modes")


def list_policy_losses() -> list[str]:
    """Sorted names of all registered policy-loss modes."""
    return sorted(_REGISTRY)
