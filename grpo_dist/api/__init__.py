"""The in-process Python API: GRPO on a model object, in the calling process.

::

    from grpo_dist import GRPO
    trainer = GRPO(model=model, ref_model=ref_model, reward_fn=reward_fn, group_size=4, kl_coef=0.1,
                   learning_rate=1e-4, max_new_tokens=8)
    metrics = trainer.train(prompts=prompt_tensor, n_epochs=3)
    print(metrics["mean_reward"], metrics["kl"])

One step, for a batch of ``N`` prompts: sample ``G = group_size`` completions of each (``B = N * G``
rows), score them with ``reward_fn``, compute advantages with the registered estimator
(:mod:`grpo_dist.core.advantages`, group z-scores by default), reference log-probs under the frozen
``ref_model``, then update the policy with the distributed actor's update step
(:func:`grpo_dist.training.update.policy_mini_batch_step` around
:func:`grpo_dist.training.objective.micro_batch_loss`: the registered policy loss, entropy bonus and
KL loss, aggregated over the mini-batch; gradient clipping) and Adam.

With the defaults (one optimizer step per batch, so the ratio to the sampling policy is 1; the
``seq-mean-token-sum`` aggregation; the k1 KL estimator averaged over tokens) the gradient is that of
DeepSeekMath's GRPO pseudocode::

    loss = -mean_i(A_i * sum_t logp_i,t) + kl_coef * mean_i,t(logp_i,t - ref_logp_i,t)

verl's choices are options: ``loss_agg_mode="token-mean"``, ``kl_loss_type="low_var_kl"``,
``ppo_epochs`` and ``mini_batch_size`` (several clipped PPO updates per batch).

LoRA (``lora_rank > 0``, or a peft model as ``model``) changes which parameters train and what the
reference is (the base model: the policy with its adapters off), not the objective.

No Ray, vLLM or Hydra; no files are written. docs/python_api.md is the user guide.

:class:`GRPO` composes the package's modules, one job each: :mod:`~grpo_dist.api.options` (the
constructor's checks and the objective), :mod:`~grpo_dist.api.models` (plain or Hugging Face model:
calls, probe, pad and EOS ids), :mod:`~grpo_dist.api.prompts`, :mod:`~grpo_dist.api.sampling`
(:class:`Rollout`), :mod:`~grpo_dist.api.scoring` (rewards and advantages),
:mod:`~grpo_dist.api.update` (log-probs and optimizer steps) and :mod:`~grpo_dist.api.lora` (LoRA
adapters and the adapters-off reference).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from grpo_dist.api.lora import AdaptersOff, check_lora_model
from grpo_dist.api.models import (
    is_hf_causal_lm,
    is_peft_model,
    model_device,
    policy_module,
    probe_vocab_size,
    resolve_eos,
    resolve_pad,
)
from grpo_dist.api.options import (
    TRAINER_ONLY_LOSS_MODES,  # re-exported (with RewardFn): names this module has always had
    api_estimators,
    api_loss_modes,
    build_objective,
    check_estimator,
    check_float,
    check_group_size,
    check_int,
    check_lora,
    check_models,
    check_optional_int,
    check_reward_fn,
)
from grpo_dist.api.prompts import prompt_tensor
from grpo_dist.api.sampling import Rollout, Sampler
from grpo_dist.api.scoring import RewardFn, advantages, check_rewards, score_rollout
from grpo_dist.api.update import PolicyUpdate, eval_mode, update_data
from grpo_dist.training.lora import add_adapters

__all__ = ["GRPO", "Rollout", "api_loss_modes", "api_estimators"]


class GRPO:
    """GRPO on a model object in this process (see the module docstring and docs/python_api.md).

    Args:
        model: the policy, trained in place: a ``torch.nn.Module`` whose ``forward(input_ids)``
            returns logits ``[B, T, V]`` (a tensor, or an object with ``.logits``), or a Hugging Face
            causal LM (called with attention mask and position ids; sampled with its ``generate``).
            A plain module must be causal: it sees the left padding of its prompts, the same way when
            sampling and when training.
        ref_model: the frozen reference for the KL term; never updated. None: a frozen copy of
            ``model`` as it is now; for a peft policy (``lora_rank > 0``, or a ``peft.PeftModel``
            given), the policy itself with its adapters disabled, i.e. the base model (no copy).
        reward_fn: ``reward_fn(completions, prompts) -> list[float]``, one finite number per
            completion. ``completions[i]`` and ``prompts[i]`` (its prompt, one entry per completion)
            are 1-D token-id tensors without padding (a completion keeps its EOS), or strings when a
            tokenizer is given.
        group_size: completions per prompt (G): at least 2 for a group-based estimator (``grpo``,
            ``rloo``, ...: it compares a prompt's completions with each other); 1 is accepted for an
            estimator that is not group-based (``reinforce_plus_plus``).
        kl_coef: weight of the KL loss against ``ref_model``.
        learning_rate: Adam's learning rate.
        max_new_tokens: longest completion.
        max_grad_norm: clip the gradient's global L2 norm to this; 0: no clipping.
        temperature: sampling temperature (the log-probs of the update use it too).
        batch_size: prompts per step (per batch of completions); the last batch of an epoch may be
            smaller.
        ppo_epochs: passes over each batch (each pass one optimizer step per mini-batch).
        mini_batch_size: prompts per optimizer step; None: the whole batch.
        micro_batch_size: completions per forward/backward (a memory knob: it does not change the
            update); None: the whole mini-batch.
        loss_mode: a registered policy loss (:func:`grpo_dist.core.policy_loss.list_policy_losses`).
        adv_estimator: a registered advantage estimator
            (:func:`grpo_dist.core.advantages.list_adv_estimators`) that needs neither a critic's
            values nor per-step rewards.
        norm_adv_by_std: divide group-centred rewards by the group's std (False: Dr. GRPO).
        loss_agg_mode: aggregation of the policy term and the entropy
            (:data:`grpo_dist.core.losses.LOSS_AGG_MODES`).
        kl_loss_type: per-token KL estimator: ``kl`` (k1), ``abs``, ``mse`` (k2), ``low_var_kl`` (k3).
        kl_loss_agg_mode: aggregation of the KL term; None: like the policy term.
        entropy_coeff: weight of the entropy bonus.
        clip_ratio_low, clip_ratio_high, clip_ratio_c: the PPO clip range and the dual-clip bound.
        policy_loss_params: further fields of :class:`~grpo_dist.core.policy_loss.PolicyLossParams`
            that a loss mode reads, by name (the trainer's ``actor_rollout_ref.actor.policy_loss.<name>``
            keys, e.g. ``{"clip_cov_ratio": 0.001}``).
        tokenizer: a Hugging Face tokenizer: prompts may then be strings, and ``reward_fn`` gets strings.
        pad_token_id: the id that left-pads prompt tensors (None: the tokenizer's, then the model
            config's; none at all: prompts are not padded).
        eos_token_id: an id (or ids) that ends a completion (None: a Hugging Face model's generation
            config, then its config, then the tokenizer's; none at all: every completion has
            ``max_new_tokens`` tokens).
        device: where to train (the models are moved there); None: the device of ``model``.
        seed: seeds sampling and the order of prompts.
        shuffle: shuffle the prompts at every epoch.
        progress: show a tqdm progress bar in :meth:`train`.
        lora_rank: ``r > 0``: train LoRA adapters instead of the whole model (:mod:`grpo_dist.api.lora`):
            a Hugging Face causal LM is wrapped with peft, its weights frozen, and every target linear
            layer computes ``W x + (lora_alpha / r) * B A x`` with only ``A`` [r, in] (drawn from
            ``seed``) and ``B`` [out, r] (zero at first) trained. 0: no adapters are added (a model
            that already is a ``peft.PeftModel`` trains its own adapters as they are).
        lora_alpha: the adapters' scale is ``lora_alpha / lora_rank``.
        lora_target_modules: ``"all-linear"`` (every linear layer but the output layer), a list of
            module names (``["q_proj", "v_proj"]``: a module whose dotted name ends with one), or a
            regular expression over the full names.
        lora_dropout: peft's dropout on the adapters' input, in [0, 1). The update runs the policy in
            eval mode (its log-probs are the sampling policy's), so it is inactive in this API; it is
            kept in the adapters' config.

    Attributes:
        model: the policy; with ``lora_rank > 0`` the peft model around the model given (peft adds
            the adapters to that model's layers in place).
        ref_model: the separate reference module; None when the reference is the peft policy with its
            adapters off.
        reference: what the reference log-probs come from: ``ref_model``, or
            :class:`~grpo_dist.api.lora.AdaptersOff` around ``model``.
        history: one dict of metrics per step, in order.
        optimizer: the ``torch.optim.Adam`` over the model's trainable parameters (under LoRA, the
            adapters only).
    """

    def __init__(
        self,
        model: nn.Module,
        ref_model: nn.Module | None = None,
        reward_fn: RewardFn | None = None,
        group_size: int = 4,
        kl_coef: float = 0.1,
        learning_rate: float = 1e-4,
        max_new_tokens: int = 8,
        max_grad_norm: float = 1.0,
        *,
        temperature: float = 1.0,
        batch_size: int = 8,
        ppo_epochs: int = 1,
        mini_batch_size: int | None = None,
        micro_batch_size: int | None = None,
        loss_mode: str = "vanilla",
        adv_estimator: str = "grpo",
        norm_adv_by_std: bool = True,
        loss_agg_mode: str = "seq-mean-token-sum",
        kl_loss_type: str = "kl",
        kl_loss_agg_mode: str | None = "token-mean",
        entropy_coeff: float = 0.0,
        clip_ratio_low: float = 0.2,
        clip_ratio_high: float = 0.2,
        clip_ratio_c: float = 3.0,
        policy_loss_params: Mapping[str, Any] | None = None,
        tokenizer: Any = None,
        pad_token_id: int | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        device: str | torch.device | None = None,
        seed: int = 0,
        shuffle: bool = True,
        progress: bool = True,
        lora_rank: int = 0,
        lora_alpha: float = 16.0,
        lora_target_modules: str | Sequence[str] = "all-linear",
        lora_dropout: float = 0.0,
    ) -> None:
        # --- the arguments (all checked before any model is touched) ---------------------------
        check_models(model, ref_model)
        check_reward_fn(reward_fn)
        self.reward_fn = reward_fn
        self.estimator = check_estimator(adv_estimator)
        self.group_size = check_group_size(group_size, adv_estimator, self.estimator)
        self.kl_coef = check_float("kl_coef", kl_coef, minimum=0.0)
        self.learning_rate = check_float("learning_rate", learning_rate, minimum=0.0, strict=True)
        self.max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1)
        self.max_grad_norm = check_float("max_grad_norm", max_grad_norm, minimum=0.0)
        self.temperature = check_float("temperature", temperature, minimum=0.0, strict=True)
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.ppo_epochs = check_int("ppo_epochs", ppo_epochs, 1)
        self.mini_batch_size = check_optional_int("mini_batch_size", mini_batch_size, 1)
        self.micro_batch_size = check_optional_int("micro_batch_size", micro_batch_size, 1)
        self.norm_adv_by_std = bool(norm_adv_by_std)
        self.seed = check_int("seed", seed, 0)
        self.shuffle, self.progress = bool(shuffle), bool(progress)
        self.lora = check_lora(rank=lora_rank, alpha=lora_alpha, dropout=lora_dropout,
                               target_modules=lora_target_modules, seed=self.seed)
        check_lora_model(model, self.lora)
        self.objective = build_objective(
            loss_mode=loss_mode, loss_agg_mode=loss_agg_mode, kl_loss_type=kl_loss_type,
            kl_loss_agg_mode=kl_loss_agg_mode, kl_coef=self.kl_coef, entropy_coeff=entropy_coeff,
            clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high, clip_ratio_c=clip_ratio_c,
            policy_loss_params=policy_loss_params, max_new_tokens=self.max_new_tokens, temperature=self.temperature,
        )

        # --- the models -------------------------------------------------------------------------
        self.is_hf = is_hf_causal_lm(model)
        self.device = torch.device(model_device(model) if device is None else device)
        model = model.to(self.device)
        adapters_off = ref_model is None and (self.lora.enabled or is_peft_model(model))
        self.ref_model: nn.Module | None = None
        if not adapters_off:
            self.ref_model = (copy.deepcopy(model) if ref_model is None else ref_model).to(self.device)
            self.ref_model.requires_grad_(False)
        self.tokenizer = tokenizer
        self.pad_token_id = resolve_pad(pad_token_id, model=model, is_hf=self.is_hf, tokenizer=tokenizer)
        self.eos_token_ids = resolve_eos(eos_token_id, model=model, is_hf=self.is_hf, tokenizer=tokenizer)
        self.vocab_size = probe_vocab_size(model, "model", is_hf=self.is_hf, device=self.device)
        if self.ref_model is not None:
            ref_vocab = probe_vocab_size(self.ref_model, "ref_model", is_hf=self.is_hf, device=self.device)
            if ref_vocab != self.vocab_size:
                raise ValueError(f"GRPO ref_model returns {ref_vocab} logits per token, the model "
                                 f"{self.vocab_size}: they must share a vocabulary")
        if self.lora.enabled:  # last: peft changes the given model's layers in place, so only once all is checked
            with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
                model = add_adapters(model, self.lora)
        self.model = model
        self.reference: nn.Module | AdaptersOff = self.ref_model if self.ref_model is not None else AdaptersOff(model)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        if not trainable:
            hint = (" (a peft model loaded with PeftModel.from_pretrained needs is_trainable=True)"
                    if is_peft_model(self.model) else "")
            raise ValueError(f"GRPO model has no parameter with requires_grad=True: there is nothing to train{hint}")
        self.optimizer = torch.optim.Adam(trainable, lr=self.learning_rate)
        self.history: list[dict[str, float]] = []
        self.global_step = 0
        self._rng = torch.Generator().manual_seed(self.seed)

    # ------------------------------------------------------------------------------------------
    # one step: generate, score, update
    # ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: Any) -> Rollout:
        """Sample ``group_size`` completions of every prompt (a LongTensor [N, P] or, with a
        tokenizer, a list of strings) at ``temperature``. The policy is left in eval mode."""
        ids_NP, _ = self._prompt_tensor(prompts)
        seed = int(torch.randint(0, 2**62, (1,), generator=self._rng))
        sampler = Sampler(model=self.model, is_hf=self.is_hf, device=self.device, temperature=self.temperature,
                          max_new_tokens=self.max_new_tokens, pad_token_id=self.pad_token_id,
                          eos_token_ids=self.eos_token_ids)
        return sampler.rollout(ids_NP, self.group_size, seed)

    def score(self, rollout: Rollout, prompt_texts: list[str] | None = None) -> torch.Tensor:
        """``reward_fn`` on the rollout's completions: a float32 tensor [B]. ``ValueError`` when it
        does not return one finite number per completion."""
        return score_rollout(rollout, self.reward_fn, tokenizer=self.tokenizer, prompt_texts=prompt_texts)

    def update(self, rollout: Rollout, rewards: torch.Tensor | Sequence[float]) -> dict[str, float]:
        """Advantages from ``rewards`` [B], reference (and, unless on-policy, old) log-probs, then
        ``ppo_epochs`` passes of one optimizer step per mini-batch. Returns the step's metrics."""
        rewards_B = check_rewards(rewards, len(rollout)).to(self.device)
        advantages_BR = advantages(self.estimator, rollout, rewards_B, norm_adv_by_std=self.norm_adv_by_std)
        data = update_data(rollout, advantages_BR, self.device)
        policy_update = PolicyUpdate(
            objective=self.objective, optimizer=self.optimizer, device=self.device, temperature=self.temperature,
            max_grad_norm=self.max_grad_norm, ppo_epochs=self.ppo_epochs,
            mini_batch_rows=None if self.mini_batch_size is None else self.mini_batch_size * self.group_size,
            micro_batch_size=self.micro_batch_size,
        )
        policy, ref = policy_module(self.model, self.is_hf), policy_module(self.reference, self.is_hf)
        models = (self.model,) if self.ref_model is None else (self.model, self.ref_model)
        with eval_mode(*models):  # dropout off: the update's log-probs are the sampling policy's
            out = policy_update.run(policy, ref, data)
        out["mean_reward"] = float(rewards_B.mean())
        out["response_length"] = float(rollout.response_mask.sum(-1).mean())
        return out

    def step(self, prompts: Any) -> dict[str, float]:
        """One GRPO step on a batch of prompts: generate, score, update. Appends to :attr:`history`."""
        ids_NP, texts = self._prompt_tensor(prompts)
        return self._step(ids_NP, texts, epoch=0)

    def _step(self, ids_NP: torch.Tensor, texts: list[str] | None, epoch: int) -> dict[str, float]:
        rollout = self.generate(ids_NP)
        rewards_B = self.score(rollout, texts)
        metrics = self.update(rollout, rewards_B)
        self.global_step += 1
        metrics = {"step": float(self.global_step), "epoch": float(epoch)} | metrics
        self.history.append(metrics)
        return metrics

    def _prompt_tensor(self, prompts: Any) -> tuple[torch.Tensor, list[str] | None]:
        """Check and tokenize ``prompts``: the [N, P] id tensor, and the strings when given as strings."""
        return prompt_tensor(prompts, tokenizer=self.tokenizer, pad_token_id=self.pad_token_id,
                             vocab_size=self.vocab_size)

    # ------------------------------------------------------------------------------------------
    def train(self, prompts: Any, n_epochs: int = 1) -> dict[str, float]:
        """``n_epochs`` passes over ``prompts`` (a LongTensor [N, P] of token ids, left-padded with the
        pad id, or with a tokenizer a list of strings) in batches of ``batch_size`` prompts, one
        :meth:`step` per batch. Returns the means over the last epoch's steps of every step metric
        (at least ``mean_reward``, ``kl``, ``loss``, ``entropy``, ``response_length``);
        :attr:`history` keeps each step's."""
        n_epochs = check_int("n_epochs", n_epochs, 1)
        ids_NP, texts = self._prompt_tensor(prompts)
        N = ids_NP.shape[0]
        starts = list(range(0, N, self.batch_size))
        from tqdm.auto import tqdm

        bar = tqdm(total=n_epochs * len(starts), desc="GRPO", disable=not self.progress, leave=True)
        last: list[dict[str, float]] = []
        try:
            for epoch in range(n_epochs):
                order = torch.randperm(N, generator=self._rng) if self.shuffle else torch.arange(N)
                last = []
                for s in starts:
                    rows = order[s:s + self.batch_size]
                    metrics = self._step(ids_NP[rows], [texts[i] for i in rows.tolist()] if texts else None, epoch)
                    last.append(metrics)
                    bar.update(1)
                    bar.set_postfix(epoch=epoch, reward=f"{metrics['mean_reward']:.3f}", kl=f"{metrics['kl']:.4f}")
        finally:
            bar.close()
        return {k: sum(m[k] for m in last) / len(last) for k in last[0] if k not in ("step", "epoch")}

