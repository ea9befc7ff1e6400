"""Hugging Face ``generate`` rollout engine: the fallback when vLLM is not available.

Same contract as the vLLM engine (see :mod:`grpo_dist.rollout.base`): prompts are batched and
left-padded, ``n`` samples per prompt come from ``num_return_sequences`` (prompt-major order), and
each token's log-prob is ``log_softmax`` of the *processed* scores it was sampled from (after
temperature, top-k, top-p; the raw logits for greedy decoding). Generation stops on any of the
model's ``generation_config.eos_token_id``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch

from grpo_dist.rollout.base import RolloutOutput, SamplingSettings

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFEngine:
    """A :class:`~grpo_dist.rollout.base.RolloutEngine` backed by ``transformers`` ``generate``.

    Args:
        model_path: a Hugging Face model directory.
        dtype: "float32", "bfloat16" or "float16".
        device: torch device of the model ("cpu", "cuda", "cuda:1", ...).
        seed: seed of the engine's sampling stream (used when ``SamplingSettings.seed`` is None).
            Sampling runs under ``torch.random.fork_rng``: the process's global RNG is untouched.
        trust_remote_code: let the model folder's own Python code run (its custom model classes),
            as ``actor_rollout_ref.model.trust_remote_code`` asks.
        config_overrides: fields set on the model's config before it is built (``model.override_config``,
            as the actor builds the policy).
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        dtype: str = "float32",
        device: str = "cpu",
        seed: int = 0,
        trust_remote_code: bool = False,
        config_overrides: dict | None = None,
    ) -> None:
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        from transformers import AutoConfig, AutoModelForCausalLM

        self.device = torch.device(device)
        extra = {}
        if config_overrides:
            config = AutoConfig.from_pretrained(str(model_path), trust_remote_code=trust_remote_code)
            for key, value in config_overrides.items():
                setattr(config, key, value)
            extra["config"] = config
        self.model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=_DTYPES[dtype],
                                                          trust_remote_code=trust_remote_code, **extra)
        self.model.to(self.device).eval()
        gen_cfg = self.model.generation_config
        eos = gen_cfg.eos_token_id if gen_cfg.eos_token_id is not None else self.model.config.eos_token_id
        if eos is None:
            raise ValueError(f"{model_path}: neither generation_config nor config sets eos_token_id")
        self.eos_token_ids: list[int] = [eos] if isinstance(eos, int) else list(eos)
        pad = gen_cfg.pad_token_id if gen_cfg.pad_token_id is not None else self.model.config.pad_token_id
        self.pad_token_id: int = self.eos_token_ids[0] if pad is None else int(pad)
        self._seeds = torch.Generator().manual_seed(seed)
        self._asleep = False
        self._adapter_config: dict | None = None  # the LoRA adapter's peft config once one is loaded

    accepts_partial_weights = True  # update_weights copies tensor by tensor

    @torch.no_grad()
    def generate(
        self, prompt_token_ids: list[list[int]], sampling: SamplingSettings
    ) -> RolloutOutput:
        """Sample ``sampling.n`` responses for each of the ``B`` prompts; prompt-major output."""
        if self._asleep:
            raise RuntimeError("HFEngine is asleep; call wake_up() first")
        for i, p in enumerate(prompt_token_ids):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
        if not prompt_token_ids:
            return RolloutOutput.empty(sampling)
        if sampling.ignore_eos:
            raise ValueError("the hf engine stops at the EOS token; generating past it (rollout.ignore_eos) needs "
                             "rollout.name=vllm")

        input_ids_BP, attention_mask_BP = _left_pad(prompt_token_ids, self.pad_token_id)
        input_ids_BP = input_ids_BP.to(self.device)
        attention_mask_BP = attention_mask_BP.to(self.device)
        kwargs: dict = dict(
            max_new_tokens=sampling.max_tokens,
            num_return_sequences=sampling.n,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            output_scores=sampling.logprobs,
            return_dict_in_generate=True,
        )
        if sampling.do_sample:
            kwargs.update(
                do_sample=True,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=max(sampling.top_k, 0),  # 0 disables (HF's own default would be 50)
            )
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)

        call_seed = (
            sampling.seed
            if sampling.seed is not None
            else int(torch.randint(0, 2**62, (1,), generator=self._seeds))
        )
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(call_seed)
            out = self.model.generate(
                input_ids=input_ids_BP, attention_mask=attention_mask_BP, **kwargs
            )

        prompt_len = input_ids_BP.shape[1]
        tokens_NT = out.sequences[:, prompt_len:]  # N = B*n, prompt-major (repeat_interleave)
        # scores: T tensors [N, V] of processed logits (-inf where top-k/top-p removed a token).
        logp_NT = None
        if sampling.logprobs:
            scores_NTV = torch.stack(out.scores, dim=1).float()
            logp_NT = (
                torch.log_softmax(scores_NTV, dim=-1).gather(-1, tokens_NT.unsqueeze(-1)).squeeze(-1)
            )
        eos_NT = torch.isin(tokens_NT, torch.tensor(self.eos_token_ids, device=tokens_NT.device))

        response_ids: list[list[int]] = []
        logprobs: list[list[float]] | None = [] if logp_NT is not None else None
        finished_by_eos: list[bool] = []
        for row in range(tokens_NT.shape[0]):
            hits = eos_NT[row].nonzero()
            ended = hits.numel() > 0
            length = int(hits[0]) + 1 if ended else tokens_NT.shape[1]
            response_ids.append(tokens_NT[row, :length].tolist())
            if logprobs is not None:
                logprobs.append(logp_NT[row, :length].tolist())
            finished_by_eos.append(ended)
        return RolloutOutput(
            response_ids=response_ids, logprobs=logprobs, finished_by_eos=finished_by_eos
        )

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy ``(name, tensor)`` pairs (the model's state-dict names) into the model in place.

        Names the model does not have raise ValueError; names left out keep their values.
        """
        targets = self.model.state_dict(keep_vars=True)
        pending = list(named_tensors)
        unknown = [name for name, _ in pending if name not in targets]
        if unknown:
            raise ValueError(
                f"update_weights got {len(unknown)} names the model does not have, e.g. "
                f"{unknown[:3]}; expected Hugging Face state-dict names such as "
                f"{list(targets)[:2]}"
            )
        for name, tensor in pending:
            target = targets[name]
            if target.shape != tensor.shape:
                raise ValueError(
                    f"update_weights: {name} has shape {tuple(tensor.shape)}, the model's is "
                    f"{tuple(target.shape)}"
                )
            target.data.copy_(tensor)

    @torch.no_grad()
    def load_adapter(self, named_tensors: Iterable[tuple[str, torch.Tensor]], config: dict) -> None:
        """Sample through this LoRA adapter from now on (:meth:`grpo_dist.rollout.vllm_engine.VLLMEngine.load_adapter`'s
        contract): the first call wraps the model in a peft model built from ``config``; every call loads the
        tensors (peft's saved names) into its adapter."""
        from peft import get_peft_config, get_peft_model, set_peft_model_state_dict

        from grpo_dist.rollout.adapters import check_adapter_names

        tensors = {name: t.to(self.device) for name, t in named_tensors}
        check_adapter_names(tensors)
        if self._adapter_config is None:
            self.model = get_peft_model(self.model, get_peft_config(dict(config))).eval()
            self._adapter_config = dict(config)
        elif dict(config) != self._adapter_config:
            raise ValueError("load_adapter got an adapter configured differently from the one loaded before "
                             "(rank, alpha or target modules changed during the run)")
        result = set_peft_model_state_dict(self.model, tensors)
        missing = [k for k in result.missing_keys if ".lora_" in k]
        if missing or result.unexpected_keys:
            raise ValueError(f"load_adapter: the adapter's tensors do not match the model's adapter (missing "
                             f"{missing[:2]}, unexpected {list(result.unexpected_keys)[:2]})")

    def sleep(self) -> None:
        """Give the memory ``generate`` cached (its KV cache) back to the device; the weights stay.

        Unlike vLLM, ``generate`` holds no memory between calls except the weights, and moving them
        to host memory and back every step cost about 0.4 s of each step for a 243 M-parameter model
        on an H100. ``generate`` refuses to run until ``wake_up``.
        """
        if not self._asleep:
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            self._asleep = True

    def wake_up(self) -> None:
        """Allow ``generate`` again after ``sleep``."""
        self._asleep = False

    def close(self) -> None:
        """Drop the model."""
        self.model = None  # type: ignore[assignment]
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, P]`` left-padded ids and attention mask (1 on prompt tokens) for ragged prompts."""
    width = max(len(p) for p in prompts)
    ids_BP = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask_BP = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids_BP[row, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask_BP[row, width - len(p) :] = 1
    return ids_BP, mask_BP
