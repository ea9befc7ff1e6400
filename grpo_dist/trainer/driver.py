"""The single-controller driver: owns the loop, holds no model, drives the worker groups.

One step, as data::

    prompts -> rollout (n responses each) -> reward (rules and/or a reward model) -> old log-probs
            -> reference log-probs -> values (with a critic) -> advantages -> critic update (with a critic)
            -> actor update (after the critic warm-up) -> weight sync
            -> reward-model update and reference reset (iterative RL, every N steps)
            -> metrics, validation, checkpoint

The workers come from the role table (:mod:`grpo_dist.trainer.roles`), the weight sync, iterative RL and the
engines' schedule of batches generated ahead are protocol objects of their own (:mod:`grpo_dist.trainer.weight_sync`,
:mod:`grpo_dist.trainer.iterative`, :mod:`grpo_dist.trainer.engines`),
the reward stage scores (:mod:`grpo_dist.trainer.reward_stage`), and the batch is assembled by
:mod:`grpo_dist.rollout.assemble`; what remains here is the recipe. Each phase is timed on the driver
(``timing_s/<phase>``); phases done by workers also log the workers' own busy time
(``timing_s/<phase>/worker``, slowest rank; see :class:`grpo_dist.workers.common.Timed`).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from grpo_dist.batch import Batch
from grpo_dist.config.fully_async import fully_async_note
from grpo_dist.config.spec import RunSpec
from grpo_dist.config.validate import logger_names
from grpo_dist.core.advantages import AdvantageInputs, AdvantageParams, get_adv_estimator
from grpo_dist.core.kl import make_kl_controller
from grpo_dist.core.pf_ppo import pf_ppo_indices, pf_ppo_weights
from grpo_dist.data.dataset import PromptDataset, collate_prompts
from grpo_dist.data.sampler import EpochSampler
from grpo_dist.agents.collect import agent_row
from grpo_dist.rollout.assemble import merge_outputs, prompt_batch, responses_to_batch, shard_prompts
from grpo_dist.rollout.base import SamplingSettings, rollout_step_seed
from grpo_dist.rollout.tp import engine_outputs, engine_shares
from grpo_dist.trainer import checkpoint, validation
from grpo_dist.trainer.dumps import GenerationDump, batch_rows
from grpo_dist.trainer.dynamic_sampling import step_sampler
from grpo_dist.trainer.engines import Engines
from grpo_dist.trainer.iterative import IterativeRL
from grpo_dist.trainer.metrics import (NonfiniteGuard, NoSignalWarning, ResponseClipWarning, Timer, critic_data_metrics,
                                       data_metrics, throughput_metrics, token_count)
from grpo_dist.trainer.reward_stage import RewardStage
from grpo_dist.trainer.roles import Workers, create_workers, startup_lines
from grpo_dist.trainer.schedule import actor_update_due
from grpo_dist.trainer.tracking import Progress, Tracker
from grpo_dist.trainer.stop import StopSignal
from grpo_dist.trainer.summary import RunSummary, TrainingError
from grpo_dist.trainer.step_rewards import token_level_rewards
from grpo_dist.trainer.updates import sharded_forward_cat, sharded_update
from grpo_dist.trainer.weight_sync import WeightSync, choose_transport
from grpo_dist.training.settings import CRITIC_UPDATE_KEYS, update_keys
from grpo_dist.workers.common import unwrap_timed


class GRPOTrainer:
    """The loop. It reads its numbers from ``plan`` (the run specification's
    :meth:`~grpo_dist.config.spec.RunSpec.driver_plan`); ``spec`` itself only goes to the role table, which
    builds the workers' settings from it."""

    def __init__(self, spec: RunSpec, *, model_path: str, tokenizer: Any, tokenizer_path: str,
                 train_data: PromptDataset, val_data: PromptDataset | None, device: str, out_dir: str,
                 stop: StopSignal | None = None) -> None:
        """``stop``: the run's SIGTERM handling, installed by the caller before anything started (a
        new, uninstalled one when None)."""
        self.spec, self.device, self.out_dir = spec, device, Path(out_dir)
        self.plan = p = spec.driver_plan(device, len(train_data))
        self.model_path, self.tokenizer, self.tokenizer_path = model_path, tokenizer, tokenizer_path
        self.train_data, self.val_data, self.pad_id = train_data, val_data, train_data.pad_id
        self.shape, self.total_steps = p.shape, p.total_steps
        self.sampler = EpochSampler(len(train_data), p.prompts_per_draw, seed=p.data_seed, shuffle=p.data_shuffle)
        self.estimator = get_adv_estimator(p.estimator)
        self.adv_params = AdvantageParams(gamma=p.gamma, lam=p.lam, norm_adv_by_std=p.norm_adv_by_std)
        self.kl_ctrl = make_kl_controller(*p.kl_ctrl)
        self.val_sampling, self.clip_warning = p.val_sampling, ResponseClipWarning(p.response_length)
        self.no_signal = NoSignalWarning()  # steps in a row whose groups all scored alike: said once per stretch
        self.workers: Workers | None
        self.workers, self.global_step = None, 0
        self.rewards: RewardStage | None = None  # set with the workers (start_workers)
        self.iterative: IterativeRL | None = None
        self.summary = RunSummary(out_dir=str(self.out_dir))
        self.nonfinite = NonfiniteGuard(p.max_consecutive_nonfinite_steps)
        self.rollout_dump = GenerationDump(p.rollout_data_dir, "trainer.rollout_data_dir") if p.rollout_data_dir else None
        self.val_dump = (GenerationDump(p.validation_data_dir, "trainer.validation_data_dir")
                         if p.validation_data_dir else None)
        self.stop = stop if stop is not None else StopSignal(out_dir=str(self.out_dir))
        self.rc, self.sampling = p.rollout_correction, step_sampler(p.step_sampling)
        # one optimizer step on fresh samples is on-policy (ratio 1): no old-log-prob forward unless compared with the rollout's
        self.on_policy, self.old_logp_forward = p.on_policy, p.old_logp_forward
        self.policy_version = 0
        """The actor's updates so far (the engines' own version trails it between an update and the next sync)."""
        self.engines = Engines(p, self.total_steps, sampler=self.sampler, next_items=lambda: self.next_items(),
                               generation_call=lambda *a: self._generation_call(*a),
                               generated=lambda *a: self._generated(*a))
        """The engines' version and what they generate ahead (:mod:`grpo_dist.trainer.engines`)."""

    # ================================================================ set-up / tear-down
    def start_workers(self, workers: Workers | None = None) -> None:
        """Start the run's workers, or finish starting those ``workers`` (:func:`~grpo_dist.trainer.roles.create_workers`)."""
        world, dev = self.shape.world_size, self.device
        self.workers = workers or create_workers(self.spec, dev, self.model_path, self.tokenizer_path)
        self.workers.start(self.total_steps, self.spec.reward_decoder(self.tokenizer))
        w = self.workers
        self.actor, self.rollout, self.ref, self.reward = w["actor"], w["rollout"], w.get("reference"), w["reward"]
        self.critic = w.get("critic")
        p = self.plan
        self.rewards = RewardStage.from_plan(self.spec, p, self.reward, w.groups, tokenizer=self.tokenizer,
                                             tokenizer_path=self.tokenizer_path)
        self.summary.rewards = self.rewards.counts
        self.iterative = IterativeRL.from_plan(p, w.get(p.iterative.role) if p.iterative else None, actor=self.actor,
                                               reference=self.ref, device=dev, reference_dtype=p.reference_dtype)
        self.sync = WeightSync(self.actor, self.rollout,
                               transport=choose_transport(self.actor, self.rollout, dev, p.sync_backend),
                               dtype=p.sync_dtype, bucket_bytes=p.sync_bucket_bytes, device=dev,
                               timeout_s=p.sync_timeout_s)
        self.engines.attach(self.rollout, self.sync, pad_id=self.pad_id)
        if self.sync.prepare():  # LoRA, adapters only: the engines serve the policy's adapter from the first step
            self.sync()
        placement = w.write_placement(self.out_dir / "placement.json", weight_sync=self.sync.transport)
        sync_label = self.sync.label + (" (LoRA adapters only)" if self.sync.adapter_only else "")
        for line in startup_lines(p.compute_dtype, p.startup_warning, dev, world, placement, sync_label,
                                        w.model_notes):
            print(f"grpo_dist: {line}", flush=True)
        if p.fully_async is not None:
            print(f"grpo_dist: {fully_async_note(p.fully_async)}", flush=True)

    def close(self) -> None:
        self.workers, workers = None, self.workers
        if workers is not None:
            workers.close()

    # ================================================================ stages
    def generate(self, items: list[dict], uid_prefix: str, sampling: SamplingSettings) -> tuple[Batch, float]:
        """``sampling.n`` responses per prompt from the rollout ranks, as the step's batch (rows grouped
        by prompt); and the slowest rollout rank's busy seconds."""
        prompts, method, per_rank = self._generation_call(items, uid_prefix, sampling)
        return self._generated(prompts, self.rollout.call(method, per_rank=per_rank), sampling)

    def _generation_call(self, items: list[dict], uid_prefix: str, sampling: SamplingSettings) -> tuple[Batch, str, list]:
        """The prompts of ``items``, and the rollout call generating their responses: its method and each rank's
        arguments (prompts split over the engines, the same share for every process of an engine)."""
        prompts = prompt_batch(collate_prompts(items, self.pad_id, self.plan.max_prompt_length), uid_prefix)
        tp = self.plan.rollout_tp  # one engine per tp ranks
        if self.plan.agents is not None:  # rollout.mode=async: agent loops on each engine's processes
            shares = shard_prompts([agent_row(item) for item in items], len(self.rollout) // tp, sampling)
            return prompts, "run_agents", engine_shares(
                [(rows, s, self.plan.agents, self.tokenizer_path) for rows, s in shares], tp)
        shares = shard_prompts(list(prompts["prompt_ids"]), len(self.rollout) // tp, sampling)
        return prompts, "generate", engine_shares(shares, tp)

    def _generated(self, prompts: Batch, results: list, sampling: SamplingSettings) -> tuple[Batch, float]:
        """The step's batch from the rollout ranks' results, and the slowest rank's busy seconds."""
        outs, busy_s = unwrap_timed(results)
        outs = engine_outputs(outs, self.plan.rollout_tp)
        batch = responses_to_batch(prompts, merge_outputs(outs, sampling), n=sampling.n, pad_id=self.pad_id,
                                   response_length=self.plan.response_length)
        return batch, busy_s

    def scored(self, batch: Batch, timer: Timer) -> tuple[Batch, dict[str, float]]:
        """``batch`` with ``scores`` from the reward stage, and the reward stats."""
        with timer("reward"):
            batch["scores"], stats = self.rewards.score(batch, timer=timer)
        return batch, stats

    def scored_rollout(self, items: list[dict], k: int, timer: Timer) -> tuple[Batch, dict[str, float]]:
        """Generation batch ``k`` of the step, scored (``scores``: the reward function's; ``reward_baselines``:
        the greedy response's reward, for estimators that need one); and the reward stats."""
        tag = f"s{self.global_step}" + (f"g{k}" if k else "")
        with timer("gen"):
            batch, busy_s = self.generate(items, tag, replace(self.plan.train_sampling, seed=self.step_seed() + k * 1_000_003))
        timer.add("gen/worker", busy_s)
        if self.estimator.needs_baseline_rollout:
            with timer("gen_max"):
                batch["reward_baselines"] = self.greedy_rewards(items, tag + "b")
        return self.scored(batch, timer)

    def greedy_rewards(self, items: list[dict], tag: str) -> torch.Tensor:
        """The reward of one greedy response per prompt, repeated for the prompt's ``n`` rows [B] (ReMax's baseline)."""
        baseline, _ = self.generate(items, tag, self.plan.baseline_sampling)
        self.rewards.score(baseline)
        return baseline["token_level_scores"].sum(-1).repeat_interleave(self.shape.n)

    def next_items(self) -> list[dict]:
        return [self.train_data[i] for i in next(self.sampler)]

    def advantages(self, batch: Batch) -> Batch:
        """``advantages`` and ``returns`` [B, R] in ``batch`` by the run's estimator; returned as it is, or with
        PF-PPO (``algorithm.use_pf_ppo``) its rows resampled by reward, with replacement, drawn with the step's seed
        (:mod:`grpo_dist.core.pf_ppo`)."""
        def optional(key: str) -> Any:
            return batch[key] if key in batch else None

        inputs = AdvantageInputs(
            token_level_rewards_BT=batch["token_level_rewards"], response_mask_BT=batch["response_mask"],
            index_B=list(batch["uid"]), values_BT=optional("values"), step_end_mask_BT=optional("step_end_mask"),
            reward_baselines_B=optional("reward_baselines"),
        )
        batch["advantages"], batch["returns"] = self.estimator(inputs, self.adv_params)
        if self.plan.pf_ppo is None:
            return batch
        weights_B = pf_ppo_weights(batch["token_level_scores"].sum(-1), *self.plan.pf_ppo)
        return batch.reorder(pf_ppo_indices(weights_B, torch.Generator().manual_seed(self.step_seed())))

    def update_critic(self, batch: Batch) -> tuple[dict[str, float], float]:
        """One value-loss update on the critic ranks: its metrics and the slowest rank's busy seconds."""
        p = self.plan
        M = len(batch) // (p.critic_mini_batch_prompts * self.shape.n)
        metrics, _, busy_s = sharded_update(self.critic, "update_critic", batch, CRITIC_UPDATE_KEYS, num_mini_batches=M,
                                            world_size=self.shape.world_size, balance=p.balance_batch,
                                            role="critic", shuffle=p.critic_shuffle)
        return metrics, busy_s

    def update_actor(self, batch: Batch) -> tuple[dict[str, float], float]:
        """One policy update on the actor ranks: its metrics (with ``global_seqlen/*``) and the slowest
        rank's busy seconds."""
        p = self.plan
        keys = update_keys(use_kl_loss=p.use_kl_loss, old_log_probs=not self.on_policy,
                           rollout_is_weights="rollout_is_weights" in batch)
        M = len(batch) // (p.actor_mini_batch_prompts * self.shape.n)
        metrics, balance, busy_s = sharded_update(self.actor, "update_policy", batch, keys, num_mini_batches=M,
                                                  world_size=self.shape.world_size, balance=p.balance_batch,
                                                  role="actor", shuffle=p.actor_shuffle)
        return metrics | balance, busy_s

    def step_seed(self) -> int:
        """Sampling seed of this step (:func:`rollout_step_seed`)."""
        return rollout_step_seed(self.plan.rollout_seed, self.global_step, self.shape.responses)

    # ================================================================ one step
    def train_step(self, items: list[dict] | None) -> dict[str, float]:
        """One step on ``items`` (the step's prompts; None with one-step-off-policy when the step's batch was
        started during the previous step)."""
        p, timer, m, W = self.plan, Timer(), {}, self.shape.world_size
        t0 = time.perf_counter()
        with timer("step"):
            step, version = self.global_step + 1, self.policy_version
            if p.fully_async is not None:
                batch, reward_stats = self.scored(self.engines.take_chunk(step, version, timer, m), timer)
            elif p.one_step_off or self.engines.ahead is not None:  # (a one-step-off checkpoint's batch: in any mode)
                batch, reward_stats = self.scored(self.engines.take_ahead(step, items, version, timer, m), timer)
            else:
                batch, reward_stats = self.sampling.collect(items, self.next_items,
                                                            lambda it, k: self.scored_rollout(it, k, timer))
            if p.free_cache_engine:
                self.rollout.call("sleep")  # colocated: the engine gives its device memory back while the actor trains
            if p.old_from_rollout:  # bypass mode, or fully asynchronous training's use_rollout_log_probs
                batch["old_log_probs"] = batch["rollout_log_probs"]
            elif self.old_logp_forward:
                with timer("old_log_prob"):  # log-probs [B, R] under the current policy
                    batch["old_log_probs"], busy_s = sharded_forward_cat(self.actor, "compute_log_prob", batch, W,
                                                                         *p.old_logp_batching)
                timer.add("old_log_prob/worker", busy_s)
            if self.ref is not None:
                with timer("ref"):
                    batch["ref_log_prob"], busy_s = sharded_forward_cat(self.ref, "compute_ref_log_prob", batch, W,
                                                                        *p.ref_logp_batching, p.logit_temperature)
                timer.add("ref/worker", busy_s)
            if self.critic is not None:
                with timer("values"):  # [B, R], 0 outside the response
                    batch["values"], busy_s = sharded_forward_cat(self.critic, "compute_values", batch, W,
                                                                  extra_keys=["response_mask"])
                timer.add("values/worker", busy_s)
            with timer("adv"):
                m.update(token_level_rewards(batch, kl_ctrl=self.kl_ctrl, use_kl_in_reward=p.use_kl_in_reward,
                                             kl_penalty=p.kl_penalty, rc=self.rc))
                batch = self.advantages(batch)
            if self.critic is not None:
                with timer("update_critic"):
                    critic_metrics, busy_s = self.update_critic(batch)
                timer.add("update_critic/worker", busy_s)
                m.update(critic_metrics)
            if actor_update_due(self.global_step, p.critic_warmup):
                with timer("update_actor"):
                    actor_metrics, busy_s = self.update_actor(batch)
                timer.add("update_actor/worker", busy_s)
                m.update(actor_metrics)
                self.policy_version += 1
                if not p.one_step_off and p.fully_async is None:  # else the engines are generating: see their schedules
                    self.engines.sync_to(self.policy_version, timer, m)
            elif p.free_cache_engine:
                # critic warm-up: the policy did not change, so there is nothing to send; the engine
                # only gets its memory back
                self.rollout.call("wake_up")
            if p.fully_async is not None:
                self.engines.sync_due(self.global_step + 1, self.policy_version, timer, m)
            if self.iterative is not None:  # iterative RL: every N steps, the reward-model update and reference reset
                m.update(self.iterative.after_step(batch, self.global_step + 1, timer))
            if self.rollout_dump is not None:
                with timer("dump_rollout_generations"):  # (verl's timing name)
                    self.rollout_dump.write(self.global_step + 1, batch_rows(
                        batch, self.tokenizer, batch["token_level_scores"].sum(-1).tolist(), self.global_step + 1))
        step_s = time.perf_counter() - t0
        ntok = token_count(batch)
        self.summary.tokens += ntok
        m.update(data_metrics(batch, p.response_length))
        if not p.train_sampling.ignore_eos:  # (with it, every response runs to the limit by request)
            self.clip_warning.observe(m["response_length/clip_ratio"], step=self.global_step + 1)
        self.no_signal.observe(m, step=self.global_step + 1)
        if "values" in batch:
            m.update(critic_data_metrics(batch))
        m.update(reward_stats)
        m.update(timer.metrics())
        if p.fully_async is not None:  # verl's trainer/idle_ratio: the part of the step spent waiting for chunks
            m["trainer/idle_ratio"] = m["timing_s/wait_prev_gen"] / max(m["timing_s/step"], 1e-9)
        m.update(throughput_metrics(ntok, step_s, self.shape.world_size))
        return m

    def training_epoch(self) -> int:
        """The sampler's epoch of the prompts the next step trains on."""
        return self.engines.epoch(self.sampler.epoch)

    # ================================================================ validation
    def validate(self, tracker: Tracker | None = None) -> dict[str, float]:
        """Scores of the validation set by the verifier (:func:`grpo_dist.trainer.validation.validate`)."""
        p = self.plan
        self.engines.wait_generated()  # the engines finish the batches generated ahead, then hold the current policy
        self.engines.sync_to(self.policy_version, Timer())  # its time is validation's (timing_s/testing)
        with self.workers.calls_labelled("validation"):  # its calls' sizes are not the step's: own deadlines
            return validation.validate(
                self.val_data, generate=lambda items, tag: self.generate(items, tag, self.val_sampling)[0],
                score=lambda batch: self.rewards.score(batch, token_level=False)[0], batch_size=p.val_batch_size,
                tokenizer=self.tokenizer, log_generations=p.log_val_generations,
                tracker=tracker, step=self.global_step, dump=self.val_dump)

    def validate_only(self, tracker: Tracker) -> RunSummary:
        """``trainer.val_only`` (verl): validate the resumed checkpoint (else the initial model), log, stop."""
        t_start = time.perf_counter()
        self.summary.val_before = self.summary.val_after = self.validate(tracker)
        tracker.log(self.summary.val_before, step=self.global_step)
        self.summary.steps, self.summary.wall_s, self.summary.val_only = self.global_step, time.perf_counter() - t_start, True
        return self.summary

    # ================================================================ checkpoints
    def save(self) -> str:
        """Save the step's checkpoint (:func:`grpo_dist.trainer.checkpoint.save`: the workers' shards and
        the iterative-RL state, then the driver state, published by one rename)."""
        p, t0 = self.plan, time.perf_counter()
        export_hf = p.export_hf_every_checkpoint or self.global_step >= self.total_steps

        def write_shards(tmp: Path) -> None:
            self.workers.save(tmp, export_hf=export_hf)
            if self.iterative is not None:
                self.iterative.save(tmp)
            self.engines.save(tmp)  # what was generated ahead, trained on first after a resume
        state = {"global_step": self.global_step, "sampler": self.sampler.state_dict(), "kl_coef": self.kl_ctrl.value,
                 "total_steps": self.total_steps, "policy_version": self.policy_version, **self.engines.state()}
        final = checkpoint.save(p.checkpoint_root, self.global_step, state, max_keep=p.max_ckpt_to_keep,
                                write_shards=write_shards, newest=self.stop.last_checkpoint,
                                root_key="trainer.default_local_dir", resume_settings=self.stop.resume_settings)
        self.summary.last_checkpoint = str(final)
        self.stop.saved(str(final), time.perf_counter() - t0)
        return str(final)

    def resume(self, point: checkpoint.ResumePoint) -> None:
        """Load ``point`` (chosen and verified on the driver before the workers started:
        :func:`grpo_dist.trainer.checkpoint.choose_resume`) into the workers and the driver's state."""
        state = point.state
        self.workers.load(point.path)
        if self.iterative is not None:
            self.iterative.load(point.path)
        self.sampler.load_state_dict(state["sampler"])
        self.global_step = point.step
        self.kl_ctrl.value = float(state.get("kl_coef", self.kl_ctrl.value))
        self.policy_version = int(state.get("policy_version", self.global_step))
        self.engines.load(point.path, state, step=self.global_step, policy_version=self.policy_version)
        print(f"grpo_dist: resumed from {point.path} (step {self.global_step})", flush=True)

    def _check_finite(self, metrics: dict[str, float], tracker: Tracker) -> None:
        """Stop (after logging this step and saving) when too many updates in a row were skipped."""
        if self.nonfinite.observe(metrics):
            tracker.log(metrics, step=self.global_step)
            raise TrainingError(self.nonfinite.message(self.global_step, saved=self.save()))

    # ================================================================ the loop
    def fit(self, resume: checkpoint.ResumePoint | None = None) -> RunSummary:
        """Train to ``total_steps``, first loading ``resume`` when given."""
        t = self.plan
        if resume is not None:
            self.resume(resume)
            self.stop.last_checkpoint = str(resume.path)
        self.stop.training()
        self.summary.first_step = self.global_step
        tracker = Tracker(logger_names(t.loggers), out_dir=self.out_dir, project=t.project_name,
                          experiment=t.experiment_name, config=self.spec.as_dict(), resume_step=self.global_step,
                          progress_bar=t.progress_bar and not t.val_only)
        if t.val_only:
            try:
                return self.validate_only(tracker)
            finally:
                tracker.close()
        progress = Progress(t.progress_bar, total=self.total_steps, initial=self.global_step)
        try:
            t_start = time.perf_counter()
            if t.val_before_train and self.val_data is not None and self.global_step == 0:
                self.summary.val_before = self.validate(tracker)
                tracker.log(self.summary.val_before, step=0)
            last_val: dict[str, float] = {}
            while self.global_step < self.total_steps:
                epoch = self.training_epoch()
                self.stop.step_begins(self.global_step + 1)
                self.workers.profile_step(self.global_step + 1)
                drawn = self.engines.ahead is not None or t.fully_async is not None  # (the schedule draws the prompts)
                metrics = self.train_step(None if drawn else self.next_items())
                self.global_step += 1
                metrics["training/global_step"], metrics["training/epoch"] = self.global_step, epoch
                is_last = self.global_step >= self.total_steps
                self._check_finite(metrics, tracker)
                timer = Timer()
                if self.val_data is not None and t.test_freq > 0 and (self.global_step % t.test_freq == 0 or is_last):
                    with timer("testing"):
                        last_val = self.validate(tracker)
                    metrics.update(last_val)
                self.stop.step_work_done()
                saved = None
                if (t.save_freq > 0 and self.global_step % t.save_freq == 0) or is_last or self.stop.requested:
                    with timer("save_checkpoint"):
                        saved = self.save()
                metrics.update(timer.metrics())
                tracker.log(metrics, step=self.global_step)
                progress.update(metrics, last_val)
                self.stop.at_step_boundary(self.global_step, saved, self.save)
            self.stop.finished()
            self.summary.val_after, self.summary.steps = last_val, self.global_step
            self.summary.wall_s = time.perf_counter() - t_start
        finally:
            progress.close()
            tracker.close()
        return self.summary
