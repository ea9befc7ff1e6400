"""The policy's training objective on one micro-batch, and the sums that turn micro-batches into metrics.

One objective, two callers: :class:`~grpo_dist.training.actor.FSDPActor` (every rank, every
micro-batch of its share of a mini-batch) and the in-process API (:mod:`grpo_dist.api`, one process,
no FSDP), both through :func:`grpo_dist.training.update.policy_mini_batch_step`. That step cuts a
mini-batch into micro-batches, builds one :class:`~grpo_dist.core.losses.AggSpec` from the token and
sequence counts of the WHOLE mini-batch, and calls :func:`micro_batch_loss` on each micro-batch::

    loss = pg_loss - entropy_coeff * agg(entropy) + kl_loss_coef * agg_kl(kl_penalty(logp, ref_logp))

``pg_loss`` is the registered policy-loss mode (:mod:`grpo_dist.core.policy_loss`); ``agg`` is
:func:`~grpo_dist.core.losses.agg_loss` with the mini-batch's spec; ``agg_kl`` the same spec (the same
counts) with the mode ``kl_loss_agg_mode`` when one is set (the actor's
``actor_rollout_ref.actor.kl_loss_agg_mode``; the API's default, the pseudocode of DeepSeekMath's GRPO,
aggregates the policy term by sequence sums and the KL term by a token mean). Summing the
micro-batches' losses (and their gradients) over micro-batches and ranks gives the loss of the whole
mini-batch. Nothing here uses ``torch.distributed``: reducing across ranks is the caller's job
(:class:`TermSums` hands it the numbers to reduce).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from grpo_dist.core.kl import canonical_kl_kind, kl_penalty
from grpo_dist.core.losses import ALL_LOSS_AGG_MODES, AggSpec, agg_loss
from grpo_dist.core.policy_loss import (
    RESERVED_METRIC_NAMES,
    PolicyLossInputs,
    PolicyLossParams,
    PolicyLossSpec,
    get_policy_loss,
)
from grpo_dist.training.policy import forward_logprobs
from grpo_dist.training.settings import ActorSettings

__all__ = ["AGGREGATES", "PolicyObjective", "MicroBatchLoss", "micro_batch_loss", "TermSums"]

AGGREGATES: tuple[str, ...] = ("pg_loss", "entropy", "kl_loss")
"""The objective's own terms, reported before the policy loss's metrics (``kl_loss`` only when the
KL loss is on)."""


@dataclass(frozen=True)
class PolicyObjective:
    """The numbers of the objective (module docstring), with the policy loss looked up.

    Attributes:
        policy_loss: the registered mode (:func:`~grpo_dist.core.policy_loss.get_policy_loss`).
        params: what the mode reads (clip ranges, ...).
        loss_agg_mode: one of :data:`~grpo_dist.core.losses.ALL_LOSS_AGG_MODES`, for the policy term
            and the entropy.
        norm_constant: divisor of ``seq-mean-token-sum-norm`` (the max response length); None: T.
        entropy_coeff: weight of the entropy bonus (0: the entropy is computed for the metric only,
            without a graph).
        use_kl_loss: add the KL term (then every micro-batch needs ``ref_log_prob``).
        kl_loss_coef: its weight.
        kl_loss_type: the per-token estimator (:func:`~grpo_dist.core.kl.kl_penalty`; not ``full``).
        kl_loss_agg_mode: how the KL term is aggregated; None: like the policy term.
        temperature: logits are divided by it (the rollout's sampling temperature).
    """

    policy_loss: PolicyLossSpec
    params: PolicyLossParams
    loss_agg_mode: str
    norm_constant: float | None
    entropy_coeff: float
    use_kl_loss: bool
    kl_loss_coef: float
    kl_loss_type: str
    kl_loss_agg_mode: str | None
    temperature: float
    remove_padding: bool = False
    """The packed forward (:func:`~grpo_dist.training.policy.forward_logprobs`): same values, less compute."""
    fused: bool = False
    """Log-probs from the hidden states without forming logits (same values, less memory)."""
    logprob_chunk_size: int | None = None
    """Positions per chunk of the output layer's log-softmax; None: from the vocabulary size."""

    def __post_init__(self) -> None:
        for name in ("loss_agg_mode", "kl_loss_agg_mode"):
            mode = getattr(self, name)
            if mode is None and name == "kl_loss_agg_mode":
                continue
            if mode not in ALL_LOSS_AGG_MODES:
                raise ValueError(f"{name} {mode!r} is not a loss aggregation mode; valid: {list(ALL_LOSS_AGG_MODES)}")
        if canonical_kl_kind(self.kl_loss_type) == "full":
            raise ValueError("kl_loss_type='full' needs the reference logits; use low_var_kl (k3), kl (k1), abs or mse (k2)")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")

    @classmethod
    def from_settings(cls, s: ActorSettings) -> PolicyObjective:
        """The actor's objective (``settings.kl_loss_agg_mode`` None: the KL term aggregated like the
        policy term, as in verl)."""
        return cls(
            policy_loss=get_policy_loss(s.loss_mode),
            params=s.policy_loss,
            loss_agg_mode=s.loss_agg_mode,
            norm_constant=s.norm_constant,
            entropy_coeff=s.entropy_coeff,
            use_kl_loss=s.use_kl_loss,
            kl_loss_coef=s.kl_loss_coef,
            kl_loss_type=s.kl_loss_type,
            kl_loss_agg_mode=s.kl_loss_agg_mode,
            temperature=s.temperature,
            remove_padding=s.use_remove_padding,
            fused=s.use_fused_kernels,
            logprob_chunk_size=s.logprob_chunk_size,
        )

    def agg_spec(self, global_tokens: float, global_seqs: float) -> AggSpec:
        """The mini-batch's spec for the policy term, from its counts over all micro-batches and ranks."""
        return AggSpec(
            mode=self.loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs, norm_constant=self.norm_constant
        )


@dataclass
class MicroBatchLoss:
    """What :func:`micro_batch_loss` returns for one micro-batch.

    Attributes:
        loss: 0-dim, with a graph: this micro-batch's piece of the mini-batch's objective.
        terms: 0-dim detached pieces of the mini-batch aggregates ``pg_loss``, ``entropy`` and
            (with the KL loss) ``kl_loss``: summed over micro-batches they give the mini-batch's values.
        metrics: the policy loss's own metrics (masked token means over this micro-batch).
        tokens: 0-dim, the micro-batch's response-token count (the weight of its metrics).
        entropy_BR: [B, R] detached per-token entropy (for diagnostics in other aggregations).
    """

    loss: torch.Tensor
    terms: dict[str, torch.Tensor]
    metrics: Mapping[str, torch.Tensor]
    tokens: torch.Tensor
    entropy_BR: torch.Tensor


def micro_batch_loss(
    model: nn.Module,
    mb: Mapping[str, torch.Tensor],
    *,
    objective: PolicyObjective,
    agg: AggSpec,
    response_length: int,
) -> MicroBatchLoss:
    """Forward one micro-batch and compute its piece of the objective (module docstring).

    ``mb`` (on the model's device): input_ids, attention_mask, position_ids [B, P+R]; response_mask,
    advantages [B, R]; old_log_probs [B, R] (absent: on-policy, ``logp.detach()`` stands in);
    rollout_is_weights [B, R] when the step has rollout importance weights (only for a policy loss that
    takes them: :attr:`~grpo_dist.core.policy_loss.PolicyLossSpec.accepts_rollout_is_weights`);
    ref_log_prob [B, R] when ``objective.use_kl_loss``. ``model`` is called the way
    :func:`~grpo_dist.training.policy.forward_logprobs` calls a Hugging Face causal LM. ``agg`` holds the
    counts of the whole mini-batch. The caller back-propagates ``loss`` (scaled as its gradient
    reduction needs) and feeds the result to a :class:`TermSums`.
    """
    o = objective
    if "rollout_is_weights" in mb and not o.policy_loss.accepts_rollout_is_weights:
        raise ValueError(f"the micro-batch has rollout importance weights but policy loss {o.policy_loss.name!r} does "
                         "not take them (register it with rollout_is_weights=True)")
    mask = mb["response_mask"]
    logp, entropy = forward_logprobs(
        model,
        mb["input_ids"],
        mb["attention_mask"],
        mb["position_ids"],
        response_length=response_length,
        temperature=o.temperature,
        compute_entropy=True,
        entropy_requires_grad=o.entropy_coeff != 0,
        remove_padding=o.remove_padding,
        fused=o.fused,
        logits_chunk_size=o.logprob_chunk_size,
    )
    weights = mb["rollout_is_weights"].float() if "rollout_is_weights" in mb else None
    inputs = PolicyLossInputs(
        logp,
        mb["old_log_probs"].float() if "old_log_probs" in mb else logp.detach(),
        mb["advantages"].float(),
        mask,
        rollout_is_weights_BT=weights,
    )
    pg_loss, pg_metrics = o.policy_loss.fn(inputs, agg=agg, params=o.params)
    assert entropy is not None
    entropy_agg = agg_loss(entropy, mask, agg)
    loss = pg_loss - o.entropy_coeff * entropy_agg if o.entropy_coeff != 0 else pg_loss
    terms = {"pg_loss": pg_loss.detach(), "entropy": entropy_agg.detach()}
    if o.use_kl_loss:
        kl_agg_spec = agg if o.kl_loss_agg_mode in (None, agg.mode) else dataclasses.replace(agg, mode=o.kl_loss_agg_mode)
        kl_agg = agg_loss(kl_penalty(logp, mb["ref_log_prob"].float(), o.kl_loss_type), mask, kl_agg_spec)
        loss = loss + o.kl_loss_coef * kl_agg
        terms["kl_loss"] = kl_agg.detach()
    return MicroBatchLoss(
        loss=loss, terms=terms, metrics=pg_metrics, tokens=mask.detach().double().sum(), entropy_BR=entropy.detach()
    )


class TermSums:
    """Sums of one mini-batch's micro-batch results, kept on the device (read once per mini-batch).

    ``pg_loss``, ``entropy``, ``kl_loss`` are summed as they come (they are pieces of the mini-batch
    aggregates); each policy-loss metric is summed weighted by its micro-batch's token count. The
    caller reduces :meth:`local` over ranks (or not, in one process) and passes the result to
    :meth:`totals`. The first :meth:`add` checks the policy loss's metrics contract
    (:mod:`grpo_dist.core.policy_loss`): 0-dim tensors under string names, none reserved, the same
    names on every call.
    """

    def __init__(self, objective: PolicyObjective, device: torch.device) -> None:
        self.objective = objective
        self.device = device
        self.sums = {name: torch.zeros((), dtype=torch.float64, device=device) for name in AGGREGATES}
        self.metric_names: tuple[str, ...] | None = None

    def add(self, out: MicroBatchLoss) -> None:
        """Add one micro-batch's terms and metrics."""
        if self.metric_names is None:
            self.metric_names = self._check_metrics(out.metrics)
            self.sums.update({n: torch.zeros((), dtype=torch.float64, device=self.device) for n in self.metric_names})
        elif tuple(out.metrics) != self.metric_names:
            raise ValueError(
                f"policy loss {self.objective.policy_loss.name!r} returned metrics {list(out.metrics)} after "
                f"{list(self.metric_names)}: a loss must return the same metric names on every call"
            )
        for name, value in out.terms.items():
            self.sums[name] += value.double()
        for name in self.metric_names:
            self.sums[name] += out.metrics[name].detach().double() * out.tokens

    @property
    def names(self) -> tuple[str, ...]:
        """The summed quantities, in the order of :meth:`local`: the aggregates, then the metrics."""
        assert self.metric_names is not None, "add at least one micro-batch first"
        return AGGREGATES + self.metric_names

    def local(self) -> list[float]:
        """This process's sums, in the order of :attr:`names` (to be summed over ranks)."""
        return torch.stack([self.sums[n] for n in self.names]).tolist()

    def totals(self, summed: list[float], global_tokens: float) -> dict[str, float]:
        """The mini-batch's values from the sums over all ranks: the aggregates as summed, the
        metrics divided by the mini-batch's token count (0 when it has none); ``kl_loss`` only with
        the KL loss."""
        totals = dict(zip(self.names, summed, strict=True))
        for name in self.metric_names or ():
            totals[name] = totals[name] / global_tokens if global_tokens > 0 else 0.0
        if not self.objective.use_kl_loss:
            del totals["kl_loss"]
        return totals

    def _check_metrics(self, metrics: Mapping[str, torch.Tensor]) -> tuple[str, ...]:
        name = self.objective.policy_loss.name
        if not isinstance(metrics, Mapping):
            raise ValueError(f"policy loss {name!r} must return (loss, dict of metrics), got {type(metrics).__name__}")
        clash = sorted(RESERVED_METRIC_NAMES & set(metrics))
        if clash:
            raise ValueError(
                f"policy loss {name!r} returned metrics named {clash}, which the actor reports itself; rename them"
            )
        for key, value in metrics.items():
            if not isinstance(key, str) or not isinstance(value, torch.Tensor) or value.dim() != 0:
                raise ValueError(
                    f"policy loss {name!r}: metric {key!r} must be a 0-dim tensor under a string name, "
                    f"got {type(value).__name__}{tuple(getattr(value, 'shape', ()))}"
                )
        return tuple(metrics)
