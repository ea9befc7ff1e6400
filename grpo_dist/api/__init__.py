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

No Ray, vLLM or Hydra; no files are written. docs/python_api.md is the user guide.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import numbers
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from grpo_dist.core.advantages import AdvantageInputs, AdvantageParams, get_adv_estimator, list_adv_estimators
from grpo_dist.core.kl import canonical_kl_kind
from grpo_dist.core.losses import LOSS_AGG_MODES
from grpo_dist.core.policy_loss import PolicyLossParams, get_policy_loss, list_policy_losses
from grpo_dist.training.micro_batches import split_by_count, take_rows
from grpo_dist.training.objective import PolicyObjective
from grpo_dist.training.policy import forward_logprobs
from grpo_dist.training.update import policy_mini_batch_step, run_mini_batches

__all__ = ["GRPO", "Rollout", "api_loss_modes", "api_estimators"]

# loss modes that only the distributed trainer can feed (bypass mode takes the rollout engine's
# log-probs as the old policy, set up by algorithm.rollout_correction)
TRAINER_ONLY_LOSS_MODES = frozenset({"bypass_mode"})


def _api_estimator(spec) -> bool:
    return not (spec.needs_values or spec.needs_step_rewards or spec.needs_baseline_rollout)


def api_loss_modes() -> list[str]:
    """The registered policy-loss modes :class:`GRPO` accepts."""
    return [m for m in list_policy_losses() if m not in TRAINER_ONLY_LOSS_MODES]


def api_estimators() -> list[str]:
    """The registered advantage estimators :class:`GRPO` accepts (no critic, step rewards or baseline rollout)."""
    return [n for n in list_adv_estimators() if _api_estimator(get_adv_estimator(n))]

RewardFn = Callable[[list[Any], list[Any]], Sequence[float]]


@dataclass
class Rollout:
    """``B = N * G`` sampled completions of ``N`` prompts, in verl's layout: a left-padded prompt
    (width ``P``) followed by a right-padded response (width ``R``). Rows ``g*G .. g*G+G-1`` are the
    group of prompt ``g`` (prompt-major order).

    Attributes:
        input_ids: [B, P+R] prompt and response token ids.
        attention_mask: [B, P+R] 1 on the tokens the model attends to (for a plain module, which
            sees every prompt column, all prompt columns are 1).
        position_ids: [B, P+R] ``cumsum(attention_mask) - 1``, clamped at 0.
        responses: [B, R] the response ids (``input_ids[:, P:]``), padded after the end.
        response_mask: [B, R] float, 1 on the response tokens (up to and including an EOS).
        prompt_mask: [B, P] 1 on real prompt tokens (0 on the left padding).
        group_ids: [B] long, the index of each row's prompt in the batch.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    responses: torch.Tensor
    response_mask: torch.Tensor
    prompt_mask: torch.Tensor
    group_ids: torch.Tensor

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def completions(self) -> list[torch.Tensor]:
        """Each row's response tokens (up to and including an EOS), as 1-D CPU LongTensors."""
        lengths = self.response_mask.sum(-1).long().tolist()
        return [self.responses[i, :n].cpu() for i, n in enumerate(lengths)]

    def prompts(self) -> list[torch.Tensor]:
        """Each row's prompt tokens without the padding, as 1-D CPU LongTensors."""
        P = self.prompt_mask.shape[1]
        return [self.input_ids[i, :P][self.prompt_mask[i].bool()].cpu() for i in range(len(self))]


class _LogitsOnly(nn.Module):
    """Calls a plain module as ``forward(input_ids)``: the keyword call that
    :func:`~grpo_dist.training.policy.forward_logprobs` makes (Hugging Face's) is reduced to it."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: torch.Tensor, **_hf_keywords: Any) -> SimpleNamespace:
        return SimpleNamespace(logits=_logits_of(self.inner(input_ids)))


def _logits_of(output: Any) -> Any:
    return output.logits if hasattr(output, "logits") else output


def _is_hf_causal_lm(model: nn.Module) -> bool:
    """A Hugging Face ``PreTrainedModel`` (called with attention mask and position ids, sampled with
    ``generate``). A model of that class can exist only once transformers is imported, so this never
    imports it."""
    transformers = sys.modules.get("transformers")
    return transformers is not None and isinstance(model, transformers.PreTrainedModel)


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"GRPO {name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_float(name: str, value: Any, *, minimum: float, strict: bool = False) -> float:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > minimum if strict else value >= minimum)
    if not ok:
        raise ValueError(f"GRPO {name} must be a finite number {'>' if strict else '>='} {minimum}, got {value!r}")
    return float(value)


class GRPO:
    """GRPO on a model object in this process (see the module docstring and docs/python_api.md).

    Args:
        model: the policy, trained in place: a ``torch.nn.Module`` whose ``forward(input_ids)``
            returns logits ``[B, T, V]`` (a tensor, or an object with ``.logits``), or a Hugging Face
            causal LM (called with attention mask and position ids; sampled with its ``generate``).
            A plain module must be causal: it sees the left padding of its prompts, the same way when
            sampling and when training.
        ref_model: the frozen reference for the KL term; never updated. None: a frozen copy of
            ``model`` as it is now.
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

    Attributes:
        history: one dict of metrics per step, in order.
        optimizer: the ``torch.optim.Adam`` over the model's trainable parameters.
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
    ) -> None:
        # --- the numbers (all checked before any model is touched) ----------------------------
        if not isinstance(model, nn.Module):
            raise ValueError(f"GRPO model must be a torch.nn.Module, got {type(model).__name__}")
        if ref_model is not None and not isinstance(ref_model, nn.Module):
            raise ValueError(f"GRPO ref_model must be a torch.nn.Module or None, got {type(ref_model).__name__}")
        if ref_model is model:
            raise ValueError("GRPO ref_model is the policy itself; pass a separate copy, or omit it to get a frozen copy")
        if reward_fn is None or not callable(reward_fn):
            raise ValueError(f"GRPO reward_fn must be a function reward_fn(completions, prompts) -> list[float], got {reward_fn!r}")
        self.reward_fn = reward_fn
        self.estimator = get_adv_estimator(adv_estimator)
        if not _api_estimator(self.estimator):
            usable = [n for n in list_adv_estimators() if _api_estimator(get_adv_estimator(n))]
            need = ("a critic's values" if self.estimator.needs_values else "per-step rewards"
                    if self.estimator.needs_step_rewards else "a greedy baseline rollout")
            raise ValueError(f"GRPO adv_estimator {adv_estimator!r} needs {need}, which this API does not produce; "
                             f"valid: {usable}")
        self.group_size = self._check_group_size(group_size, adv_estimator)
        self.kl_coef = _check_float("kl_coef", kl_coef, minimum=0.0)
        self.learning_rate = _check_float("learning_rate", learning_rate, minimum=0.0, strict=True)
        self.max_new_tokens = _check_int("max_new_tokens", max_new_tokens, 1)
        self.max_grad_norm = _check_float("max_grad_norm", max_grad_norm, minimum=0.0)
        self.temperature = _check_float("temperature", temperature, minimum=0.0, strict=True)
        self.batch_size = _check_int("batch_size", batch_size, 1)
        self.ppo_epochs = _check_int("ppo_epochs", ppo_epochs, 1)
        self.mini_batch_size = None if mini_batch_size is None else _check_int("mini_batch_size", mini_batch_size, 1)
        self.micro_batch_size = None if micro_batch_size is None else _check_int("micro_batch_size", micro_batch_size, 1)
        self.norm_adv_by_std = bool(norm_adv_by_std)
        self.seed = _check_int("seed", seed, 0)
        self.shuffle, self.progress = bool(shuffle), bool(progress)
        for name, mode in (("loss_agg_mode", loss_agg_mode), ("kl_loss_agg_mode", kl_loss_agg_mode)):
            if not (mode in LOSS_AGG_MODES or (mode is None and name == "kl_loss_agg_mode")):
                raise ValueError(f"GRPO {name} {mode!r} is not an aggregation mode; valid: {list(LOSS_AGG_MODES)}")
        try:
            if canonical_kl_kind(kl_loss_type) == "full":
                raise ValueError("needs the reference logits")
        except ValueError as e:
            raise ValueError(f"GRPO kl_loss_type {kl_loss_type!r} is not usable ({e}); "
                             "valid: kl (k1), abs, mse (k2), low_var_kl (k3)") from None
        known = {f.name for f in dataclasses.fields(PolicyLossParams)}
        extra = dict(policy_loss_params or {})
        unknown = sorted(set(extra) - known)
        if unknown:
            raise ValueError(f"GRPO policy_loss_params {unknown} are not fields of PolicyLossParams; valid: {sorted(known)}")
        clips = dict(clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high, clip_ratio_c=clip_ratio_c)
        try:
            params = PolicyLossParams(**(clips | extra))
        except ValueError as e:
            raise ValueError(f"GRPO clip ratios / policy_loss_params: {e}") from None
        if loss_mode in TRAINER_ONLY_LOSS_MODES:
            raise ValueError(f"GRPO loss_mode {loss_mode!r} needs the rollout engine's log-probs and rollout-correction "
                             f"settings, which this API does not have; valid: {api_loss_modes()}")
        self.objective = PolicyObjective(
            policy_loss=get_policy_loss(loss_mode),
            params=params,
            loss_agg_mode=loss_agg_mode,
            norm_constant=float(self.max_new_tokens),
            entropy_coeff=_check_float("entropy_coeff", entropy_coeff, minimum=-math.inf),
            use_kl_loss=True,  # always computed: ``kl`` is reported even with kl_coef=0
            kl_loss_coef=self.kl_coef,
            kl_loss_type=kl_loss_type,
            kl_loss_agg_mode=kl_loss_agg_mode,
            temperature=self.temperature,
        )

        # --- the models -------------------------------------------------------------------------
        self.is_hf = _is_hf_causal_lm(model)
        if device is None:
            first = next(iter(model.parameters()), None)
            device = first.device if first is not None else torch.device("cpu")
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.ref_model = (copy.deepcopy(model) if ref_model is None else ref_model).to(self.device)
        self.ref_model.requires_grad_(False)
        self.tokenizer = tokenizer
        self.pad_token_id = self._resolve_pad(pad_token_id)
        self.eos_token_ids = self._resolve_eos(eos_token_id)
        self.vocab_size = self._probe(self.model, "model")
        ref_vocab = self._probe(self.ref_model, "ref_model")
        if ref_vocab != self.vocab_size:
            raise ValueError(f"GRPO ref_model returns {ref_vocab} logits per token, the model {self.vocab_size}: "
                             "they must share a vocabulary")
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        if not trainable:
            raise ValueError("GRPO model has no parameter with requires_grad=True: there is nothing to train")
        self.optimizer = torch.optim.Adam(trainable, lr=self.learning_rate)
        self.history: list[dict[str, float]] = []
        self.global_step = 0
        self._rng = torch.Generator().manual_seed(self.seed)

    # ------------------------------------------------------------------------------------------
    # set-up helpers
    # ------------------------------------------------------------------------------------------
    def _check_group_size(self, group_size: Any, adv_estimator: str) -> int:
        if not self.estimator.group_based:
            return _check_int("group_size", group_size, 1)
        try:
            return _check_int("group_size", group_size, 2)
        except ValueError as e:
            singles = [n for n in api_estimators() if not get_adv_estimator(n).group_based]
            raise ValueError(f"{e}: adv_estimator {adv_estimator!r} compares the completions of a prompt with each "
                             f"other; group_size=1 needs an estimator that is not group-based: {singles}") from None

    def _config_id(self, name: str) -> Any:
        """``name`` from the model's generation config, then its config (Hugging Face models only)."""
        for cfg in (getattr(self.model, "generation_config", None), getattr(self.model, "config", None)):
            value = getattr(cfg, name, None) if cfg is not None else None
            if value is not None:
                return value
        return None

    def _resolve_pad(self, pad_token_id: int | None) -> int | None:
        if pad_token_id is None and self.tokenizer is not None:
            pad_token_id = self.tokenizer.pad_token_id
        if pad_token_id is None and self.is_hf:
            pad_token_id = self._config_id("pad_token_id")
        if pad_token_id is not None:
            _check_int("pad_token_id", pad_token_id, 0)
        return pad_token_id

    def _resolve_eos(self, eos_token_id: int | Sequence[int] | None) -> list[int]:
        if eos_token_id is None and self.is_hf:  # what generate stops on (may list several ids)
            eos_token_id = self._config_id("eos_token_id")
        if eos_token_id is None and self.tokenizer is not None:
            eos_token_id = self.tokenizer.eos_token_id
        if eos_token_id is None:
            return []
        ids = [eos_token_id] if isinstance(eos_token_id, numbers.Integral) else list(eos_token_id)
        return [_check_int("eos_token_id", i, 0) for i in ids]

    def _call(self, model: nn.Module, input_ids: torch.Tensor) -> Any:
        """Logits of ``model`` on unpadded ``input_ids`` [B, T] (the probe)."""
        if self.is_hf:
            ones = torch.ones_like(input_ids)
            pos = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
            return _logits_of(model(input_ids=input_ids, attention_mask=ones, position_ids=pos, use_cache=False))
        return _logits_of(model(input_ids))

    @torch.no_grad()
    def _probe(self, model: nn.Module, name: str) -> int:
        """Run ``model`` on a [2, 3] input; the vocabulary size V of its logits [2, 3, V]."""
        was_training = model.training
        model.eval()
        try:
            out = self._call(model, torch.zeros((2, 3), dtype=torch.long, device=self.device))
        finally:
            model.train(was_training)
        if not (isinstance(out, torch.Tensor) and out.dim() == 3 and tuple(out.shape[:2]) == (2, 3)
                and out.is_floating_point() and out.shape[2] >= 2):
            got = f"a tensor of shape {tuple(out.shape)} and dtype {out.dtype}" if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(f"GRPO {name}: forward(input_ids [2, 3]) must return float logits [2, 3, V] with V >= 2 "
                             f"(a tensor or an object with .logits), got {got}")
        return int(out.shape[2])

    def _policy_module(self, model: nn.Module) -> nn.Module:
        """What :func:`micro_batch_loss` / :func:`forward_logprobs` call."""
        return model if self.is_hf else _LogitsOnly(model)

    # ------------------------------------------------------------------------------------------
    # prompts
    # ------------------------------------------------------------------------------------------
    def _prompt_tensor(self, prompts: Any) -> tuple[torch.Tensor, list[str] | None]:
        """Check and tokenize ``prompts``: the [N, P] id tensor, and the strings when given as strings."""
        if isinstance(prompts, torch.Tensor):
            if prompts.dtype.is_floating_point or prompts.dtype.is_complex or prompts.dtype == torch.bool:
                raise ValueError(f"GRPO prompts must be a LongTensor of token ids [N, P], got dtype {prompts.dtype}")
            if prompts.dim() != 2 or prompts.shape[0] < 1 or prompts.shape[1] < 1:
                raise ValueError(f"GRPO prompts must be a 2-D tensor [N, P] of token ids with N, P >= 1, "
                                 f"got shape {tuple(prompts.shape)}")
            ids = prompts.long()
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= self.vocab_size:
                raise ValueError(f"GRPO prompts hold token ids in [{lo}, {hi}]; the model's vocabulary is "
                                 f"[0, {self.vocab_size - 1}]")
            empty = (~self._prompt_mask(ids).bool().any(-1)).nonzero().flatten().tolist()
            if empty:
                raise ValueError(f"GRPO prompts rows {empty[:5]} are all padding (pad_token_id={self.pad_token_id}); "
                                 "every prompt needs at least one token")
            return ids, None
        if isinstance(prompts, (list, tuple)) and prompts and all(isinstance(p, str) for p in prompts):
            if self.tokenizer is None:
                raise ValueError("GRPO prompts are strings: pass tokenizer=... to GRPO, or give a LongTensor [N, P] of ids")
            rows = [list(self.tokenizer(p)["input_ids"]) for p in prompts]
            empty = [i for i, r in enumerate(rows) if not r]
            if empty:
                raise ValueError(f"GRPO prompts {empty[:5]} tokenize to nothing; every prompt needs at least one token")
            if self.pad_token_id is None and len({len(r) for r in rows}) > 1:
                raise ValueError("GRPO prompts of different lengths need a pad id: the tokenizer has none; pass pad_token_id=...")
            width = max(len(r) for r in rows)
            pad = self.pad_token_id if self.pad_token_id is not None else 0
            ids = torch.full((len(rows), width), pad, dtype=torch.long)
            for i, r in enumerate(rows):
                ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
            return self._prompt_tensor(ids)[0], list(prompts)
        raise ValueError(f"GRPO prompts must be a LongTensor [N, P] of token ids or (with a tokenizer) a non-empty "
                         f"list of strings, got {type(prompts).__name__}")

    def _prompt_mask(self, ids_NP: torch.Tensor) -> torch.Tensor:
        """1 from each row's first non-pad token on (left padding); all 1 without a pad id."""
        if self.pad_token_id is None:
            return torch.ones_like(ids_NP)
        return ((ids_NP != self.pad_token_id).long().cumsum(-1) > 0).long()

    # ------------------------------------------------------------------------------------------
    # one step: generate, score, update
    # ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: Any) -> Rollout:
        """Sample ``group_size`` completions of every prompt (a LongTensor [N, P] or, with a
        tokenizer, a list of strings) at ``temperature``. The policy is left in eval mode."""
        ids_NP, _ = self._prompt_tensor(prompts)
        G = self.group_size
        ids_BP = ids_NP.repeat_interleave(G, dim=0).to(self.device)
        prompt_mask_BP = self._prompt_mask(ids_BP)
        seed = int(torch.randint(0, 2**62, (1,), generator=self._rng))
        self.model.eval()
        if self.is_hf:
            tokens_BL = self._sample_hf(ids_BP, prompt_mask_BP, seed)
        else:
            tokens_BL = self._sample_plain(ids_BP, seed)
        L = tokens_BL.shape[1]
        if self.eos_token_ids:
            is_eos_BL = torch.isin(tokens_BL, torch.tensor(self.eos_token_ids, device=tokens_BL.device))
            first_B = torch.where(is_eos_BL.any(-1), is_eos_BL.int().argmax(-1) + 1, L)
        else:
            first_B = torch.full((tokens_BL.shape[0],), L, device=tokens_BL.device)
        response_mask_BL = (torch.arange(L, device=tokens_BL.device) < first_B.unsqueeze(-1)).long()
        pad = self._pad_fill()
        tokens_BL = torch.where(response_mask_BL.bool(), tokens_BL, torch.full_like(tokens_BL, pad))
        seen_BP = prompt_mask_BP if self.is_hf else torch.ones_like(prompt_mask_BP)
        attention_mask = torch.cat([seen_BP, response_mask_BL], dim=1)
        return Rollout(
            input_ids=torch.cat([ids_BP, tokens_BL], dim=1),
            attention_mask=attention_mask,
            position_ids=(attention_mask.cumsum(-1) - 1).clamp(min=0),
            responses=tokens_BL,
            response_mask=response_mask_BL.float(),
            prompt_mask=prompt_mask_BP,
            group_ids=torch.arange(ids_NP.shape[0], device=self.device).repeat_interleave(G),
        )

    def _pad_fill(self) -> int:
        if self.pad_token_id is not None:
            return self.pad_token_id
        return self.eos_token_ids[0] if self.eos_token_ids else 0

    def _sample_hf(self, ids_BP: torch.Tensor, mask_BP: torch.Tensor, seed: int) -> torch.Tensor:
        """Hugging Face ``generate`` (KV cache), pure sampling at ``temperature``: [B, L <= max_new_tokens]."""
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            out = self.model.generate(
                input_ids=ids_BP,
                attention_mask=mask_BP,
                do_sample=True,
                temperature=self.temperature,
                top_k=0,  # 0 disables top-k (the library's default would be 50)
                top_p=1.0,
                max_new_tokens=self.max_new_tokens,
                eos_token_id=self.eos_token_ids or None,
                pad_token_id=self._pad_fill(),
                use_cache=True,
            )
        return out[:, ids_BP.shape[1]:]

    def _sample_plain(self, ids_BP: torch.Tensor, seed: int) -> torch.Tensor:
        """Token by token on the whole sequence (a plain module has no KV cache): [B, L <= max_new_tokens]."""
        gen = torch.Generator(device=self.device).manual_seed(seed)
        eos = torch.tensor(self.eos_token_ids, device=self.device, dtype=torch.long)
        finished_B = torch.zeros(ids_BP.shape[0], dtype=torch.bool, device=self.device)
        ids, new = ids_BP, []
        for _ in range(self.max_new_tokens):
            logits_BV = _logits_of(self.model(ids))[:, -1, :].float() / self.temperature
            next_B = torch.multinomial(torch.softmax(logits_BV, dim=-1), 1, generator=gen).squeeze(-1)
            next_B = torch.where(finished_B, torch.full_like(next_B, self._pad_fill()), next_B)
            new.append(next_B)
            ids = torch.cat([ids, next_B.unsqueeze(-1)], dim=1)
            if eos.numel():
                finished_B |= torch.isin(next_B, eos)
                if bool(finished_B.all()):
                    break
        return torch.stack(new, dim=1)

    def score(self, rollout: Rollout, prompt_texts: list[str] | None = None) -> torch.Tensor:
        """``reward_fn`` on the rollout's completions: a float32 tensor [B]. ``ValueError`` when it
        does not return one finite number per completion."""
        completions: list[Any] = rollout.completions()
        prompts: list[Any] = rollout.prompts()
        if self.tokenizer is not None:
            completions = self.tokenizer.batch_decode([c.tolist() for c in completions], skip_special_tokens=True)
            if prompt_texts is not None:
                prompts = [prompt_texts[g] for g in rollout.group_ids.tolist()]
            else:
                prompts = self.tokenizer.batch_decode([p.tolist() for p in prompts], skip_special_tokens=True)
        rewards = self.reward_fn(completions, prompts)
        return _check_rewards(rewards, len(rollout))

    def update(self, rollout: Rollout, rewards: torch.Tensor | Sequence[float]) -> dict[str, float]:
        """Advantages from ``rewards`` [B], reference (and, unless on-policy, old) log-probs, then
        ``ppo_epochs`` passes of one optimizer step per mini-batch. Returns the step's metrics."""
        rewards_B = _check_rewards(rewards, len(rollout)).to(self.device)
        B, R = rollout.responses.shape
        G = self.group_size
        mask_BR = rollout.response_mask
        scores_BR = torch.zeros(B, R, device=self.device)
        last_B = (mask_BR.sum(-1).long() - 1).clamp(min=0)
        scores_BR[torch.arange(B, device=self.device), last_B] = rewards_B
        inputs = AdvantageInputs(token_level_rewards_BT=scores_BR, response_mask_BT=mask_BR,
                                 index_B=rollout.group_ids.tolist())
        advantages_BR, _ = self.estimator(inputs, AdvantageParams(norm_adv_by_std=self.norm_adv_by_std))
        data = {
            "input_ids": rollout.input_ids,
            "attention_mask": rollout.attention_mask,
            "position_ids": rollout.position_ids,
            "responses": rollout.responses,
            "response_mask": mask_BR,
            "advantages": advantages_BR.float(),
        }
        data = {k: v.to(self.device) for k, v in data.items()}
        rows_per_mini = B if self.mini_batch_size is None else min(B, self.mini_batch_size * G)
        minis = split_by_count(B, rows_per_mini)
        policy, ref = self._policy_module(self.model), self._policy_module(self.ref_model)
        was_training, ref_was_training = self.model.training, self.ref_model.training
        self.model.eval()  # dropout off: the update's log-probs are the sampling policy's
        self.ref_model.eval()
        try:
            data["ref_log_prob"] = self._log_probs(ref, data)
            if self.ppo_epochs > 1 or len(minis) > 1:
                data["old_log_probs"] = self._log_probs(policy, data)
            out, nonfinite = run_mini_batches(lambda rows: self._mini_batch_step(policy, take_rows(data, rows)), minis,
                                              epochs=self.ppo_epochs)
        finally:
            self.model.train(was_training)
            self.ref_model.train(ref_was_training)
        out["grad_norm_nonfinite_count"] = float(nonfinite)
        out["mean_reward"] = float(rewards_B.mean())
        out["response_length"] = float(mask_BR.sum(-1).mean())
        return out

    @torch.no_grad()
    def _log_probs(self, model: nn.Module, data: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """No-grad log-probs [B, R] of the responses under ``model``, micro-batch by micro-batch."""
        B, R = data["responses"].shape
        pieces = []
        for rows in split_by_count(B, self.micro_batch_size or B):
            mb = take_rows(data, rows)
            logp, _ = forward_logprobs(model, mb["input_ids"], mb["attention_mask"], mb["position_ids"],
                                       response_length=R, temperature=self.temperature, compute_entropy=False)
            pieces.append(logp)
        return torch.cat(pieces, dim=0)

    def _mini_batch_step(self, policy: nn.Module, mb_data: dict[str, torch.Tensor]) -> tuple[dict[str, float], bool]:
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

    # ------------------------------------------------------------------------------------------
    def train(self, prompts: Any, n_epochs: int = 1) -> dict[str, float]:
        """``n_epochs`` passes over ``prompts`` (a LongTensor [N, P] of token ids, left-padded with the
        pad id, or with a tokenizer a list of strings) in batches of ``batch_size`` prompts, one
        :meth:`step` per batch. Returns the means over the last epoch's steps of every step metric
        (at least ``mean_reward``, ``kl``, ``loss``, ``entropy``, ``response_length``);
        :attr:`history` keeps each step's."""
        n_epochs = _check_int("n_epochs", n_epochs, 1)
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


def _check_rewards(rewards: Any, count: int) -> torch.Tensor:
    """One finite real number per completion, as a float32 CPU tensor [count]; ``ValueError`` otherwise.

    A list, tuple, 1-D tensor or array of Python or numpy numbers (bools count as 0/1)."""
    if isinstance(rewards, torch.Tensor) and rewards.dim() != 1:
        raise ValueError(f"reward_fn must return {count} numbers, got a tensor of shape {tuple(rewards.shape)}")
    if hasattr(rewards, "tolist") and not isinstance(rewards, (list, tuple)):
        rewards = rewards.tolist()
    if not isinstance(rewards, (list, tuple)):
        raise ValueError(f"reward_fn must return a list of {count} numbers, got {type(rewards).__name__}")
    if len(rewards) != count:
        raise ValueError(f"reward_fn returned {len(rewards)} rewards for {count} completions: one number per completion")
    out = []
    for i, v in enumerate(rewards):
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            v = v.item()
        if not isinstance(v, numbers.Real):
            raise ValueError(f"reward_fn returned {v!r} ({type(v).__name__}) for completion {i}: rewards must be numbers")
        if not math.isfinite(v):
            raise ValueError(f"reward_fn returned {v} for completion {i}: rewards must be finite")
        out.append(float(v))
    return torch.tensor(out, dtype=torch.float32)
