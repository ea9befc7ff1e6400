"""The names the configuration accepts for core's math, without torch: the loss aggregation modes
(``actor.loss_agg_mode``), the KL estimators (``algorithm.kl_penalty``, ``actor.kl_loss_type``) and the
PF-PPO weightings (``algorithm.pf_ppo.reweight_method``). The math modules that implement them
(:mod:`~grpo_dist.core.losses`, :mod:`~grpo_dist.core.kl`, :mod:`~grpo_dist.core.pf_ppo`) read them from
here and document what each means; the configuration checks a value before anything heavy is imported.
"""

__all__ = [
    "LOSS_AGG_MODES",
    "UNNORMALISED_LOSS_AGG_MODES",
    "ALL_LOSS_AGG_MODES",
    "KL_KINDS",
    "KL_ALIASES",
    "STRAIGHT_THROUGH_KL_KINDS",
    "STRAIGHT_THROUGH_KL_ALIASES",
    "canonical_kl_kind",
    "PF_PPO_METHODS",
]

LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
"""The aggregation modes that normalise (by a token or sequence count, or a constant)."""
UNNORMALISED_LOSS_AGG_MODES: tuple[str, ...] = ("token-sum",)
"""Modes without a normaliser: the loss grows with the number of tokens in the mini-batch."""
ALL_LOSS_AGG_MODES: tuple[str, ...] = LOSS_AGG_MODES + UNNORMALISED_LOSS_AGG_MODES
"""Every value of ``actor.loss_agg_mode``."""

KL_KINDS: tuple[str, ...] = ("kl", "abs", "mse", "low_var_kl", "full")
KL_ALIASES: dict[str, str] = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}
STRAIGHT_THROUGH_KL_KINDS: tuple[str, ...] = ("kl+", "low_var_kl+")
"""Kinds with k1's or k3's value and k2's gradient (see :mod:`grpo_dist.core.kl`)."""
STRAIGHT_THROUGH_KL_ALIASES: dict[str, str] = {"k1+": "kl+", "k3+": "low_var_kl+"}


def canonical_kl_kind(name: str) -> str:
    """The canonical KL kind for ``name`` (``"k3"`` -> ``"low_var_kl"``, ``"k3+"`` ->
    ``"low_var_kl+"``); ``ValueError`` if unknown."""
    if isinstance(name, str):
        if name in KL_KINDS or name in STRAIGHT_THROUGH_KL_KINDS:
            return name
        if name in KL_ALIASES:
            return KL_ALIASES[name]
        if name in STRAIGHT_THROUGH_KL_ALIASES:
            return STRAIGHT_THROUGH_KL_ALIASES[name]
    valid = list(KL_KINDS) + list(STRAIGHT_THROUGH_KL_KINDS) + [
        f"{a} (= {c})" for a, c in {**KL_ALIASES, **STRAIGHT_THROUGH_KL_ALIASES}.items()
    ]
    raise ValueError(f"unknown KL kind {name!r} (kl_penalty / kl_loss_type); valid kinds: {valid}")


PF_PPO_METHODS: tuple[str, ...] = ("pow", "max_min", "max_random")
"""PF-PPO's weightings of a response by its reward (:mod:`grpo_dist.core.pf_ppo`)."""
