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

#: Shape of the GPU model: Qwen2-architecture, ~243 M parameters (16 layers of 1024, GQA 16/4 heads).
GPU_SHAPE = dict(hidden_size=1024, num_layers=16, num_heads=16, num_kv_heads=4, head_dim=64,
                 intermediate_size=4096, max_position_embeddings=1024)

#: Dense bf16 tensor-core peak (FLOP/s) of the GPUs the benchmark knows, from the vendors' data
#: sheets (SXM parts): the denominator of the model FLOPs utilisation (MFU).
GPU_PEAK_BF16 = {"H100": 989.4e12, "H200": 989.4e12, "H800": 989.4e12, "A100": 312e12, "A800": 312e12,
                 "L40S": 362e12, "B200": 2250e12}


def gpu_peak_flops(device_name: str) -> float | None:
    """Dense bf16 peak of ``torch.cuda.get_device_name()``'s GPU, or None when the benchmark does not know it."""
    for key, peak in GPU_PEAK_BF16.items():
        if key in device_name.upper():
            return peak
    return None


def workloads(quick: bool, device: str = "cpu", rollout: str = "vllm", precision: str = "auto") -> list[dict]:
    """The workloads of a run. Steps = warmup_steps (not measured) + measured steps.

    ``tiny``: the embedded task (builtin:tiny-reverse, builtin:reverse/train) with its natural
    response lengths (up to 24 tokens; the model stops on EOS after a few).
    ``large``: a random ~23 M-parameter model whose EOS rows of the output layer are zeroed and
    sampled with top_k=20, so EOS is never among the candidates: every response is exactly
    ``response_length`` = 256 tokens in every program (equal work, no length noise). 2 prompts x 4
    responses per step: a decode batch of 8, where generation is the largest phase of TRL's step.

    ``precision``: ``fp32`` (everything float32) or ``bf16`` (float32 master weights, bf16 compute in
    every program: grpo_dist's FSDP2 mixed precision, TRL's ``bf16=True``, autocast in the bare loop,
    bf16 rollout engines); ``auto``: bf16 on CUDA, fp32 on the CPU.
    """
    if precision == "auto":
        precision = "bf16" if device == "cuda" else "fp32"
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"precision must be auto, fp32 or bf16, not {precision!r}")
    common = dict(temperature=1.0, top_p=1.0, lr=1e-6, kl_coef=0.001, max_prompt_length=64, seed=1,
                  data_seed=42, gradient_checkpointing=False)
    tiny = dict(common, name="tiny", model="builtin:tiny-reverse",
                model_desc="builtin:tiny-reverse (embedded task, warmed-up Qwen2 128x4 layers)", batch_size=8, n=4, response_length=24,
                micro_batch=16, top_k=-1, warmup_steps=1, steps=2 if quick else 11)
    large = dict(common, name="large", model="large",
                 model_desc="random Qwen2 512 hidden x 8 layers (8 heads, 2 KV heads), EOS logits zeroed", batch_size=2, n=4, response_length=256,
                 micro_batch=4, top_k=20, warmup_steps=2, steps=5)
    if device == "cuda":
        # Same recipe as "large", sized for one GPU: 16 prompts x 8 responses of exactly 256 tokens,
        # bf16 compute over float32 master weights (grpo_dist's default on CUDA; TRL: bf16=True; the bare
        # loop: autocast), 4 micro-batches of 32 per update.
        gpu = dict(common, name="gpu", model="gpu", device="cuda", rollout=rollout,
                   model_desc="random Qwen2 1024 hidden x 16 layers (16 heads, 4 KV heads), EOS logits zeroed",
                   batch_size=16, n=8, response_length=256, micro_batch=32, top_k=20, warmup_steps=1,
                   steps=2 if quick else 4)
        gpu["precision"] = precision
        return [gpu]
    for w in (tiny, large):
        w.update(device="cpu", rollout=rollout, precision=precision)
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
    elif w["model"] == "gpu":
        w["model_dir"] = str(build_large_model(work_dir / "gpu_model", GPU_SHAPE))
    else:
        w["model_dir"] = tasks.resolve(w["model"])
    w["train_file"] = tasks.resolve("builtin:reverse/train")
    w["num_params"] = count_params(w["model_dir"])
    w["matmul_params"] = count_params(w["model_dir"], matmul_only=True)
    w["attn_width"] = attention_width(w["model_dir"])
    w["step_prompts"] = step_prompt_indices(w)
    return w


def build_large_model(out: Path, shape: dict | None = None) -> Path:
    """A random Qwen2 model of ``shape`` (default :data:`LARGE_SHAPE`) whose EOS rows of ``lm_head`` are zero.

    With the rows zero the EOS logits are exactly 0 while the other ~100 logits have std ~2; with
    top_k=20 (the 20th largest of them is ~ +1.7) EOS is never a candidate, so responses run to
    the length limit in vLLM and in Hugging Face generate alike.
    """
    from safetensors.torch import load_file, save_file

    from grpo_dist.utils.tiny_model import build_tiny_model

    shape = dict(shape or LARGE_SHAPE)
    marker = out / "bench_model.json"
    spec = json.dumps({"shape": shape, "eos_rows_zeroed": list(EOS_TOKEN_IDS), "version": 1}, sort_keys=True)
    if marker.exists() and marker.read_text() == spec:
        return out
    build_tiny_model(out, seed=0, **shape)
    files = sorted(out.glob("*.safetensors"))
    assert len(files) == 1, files
    state = load_file(str(files[0]))
    w = state["lm_head.weight"].clone()
    w[list(EOS_TOKEN_IDS)] = 0.0
    state["lm_head.weight"] = w
    save_file({k: v.contiguous() for k, v in state.items()}, str(files[0]), metadata={"format": "pt"})
    marker.write_text(spec)
    return out


def count_params(model_dir: str, matmul_only: bool = False) -> int:
    """Parameters in the model's safetensors files; ``matmul_only``: only the 2-D weights that multiply
    activations (every Linear, the output layer included; not the embedding table, norms or biases)."""
    from safetensors import safe_open

    total = 0
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(f), "pt") as sf:
            for k in sf.keys():
                shape = sf.get_slice(k).get_shape()
                if matmul_only and (len(shape) != 2 or "embed_tokens" in k):
                    continue
                n = 1
                for d in shape:
                    n *= d
                total += n
    return total


def attention_width(model_dir: str) -> int:
    """layers x query heads x head_dim of a Hugging Face config: the attention term's factor in :func:`train_flops`."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return int(cfg["num_hidden_layers"] * cfg["num_attention_heads"] * head_dim)


def train_flops(matmul_params: int, attn_width: int, seq_lens) -> float:
    """Model FLOPs of one forward + backward over sequences of the given (unpadded) lengths.

    forward = 2 * matmul_params * S  (every weight: one multiply-add per token)
            + 2 * attn_width * S^2   (causal attention: Q K^T and A V each ~S^2/2 dot products of
                                      head_dim per head and layer, 2 FLOPs per multiply-add)
    backward = 2 x forward, so a training step is 3 x forward. Padding is not counted: this is the
    useful work (model FLOPs), as in the usual MFU definition.
    """
    fwd = sum(2.0 * matmul_params * s + 2.0 * attn_width * s * s for s in seq_lens)
    return 3.0 * fwd


def is_bf16(w: dict) -> bool:
    """Whether the workload computes in bf16 (``precision``; workloads of older results files have
    none: bf16 on CUDA, float32 on the CPU, as ``workloads(precision="auto")``)."""
    return w.get("precision", "bf16" if w.get("device") == "cuda" else "fp32") == "bf16"


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
    from grpo_dist.data.sampler import EpochSampler

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
