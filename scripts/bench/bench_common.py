"""Shared pieces of the benchmark: the workloads, their model directories and the prompts of each step.

A workload is a plain dict (it crosses process boundaries as JSON): every program of the benchmark
(grpo_dist through ``python -m grpo_dist.main``, TRL's GRPOTrainer, bare vLLM, the bare torch loop)
reads the same dict, so they run the same model, the same prompts in the same order, the same
group size, response length, micro-batch size and sampling settings.

Nothing in this module imports torch at import time: the orchestrator (run_bench.py) stays light.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The EOS ids of ``grpo_dist.utils.tiny_model`` (``<|endoftext|>`` = 1, ``<|im_end|>`` = 3).
EOS_TOKEN_IDS = (1, 3)

#: Shape of the "large" model: Qwen2-architecture, ~22.7 M parameters, head_dim 64 (vLLM CPU).
LARGE_SHAPE = dict(hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=2, head_dim=64,
                   intermediate_size=1408, max_position_embeddings=512)


def workloads(quick: bool) -> list[dict]:
    """The workloads of a run. Steps = warmup_steps (not measured) + measured steps.

    ``tiny``: the embedded task (builtin:tiny-reverse, builtin:reverse/train) with its natural
    response lengths (up to 24 tokens; the model stops on EOS after a few).
    ``large``: a random ~23 M-parameter model whose EOS rows of the output layer are zeroed and
    sampled with top_k=20, so EOS is never among the candidates: every response is exactly
    ``response_length`` = 256 tokens in every program (equal work, no length noise). 2 prompts x 4
    responses per step: a decode batch of 8, where generation is the largest phase of TRL's step.
    """
    common = dict(temperature=1.0, top_p=1.0, lr=1e-6, kl_coef=0.001, max_prompt_length=64, seed=1,
                  data_seed=42, gradient_checkpointing=False)
    tiny = dict(common, name="tiny", model="builtin:tiny-reverse",
                model_desc="builtin:tiny-reverse (embedded task, warmed-up Qwen2 128x4 layers)", batch_size=8, n=4, response_length=24,
                micro_batch=16, top_k=-1, warmup_steps=1, steps=2 if quick else 11)
    large = dict(common, name="large", model="large",
                 model_desc="random Qwen2 512 hidden x 8 layers (8 heads, 2 KV heads), EOS logits zeroed", batch_size=2, n=4, response_length=256,
                 micro_batch=4, top_k=20, warmup_steps=1, steps=4)
    return [tiny] if quick else [tiny, large]


def cache_dir() -> Path:
    return Path(os.path.expanduser(os.environ.get("GRPO_DIST_CACHE", "~/.cache/grpo_dist")))


def prepare(workload: dict, work_dir: Path) -> dict:
    """Resolve the workload's model and data into real paths (building the model if needed).

    Adds ``model_dir``, ``train_file``, ``num_params``, ``step_prompts`` (the dataset row indices
    each step uses, in grpo_dist's order) and returns the completed dict.
    """
    from grpo_dist import tasks

    w = dict(workload)
    if w["model"] == "large":
        w["model_dir"] = str(build_large_model(work_dir / "large_model"))
    else:
        w["model_dir"] = tasks.resolve(w["model"])
    w["train_file"] = tasks.resolve("builtin:reverse/train")
    w["num_params"] = count_params(w["model_dir"])
    w["step_prompts"] = step_prompt_indices(w)
    return w


def build_large_model(out: Path) -> Path:
    """A random Qwen2 model of :data:`LARGE_SHAPE` whose EOS rows of ``lm_head`` are zero.

    With the rows zero the EOS logits are exactly 0 while the other ~100 logits have std ~2; with
    top_k=20 (the 20th largest of them is ~ +1.7) EOS is never a candidate, so responses run to
    the length limit in vLLM and in Hugging Face generate alike.
    """
    from safetensors.torch import load_file, save_file

    from grpo_dist.utils.tiny_model import build_tiny_model

    marker = out / "bench_model.json"
    spec = json.dumps({"shape": LARGE_SHAPE, "eos_rows_zeroed": list(EOS_TOKEN_IDS), "version": 1}, sort_keys=True)
    if marker.exists() and marker.read_text() == spec:
        return out
    build_tiny_model(out, seed=0, **LARGE_SHAPE)
    files = sorted(out.glob("*.safetensors"))
    assert len(files) == 1, files
    state = load_file(str(files[0]))
    w = state["lm_head.weight"].clone()
    w[list(EOS_TOKEN_IDS)] = 0.0
    state["lm_head.weight"] = w
    save_file({k: v.contiguous() for k, v in state.items()}, str(files[0]), metadata={"format": "pt"})
    marker.write_text(spec)
    return out


def count_params(model_dir: str) -> int:
    from safetensors import safe_open

    total = 0
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(f), "pt") as sf:
            for k in sf.keys():
                n = 1
                for d in sf.get_slice(k).get_shape():
                    n *= d
                total += n
    return total


def load_prompt_dataset(w: dict):
    """grpo_dist's own PromptDataset over the workload's train file (same tokenisation as the trainer)."""
    from transformers import AutoTokenizer

    from grpo_dist.data.dataset import PromptDataset

    tok = AutoTokenizer.from_pretrained(w["model_dir"])
    ds = PromptDataset.from_files([w["train_file"]], tok, prompt_key="prompt", max_prompt_length=w["max_prompt_length"],
                                  filter_overlong_prompts=False, truncation="error")
    return tok, ds


def step_prompt_indices(w: dict) -> list[list[int]]:
    """Row indices of each step's prompts, as grpo_dist's sampler draws them (data.seed, shuffle on)."""
    from grpo_dist.data.dataset import EpochSampler

    _, ds = load_prompt_dataset(w)
    sampler = EpochSampler(len(ds), w["batch_size"], seed=w["data_seed"], shuffle=True)
    return [next(sampler) for _ in range(w["steps"])]


def read_json(path: str | os.PathLike) -> dict:
    return json.loads(Path(path).read_text())


def write_json(path: str | os.PathLike, obj) -> None:
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True))
    os.replace(tmp, path)


def subprocess_main(fn) -> None:
    """``python prog.py WORKLOAD_JSON OUT_JSON``: run ``fn(workload) -> dict`` and write the result."""
    if len(sys.argv) != 3:
        raise SystemExit(f"usage: {sys.argv[0]} WORKLOAD_JSON OUT_JSON")
    w = read_json(sys.argv[1])
    write_json(sys.argv[2], fn(w))
