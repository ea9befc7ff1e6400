"""The single-controller driver: owns the loop, holds no model, drives the worker groups.

One step, as data::

    prompts -> rollout (n responses each) -> reward (rules and/or a reward model) -> old log-probs
            -> reference log-probs -> values (with a critic) -> advantages -> critic update (with a critic)
            -> actor update (after the critic warm-up) -> weight sync
            -> reward-model update and reference reset (iterative RL, every N steps)
            -> metrics, validation, checkpoint

The workers come from the role table (:mod:`grpo_dist.trainer.roles`), the weight sync and iterative RL
are protocol objects of their own (:mod:`grpo_dist.trainer.weight_sync`, :mod:`grpo_dist.trainer.iterative`),
the reward stage scores (:mod:`grpo_dist.trainer.reward_stage`), and the batch is assembled by
:mod:`grpo_dist.rollout.assemble`; what remains here is the recipe. Each phase is timed on the driver
(``timing_s/<phase>``); phases done by workers also log the workers' own busy time
(``timing_s/<phase>/worker``, slowest rank; see :class:`grpo_dist.workers.common.Timed`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from grpo_dist.batch import Batch
from grpo_dist.config.schema import GRPOConfig
from grpo_dist.core.advantages import get_adv_estimator
from grpo_dist.core.diagnostics import rollout_probs_diff
from grpo_dist.core.kl import apply_kl_penalty, make_kl_controller
from grpo_dist.data.dataset import PromptDataset, collate_prompts
from grpo_dist.data.sampler import EpochSampler
from grpo_dist.distributed.worker_group import cluster_cpus
from grpo_dist.rollout.assemble import merge_outputs, prompt_batch, responses_to_batch, shard_prompts
from grpo_dist.rollout.base import SamplingSettings
from grpo_dist.trainer import build, checkpoint
from grpo_dist.trainer.metrics import (
    NonfiniteGuard,
    ResponseClipWarning,
    Timer,
    critic_data_metrics,
    data_metrics,
    reduce_validation,
    throughput_metrics,
    token_count,
)
from grpo_dist.trainer.iterative import IterativeRL
from grpo_dist.trainer.reward_stage import RewardStage
from grpo_dist.trainer.roles import RoleContext, Workers
from grpo_dist.trainer.rollout_correction import apply_rollout_correction
from grpo_dist.trainer.tracking import Progress, Tracker
from grpo_dist.trainer.stop import StopSignal
from grpo_dist.trainer.summary import RunSummary, TrainingError
from grpo_dist.trainer.updates import sharded_forward, sharded_update
from grpo_dist.trainer.weight_sync import WeightSync, choose_transport
from grpo_dist.training.settings import CRITIC_UPDATE_KEYS, UPDATE_KEYS
from grpo_dist.workers.common import unwrap_timed


class GRPOTrainer:
    def __init__(self, cfg: GRPOConfig, *, model_path: str, tokenizer: Any, tokenizer_path: str,
                 train_data: PromptDataset, val_data: PromptDataset | None, device: str, out_dir: str) -> None:
        self.cfg, self.device, self.out_dir = cfg, device, Path(out_dir)
        self.model_path, self.tokenizer, self.tokenizer_path = model_path, tokenizer, tokenizer_path
        self.train_data, self.val_data, self.pad_id = train_data, val_data, train_data.pad_id
        self.shape = build.step_shape(cfg)
        self.sampler = EpochSampler(len(train_data), build.prompts_per_draw(cfg), seed=cfg.data.seed, shuffle=cfg.data.shuffle)
        t = cfg.trainer
        self.total_steps = t.total_training_steps or t.total_epochs * self.sampler.steps_per_epoch
        self.estimator = get_adv_estimator(cfg.algorithm.adv_estimator)
        kc = cfg.algorithm.kl_ctrl
        self.kl_ctrl = make_kl_controller(kc.type, kc.kl_coef, kc.target_kl, kc.horizon)
        self.val_sampling = build.val_sampling(cfg)
        self.clip_warning = ResponseClipWarning(cfg.actor_rollout_ref.rollout.response_length)
        self.workers: Workers | None = None
        self.global_step = 0
        self.summary = RunSummary(out_dir=str(self.out_dir))
        self.nonfinite, self.stop = NonfiniteGuard(cfg.trainer.max_consecutive_nonfinite_steps), StopSignal()
        self.rc, self.sampling, self.overlong = build.rollout_correction(cfg), build.step_sampling(cfg), build.overlong_buffer(cfg)
        # one optimizer step on fresh samples is on-policy (ratio 1): no old-log-prob forward unless compared with the rollout's
        self.on_policy = (self.shape.num_mini_batches == 1 and cfg.actor_rollout_ref.actor.ppo_epochs == 1
                          and not cfg.algorithm.use_kl_in_reward and not self.rc.bypass)
        self.old_logp_forward = not self.rc.bypass and (not self.on_policy or build.rollout_log_probs(cfg))

    # ================================================================ set-up / tear-down
    def start_workers(self) -> None:
        world, dev = self.shape.world_size, self.device
        threads = max(1, int(cluster_cpus() // max(world, 1))) if dev == "cpu" else 4
        self.workers = Workers(RoleContext(self.cfg, dev, self.model_path, self.tokenizer_path, self.total_steps,
                                           world, threads))
        self.workers.start()
        w = self.workers
        self.actor, self.rollout, self.ref, self.reward = w["actor"], w["rollout"], w.get("reference"), w["reward"]
        self.critic = w.get("critic")
        self.rewards = RewardStage.from_config(self.cfg, self.reward, w.get("reward_model"), world_size=world, tokenizer=self.tokenizer,
                                               tokenizer_path=self.tokenizer_path, overlong=self.overlong)
        self.iterative = IterativeRL.from_config(self.cfg, w.get("reward_model"), actor=self.actor, reference=self.ref,
                                                 device=dev, world_size=world)
        r = self.cfg.actor_rollout_ref.rollout
        self.sync = WeightSync(self.actor, self.rollout, transport=choose_transport(self.actor, self.rollout, dev),
                               dtype=build.compute_dtype(r.dtype, dev),
                               bucket_bytes=int(r.update_weights_bucket_megabytes) * 2**20)
        placement = w.write_placement(self.out_dir / "placement.json", weight_sync=self.sync.transport)
        for line in build.startup_lines(self.cfg, dev, world, placement, self.sync.transport):
            print(f"grpo_dist: {line}", flush=True)

    def close(self) -> None:
        self.workers, workers = None, self.workers
        if workers is not None:
            workers.close()

    # ================================================================ stages
    def generate(self, items: list[dict], uid_prefix: str, sampling: SamplingSettings) -> tuple[Batch, float]:
        """``sampling.n`` responses per prompt from the rollout ranks, as the step's batch (rows grouped
        by prompt); and the slowest rollout rank's busy seconds."""
        prompts = prompt_batch(collate_prompts(items, self.pad_id, self.cfg.data.max_prompt_length), uid_prefix)
        shares = shard_prompts(list(prompts["prompt_ids"]), len(self.rollout), sampling)
        outs, busy_s = unwrap_timed(self.rollout.call("generate", per_rank=shares))
        batch = responses_to_batch(prompts, merge_outputs(outs, sampling), n=sampling.n, pad_id=self.pad_id,
                                   response_length=self.cfg.actor_rollout_ref.rollout.response_length)
        return batch, busy_s

    def scored_rollout(self, items: list[dict], k: int, timer: Timer) -> tuple[Batch, dict[str, float]]:
        """Generation batch ``k`` of the step, scored (``scores``: the reward function's; ``reward_baselines``:
        the greedy response's reward, for estimators that need one); and the reward stats."""
        tag = f"s{self.global_step}" + (f"g{k}" if k else "")
        with timer("gen"):
            batch, busy_s = self.generate(items, tag, build.train_sampling(self.cfg, seed=self.step_seed() + k * 1_000_003))
        timer.add("gen/worker", busy_s)
        if self.estimator.needs_baseline_rollout:
            with timer("gen_max"):
                baseline, _ = self.generate(items, tag + "b", build.baseline_sampling(self.cfg))
                self.rewards.score(baseline)
                batch["reward_baselines"] = baseline["token_level_scores"].sum(-1).repeat_interleave(self.shape.n)
        with timer("reward"):
            batch["scores"], stats = self.rewards.score(batch, timer=timer)
        return batch, stats

    def next_items(self) -> list[dict]:
        return [self.train_data[i] for i in next(self.sampler)]

    def old_log_probs(self, batch: Batch) -> tuple[torch.Tensor, float]:
        """Log-probs [B, R] under the current policy, and the slowest actor rank's busy seconds."""
        outs, busy_s = sharded_forward(self.actor, "compute_log_prob", batch, self.shape.world_size,
                                       *build.forward_batching(self.cfg.actor_rollout_ref.rollout))
        return torch.cat([logp for logp, _ in outs], dim=0), busy_s

    def ref_log_probs(self, batch: Batch) -> tuple[torch.Tensor, float]:
        """Log-probs [B, R] under the reference policy, and the slowest reference rank's busy seconds."""
        outs, busy_s = sharded_forward(self.ref, "compute_ref_log_prob", batch, self.shape.world_size,
                                       *build.forward_batching(self.cfg.actor_rollout_ref.ref),
                                       self.cfg.actor_rollout_ref.rollout.temperature or 1.0)
        return torch.cat(outs, dim=0), busy_s

    def values(self, batch: Batch) -> tuple[torch.Tensor, float]:
        """The critic's values [B, R] (0 outside the response), and the slowest critic rank's busy seconds."""
        outs, busy_s = sharded_forward(self.critic, "compute_values", batch, self.shape.world_size, extra_keys=["response_mask"])
        return torch.cat(outs, dim=0), busy_s

    def advantages(self, batch: Batch) -> None:
        alg = self.cfg.algorithm
        batch["advantages"], batch["returns"] = self.estimator.fn(
            token_level_rewards_BT=batch["token_level_rewards"], response_mask_BT=batch["response_mask"],
            index_B=list(batch["uid"]), gamma=alg.gamma, lam=alg.lam, norm_adv_by_std=alg.norm_adv_by_std_in_grpo,
            values_BT=batch["values"] if "values" in batch else None,
            step_end_mask_BT=batch["step_end_mask"] if "step_end_mask" in batch else None,
            **({"reward_baselines_B": batch["reward_baselines"]} if self.estimator.needs_baseline_rollout else {}),
        )

    def update_critic(self, batch: Batch) -> tuple[dict[str, float], float]:
        """One value-loss update on the critic ranks: its metrics and the slowest rank's busy seconds."""
        M = self.cfg.data.train_batch_size // self.cfg.critic.ppo_mini_batch_size
        metrics, _, busy_s = sharded_update(self.critic, "update_critic", batch, CRITIC_UPDATE_KEYS, num_mini_batches=M,
                                            world_size=self.shape.world_size, balance=self.cfg.trainer.balance_batch,
                                            role="critic")
        return metrics, busy_s

    def update_actor(self, batch: Batch) -> tuple[dict[str, float], float]:
        """One policy update on the actor ranks: its metrics (with ``global_seqlen/*``) and the slowest
        rank's busy seconds."""
        keys = [*UPDATE_KEYS, *(["ref_log_prob"] if self.cfg.actor_rollout_ref.actor.use_kl_loss else []),
                *([] if self.on_policy else ["old_log_probs"]), *(k for k in ["rollout_is_weights"] if k in batch)]
        M = len(batch) // (self.cfg.actor_rollout_ref.actor.ppo_mini_batch_size * self.shape.n)
        metrics, balance, busy_s = sharded_update(self.actor, "update_policy", batch, keys, num_mini_batches=M,
                                                  world_size=self.shape.world_size,
                                                  balance=self.cfg.trainer.balance_batch, role="actor")
        return metrics | balance, busy_s

    def step_seed(self) -> int:
        """Sampling seed of this step: a disjoint range of per-response seeds for every step."""
        return (self.cfg.actor_rollout_ref.rollout.seed * 100_003 + self.global_step) * (self.shape.responses + 1)

    # ================================================================ one step
    def train_step(self, items: list[dict]) -> dict[str, float]:
        cfg, timer, m = self.cfg, Timer(), {}
        t0 = time.perf_counter()
        with timer("step"):
            batch, reward_stats = self.sampling.collect(items, self.next_items, lambda it, k: self.scored_rollout(it, k, timer))
            if cfg.actor_rollout_ref.rollout.free_cache_engine:
                self.rollout.call("sleep")  # colocated: the engine gives its device memory back while the actor trains
            if self.rc.bypass:
                batch["old_log_probs"] = batch["rollout_log_probs"]
            elif self.old_logp_forward:
                with timer("old_log_prob"):
                    batch["old_log_probs"], busy_s = self.old_log_probs(batch)
                timer.add("old_log_prob/worker", busy_s)
            if self.ref is not None:
                with timer("ref"):
                    batch["ref_log_prob"], busy_s = self.ref_log_probs(batch)
                timer.add("ref/worker", busy_s)
            if self.critic is not None:
                with timer("values"):
                    batch["values"], busy_s = self.values(batch)
                timer.add("values/worker", busy_s)
            with timer("adv"):
                batch["token_level_rewards"] = batch["token_level_scores"]
                if cfg.algorithm.use_kl_in_reward:
                    batch["token_level_rewards"], kl = apply_kl_penalty(
                        batch["token_level_scores"], batch["old_log_probs"], batch["ref_log_prob"], batch["response_mask"],
                        kl_coef=self.kl_ctrl.value, kind=cfg.algorithm.kl_penalty)
                    m.update({"actor/reward_kl_penalty": kl, "actor/reward_kl_penalty_coeff": self.kl_ctrl.value})
                    # the controller advances by the step's responses (verl: the batch size, as in TRL)
                    self.kl_ctrl.update(kl, n_steps=len(batch))
                if "rollout_log_probs" in batch and not self.rc.bypass:  # the trainer's log-probs vs the engine's
                    m.update(rollout_probs_diff(batch["rollout_log_probs"], batch["old_log_probs"], batch["response_mask"]))
                    m.update(apply_rollout_correction(batch, self.rc))  # rollout_corr/*; weights and rejection if set
                self.advantages(batch)
            if self.critic is not None:
                with timer("update_critic"):
                    critic_metrics, busy_s = self.update_critic(batch)
                timer.add("update_critic/worker", busy_s)
                m.update(critic_metrics)
            if build.actor_update_due(self.global_step, cfg.trainer.critic_warmup):
                with timer("update_actor"):
                    actor_metrics, busy_s = self.update_actor(batch)
                timer.add("update_actor/worker", busy_s)
                m.update(actor_metrics)
                with timer("update_weights"):
                    for name, seconds in self.sync().items():
                        timer.add(name, seconds)
            if self.iterative is not None:  # iterative RL: every N steps, the reward-model update and reference reset
                m.update(self.iterative.after_step(batch, self.global_step + 1, timer))
            elif cfg.actor_rollout_ref.rollout.free_cache_engine:
                # critic warm-up: the policy did not change, so there is nothing to send; the engine
                # only gets its memory back
                self.rollout.call("wake_up")
        step_s = time.perf_counter() - t0
        ntok = token_count(batch)
        self.summary.tokens += ntok
        m.update(data_metrics(batch, cfg.actor_rollout_ref.rollout.response_length))
        self.clip_warning.observe(m["response_length/clip_ratio"], step=self.global_step + 1)
        if "values" in batch:
            m.update(critic_data_metrics(batch))
        m.update(reward_stats)
        m.update(timer.metrics())
        m.update(throughput_metrics(ntok, step_s, self.shape.world_size))
        return m

    # ================================================================ validation
    def validate(self) -> dict[str, float]:
        if self.val_data is None:
            return {}
        bs = self.cfg.data.val_batch_size or len(self.val_data)
        sources, scores = [], []
        for start in range(0, len(self.val_data), bs):
            items = [self.val_data[i] for i in range(start, min(start + bs, len(self.val_data)))]
            batch, _ = self.generate(items, f"v{start}", self.val_sampling)
            s, _ = self.rewards.score(batch, token_level=False)
            sources += [str(x) for x in batch["data_source"]]
            scores += s.tolist()
        return reduce_validation(sources, scores, self.val_sampling.n)

    # ================================================================ checkpoints
    def save(self) -> str:
        root = Path(self.cfg.trainer.default_local_dir)
        tmp = checkpoint.tmp_dir(root, self.global_step)
        contents = self.cfg.actor_rollout_ref.actor.checkpoint.contents
        self.workers.save(tmp, export_hf="hf_model" in contents or self.global_step >= self.total_steps)
        if self.iterative is not None:
            self.iterative.save(tmp)
        state = {"global_step": self.global_step, "sampler": self.sampler.state_dict(), "kl_coef": self.kl_ctrl.value,
                 "total_steps": self.total_steps}
        final = checkpoint.publish(root, tmp, self.global_step, state, self.cfg.trainer.max_actor_ckpt_to_keep)
        self.summary.last_checkpoint = str(final)
        return str(final)

    def maybe_resume(self) -> None:
        ckpt = checkpoint.resume_target(self.cfg.trainer)
        if ckpt is None:
            return
        state = checkpoint.read_state(ckpt)
        self.workers.load(ckpt)
        if self.iterative is not None:
            self.iterative.load(ckpt)
        self.sampler.load_state_dict(state["sampler"])
        self.global_step = int(state["global_step"])
        self.kl_ctrl.value = float(state.get("kl_coef", self.kl_ctrl.value))
        self.sync()
        print(f"grpo_dist: resumed from {ckpt} (step {self.global_step})", flush=True)

    def _check_finite(self, metrics: dict[str, float], tracker: Tracker) -> None:
        """Stop (after logging this step and saving) when too many updates in a row were skipped."""
        if self.nonfinite.observe(metrics):
            tracker.log(metrics, step=self.global_step)
            raise TrainingError(self.nonfinite.message(self.global_step, saved=self.save()))

    # ================================================================ the loop
    def fit(self) -> RunSummary:
        t = self.cfg.trainer
        self.maybe_resume()
        self.summary.first_step = self.global_step
        tracker = Tracker(list(t.logger), out_dir=self.out_dir, project=t.project_name, experiment=t.experiment_name,
                          config={}, resume_step=self.global_step, progress_bar=t.progress_bar)
        progress = Progress(t.progress_bar, total=self.total_steps, initial=self.global_step,
                            val_suffix=f"/acc/mean@{self.val_sampling.n}")
        try:
            t_start = time.perf_counter()
            if t.val_before_train and self.val_data is not None and self.global_step == 0:
                self.summary.val_before = self.validate()
                tracker.log(self.summary.val_before, step=0)
            last_val: dict[str, float] = {}
            while self.global_step < self.total_steps:
                epoch = self.sampler.epoch
                metrics = self.train_step(self.next_items())
                self.global_step += 1
                metrics["training/global_step"], metrics["training/epoch"] = self.global_step, epoch
                is_last = self.global_step >= self.total_steps
                self._check_finite(metrics, tracker)
                timer = Timer()
                if self.val_data is not None and t.test_freq > 0 and (self.global_step % t.test_freq == 0 or is_last):
                    with timer("testing"):
                        last_val = self.validate()
                    metrics.update(last_val)
                if (t.save_freq > 0 and self.global_step % t.save_freq == 0) or is_last or self.stop.requested:
                    with timer("save_checkpoint"):
                        self.save()
                metrics.update(timer.metrics())
                tracker.log(metrics, step=self.global_step)
                progress.update(metrics, last_val)
                self.stop.raise_if_requested(self.global_step, self.summary.last_checkpoint)
            self.summary.val_after, self.summary.steps = last_val, self.global_step
            self.summary.wall_s = time.perf_counter() - t_start
        finally:
            progress.close()
            tracker.close()
        return self.summary
