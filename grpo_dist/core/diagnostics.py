"""Diagnostics of a step that are not part of the loss: how far the rollout engine's sampling
distribution is from the trainer's on the same tokens, how old a trained batch's tokens are (each
token's policy version, from asynchronous training), and how many groups carry no learning signal."""

import torch


def rollout_probs_diff(rollout_logp_BR: torch.Tensor, actor_logp_BR: torch.Tensor,
                       mask_BR: torch.Tensor) -> dict[str, float]:
    """How far the rollout engine's token probabilities are from the actor's on the same tokens.

    ``d = |exp(rollout_logp) - exp(actor_logp)|`` over the response tokens (``mask_BR`` = 1), all
    ``[B, R]``; returns ``training/rollout_probs_diff_{max,mean,std}`` (verl's names). Nonzero
    values come from the engines' numerics (kernels, dtype) or from sampling settings that change
    the distribution (temperature, top-k/top-p: the rollout log-probs are the processed ones).
    """
    m = mask_BR.bool()
    if not m.any():
        return {}
    d = (rollout_logp_BR.float().exp() - actor_logp_BR.float().exp()).abs()[m]
    return {
        "training/rollout_probs_diff_max": d.max().item(),
        "training/rollout_probs_diff_mean": d.mean().item(),
        "training/rollout_probs_diff_std": d.std(unbiased=False).item(),
    }


def off_policy_metrics(versions_BR: torch.Tensor, current: int, started: int) -> dict[str, float]:
    """verl's v1 ``training/off_policy/*`` (mean, max, min over the batch's responses) from each token's policy
    version ``versions_BR`` ``[B, R]`` (-1 on padding), trained by policy version ``current`` (the updates so far);
    an empty response counts as sampled by ``started``, the version its chunk started with:

    - ``trajectory_spans``: versions one response was sampled across (``newest - oldest + 1``; 1 without a sync in
      between);
    - ``trajectory_staleness``: ``current - newest``, the lag behind the policy that trains on it;
    - ``trajectory_staleness_worst``: ``current - oldest``."""
    present_BR = versions_BR >= 0
    empty_B = ~present_BR.any(-1)
    newest_B = torch.where(present_BR, versions_BR, -1).amax(-1).masked_fill(empty_B, started)
    oldest_B = torch.where(present_BR, versions_BR, torch.iinfo(torch.long).max).amin(-1).masked_fill(empty_B, started)
    out: dict[str, float] = {}
    for name, values_B in (("trajectory_spans", newest_B - oldest_B + 1), ("trajectory_staleness", current - newest_B),
                           ("trajectory_staleness_worst", current - oldest_B)):
        v = values_B.double()
        out.update({f"training/off_policy/{name}/mean": float(v.mean()), f"training/off_policy/{name}/max": float(v.max()),
                    f"training/off_policy/{name}/min": float(v.min())})
    return out


def partial_metrics(versions_BR: torch.Tensor) -> dict[str, float]:
    """verl's ``fully_async/partial/*`` of a trained batch from its ``rollout_versions`` ``[B, R]`` (each
    token's policy version, -1 on padding): the responses whose first and last tokens were sampled by
    different versions (``total_partial_num``), their share of the batch (``partial_ratio``) and the
    largest span of versions within one response (``max_partial_span``). An empty response is not partial."""
    present_BR = versions_BR >= 0
    lengths_B = present_BR.sum(-1)
    first_B = versions_BR[:, 0]
    last_B = versions_BR.gather(1, (lengths_B - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    spans_B = torch.where(lengths_B > 0, last_B - first_B, torch.zeros_like(lengths_B))
    partial = int((spans_B != 0).sum())
    rows = versions_BR.shape[0]
    return {"fully_async/partial/total_partial_num": float(partial),
            "fully_async/partial/partial_ratio": partial / rows if rows else 0.0,
            "fully_async/partial/max_partial_span": float(spans_B.max()) if rows else 0.0}


def zero_advantage_group_ratio(advantages_BT: torch.Tensor, mask_BT: torch.Tensor, index_B: list,
                               atol: float = 1e-6) -> float:
    """The share of groups whose responses all have advantage 0: ``training/zero_advantage_group_ratio``.

    A group is the rows sharing an ``index_B`` value (a prompt's ``n`` responses, its ``uid``). Group ``g`` has no
    signal when ``max_{i in g, t} |A[i, t]| * m[i, t] <= atol`` (``advantages_BT`` and ``mask_BT`` ``[B, T]``): its
    responses contribute nothing to the policy gradient. Under GRPO and its group-relative variants that is a group
    whose responses all scored alike (all right, or all wrong). Returns ``(groups with no signal) / (groups)``, 0.0
    for an empty batch.
    """
    if not index_B:
        return 0.0
    largest_B = (advantages_BT.float().abs() * mask_BT.float()).amax(-1)
    signal: dict = {}
    for key, value in zip(index_B, largest_B.tolist()):
        signal[key] = signal.get(key, False) or value > atol
    return sum(not s for s in signal.values()) / len(signal)
