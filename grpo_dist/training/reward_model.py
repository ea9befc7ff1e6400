"""A learned reward model under FSDP2: scores of responses, and its further training (iterative RL).

One :class:`FSDPRewardModel` per data-parallel rank; every public method is collective and must be
called on all ranks in the same order (a Ray worker group does this). No Ray, no vLLM here.

The model
---------
A causal-LM backbone with a scalar head, loaded with ``AutoModelForTokenClassification`` and
``num_labels=1`` so that every position has a score. A folder saved with
``AutoModelForSequenceClassification`` and one label loads the same way: for Qwen2, Llama and the
other ``Generic*Classification`` models both heads are the linear layer ``score``; the sequence head
has no bias, so such a folder is built with ``token_classification_bias=False`` and keeps its trained
head exactly. The output at a token is the score of the prefix that ends with it (a logit).

The folder must hold that head: a causal LM's folder (``lm_head``, no scalar head) or a classifier
whose head has a name the token-classification class does not read (GPT-2's sequence classifier
saves ``score``, its token classifier reads ``classifier``) would get a new, random head, and its
scores would be noise. :func:`check_reward_head` refuses such a folder from the names in its weight
files (safetensors headers or index, no weights read): the driver calls it before any worker starts;
the load itself refuses a head that transformers reports missing (``load_hf_model(require_head=True)``).

Where scores are read
---------------------
The batch is a left-padded prompt (P columns) followed by a right-padded response (R columns).

- Outcome: the score at the last valid token of prompt + response (the response's last token, or
  the prompt's last one for an empty response): :meth:`FSDPRewardModel.compute_scores` returns it per
  row (``last_B``).
- Process: the scores at response tokens (``token_scores_BR``, the output at column ``P + t`` for
  response token ``t``); the caller reads them at the tokens that end a step.
- When the reward model has its own tokenizer (``settings.reencode``), each prompt + response is
  decoded with the policy's tokenizer and re-encoded with the reward model's chat template (the
  prompt's chat messages, then the response as the assistant's turn); only ``last_B`` is returned.

Training
--------
:meth:`FSDPRewardModel.update` takes rank ``r``'s rows laid out as the critic's update does
(:func:`grpo_dist.training.micro_batches.rank_shard_indices`) with ``rm_targets`` [B, R]: the
verifier's label in [0, 1] on the response tokens scored (NaN elsewhere). The loss is binary
cross-entropy on the score as a logit, normalised by the labelled positions of the whole mini-batch
(:func:`grpo_dist.core.reward_model.labelled_bce`); each micro-batch back-propagates ``loss * W``
(FSDP2 averages gradients over the ``W`` ranks), so the update does not depend on the micro-batch
size or the number of ranks. AdamW with a constant learning rate, gradient-norm clipping.

Metrics: ``reward_model/train_loss`` (the mini-batch's loss), ``reward_model/train_accuracy`` (labelled
positions agreeing with the verifier, before each optimizer step), ``reward_model/grad_norm``, each
averaged over the mini-batches and epochs of the call; ``reward_model/grad_norm_nonfinite_count``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForTokenClassification

from grpo_dist.core.reward_model import labelled_bce
from grpo_dist.training.fsdp_role import FSDPRole
from grpo_dist.training.micro_batches import plan_micro_batches, restore_order, take_rows
from grpo_dist.training.model_builder import model_config
from grpo_dist.training.policy import require_keys, require_same_shape, trim_padding_columns
from grpo_dist.training.settings import FORWARD_KEYS, RM_UPDATE_KEYS, RewardModelSettings

__all__ = ["FSDPRewardModel", "check_reward_head", "forward_scores", "reward_head_config", "reencode_for_reward_model",
           "saved_weight_names"]


def reward_head_config(model_path: str | os.PathLike, *, trust_remote_code: bool = False) -> dict[str, Any]:
    """Config fields that build ``model_path`` as a one-output token-classification model: one label,
    and no head bias when the folder was saved as a sequence classifier (whose ``score`` has none)."""
    config = AutoConfig.from_pretrained(str(model_path), trust_remote_code=trust_remote_code)
    out: dict[str, Any] = {"num_labels": 1}
    if any(str(a).endswith("ForSequenceClassification") for a in (getattr(config, "architectures", None) or [])):
        out["token_classification_bias"] = False
    return out



def saved_weight_names(model_path: str | os.PathLike) -> tuple[str, set[str]] | None:
    """``(file, names)``: the names of the tensors a Hugging Face folder saves, read from its
    safetensors index or file headers (or a PyTorch index, or a memory-mapped PyTorch file), without
    reading the weights; None when the folder has no weight file of those kinds or it cannot be read
    (the load then says what is wrong with it)."""
    import json

    from safetensors import safe_open

    folder = Path(model_path)
    try:
        for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
            if (folder / index).is_file():
                return index, set(json.loads((folder / index).read_text())["weight_map"])
        if (folder / "model.safetensors").is_file():
            with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
                return "model.safetensors", set(f.keys())
        if (folder / "pytorch_model.bin").is_file():
            state = torch.load(folder / "pytorch_model.bin", map_location="cpu", mmap=True, weights_only=True)
            return "pytorch_model.bin", set(state)
    except Exception:  # noqa: BLE001 - an unreadable file is the load's to report, with its own message
        return None
    return None


def _head_names(model: nn.Module, names: Sequence[str]) -> list[str]:
    """The names among ``names`` (a model's state-dict keys) outside its backbone (``base_model_prefix``)."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    return [k for k in names if not (prefix and k.startswith(prefix + "."))]


def check_reward_head(model_path: str | os.PathLike, *, overrides: Mapping[str, Any] | None = None,
                      trust_remote_code: bool = False, key: str = "reward_model.model.path") -> None:
    """``ValueError`` unless the folder's weights hold the head the reward model is read with.

    The reward model is ``AutoModelForTokenClassification`` built from the folder's config with
    :func:`reward_head_config` (and ``overrides``); its head is what lies outside the backbone
    (``score.weight``/``score.bias`` for Qwen2 and Llama, ``classifier.*`` for GPT-2 or BERT). The
    model is built on the meta device (no memory) and compared with the names in the folder's weight
    files (:func:`saved_weight_names`). The message names the folder, the head weights missing and
    what the folder holds outside the backbone instead (``lm_head.weight``: a causal LM). A folder
    this cannot read (no weight file of a known kind, an architecture without a token-classification
    class) is left to the load, which fails or checks the head itself."""
    saved = saved_weight_names(model_path)
    if saved is None:
        return
    file, names = saved
    config = model_config(model_path, {**(overrides or {}), **reward_head_config(model_path, trust_remote_code=trust_remote_code)},
                          trust_remote_code=trust_remote_code)
    try:
        with torch.device("meta"):
            model = AutoModelForTokenClassification.from_config(config, trust_remote_code=trust_remote_code)
    except (ValueError, KeyError, ImportError):
        return
    expected = list(model.state_dict())
    head = _head_names(model, expected)
    missing = [k for k in head if k not in names]
    if not head or not missing:
        return
    prefix = model.base_model_prefix
    backbone = {k.removeprefix(prefix + ".") for k in expected} | set(expected)
    other = sorted(k for k in names if k not in backbone)
    found = (", ".join(other[:6]) + (f" and {len(other) - 6} more" if len(other) > 6 else "")) if other else "nothing"
    causal = " (a causal LM's output layer: this folder is a language model, not a reward model)" if any(
        k.split(".")[0] == "lm_head" for k in other) else ""
    raise ValueError(
        f"the reward model {model_path} ({key}) holds no trained reward head: it is read as {type(model).__name__}, "
        f"whose head weights {', '.join(missing)} are not in the folder ({file}); outside the backbone the folder "
        f"holds {found}{causal}. A new head would be random and its scores noise, so the run stops. Give a folder "
        f"whose weights hold {', '.join(head)}: one saved with AutoModelForTokenClassification and num_labels=1 "
        "(scripts/train_reward_model.py trains one on a policy's backbone), or a one-label "
        "AutoModelForSequenceClassification of a model whose two heads share the name 'score' (Qwen2, Llama, Mistral)"
    )


def forward_scores(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    *,
    response_length: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's output at the response tokens and at each row's last valid token.

    Shapes: input_ids, attention_mask, position_ids [B, P+R] -> ``(token_scores_BR [B, R],
    last_B [B])``, float32; ``token_scores_BR[:, t]`` is the output at column ``P + t`` (0 past the last
    column any row attends to). Columns no row attends to are trimmed before the forward. Gradients
    flow under grad mode. ``response_length`` 0 is allowed (rows of a re-encoded batch: only ``last_B``).
    """
    require_same_shape(input_ids, attention_mask, position_ids)
    R, L = response_length, input_ids.shape[1]
    if not 0 <= R < L:
        raise ValueError(f"response_length {R} must be in [0, {L})")
    if R:
        start, kept = trim_padding_columns(attention_mask, R)
        end = L - R + kept
    else:
        any_col = attention_mask.bool().any(dim=0).nonzero()
        start, end, kept = (int(any_col[0]), int(any_col[-1]) + 1, 0) if any_col.numel() else (0, 1, 0)
    with warnings.catch_warnings():
        # the head's output is a view; FSDP2 warns that an in-place op on it would skip its backward
        # hook, and nothing here modifies it in place
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
        out = model(
            input_ids=input_ids[:, start:end],
            attention_mask=attention_mask[:, start:end],
            position_ids=position_ids[:, start:end],
            use_cache=False,
        )
    logits_BK = out.logits[..., 0].float()
    mask_BK = attention_mask[:, start:end].bool()
    cols_K = torch.arange(end - start, device=mask_BK.device)
    last_B = torch.where(mask_BK, cols_K, -1).amax(dim=1).clamp(min=0)
    last_scores_B = logits_BK.gather(1, last_B.unsqueeze(1)).squeeze(1)
    token_BR = logits_BK[:, L - R - start:] if R else logits_BK[:, :0]
    if kept < R:
        token_BR = nn.functional.pad(token_BR, (0, R - kept))
    return token_BR, last_scores_B


def reencode_for_reward_model(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    response_length: int,
    raw_prompts: Sequence[Any],
    input_tokenizer: Any,
    rm_tokenizer: Any,
    max_length: int | None,
) -> dict[str, torch.Tensor]:
    """The rows as the reward model reads them with its own tokenizer (verl's chat-template switch).

    Per row: the response's valid tokens are decoded with ``input_tokenizer`` (special tokens
    dropped); the chat is the row's prompt messages (a plain prompt text counts as one user message)
    followed by ``{"role": "assistant", "content": response}``, rendered with the reward model's chat
    template (or, without one, the decoded prompt followed by the response) and encoded without
    adding special tokens. Inputs longer than ``max_length`` keep their last ``max_length`` tokens
    (the score is read at the end). Rows are right-padded with the reward model's pad id (its EOS id
    when it has none).

    Returns ``input_ids``, ``attention_mask``, ``position_ids`` [B, L'] (L' the longest row).
    """
    R = response_length
    P = input_ids.shape[1] - R
    pad_id = rm_tokenizer.pad_token_id if rm_tokenizer.pad_token_id is not None else (rm_tokenizer.eos_token_id or 0)
    rows: list[list[int]] = []
    for b in range(input_ids.shape[0]):
        resp_mask = attention_mask[b, P:].bool()
        response = input_tokenizer.decode(input_ids[b, P:][resp_mask].tolist(), skip_special_tokens=True)
        raw = raw_prompts[b]
        messages = [{"role": "user", "content": raw}] if isinstance(raw, str) else [dict(m) for m in raw]
        chat = messages + [{"role": "assistant", "content": response}]
        if getattr(rm_tokenizer, "chat_template", None):
            text = rm_tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=False)
        else:
            prompt_mask = attention_mask[b, :P].bool()
            text = input_tokenizer.decode(input_ids[b, :P][prompt_mask].tolist(), skip_special_tokens=True) + response
        ids = rm_tokenizer(text, add_special_tokens=False)["input_ids"]
        if max_length is not None and len(ids) > max_length:
            ids = ids[-max_length:]
        rows.append(ids or [pad_id])
    width = max(len(r) for r in rows) if rows else 1
    ids_BL = torch.full((len(rows), width), int(pad_id), dtype=torch.long)
    mask_BL = torch.zeros((len(rows), width), dtype=torch.long)
    for b, r in enumerate(rows):
        ids_BL[b, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask_BL[b, : len(r)] = 1
    return {"input_ids": ids_BL, "attention_mask": mask_BL, "position_ids": (mask_BL.cumsum(-1) - 1).clamp(min=0)}


class FSDPRewardModel(FSDPRole):
    """The reward model on one data-parallel rank (FSDP2-sharded); with ``settings.trainable`` also its
    AdamW (the scaffold: :class:`~grpo_dist.training.fsdp_role.FSDPRole`). The default process group
    must already be initialised with ``world_size`` ranks. Every method is collective. Dropout is
    zeroed at load; the model is in train mode only inside :meth:`update`."""

    metric_prefix = "reward_model"

    def __init__(self, model_path: str | os.PathLike, settings: RewardModelSettings, *, rank: int, world_size: int,
                 device: str | torch.device) -> None:
        super().__init__(model_path, settings, rank=rank, world_size=world_size, device=device,
                         config_overrides={**(settings.override_config or {}),
                                           **reward_head_config(model_path, trust_remote_code=settings.trust_remote_code)})
        self.defer_grad_sync = False  # the gradients are reduce-scattered after every micro-batch
        self.build_model(model_class=AutoModelForTokenClassification, trainable=settings.trainable, seed=settings.seed,
                         require_head=True)
        if settings.trainable:
            self.build_optimizer()
        self.input_tokenizer = self.rm_tokenizer = None
        if settings.reencode:
            from transformers import AutoTokenizer

            self.input_tokenizer = AutoTokenizer.from_pretrained(settings.input_tokenizer_path,
                                                                 trust_remote_code=settings.trust_remote_code)
            self.rm_tokenizer = AutoTokenizer.from_pretrained(self.model_path, trust_remote_code=settings.trust_remote_code)

    # ------------------------------------------------------------------------------------------
    def _micro_batches(self, attention_mask: torch.Tensor, *, update: bool, mini: int = 0) -> list[list[int]]:
        s = self.settings
        if update:
            return plan_micro_batches(attention_mask, micro_batch_size=s.update_micro_batch_size_per_gpu or mini)
        if s.use_dynamic_bsz:
            return plan_micro_batches(attention_mask, max_token_len=s.forward_max_token_len_per_gpu)
        return plan_micro_batches(attention_mask, micro_batch_size=s.micro_batch_size_per_gpu)

    # ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def compute_scores(self, data: Mapping[str, torch.Tensor],
                       raw_prompts: Sequence[Any] | None = None) -> dict[str, torch.Tensor | None]:
        """Scores of this rank's rows (CPU float32, input row order).

        Needs input_ids, attention_mask, position_ids, responses (and ``raw_prompts``, each row's chat
        messages, when re-encoding). Returns ``last_B`` [B] (the score at the last valid token) and
        ``token_scores_BR`` [B, R] (scores at the response tokens, 0 outside the response; None when
        re-encoding). Micro-batches of ``micro_batch_size_per_gpu`` rows, or by token budget with
        ``use_dynamic_bsz``.
        """
        require_keys(data, FORWARD_KEYS, "compute_scores")
        self.model.eval()
        R = data["responses"].shape[1]
        rows = {k: data[k] for k in ("input_ids", "attention_mask", "position_ids")}
        if self.settings.reencode:
            if raw_prompts is None or len(raw_prompts) != rows["input_ids"].shape[0]:
                raise ValueError("compute_scores: re-encoding for the reward model's tokenizer needs each row's prompt messages")
            rows = reencode_for_reward_model(rows["input_ids"], rows["attention_mask"], response_length=R,
                                             raw_prompts=raw_prompts, input_tokenizer=self.input_tokenizer,
                                             rm_tokenizer=self.rm_tokenizer, max_length=self.settings.max_length)
        mbs = self._micro_batches(rows["attention_mask"], update=False)
        if not mbs:
            return {"last_B": torch.zeros(0), "token_scores_BR": None if self.settings.reencode else torch.zeros(0, R)}
        tokens, last = [], []
        width = 0 if self.settings.reencode else R
        for idx in mbs:
            mb = {k: v.to(self.device, non_blocking=True) for k, v in take_rows(rows, idx).items()}
            tok_BR, last_B = forward_scores(self.model, mb["input_ids"], mb["attention_mask"], mb["position_ids"],
                                            response_length=width)
            tokens.append(tok_BR.cpu())
            last.append(last_B.cpu())
        last_B = restore_order(last, mbs)
        if self.settings.reencode:
            return {"last_B": last_B, "token_scores_BR": None}
        mask_BR = data["attention_mask"][:, -R:].to(torch.float32)
        token_BR = restore_order(tokens, mbs)
        return {"last_B": last_B, "token_scores_BR": torch.where(mask_BR != 0, token_BR, torch.zeros_like(token_BR))}

    def update(self, data: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """``epochs`` passes of optimizer steps over this rank's mini-batch chunks (layout in the module
        docstring; keys :data:`~grpo_dist.training.settings.RM_UPDATE_KEYS`). Returns the metrics,
        identical on all ranks."""
        s = self.settings
        if self.optimizer is None:
            raise RuntimeError("this reward model is frozen (settings.trainable=False): it has no optimizer")
        require_keys(data, RM_UPDATE_KEYS, "update")
        n, mini = self.check_update_rows(data, s.mini_batch_size_per_gpu, where="update", size_name="mini_batch_size_per_gpu")
        cpu_data = {k: data[k] for k in RM_UPDATE_KEYS}
        return self.run_update(lambda rows: self._mini_batch_step(take_rows(cpu_data, rows), mini), n, mini, epochs=s.epochs)

    def _mini_batch_step(self, mb_data: dict[str, torch.Tensor], mini: int) -> tuple[dict[str, float], bool]:
        """Forward/backward over the micro-batches of one mini-batch, then clip and step."""
        (num_labels,) = self._all_reduce_sum([float(torch.isfinite(mb_data["rm_targets"]).sum())])
        if num_labels == 0:  # only padding rows (the same on every rank: the count is global)
            return {}, True
        R = mb_data["responses"].shape[1]

        def piece(mb: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            scores_BR, _ = forward_scores(self.model, mb["input_ids"], mb["attention_mask"], mb["position_ids"], response_length=R)
            loss, agree = labelled_bce(scores_BR, mb["rm_targets"], num_labels=num_labels)
            return loss, {"loss": loss.detach().double(), "correct": agree.double()}

        totals = self.backward_micro_batches(mb_data, self._micro_batches(mb_data["attention_mask"], update=True, mini=mini),
                                             piece, ("loss", "correct"))
        grad_norm, finite = self.clip_and_step()
        return {"reward_model/train_loss": totals["loss"], "reward_model/train_accuracy": totals["correct"] / num_labels,
                "reward_model/grad_norm": grad_norm}, finite

    # ------------------------------------------------------------------------------------------
    def _require_trainable(self) -> None:
        if self.optimizer is None:
            raise RuntimeError("a frozen reward model is not checkpointed (its folder is its state)")

    def save_checkpoint(self, directory: str | os.PathLike) -> None:
        """Collective: sharded model + optimizer (DCP) and per-rank RNG/counters."""
        self._require_trainable()
        super().save_checkpoint(directory)

    def load_checkpoint(self, directory: str | os.PathLike) -> None:
        """Collective: restore what :meth:`save_checkpoint` wrote (the world size may differ)."""
        self._require_trainable()
        super().load_checkpoint(directory)
