"""Iterative RL (DeepSeekMath, Algorithm 1): the reward model is trained further on the policy's new
samples, with a replay of older ones, and the reference model is reset to the policy.

After every step's actor update the driver calls :meth:`IterativeRL.after_step`, which keeps the
step's rows with their verifier labels ``rm_targets`` (1 where the rule score is at or above
``reward_model.iterative.label_threshold``, 0 below it; written by
:class:`grpo_dist.trainer.reward_stage.RewardStage`) and, every
``reward_model.iterative.steps_per_iteration`` steps, ends the iteration (:meth:`IterativeRL.run`):

1. the iteration's samples (every row of its steps) are the fresh data; a random
   ``heldout_fraction`` of them is held out;
2. ``reward_model/accuracy_before``: agreement of the reward model with the verifier on the held-out
   rows (a labelled position agrees when ``score > 0``, i.e. sigmoid(score) > 0.5, exactly when
   the label is > 0.5);
3. the training mix is the other fresh rows and ``H`` rows drawn from the replay buffer, ``H`` chosen
   so that the historical share of the mix is ``replay_fraction`` (:func:`grpo_dist.core.reward_model.replay_count`),
   shuffled; the reward model trains on it (``epochs`` passes of mini-batches of ``mini_batch_size``
   rows; the last mini-batch is filled with unlabelled rows, which add nothing);
4. ``reward_model/accuracy``: the same agreement after the update; the fresh rows (held-out ones
   included) join the replay buffer (the oldest beyond ``buffer_size`` go);
5. with ``reset_reference`` (and a reference in the run), the reference takes the policy's current
   weights (the actor -> reference transfer is the weight-sync protocol, bucket by bucket), so the
   KL term of the next step starts from 0; ``actor/ref_reset`` is the step of the last reset.

Randomness (the hold-out, the replay draw, the shuffle) comes from a generator seeded by
``(trainer.seed, iteration)``, so a resumed run draws what the uninterrupted run drew. The buffer, the
iteration's pending rows and the counters are part of every checkpoint (:meth:`save`, as safetensors
and JSON); the reward model's weights and optimizer are its role's checkpoint.

The object talks to the reward-model group through ``call`` and to the reference reset through a
callable, so it is tested with stand-ins (tests/unit/test_iterative_rl.py).
"""

from __future__ import annotations

import json
import math

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from grpo_dist.config.driver_plan import IterativeSettings
from grpo_dist.core.reward_model import replay_count, verifier_agreement
from grpo_dist.rewards.replay import ReplayBuffer, SampleRows, concat_rows, take
from grpo_dist.trainer.metrics import Timer
from grpo_dist.trainer.updates import sharded_update
from grpo_dist.training.settings import FORWARD_KEYS, RM_UPDATE_KEYS
from grpo_dist.workers.common import unwrap_timed

if TYPE_CHECKING:  # the batch container (tensordict) is loaded with the training loop, not with the run's plan
    from grpo_dist.batch import Batch

__all__ = ["IterativeSettings", "IterativeRL", "STATE_DIR"]

STATE_DIR = "iterative_rl"
"""Folder of a checkpoint holding the protocol's state."""


class IterativeRL:
    """The protocol's state and steps (module docstring).

    Args:
        rm: the reward-model worker group (``compute_rm_score``, ``update_reward_model``).
        settings: the numbers.
        reset_reference: resets the reference to the policy and returns its timings (seconds by name);
            None: no reset (no reference in the run, or ``reset_reference=false``).
    """

    def __init__(self, rm: Any, settings: IterativeSettings, reset_reference: Callable[[], dict[str, float]] | None) -> None:
        self.rm, self.settings, self.reset_reference = rm, settings, reset_reference
        self.buffer = ReplayBuffer(settings.buffer_size)
        self.pending: list[SampleRows] = []
        self.iteration = 0
        self.last_reset = 0

    @classmethod
    def from_plan(cls, plan: Any, rm: Any, *, actor: Any, reference: Any, device: str,
                  reference_dtype: str) -> "IterativeRL | None":
        """The run's protocol (None without iterative RL: ``plan.iterative`` is None); the reference
        reset (``reward_model.iterative.reset_reference``, when the run has a reference) is the
        weight-sync protocol from the actor to the reference ranks, in ``reference_dtype``, in the
        rollout's weight-sync buckets."""
        from grpo_dist.trainer.weight_sync import WeightSync, choose_transport

        if rm is None or plan.iterative is None:
            return None
        reset = None
        if plan.reset_reference and reference is not None:
            reset = WeightSync(actor, reference, transport=choose_transport(actor, reference, device),
                               dtype=reference_dtype, bucket_bytes=plan.sync_bucket_bytes)
        return cls(rm, plan.iterative, reset)

    # ------------------------------------------------------------------------------------------
    def observe(self, batch: Batch) -> None:
        """Keep this step's rows (with their ``rm_targets``) for the running iteration."""
        self.pending.append({k: batch[k].detach().clone() for k in RM_UPDATE_KEYS})

    def due(self, step: int) -> bool:
        """Whether the step just finished (``step`` counted from 1) ends an iteration."""
        return step % self.settings.steps_per_iteration == 0

    def after_step(self, batch: Batch, step: int, timer: Timer) -> dict[str, float]:
        """The driver's one call per step (after the actor update of step ``step``, counted from 1):
        keep the rows, run the iteration's end when due (timed as ``update_reward_model``); the metrics."""
        self.observe(batch)
        out: dict[str, float] = {}
        if self.due(step):
            with timer("update_reward_model"):
                out.update(self.run(step))
        return out | self.step_metrics()

    def step_metrics(self) -> dict[str, float]:
        """Logged every step: the step of the last reference reset (0: the initial reference)."""
        return {"actor/ref_reset": float(self.last_reset)} if self.reset_reference is not None else {}

    def run(self, step: int) -> dict[str, float]:
        """Train the reward model on the iteration's samples and reset the reference; the metrics."""
        s = self.settings
        fresh = concat_rows(self.pending)
        self.pending = []
        g = torch.Generator().manual_seed(s.seed * 1_000_003 + self.iteration)
        n = len(fresh["rm_targets"]) if fresh else 0
        perm = torch.randperm(n, generator=g)
        n_held = min(int(round(n * s.heldout_fraction)), max(n - 1, 0))
        held, train = take(fresh, perm[:n_held]), take(fresh, perm[n_held:])
        out: dict[str, float] = {}
        before = self.accuracy(held)
        k = replay_count(n - n_held, s.replay_fraction, len(self.buffer))
        mix = concat_rows([train, self.buffer.sample(k, g)])
        if mix:
            mix = take(mix, torch.randperm(len(mix["rm_targets"]), generator=g))
            out.update(self.update(mix))
        after = self.accuracy(held)
        if not math.isnan(before):
            out["reward_model/accuracy_before"], out["reward_model/accuracy"] = before, after
        self.buffer.add(fresh)
        self.iteration += 1
        out.update({"reward_model/iteration": float(self.iteration), "reward_model/replay_size": float(len(self.buffer)),
                    "reward_model/replay_samples": float(k), "reward_model/fresh_samples": float(n - n_held),
                    "reward_model/heldout_samples": float(n_held)})
        if self.reset_reference is not None:
            for name, seconds in self.reset_reference().items():
                out[f"timing_s/ref_reset/{name.rsplit('/', 1)[-1]}"] = seconds
            self.last_reset = step
            out.update(self.step_metrics())
        return out

    # ------------------------------------------------------------------------------------------
    def _padded(self, rows: SampleRows, multiple: int) -> SampleRows:
        """``rows`` followed by copies of its first row without labels, up to a multiple of ``multiple``."""
        n = len(rows["rm_targets"])
        extra = -n % multiple
        if not extra:
            return rows
        pad = {k: v[:1].expand(extra, *v.shape[1:]).clone() for k, v in rows.items()}
        pad["rm_targets"] = torch.full_like(pad["rm_targets"], math.nan)
        return concat_rows([rows, pad])

    def accuracy(self, rows: SampleRows) -> float:
        """Agreement of the reward model with the labels of ``rows`` (NaN without labelled rows)."""
        if not rows or not torch.isfinite(rows["rm_targets"]).any():
            return math.nan
        W = self.settings.world_size
        padded = self._padded(rows, W)
        per = len(padded["rm_targets"]) // W
        shares = [({k: padded[k][r * per:(r + 1) * per] for k in FORWARD_KEYS}, None) for r in range(W)]
        outs, _ = unwrap_timed(self.rm.call("compute_rm_score", per_rank=shares))
        scores_BR = torch.cat([o["token_scores_BR"] for o in outs])
        agree, total = verifier_agreement(scores_BR, padded["rm_targets"])
        return agree / total

    def update(self, mix: SampleRows) -> dict[str, float]:
        """One ``update_reward_model`` call over the mix (mini-batches of whole shares of every rank)."""
        W = self.settings.world_size
        per_rank = -(-self.settings.mini_batch_size // W)
        padded = self._padded(mix, per_rank * W)
        num_mini_batches = len(padded["rm_targets"]) // (per_rank * W)
        from grpo_dist.batch import Batch

        metrics, _, _ = sharded_update(self.rm, "update_reward_model", Batch.from_dict(padded), RM_UPDATE_KEYS,
                                       num_mini_batches=num_mini_batches, world_size=W, balance=False, role=self.settings.role)
        return metrics

    # ------------------------------------------------------------------------------------------
    def save(self, checkpoint_dir: str | Path) -> None:
        """Write the buffer, the running iteration's rows and the counters under ``checkpoint_dir/iterative_rl``."""
        from safetensors.torch import save_file

        d = Path(checkpoint_dir) / STATE_DIR
        d.mkdir(parents=True, exist_ok=True)
        pending = concat_rows(self.pending)
        for name, tensors in (("replay", self.buffer.state_tensors()), ("pending", pending)):
            if tensors:
                save_file({k: v.contiguous() for k, v in tensors.items()}, str(d / f"{name}.safetensors"))
        (d / "state.json").write_text(json.dumps({"iteration": self.iteration, "last_reset": self.last_reset,
                                                  "replay_size": len(self.buffer)}, indent=1))

    def load(self, checkpoint_dir: str | Path) -> None:
        """Restore what :meth:`save` wrote (``FileNotFoundError`` naming the folder when it is missing)."""
        from safetensors.torch import load_file

        d = Path(checkpoint_dir) / STATE_DIR
        if not (d / "state.json").is_file():
            raise FileNotFoundError(f"{checkpoint_dir} holds no iterative-RL state ({STATE_DIR}/state.json): it was "
                                    "written by a run without reward_model.iterative.enable")
        state = json.loads((d / "state.json").read_text())
        self.iteration, self.last_reset = int(state["iteration"]), int(state["last_reset"])
        replay, pending = d / "replay.safetensors", d / "pending.safetensors"
        self.buffer.load_state_tensors(load_file(str(replay)) if replay.is_file() else {})
        self.pending = [load_file(str(pending))] if pending.is_file() else []
