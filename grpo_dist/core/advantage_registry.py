"""The advantage estimators' registry: each name (``algorithm.adv_estimator``), what the estimator
needs, and its function; without torch, so that the configuration checks a name and reads what it needs
(a critic, a greedy baseline rollout, per-step rewards) before anything heavy is imported.

The numbers estimators use (:class:`AdvantageParams`, ``algorithm.*``) are here too. The functions are
:mod:`grpo_dist.core.advantages`' (the module docstring there says how to call one);
the built-in rows below name them and that module binds them when it is imported. A user's estimator
is registered with :func:`register_adv_estimator` (also exported by ``grpo_dist.core.advantages``).
"""

from dataclasses import dataclass
from typing import Any, Callable

from grpo_dist.core.registry import BuiltinFn, add_spec, check_name, find_spec

__all__ = ["AdvantageParams", "AdvEstimatorSpec", "register_adv_estimator", "get_adv_estimator", "list_adv_estimators"]

@dataclass(frozen=True)
class AdvantageParams:
    """The numbers advantage estimators use (``algorithm.*``). An estimator reads the fields it needs.

    Attributes:
        gamma: discount factor in [0, 1] (``gae``, ``reinforce_plus_plus``).
        lam: GAE's lambda in [0, 1] (``gae``).
        norm_adv_by_std: divide by the group's std (GRPO) or not (Dr. GRPO);
            ``algorithm.norm_adv_by_std_in_grpo``.
        epsilon: >= 0, added to the std before dividing.
    """

    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std: bool = True
    epsilon: float = 1e-6

    def __post_init__(self) -> None:
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"lam must be in [0, 1], got {self.lam}")
        if not self.epsilon >= 0.0:
            raise ValueError(f"epsilon must be >= 0, got {self.epsilon}")


# (capability flag, the AdvantageInputs field it needs, what that field holds)
_NEEDED_INPUTS = (
    ("group_based", "index_B", "the group id of each response, e.g. prompt uids"),
    ("needs_values", "values_BT", "critic values, [B, T]"),
    ("needs_step_rewards", "step_end_mask_BT", "[B, T], 1 on the last token of each reasoning step"),
    ("needs_baseline_rollout", "reward_baselines_B", "the greedy response's reward per row, [B]"),
)
_INPUT_FIELDS = tuple(field for _, field, _ in _NEEDED_INPUTS)


@dataclass(frozen=True)
class AdvEstimatorSpec:
    """A registered advantage estimator; call it as ``spec(inputs, params)``.

    Attributes:
        name: the registry name (``algorithm.adv_estimator``).
        fn: the estimator, ``fn(inputs, params) -> (advantages_BT, returns_BT)`` (for a built-in whose
            module is not imported yet, a :class:`~grpo_dist.core.registry.BuiltinFn` that imports it).
        group_based: it compares responses within a group, so ``rollout.n`` must be > 1 to be useful
            and ``index_B`` must be given.
        needs_values: it needs ``values_BT`` from a critic.
        needs_step_rewards: it needs per-step rewards and ``step_end_mask_BT`` (process supervision).
        needs_baseline_rollout: it needs the reward of one greedy response per prompt, repeated for
            the prompt's responses (``reward_baselines_B``, ReMax).
    """

    name: str
    fn: Callable[..., Any]
    group_based: bool
    needs_values: bool = False
    needs_step_rewards: bool = False
    needs_baseline_rollout: bool = False

    def __call__(self, inputs: Any, params: Any = None) -> Any:
        """``fn(inputs, params)`` (``params`` None: ``AdvantageParams()``) after checking that every input
        the flags ask for is given (``ValueError`` naming the estimator and the input otherwise)."""
        params = AdvantageParams() if params is None else params
        # AdvantageInputs (grpo_dist.core.advantages: torch) by its fields, so that this module stays torch-free
        is_inputs = all(hasattr(inputs, f) for f in ("token_level_rewards_BT", "response_mask_BT", *_INPUT_FIELDS))
        if not is_inputs or not isinstance(params, AdvantageParams):
            raise TypeError(f"advantage estimator {self.name!r} is called as spec(AdvantageInputs(...), "
                            f"AdvantageParams(...)), got {type(inputs).__name__} and {type(params).__name__}")
        for flag, field, what in _NEEDED_INPUTS:
            if getattr(self, flag) and getattr(inputs, field) is None:
                raise ValueError(f"the {self.name!r} advantage estimator needs {field} ({what}); got None")
        return self.fn(inputs, params)


def _builtin(name: str, group_based: bool, **needs: bool) -> AdvEstimatorSpec:
    fn = BuiltinFn("grpo_dist.core.advantages", f"compute_{name}_advantage")
    return AdvEstimatorSpec(name=name, fn=fn, group_based=group_based, **needs)


# The estimators this package registers itself (verl's names); their functions are compute_<name>_advantage
# in grpo_dist.core.advantages.
_REGISTRY: dict[str, AdvEstimatorSpec] = {spec.name: spec for spec in (
    _builtin("grpo", group_based=True),
    _builtin("rloo", group_based=True),
    _builtin("reinforce_plus_plus", group_based=False),
    _builtin("gae", group_based=False, needs_values=True),
    _builtin("grpo_process", group_based=True, needs_step_rewards=True),
    _builtin("remax", group_based=False, needs_baseline_rollout=True),
    _builtin("reinforce_plus_plus_baseline", group_based=True),
    _builtin("grpo_passk", group_based=True),
    _builtin("opo", group_based=True),
    _builtin("gpg", group_based=True),
)}

def register_adv_estimator(
    name: str,
    *,
    group_based: bool,
    needs_values: bool = False,
    needs_step_rewards: bool = False,
    needs_baseline_rollout: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register ``fn`` as the advantage estimator called ``name`` (the flags: see
    :class:`AdvEstimatorSpec`).

    Registering the same function again under its name is a no-op; a second, different function under a
    name already taken raises ``ValueError``. Returns the function unchanged.
    """
    check_name(name, "advantage estimator")

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        spec = AdvEstimatorSpec(name=name, fn=fn, group_based=group_based, needs_values=needs_values,
                                needs_step_rewards=needs_step_rewards, needs_baseline_rollout=needs_baseline_rollout)
        add_spec(_REGISTRY, name, spec, "advantage estimator")
        return fn

    return decorator


def get_adv_estimator(name: str) -> AdvEstimatorSpec:
    """The registered estimator ``name``; ``ValueError`` naming the valid names if there is none."""
    return find_spec(_REGISTRY, name, "advantage estimator", "algorithm.adv_estimator")


def list_adv_estimators() -> list[str]:
    """Sorted names of all registered advantage estimators."""
    return sorted(_REGISTRY)
