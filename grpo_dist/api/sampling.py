"""Sampling: ``G`` completions of every prompt from the policy, as a :class:`Rollout` in verl's
layout (Hugging Face ``generate`` with its KV cache, or token by token for a plain module).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from grpo_dist.api.models import logits_of
from grpo_dist.api.prompts import prompt_mask


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


@dataclass(frozen=True)
class Sampler:
    """Pure sampling at ``temperature`` from ``model`` (on ``device``): a completion ends after one of
    ``eos_token_ids`` or at ``max_new_tokens``; the columns after its end hold :meth:`pad_fill`."""

    model: nn.Module
    is_hf: bool
    device: torch.device
    temperature: float
    max_new_tokens: int
    pad_token_id: int | None
    eos_token_ids: list[int]

    def pad_fill(self) -> int:
        """The id after a completion's end: the pad id, else the first EOS id, else 0."""
        if self.pad_token_id is not None:
            return self.pad_token_id
        return self.eos_token_ids[0] if self.eos_token_ids else 0

    @torch.no_grad()
    def rollout(self, ids_NP: torch.Tensor, group_size: int, seed: int) -> Rollout:
        """``group_size`` completions of each of the (checked) prompts ``ids_NP`` [N, P], sampled with
        ``seed``. The model is left in eval mode."""
        G = group_size
        ids_BP = ids_NP.repeat_interleave(G, dim=0).to(self.device)
        prompt_mask_BP = prompt_mask(ids_BP, self.pad_token_id)
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
        pad = self.pad_fill()
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
                pad_token_id=self.pad_fill(),
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
            logits_BV = logits_of(self.model(ids))[:, -1, :].float() / self.temperature
            next_B = torch.multinomial(torch.softmax(logits_BV, dim=-1), 1, generator=gen).squeeze(-1)
            next_B = torch.where(finished_B, torch.full_like(next_B, self.pad_fill()), next_B)
            new.append(next_B)
            ids = torch.cat([ids, next_B.unsqueeze(-1)], dim=1)
            if eos.numel():
                finished_B |= torch.isin(next_B, eos)
                if bool(finished_B.all()):
                    break
        return torch.stack(new, dim=1)
