"""Bare Hugging Face ``generate``: the rollout baseline where grpo_dist rolls out with its "hf" engine.

    python scripts/bench/bare_hf.py WORKLOAD_JSON OUT_JSON

One model in this process (no Ray, no trainer), in the dtype grpo_dist's engine uses on the device
(bfloat16 on CUDA, float32 on CPU), ``model.generate`` on every step's prompts (left-padded, one batch,
``num_return_sequences = n``). Two variants, as for bare vLLM:

- ``plain``: sampling with the workload's temperature / top_p / top_k and ``max_new_tokens``;
- ``as_grpo_dist``: what grpo_dist's engine asks for on top of that: a dict output, seeded with
  grpo_dist's seed of the step (``grpo_dist.rollout.base.rollout_step_seed``), so that it samples
  grpo_dist's responses (the processed scores and their log-softmax only with
  ``actor_rollout_ref.rollout.calculate_log_probs=true``, which the benchmark leaves off). The rollout
  target is measured against this variant.

Step 0 .. warmup_steps-1 are warm-up.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import is_bf16, load_prompt_dataset, subprocess_main  # noqa: E402


def run(w: dict) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_dist.rollout.base import rollout_step_seed

    cuda = w.get("device") == "cuda"
    device = torch.device("cuda" if cuda else "cpu")
    tok, ds = load_prompt_dataset(w)
    steps = [[ds[i]["prompt_ids"] for i in idx] for idx in w["step_prompts"]]
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(w["model_dir"], dtype=torch.bfloat16 if is_bf16(w) else torch.float32)
    model.to(device).eval()
    start_s = time.perf_counter() - t0
    eos = model.generation_config.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos if isinstance(eos, int) else eos[0])

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    out: dict = {"engine_start_s": start_s, "threads": torch.get_num_threads()}
    for variant in ("plain", "as_grpo_dist"):
        rows = []
        for k, prompt_ids in enumerate(steps):
            width = max(len(p) for p in prompt_ids)
            ids = torch.full((len(prompt_ids), width), pad, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, p in enumerate(prompt_ids):
                ids[i, width - len(p):] = torch.tensor(p)
                mask[i, width - len(p):] = 1
            kwargs = dict(max_new_tokens=w["response_length"], num_return_sequences=w["n"], do_sample=True,
                          temperature=w["temperature"], top_p=w["top_p"], top_k=max(w["top_k"], 0),
                          eos_token_id=eos, pad_token_id=pad)
            if variant == "as_grpo_dist":
                kwargs.update(return_dict_in_generate=True)
                torch.manual_seed(rollout_step_seed(w.get("rollout_seed", 0), k, len(prompt_ids) * w["n"]))
            sync()
            t = time.perf_counter()
            with torch.no_grad():
                res = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), **kwargs)
                if variant == "as_grpo_dist":
                    seqs = res.sequences
                else:
                    seqs = res
                new = seqs[:, width:]
                ended = torch.isin(new, torch.tensor(eos if isinstance(eos, list) else [eos], device=new.device))
                first = torch.where(ended.any(1), ended.float().argmax(1) + 1, torch.full_like(ended[:, 0], new.shape[1], dtype=torch.long))
                ntok = int(first.sum())
            sync()
            dt = time.perf_counter() - t
            rows.append({"step": k + 1, "seconds": dt, "gen_tokens": ntok, "warmup": k < w["warmup_steps"]})
        out[variant] = rows
    return out


if __name__ == "__main__":
    subprocess_main(run)
