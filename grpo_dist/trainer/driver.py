"""The single-controller driver: owns the loop, holds no model, drives the worker groups.

One step (see docs/ and DESIGN): generate -> reward -> old log-probs -> reference log-probs ->
advantages -> update -> weight sync -> metrics, validation, checkpoint.

Each phase is timed on the driver (``timing_s/<phase>``). Phases done by Ray workers also log the
workers' own busy time (``timing_s/<phase>/worker``, slowest rank; it comes back with the results,
see ``grpo_dist.workers.common.Timed``), and the weight sync is split further (``sync_weights``).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpo_dist.batch import Batch
from grpo_dist.config.schema import GRPOConfig
from grpo_dist.core.advantages import get_adv_estimator
from grpo_dist.core.diagnostics import rollout_probs_diff
from grpo_dist.core.kl import apply_kl_penalty, make_kl_controller
from grpo_dist.data.dataset import EpochSampler, PromptDataset, collate_prompts
from grpo_dist.distributed.worker_group import (
    ResourcePlan,
    SingleWorker,
    WorkerGroup,
    cluster_cpus,
    create_placement_groups,
    remove_placement_groups,
)
from grpo_dist.rewards.tokens import place_scores_on_last_token, place_step_rewards
from grpo_dist.rollout.base import RolloutOutput, SamplingSettings, pad_responses
from grpo_dist.trainer import build, checkpoint
from grpo_dist.trainer.metrics import Timer, data_metrics, reduce_validation, throughput_metrics, token_count
from grpo_dist.trainer.metrics import ResponseClipWarning
from grpo_dist.trainer.tracking import Tracker
from grpo_dist.training.micro_batches import rank_shard_indices
from grpo_dist.workers.common import unwrap_timed

#: glibc malloc settings of CPU worker processes: keep freed memory in the process instead of handing
#: it back to the kernel and faulting it in again on the next step (the update allocates and frees
#: its activations every micro-batch). On the 2-core benchmark machine the large workload's update
#: went from 2.47-2.49 s to 2.14-2.25 s and the reference forward from 0.77-0.81 s to 0.67-0.74 s;
#: the price is that a worker's resident memory stays at its peak.
CPU_WORKER_MALLOC_ENV = {
    "MALLOC_TRIM_THRESHOLD_": "4294967295",
    "MALLOC_MMAP_THRESHOLD_": "4294967295",
    "MALLOC_TOP_PAD_": "536870912",
}

UPDATE_KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask", "advantages")
FORWARD_KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. repeated non-finite updates); the message says why and what was saved."""


@dataclass
class RunSummary:
    steps: int = 0
    first_step: int = 0
    wall_s: float = 0.0
    tokens: int = 0
    val_before: dict[str, float] = field(default_factory=dict)
    val_after: dict[str, float] = field(default_factory=dict)
    last_checkpoint: str | None = None
    out_dir: str = ""


class GRPOTrainer:
    def __init__(
        self,
        cfg: GRPOConfig,
        *,
        model_path: str,
        tokenizer: Any,
        tokenizer_path: str,
        train_data: PromptDataset,
        val_data: PromptDataset | None,
        device: str,
        out_dir: str,
    ) -> None:
        self.cfg = cfg
        self.model_path = model_path
        self.tokenizer = tokenizer
        self.tokenizer_path = tokenizer_path
        self.train_data, self.val_data = train_data, val_data
        self.device = device
        self.out_dir = Path(out_dir)
        self.shape = build.step_shape(cfg)
        self.pad_id = train_data.pad_id
        self.sampler = EpochSampler(len(train_data), cfg.data.train_batch_size, seed=cfg.data.seed, shuffle=cfg.data.shuffle)
        t = cfg.trainer
        self.total_steps = t.total_training_steps or t.total_epochs * self.sampler.steps_per_epoch
        self.global_step = 0
        self.estimator = get_adv_estimator(cfg.algorithm.adv_estimator)
        kc = cfg.algorithm.kl_ctrl
        self.kl_ctrl = make_kl_controller(kc.type, kc.kl_coef, kc.target_kl, kc.horizon)
        self.use_ref = build.needs_reference(cfg)
        self.groups: list[WorkerGroup] = []
        self.sync_transport = "object_store"  # chosen in start_workers (choose_sync_transport)
        self.pgs: list = []
        self.summary = RunSummary(out_dir=str(self.out_dir))
        self.nonfinite_streak = 0
        self.clip_warning = ResponseClipWarning(cfg.actor_rollout_ref.rollout.response_length)
        # One optimizer step per training step on freshly sampled data: the sampling policy is the
        # current one, so the old-log-prob forward is skipped (the update uses ratio 1 exactly).
        self.on_policy = (self.shape.num_mini_batches == 1 and cfg.actor_rollout_ref.actor.ppo_epochs == 1
                          and not cfg.algorithm.use_kl_in_reward)

    # ================================================================ set-up / tear-down
    def start_workers(self) -> None:
        cfg, dev = self.cfg, self.device
        world = self.shape.world_size
        plan = ResourcePlan(cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node, dev, cpus_per_rank=1.0)
        self.pgs = create_placement_groups(plan)
        roles = 3 if self.use_ref else 2
        share = 1.0 / roles
        threads = max(1, int(cluster_cpus() // max(world, 1))) if dev == "cpu" else 4
        gpu = share if dev == "cuda" else 0.0
        common = dict(world_size=world, device=dev, num_threads=threads)
        # Ray starts a worker with OMP_NUM_THREADS = its CPU share (1 here); libraries that size their
        # thread pools when torch loads keep that even after torch.set_num_threads. On CPU, giving the
        # count at process start made rollout and update 6-14 % faster on the 2-core benchmark
        # machine. GPU workers keep Ray's setting: their CPU threads only launch kernels, and the
        # one GPU run with 4 OpenMP threads was not faster (docs/benchmarks.md).
        thread_env = {"OMP_NUM_THREADS": str(threads), **CPU_WORKER_MALLOC_ENV} if dev == "cpu" else {}
        self.actor = WorkerGroup("actor", _actor_cls(), plan, self.pgs, init_kwargs=lambda r: dict(rank=r, **common),
                                 num_cpus=share, num_gpus=gpu, env=thread_env)
        self.groups.append(self.actor)
        self.ref = None
        if self.use_ref:
            self.ref = WorkerGroup("reference", _ref_cls(), plan, self.pgs, init_kwargs=lambda r: dict(rank=r, **common),
                                   num_cpus=share, num_gpus=gpu, env=thread_env)
            self.groups.append(self.ref)
        engine_kwargs = build.engine_kwargs(cfg, self.model_path, dev)
        self.rollout = WorkerGroup(
            "rollout", _rollout_cls(), plan, self.pgs,
            init_kwargs=lambda r: dict(rank=r, device=dev, num_threads=threads, engine=cfg.actor_rollout_ref.rollout.name,
                                       engine_kwargs={**engine_kwargs, "seed": cfg.actor_rollout_ref.rollout.seed + r}),
            num_cpus=share, num_gpus=gpu,
            env={**build.engine_env(cfg, dev), **thread_env},
        )
        self.groups.append(self.rollout)
        rm = cfg.reward_model
        self.reward_group = SingleWorker(
            "reward", _reward_cls(), custom_path=cfg.custom_reward_function.path,
            custom_name=cfg.custom_reward_function.name, num_workers=rm.num_workers, timeout_s=rm.timeout_s,
            on_error=rm.on_error,
        )

        backend = "nccl" if dev == "cuda" else "gloo"
        settings = build.actor_settings(cfg, dev, self.total_steps)
        refs = []
        for group, extra in ((self.actor, dict(settings=settings)), (self.ref, build.reference_kwargs(cfg, dev))):
            if group is None:
                continue
            addr, port = group.call("address")[0]
            refs.append((group, group.submit("init_model", master_addr=addr, master_port=port, backend=backend,
                                             model_path=self.model_path, **extra)))
        for group, r in refs:
            group.collect(r, "model loading")
        # Engines are started by now (their constructors ran); make sure they are up.
        self.rollout.call("memory_gb")
        self.sync_transport = self.choose_sync_transport()
        self.placement = {"actor_rank_nodes": self.actor.call("node_id"), "weight_sync": self.sync_transport}
        (self.out_dir / "placement.json").write_text(json.dumps(self.placement, indent=1))
        nodes = sorted(set(self.placement["actor_rank_nodes"]))
        dtype = build.compute_dtype(self.cfg.actor_rollout_ref.actor.fsdp_config.dtype, dev)
        print(f"grpo_dist: {world} rank(s) on {len(nodes)} node(s), device {dev}, {dtype} compute, "
              f"weight sync {self.sync_transport}", flush=True)
        slow = build.cpu_half_precision_warning(self.cfg, dev)
        if slow:
            print(f"grpo_dist: warning: {slow}", flush=True)

    def choose_sync_transport(self) -> str:
        """``cuda_ipc`` when every actor rank shares its GPU with the rollout rank of the same index
        (checked by device UUID), else ``object_store``."""
        if self.device != "cuda":
            return "object_store"
        actor_gpus, rollout_gpus = self.actor.call("gpu_uuid"), self.rollout.call("gpu_uuid")
        same = len(actor_gpus) == len(rollout_gpus) and all(a is not None and a == b for a, b in zip(actor_gpus, rollout_gpus))
        return "cuda_ipc" if same else "object_store"

    def close(self) -> None:
        for g in self.groups:
            g.kill()
        self.groups = []
        if getattr(self, "reward_group", None) is not None:
            self.reward_group.kill()
            self.reward_group = None
        remove_placement_groups(self.pgs)
        self.pgs = []

    # ================================================================ stages
    def prompt_batch(self, items: list[dict], uid_prefix: str) -> Batch:
        c = collate_prompts(items, self.pad_id, self.cfg.data.max_prompt_length)
        tensors = {k: c[k] for k in ("input_ids", "attention_mask", "position_ids")}
        non = {
            "data_source": c["data_source"],
            "ground_truth": c["ground_truth"],
            "extra_info": c["extra_info"],
            "prompt_ids": c["prompt_ids"],
            "uid": [f"{uid_prefix}-{i}" for i in range(len(items))],
        }
        return Batch.from_dict(tensors, non)

    def generate(self, prompts: Batch, sampling: SamplingSettings) -> tuple[Batch, float]:
        """Sample ``sampling.n`` responses per prompt on the rollout ranks; rows grouped by prompt.
        Also returns the slowest rollout rank's busy seconds."""
        prompt_ids = list(prompts["prompt_ids"])
        k = len(self.rollout)
        bounds = np.linspace(0, len(prompt_ids), k + 1).astype(int)
        # Seeds follow the prompt's global position, so the samples do not depend on how the
        # prompts are spread over the rollout ranks.
        per_rank = [
            (prompt_ids[bounds[i]:bounds[i + 1]],
             sampling if sampling.seed is None else replace(sampling, seed=sampling.seed + int(bounds[i]) * sampling.n))
            for i in range(k)
        ]
        outs, busy_s = unwrap_timed(self.rollout.call("generate", per_rank=per_rank))
        merged = RolloutOutput(
            response_ids=[r for o in outs for r in o.response_ids],
            logprobs=[lp for o in outs for lp in o.logprobs] if sampling.logprobs else None,
            finished_by_eos=[f for o in outs for f in o.finished_by_eos],
        )
        R = self.cfg.actor_rollout_ref.rollout.response_length
        responses, response_mask, rollout_logp = pad_responses(merged, self.pad_id, R)
        rows = prompts.repeat_interleave(sampling.n)
        prompt_mask = rows["attention_mask"]
        last_pos = rows["position_ids"][:, -1:]
        resp_pos = last_pos + torch.arange(1, R + 1).unsqueeze(0)
        rows["prompts"] = rows["input_ids"]
        rows["responses"] = responses
        rows["response_mask"] = response_mask.float()
        if rollout_logp is not None:
            rows["rollout_log_probs"] = rollout_logp
        rows["input_ids"] = torch.cat([rows["input_ids"], responses], dim=1)
        rows["attention_mask"] = torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], dim=1)
        rows["position_ids"] = torch.cat([rows["position_ids"], resp_pos], dim=1)
        return rows, busy_s

    def decode_responses(self, batch: Batch) -> list[str]:
        out = []
        for ids, m in zip(batch["responses"], batch["response_mask"]):
            out.append(self.tokenizer.decode(ids[m.bool()].tolist(), skip_special_tokens=True))
        return out

    def score(self, batch: Batch, *, token_level: bool = True) -> tuple[torch.Tensor, dict[str, float]]:
        """Scores [B]; with ``token_level`` also ``token_level_scores`` in the batch: the score on the
        last response token or, with process supervision, the per-step rewards (``step_rewards``
        from the reward function) on the tokens that end each step (and ``step_end_mask``)."""
        texts = self.decode_responses(batch)
        scores, extra, stats = self.reward_group.call(
            "score", list(batch["data_source"]), texts, list(batch["ground_truth"]), list(batch["extra_info"])
        )
        scores_B = torch.tensor(scores, dtype=torch.float32)
        if not token_level:
            pass
        elif self.estimator.needs_step_rewards:
            lengths = [[len(self.tokenizer.decode([t], skip_special_tokens=True)) for t in ids[m.bool()].tolist()]
                       for ids, m in zip(batch["responses"], batch["response_mask"])]
            rewards, ends = place_step_rewards(extra.get("step_rewards", [None] * len(texts)), texts, lengths,
                                               batch["response_mask"])
            batch["token_level_scores"], batch["step_end_mask"] = rewards, ends
        else:
            batch["token_level_scores"] = place_scores_on_last_token(scores_B, batch["response_mask"])
        return scores_B, {k: float(v) for k, v in stats.items()}

    def _shard_evenly(self, batch: Batch, keys) -> list[tuple]:
        pieces = batch.select(*keys).chunk(self.shape.world_size)
        return [(p.tensor_dict(),) for p in pieces]

    def old_log_probs(self, batch: Batch) -> tuple[torch.Tensor, float]:
        """Log-probs [B, R] under the current policy, and the slowest actor rank's busy seconds."""
        r = self.cfg.actor_rollout_ref.rollout
        micro = None if r.log_prob_use_dynamic_bsz else r.log_prob_micro_batch_size_per_gpu
        tok = r.log_prob_max_token_len_per_gpu if r.log_prob_use_dynamic_bsz else None
        per_rank = [(d, micro, tok) for (d,) in self._shard_evenly(batch, FORWARD_KEYS)]
        outs, busy_s = unwrap_timed(self.actor.call("compute_log_prob", per_rank=per_rank))
        return torch.cat([lp for lp, _ in outs], dim=0), busy_s

    def ref_log_probs(self, batch: Batch) -> tuple[torch.Tensor, float]:
        """Log-probs [B, R] under the reference policy, and the slowest reference rank's busy seconds."""
        r = self.cfg.actor_rollout_ref.ref
        micro = None if r.log_prob_use_dynamic_bsz else r.log_prob_micro_batch_size_per_gpu
        tok = r.log_prob_max_token_len_per_gpu if r.log_prob_use_dynamic_bsz else None
        temp = self.cfg.actor_rollout_ref.rollout.temperature or 1.0
        per_rank = [(d, micro, tok, temp) for (d,) in self._shard_evenly(batch, FORWARD_KEYS)]
        outs, busy_s = unwrap_timed(self.ref.call("compute_ref_log_prob", per_rank=per_rank))
        return torch.cat(outs, dim=0), busy_s

    def advantages(self, batch: Batch) -> None:
        alg = self.cfg.algorithm
        adv, ret = self.estimator.fn(
            token_level_rewards_BT=batch["token_level_rewards"],
            response_mask_BT=batch["response_mask"],
            index_B=list(batch["uid"]),
            gamma=alg.gamma,
            lam=alg.lam,
            norm_adv_by_std=alg.norm_adv_by_std_in_grpo,
            step_end_mask_BT=batch["step_end_mask"] if "step_end_mask" in batch else None,
        )
        batch["advantages"] = adv
        batch["returns"] = ret

    def update_actor(self, batch: Batch) -> tuple[dict[str, float], float]:
        """One policy update on the actor ranks: its metrics, and the slowest actor rank's busy seconds."""
        keys = list(UPDATE_KEYS) + (["ref_log_prob"] if self.cfg.actor_rollout_ref.actor.use_kl_loss else [])
        keys += [] if self.on_policy else ["old_log_probs"]
        sel = batch.select(*keys)
        per_rank = []
        for rank in range(self.shape.world_size):
            idx = rank_shard_indices(len(sel), num_mini_batches=self.shape.num_mini_batches, rank=rank,
                                     world_size=self.shape.world_size)
            per_rank.append((sel.reorder(idx).tensor_dict(),))
        metrics, busy_s = unwrap_timed(self.actor.call("update_policy", per_rank=per_rank))
        out = dict(metrics[0])
        out["perf/max_memory_gb/actor"] = max(m.get("perf/max_memory_gb/actor", 0.0) for m in metrics)
        return out, busy_s

    def sync_weights(self) -> dict[str, float]:
        """Send the actor's current weights to every rollout engine, bucket by bucket
        (:mod:`grpo_dist.rollout.weight_sync`): for each bucket the actor ranks gather its full
        tensors into one flat buffer, and every rollout rank loads it, through CUDA IPC when actor
        rank r and rollout rank r share a GPU (``self.sync_transport == "cuda_ipc"``), else through
        Ray's object store (rank 0's copy, read by every rollout rank).

        Returns where the time went, in seconds, keyed by name under ``timing_s/``:
        ``update_weights/gather`` (actor ranks gathering and packing, slowest rank, summed over
        buckets), ``update_weights/transfer`` (moving the buffers: ``ray.put`` or the IPC handles,
        and the Ray calls' time outside the workers' bodies), ``update_weights/load`` (the engines
        loading, slowest rank) and ``update_weights/worker`` (busy time inside the workers: gather,
        put, engine wake-up and load).
        """
        r = self.cfg.actor_rollout_ref.rollout
        dtype = build.compute_dtype(r.dtype, self.device)
        bucket_bytes = int(r.update_weights_bucket_megabytes) * 2**20
        t0 = time.perf_counter()
        plans, gather_s = unwrap_timed(self.actor.call("sync_begin", dtype, bucket_bytes))
        _, wake_s = unwrap_timed(self.rollout.call("wake_up"))
        put_s = load_s = 0.0
        for i, bucket in enumerate(plans[0]):
            outs, busy_s = unwrap_timed(self.actor.call("sync_bucket", i, self.sync_transport))
            bucket_put_s = max(p for _, p in outs)
            gather_s += busy_s - bucket_put_s
            put_s += bucket_put_s
            if self.sync_transport == "cuda_ipc":
                per_rank = [(bucket, handle) for handle, _ in outs]
            else:
                per_rank = [(bucket, outs[0][0][0])] * len(self.rollout)
            _, busy_s = unwrap_timed(self.rollout.call("load_bucket", per_rank=per_rank))
            load_s += busy_s
        _, busy_s = unwrap_timed(self.rollout.call("finish_load"))
        load_s += busy_s
        self.actor.call("sync_end")
        total_s = time.perf_counter() - t0
        return {
            "update_weights/gather": gather_s,
            "update_weights/transfer": max(0.0, total_s - gather_s - wake_s - load_s),
            "update_weights/load": load_s,
            "update_weights/worker": gather_s + put_s + wake_s + load_s,
        }

    def step_seed(self) -> int:
        """Sampling seed of this step: a disjoint range of per-response seeds for every step."""
        return (self.cfg.actor_rollout_ref.rollout.seed * 100_003 + self.global_step) * (self.shape.responses + 1)

    # ================================================================ one step
    def train_step(self, items: list[dict]) -> dict[str, float]:
        cfg = self.cfg
        timer = Timer()
        t0 = time.perf_counter()
        with timer("step"):
            with timer("gen"):
                batch, busy_s = self.generate(self.prompt_batch(items, f"s{self.global_step}"),
                                              build.train_sampling(cfg, seed=self.step_seed()))
            timer.add("gen/worker", busy_s)
            if cfg.actor_rollout_ref.rollout.free_cache_engine:
                # colocated: the engine gives its device memory back while the actor trains
                self.rollout.call("sleep")
            with timer("reward"):
                _, reward_stats = self.score(batch)
            if not self.on_policy:
                with timer("old_log_prob"):
                    batch["old_log_probs"], busy_s = self.old_log_probs(batch)
                timer.add("old_log_prob/worker", busy_s)
            if self.use_ref:
                with timer("ref"):
                    batch["ref_log_prob"], busy_s = self.ref_log_probs(batch)
                timer.add("ref/worker", busy_s)
            with timer("adv"):
                extra: dict[str, float] = {}
                if cfg.algorithm.use_kl_in_reward:
                    rewards, kl = apply_kl_penalty(
                        batch["token_level_scores"], batch["old_log_probs"], batch["ref_log_prob"], batch["response_mask"],
                        kl_coef=self.kl_ctrl.value, kind=cfg.algorithm.kl_penalty,
                    )
                    extra = {"actor/reward_kl_penalty": kl, "actor/reward_kl_penalty_coeff": self.kl_ctrl.value}
                    self.kl_ctrl.update(kl, n_steps=len(items))
                    batch["token_level_rewards"] = rewards
                else:
                    batch["token_level_rewards"] = batch["token_level_scores"]
                self.advantages(batch)
            with timer("update_actor"):
                actor_metrics, busy_s = self.update_actor(batch)
            timer.add("update_actor/worker", busy_s)
            with timer("update_weights"):
                sync_s = self.sync_weights()
            for name, seconds in sync_s.items():
                timer.add(name, seconds)
        step_s = time.perf_counter() - t0
        ntok = token_count(batch)
        self.summary.tokens += ntok
        m: dict[str, float] = {}
        m.update(actor_metrics)
        m.update(extra)
        m.update(data_metrics(batch, cfg.actor_rollout_ref.rollout.response_length))
        self.clip_warning.observe(m["response_length/clip_ratio"], step=self.global_step + 1)
        if "rollout_log_probs" in batch and "old_log_probs" in batch:
            m.update(rollout_probs_diff(batch["rollout_log_probs"], batch["old_log_probs"], batch["response_mask"]))
        m.update(reward_stats)
        m.update(timer.metrics())
        m.update(throughput_metrics(ntok, step_s, self.shape.world_size))
        return m

    # ================================================================ validation
    def validate(self) -> dict[str, float]:
        if self.val_data is None:
            return {}
        cfg = self.cfg
        sampling = build.val_sampling(cfg)
        bs = cfg.data.val_batch_size or len(self.val_data)
        sources: list[str] = []
        scores: list[float] = []
        for start in range(0, len(self.val_data), bs):
            items = [self.val_data[i] for i in range(start, min(start + bs, len(self.val_data)))]
            batch, _ = self.generate(self.prompt_batch(items, f"v{start}"), sampling)
            s, _ = self.score(batch, token_level=False)
            sources += [str(x) for x in batch["data_source"]]
            scores += s.tolist()
        return reduce_validation(sources, scores, sampling.n)

    # ================================================================ checkpoints
    def save(self) -> str:
        root = Path(self.cfg.trainer.default_local_dir)
        tmp = checkpoint.tmp_dir(root, self.global_step)
        self.actor.call("save_checkpoint", str(tmp / "actor"))
        contents = self.cfg.actor_rollout_ref.actor.checkpoint.contents
        if "hf_model" in contents or self.global_step >= self.total_steps:
            self.actor.call("export_hf", str(tmp / "huggingface"), self.tokenizer_path)
        state = {
            "global_step": self.global_step,
            "sampler": self.sampler.state_dict(),
            "kl_coef": self.kl_ctrl.value,
            "total_steps": self.total_steps,
        }
        final = checkpoint.publish(root, tmp, self.global_step, state, self.cfg.trainer.max_actor_ckpt_to_keep)
        self.summary.last_checkpoint = str(final)
        return str(final)

    def maybe_resume(self) -> None:
        t = self.cfg.trainer
        root = Path(t.default_local_dir)
        checkpoint.clean_stale_tmp(root)
        if t.resume_mode == "disable":
            return
        ckpt = Path(t.resume_from_path) if t.resume_mode == "resume_path" else checkpoint.latest_checkpoint(root)
        if ckpt is None:
            return
        state = checkpoint.read_state(ckpt)
        self.actor.call("load_checkpoint", str(ckpt / "actor"))
        self.sampler.load_state_dict(state["sampler"])
        self.global_step = int(state["global_step"])
        self.kl_ctrl.value = float(state.get("kl_coef", self.kl_ctrl.value))
        self.sync_weights()
        print(f"grpo_dist: resumed from {ckpt} (step {self.global_step})", flush=True)

    def _check_finite(self, metrics: dict[str, float], tracker: Tracker) -> None:
        """Count steps whose update was skipped for a non-finite loss/gradient; stop after too many in a row."""
        bad = metrics.get("actor/grad_norm_nonfinite_count", 0.0) > 0 or not math.isfinite(metrics.get("actor/pg_loss", 0.0))
        self.nonfinite_streak = self.nonfinite_streak + 1 if bad else 0
        metrics["training/nonfinite_streak"] = self.nonfinite_streak
        limit = self.cfg.trainer.max_consecutive_nonfinite_steps
        if limit and self.nonfinite_streak >= limit:
            tracker.log(metrics, step=self.global_step)
            saved = self.save()
            raise TrainingError(
                f"{self.nonfinite_streak} steps in a row (up to step {self.global_step}) had a non-finite loss or "
                f"gradient norm, so their optimizer steps were skipped; stopped after saving {saved}. Lower "
                "actor_rollout_ref.actor.optim.lr, check the rewards, or raise trainer.max_consecutive_nonfinite_steps."
            )

    # ================================================================ the loop
    def fit(self) -> RunSummary:
        cfg = self.cfg
        t = cfg.trainer
        self.maybe_resume()
        self.summary.first_step = self.global_step
        tracker = Tracker(list(t.logger), out_dir=self.out_dir, project=t.project_name, experiment=t.experiment_name,
                          config={}, resume_step=self.global_step, progress_bar=t.progress_bar)
        bar = None
        try:
            if t.progress_bar:
                from tqdm import tqdm

                bar = tqdm(total=self.total_steps, initial=self.global_step, desc="GRPO", unit="step", dynamic_ncols=True)
            t_start = time.perf_counter()
            if t.val_before_train and self.val_data is not None and self.global_step == 0:
                val = self.validate()
                self.summary.val_before = val
                tracker.log(val, step=0)
            last_val: dict[str, float] = {}
            while self.global_step < self.total_steps:
                epoch = self.sampler.epoch
                items = [self.train_data[i] for i in next(self.sampler)]
                metrics = self.train_step(items)
                self.global_step += 1
                metrics["training/global_step"] = self.global_step
                metrics["training/epoch"] = epoch
                is_last = self.global_step >= self.total_steps
                self._check_finite(metrics, tracker)
                if self.val_data is not None and t.test_freq > 0 and (self.global_step % t.test_freq == 0 or is_last):
                    with _timed(metrics, "timing_s/testing"):
                        last_val = self.validate()
                    metrics.update(last_val)
                if (t.save_freq > 0 and self.global_step % t.save_freq == 0) or is_last:
                    with _timed(metrics, "timing_s/save_checkpoint"):
                        self.save()
                tracker.log(metrics, step=self.global_step)
                if bar is not None:
                    post = {"score": metrics.get("critic/score/mean", math.nan), "step_s": metrics["timing_s/step"]}
                    acc = [v for k, v in last_val.items() if k.endswith("/acc/mean@" + str(build.val_sampling(cfg).n))]
                    if acc:
                        post["val_acc"] = sum(acc) / len(acc)
                    bar.set_postfix({k: f"{v:.3g}" for k, v in post.items()})
                    bar.update(1)
            self.summary.val_after = last_val
            self.summary.steps = self.global_step
            self.summary.wall_s = time.perf_counter() - t_start
        finally:
            if bar is not None:
                bar.close()
            tracker.close()
        return self.summary


class _timed:
    def __init__(self, metrics: dict, key: str) -> None:
        self.metrics, self.key = metrics, key

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc) -> None:
        self.metrics[self.key] = time.perf_counter() - self.t0


def _actor_cls():
    from grpo_dist.workers.actor import ActorWorker

    return ActorWorker


def _ref_cls():
    from grpo_dist.workers.reference import ReferenceWorker

    return ReferenceWorker


def _rollout_cls():
    from grpo_dist.workers.rollout import RolloutWorker

    return RolloutWorker


def _reward_cls():
    from grpo_dist.workers.reward import RewardWorker

    return RewardWorker
