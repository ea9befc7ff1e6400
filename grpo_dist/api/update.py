"""The policy update of one step: reference (and, unless on-policy, old) log-probs, then ``ppo_epochs``
passes of one optimizer step per mini-batch, each the distributed actor's step
(:func:`grpo_dist.training.update.policy_mini_batch_step`) run in one process.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from grpo_dist.api.sampling import Rollout
from grpo_dist.training.micro_batches import split_by_count, take_rows
from grpo_dist.training.objective import PolicyObjective
from grpo_dist.training.policy import forward_logprobs
from grpo_dist.training.update import policy_mini_batch_step, run_mini_batches


def update_data(rollout: Rollout, advantages_BR: torch.Tensor, device: torch.device) -> dict[str, torch.Tensor]:
    """The batch the update reads (the actor's keys), on ``device``."""
    data = {
        "input_ids": rollout.input_ids,
        "attention_mask": rollout.attention_mask,
        "position_ids": rollout.position_ids,
        "responses": rollout.responses,
        "response_mask": rollout.response_mask,
        "advantages": advantages_BR,
    }
    return {k: v.to(device) for k, v in data.items()}


@contextmanager
def eval_mode(*models: nn.Module) -> Iterator[None]:
    """The models in eval mode (dropout off) inside the block; each one's mode restored after."""
    modes = [m.training for m in models]
    for m in models:
        m.eval()
    try:
        yield
    finally:
        for m, mode in zip(models, modes):
            m.train(mode)


@dataclass(frozen=True)
class PolicyUpdate:
    """One step's update of the policy (``objective`` minimised with ``optimizer``).

    Attributes:
        objective: the loss of a micro-batch (policy loss, entropy bonus, KL loss).
        optimizer: over the policy's trainable parameters.
        device: where the forwards run.
        temperature: the log-probs' temperature (the sampling one).
        max_grad_norm: clip the gradient's global norm to this; 0: no clipping.
        ppo_epochs: passes over the batch.
        mini_batch_rows: completions per optimizer step; None: the whole batch.
        micro_batch_size: completions per forward/backward; None: the whole mini-batch.
    """

    objective: PolicyObjective
    optimizer: torch.optim.Optimizer
    device: torch.device
    temperature: float
    max_grad_norm: float
    ppo_epochs: int
    mini_batch_rows: int | None
    micro_batch_size: int | None

    def run(self, policy: nn.Module, ref: nn.Module, data: dict[str, torch.Tensor]) -> dict[str, float]:
        """Reference log-probs under ``ref``, old log-probs under ``policy`` when the update takes more
        than one optimizer step, then the optimizer steps. Adds ``ref_log_prob`` (and
        ``old_log_probs``) to ``data``. Returns the means of the steps' metrics and
        ``grad_norm_nonfinite_count``."""
        B = data["responses"].shape[0]
        minis = split_by_count(B, B if self.mini_batch_rows is None else min(B, self.mini_batch_rows))
        data["ref_log_prob"] = self.log_probs(ref, data)
        if self.ppo_epochs > 1 or len(minis) > 1:
            data["old_log_probs"] = self.log_probs(policy, data)
        out, nonfinite = run_mini_batches(lambda rows: self.mini_batch_step(policy, take_rows(data, rows)), minis,
                                          epochs=self.ppo_epochs)
        out["grad_norm_nonfinite_count"] = float(nonfinite)
        return out

    @torch.no_grad()
    def log_probs(self, model: nn.Module, data: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """No-grad log-probs [B, R] of the responses under ``model``, micro-batch by micro-batch."""
        B, R = data["responses"].shape
        pieces = []
        for rows in split_by_count(B, self.micro_batch_size or B):
            mb = take_rows(data, rows)
            logp, _ = forward_logprobs(model, mb["input_ids"], mb["attention_mask"], mb["position_ids"],
                                       response_length=R, temperature=self.temperature, compute_entropy=False)
            pieces.append(logp)
        return torch.cat(pieces, dim=0)

    def mini_batch_step(self, policy: nn.Module, mb_data: dict[str, torch.Tensor]) -> tuple[dict[str, float], bool]:
        """One optimizer step over one mini-batch (:func:`grpo_dist.training.update.policy_mini_batch_step`,
        the distributed actor's step in one process), named for this API."""
        n = mb_data["responses"].shape[0]
        step = policy_mini_batch_step(policy, mb_data, split_by_count(n, self.micro_batch_size or n),
                                      objective=self.objective, optimizer=self.optimizer,
                                      grad_clip=self.max_grad_norm, device=self.device)
        t, o = step.totals, self.objective
        metrics = {
            "loss": t["pg_loss"] - o.entropy_coeff * t["entropy"] + o.kl_loss_coef * t["kl_loss"],
            "pg_loss": t["pg_loss"],
            "kl": t["kl_loss"],
            # a token mean whatever the loss aggregation (comparable with log V)
            "entropy": float(step.entropy_token_sum) / step.global_tokens if step.global_tokens > 0 else 0.0,
            "grad_norm": step.grad_norm,
        }
        metrics.update({f"actor/{name}": t[name] for name in step.metric_names})
        return metrics, step.finite
