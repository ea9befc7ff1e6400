"""Bare vLLM: ``LLM.generate`` alone on the workload's prompts and sampling settings.

    VLLM_ENABLE_V1_MULTIPROCESSING=0 python scripts/bench/bare_vllm.py WORKLOAD_JSON OUT_JSON

One engine in this process (no Ray, no trainer), built with vLLM's defaults except what the CPU needs
(float32, eager, a 1 GiB KV cache, the same context length as grpo_dist's engine). Every step's
prompts are generated once per variant:

- ``plain``: ``SamplingParams(n, temperature, top_p, top_k, max_tokens)``: the baseline;
- ``as_grpo_dist``: the requests grpo_dist's engine sends for the same step: no detokenisation and
  grpo_dist's own seed for every prompt (``grpo_dist.rollout.base.rollout_step_seed``; the sampled
  tokens' log-probs only with ``actor_rollout_ref.rollout.calculate_log_probs=true``, which the
  benchmark leaves off). With the same prompts and seeds it samples the same responses as grpo_dist's
  rollout (up to the policy's drift under the benchmark's learning rate of 1e-6), so the two do the
  same decoding work: the rollout target is measured against this variant. Its response lengths
  (prompt-major, as grpo_dist's rows) are what the bare torch loop of the same repetition trains on.

Step 0 .. warmup_steps-1 are warm-up (the first seeded request is slower).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import is_bf16, load_prompt_dataset, subprocess_main  # noqa: E402


def run(w: dict) -> dict:
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from grpo_dist.rollout.base import rollout_step_seed

    _, ds = load_prompt_dataset(w)
    steps = [[ds[i]["prompt_ids"] for i in idx] for idx in w["step_prompts"]]
    t0 = time.perf_counter()
    kwargs = dict(model=w["model_dir"], dtype="bfloat16" if is_bf16(w) else "float32", max_model_len=w["max_prompt_length"] + w["response_length"],
                  enforce_eager=True, seed=0, kv_cache_memory_bytes=1 << 30)
    if not torch.cuda.is_available():
        # the CPU backend cannot rewind a seeded CPU generator for a prompt prefilled in chunks
        kwargs["enable_chunked_prefill"] = False
    llm = LLM(**kwargs)
    start_s = time.perf_counter() - t0
    base = dict(n=w["n"], temperature=w["temperature"], top_p=w["top_p"], top_k=max(w["top_k"], 0),
                max_tokens=w["response_length"])
    out: dict = {"engine_start_s": start_s, "threads": torch.get_num_threads()}
    for variant in ("plain", "as_grpo_dist"):
        rows = []
        for k, prompt_ids in enumerate(steps):
            prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in prompt_ids]
            if variant == "plain":
                params = SamplingParams(**base)
            else:
                seed = rollout_step_seed(w.get("rollout_seed", 0), k, len(prompts) * w["n"])
                params = [SamplingParams(**base, detokenize=False, seed=seed + i * w["n"])
                          for i in range(len(prompts))]
            t = time.perf_counter()
            res = llm.generate(prompts, params, use_tqdm=False)
            dt = time.perf_counter() - t
            lengths = [len(c.token_ids) for r in res for c in sorted(r.outputs, key=lambda c: c.index)]
            rows.append({"step": k + 1, "seconds": dt, "gen_tokens": sum(lengths), "warmup": k < w["warmup_steps"],
                         "lengths": lengths})
        out[variant] = rows
    return out


if __name__ == "__main__":
    subprocess_main(run)
