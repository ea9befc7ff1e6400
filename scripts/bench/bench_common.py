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


#: Shape of the real-vocabulary model: Qwen2-architecture layers, Qwen2.5's 151,936-token vocabulary.
REAL_VOCAB_SHAPE = dict(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=64,
                        intermediate_size=704, max_position_embeddings=512)
REAL_VOCAB_SIZE = 151_936

#: Every workload name, in run order; ``--workloads`` takes a comma-separated subset of these.
WORKLOAD_NAMES = ("tiny", "large", "gen_heavy", "real_vocab", "gpu")
CPU_WORKLOADS = ("tiny", "large", "gen_heavy", "real_vocab")

#: grpo_dist's variants of the real-vocabulary workload: how log-probs meet the 151,936-token output
#: layer. "plain": one chunk of all positions (the [M, V] logits and float32 temporaries at once);
#: "chunked": the default (a few positions at a time); "fused": from the hidden states, no logits.
REAL_VOCAB_VARIANTS = {
    "chunked": [],
    "plain": ["actor_rollout_ref.model.logprob_chunk_size=1000000000"],
    "fused": ["actor_rollout_ref.model.use_fused_kernels=true"],
}


#: The bare torch loop's processes (scripts/bench/bare_torch.py): the naive padded loop, grpo_dist's forward
#: packed (which also times it padded, alternating, on the same batches), and packed with the fused head.
BARE_VARIANTS = ("naive", "packed", "packed_fused")


def check_workload_names(names: list[str], device: str = "cpu") -> list[str]:
    """``names`` if each is a workload of ``device``; else ``ValueError`` naming the unknown ones and the
    valid names (a typo must not silently run nothing)."""
    valid = ("gpu",) if device == "cuda" else CPU_WORKLOADS
    bad = [n for n in names if n not in valid]
    if bad or not names:
        raise ValueError(f"unknown workload(s) {bad or names!r} for device {device}; valid: {', '.join(valid)}")
    return names


def workloads(quick: bool, device: str = "cpu", rollout: str = "vllm", precision: str = "auto",
              names: list[str] | None = None) -> list[dict]:
    """The workloads of a run. Steps = warmup_steps (not measured) + measured steps.

    ``tiny``: the embedded task (builtin:tiny-reverse, builtin:reverse/train) with its natural
    response lengths (up to 24 tokens; the model stops on EOS after a few).
    ``large``: a random ~23 M-parameter model whose EOS rows of the output layer are zeroed and
    sampled with top_k=20, so EOS is never among the candidates: every response is exactly
    ``response_length`` = 256 tokens in every program (equal work, no length noise). 2 prompts x 4
    responses per step: a decode batch of 8, where generation is the largest phase of TRL's step.
    ``gen_heavy``: generation-heavy, as a new user's first run: the large model's shape with an EOS
    bias (:func:`build_bench_model`: every sampled token is EOS with probability 1/64, so lengths are
    geometric with mean ~56, capped at 128; the same distribution in every program), 8 prompts x 8
    responses of up to 128 tokens, full-vocabulary sampling, KL loss on, micro-batches of 16.
    ``real_vocab``: a random model with Qwen2.5's 151,936-token vocabulary (4 layers of 256: the output
    layer is most of the work and memory; sampling stays on the tokenizer's ids), the same EOS bias,
    4 prompts x 4 responses of up to 128 tokens, micro-batches of 8; grpo_dist runs in three variants
    of its log-prob computation (:data:`REAL_VOCAB_VARIANTS`).

    Quick mode: the same workloads with 2 steps (1 measured); without ``names`` only ``tiny``.

    ``precision``: ``fp32`` (everything float32) or ``bf16`` (float32 master weights, bf16 compute in
    every program: grpo_dist's FSDP2 mixed precision, TRL's ``bf16=True``, autocast in the bare loop,
    bf16 rollout engines); ``auto``: bf16 on CUDA, fp32 on the CPU. ``names``: the workloads to return
    (:func:`check_workload_names`); None: the default set of the mode.
    """
    if precision == "auto":
        precision = "bf16" if device == "cuda" else "fp32"
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"precision must be auto, fp32 or bf16, not {precision!r}")
    common = dict(temperature=1.0, top_p=1.0, lr=1e-6, kl_coef=0.001, max_prompt_length=64, seed=1,
                  data_seed=42, gradient_checkpointing=False)
    if device == "cuda":
        if names is not None:
            check_workload_names(names, device)
        # Same recipe as "large", sized for one GPU: 16 prompts x 8 responses of exactly 256 tokens,
        # bf16 compute over float32 master weights (grpo_dist's default on CUDA; TRL: bf16=True; the bare
        # loop: autocast), 4 micro-batches of 32 per update.
        gpu = dict(common, name="gpu", model="gpu", device="cuda", rollout=rollout,
                   model_desc="random Qwen2 1024 hidden x 16 layers (16 heads, 4 KV heads), EOS logits zeroed",
                   batch_size=16, n=8, response_length=256, micro_batch=32, top_k=20, warmup_steps=1,
                   steps=2 if quick else 4)
        gpu["precision"] = precision
        return [gpu]
    table = {
        "tiny": dict(common, name="tiny", model="builtin:tiny-reverse",
                     model_desc="builtin:tiny-reverse (embedded task, warmed-up Qwen2 128x4 layers)", batch_size=8, n=4,
                     response_length=24, micro_batch=16, top_k=-1, warmup_steps=1, steps=2 if quick else 11),
        "large": dict(common, name="large", model="large",
                      model_desc="random Qwen2 512 hidden x 8 layers (8 heads, 2 KV heads), EOS logits zeroed",
                      batch_size=2, n=4, response_length=256, micro_batch=4, top_k=20, warmup_steps=2,
                      steps=3 if quick else 5),
        "gen_heavy": dict(common, name="gen_heavy", model="gen_heavy", mean_response=64,
                          model_desc="random Qwen2 512 hidden x 8 layers (8 heads, 2 KV heads), EOS with p = 1/64 per token",
                          batch_size=8, n=8, response_length=128, micro_batch=16, top_k=-1, warmup_steps=1,
                          steps=2 if quick else 4, bare_variants=list(BARE_VARIANTS)),
        "real_vocab": dict(common, name="real_vocab", model="real_vocab", mean_response=64,
                           model_desc="random Qwen2 256 hidden x 4 layers, 151,936-token vocabulary, EOS with p = 1/64",
                           batch_size=4, n=4, response_length=128, micro_batch=8, top_k=-1, warmup_steps=1,
                           steps=2 if quick else 4, grpo_variants=list(REAL_VOCAB_VARIANTS),
                           bare_variants=list(BARE_VARIANTS)),
    }
    if names is None:
        names = ["tiny"] if quick else ["tiny", "large"]
    check_workload_names(names, device)
    out = []
    for name in names:
        w = dict(table[name], device="cpu", rollout=rollout, precision=precision)
        out.append(w)
    return out


def response_lengths(w: dict, step: int, rows: int) -> list[int]:
    """Per-row response lengths the bare torch loop trains on in ``step``: the lengths grpo_dist sampled
    when the workload carries them (``step_response_lengths``: the bare vLLM run's, sent grpo_dist's
    seeds, so the loop trains on grpo_dist's exact rows); else, for a workload with an EOS bias, draws
    from its length distribution (each token EOS with probability 1 / mean_response, capped at
    response_length; seeded by the step, the same in every run); else every row ``response_tokens``
    (the mean grpo_dist generated) or ``response_length``."""
    import random

    given = w.get("step_response_lengths")
    if given and step < len(given) and len(given[step]) == rows:
        return [max(1, min(int(n), w["response_length"])) for n in given[step]]
    if w.get("mean_response"):
        rng = random.Random(1000 + step)
        p, cap = 1.0 / w["mean_response"], w["response_length"]
        out = []
        for _ in range(rows):
            n = 1
            while n < cap and rng.random() >= p:
                n += 1
            out.append(n)
        return out
    return [int(w.get("response_tokens") or w["response_length"])] * rows


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
    elif w["model"] == "gen_heavy":
        w["model_dir"] = str(build_bench_model(work_dir / "gen_heavy_model", LARGE_SHAPE, mean_response=w["mean_response"]))
    elif w["model"] == "real_vocab":
        w["model_dir"] = str(build_bench_model(work_dir / "real_vocab_model", REAL_VOCAB_SHAPE, vocab_size=REAL_VOCAB_SIZE,
                                               mean_response=w["mean_response"]))
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


def build_bench_model(out: Path, shape: dict, *, vocab_size: int | None = None, mean_response: float | None = None) -> Path:
    """A random Qwen2 model of ``shape`` whose response lengths vary in a known way and whose sampling
    stays on the tokenizer's ids, in every program alike.

    The tokenizer is the tiny model's (``n`` ~ 100 tokens); ``vocab_size`` (e.g. Qwen2.5's 151,936) makes
    the model's embedding and output layer that large, so the output layer's work and memory are a real
    vocabulary's. A constant direction carries the control: dimension 0 of every embedding is ``C`` and no
    layer writes to it (rows 0 of every ``o_proj`` and ``down_proj`` are zero), so it dominates the final
    RMSNorm's input and comes out of it as ~sqrt(hidden) for every token. Output rows read it:

    - ids at or past ``n`` (not in the tokenizer): a logit of -60: never sampled;
    - EOS ids (1 and 3): a logit ``b`` with ``2 e^b / (2 e^b + n - 2) = 1 / mean_response``, the other
      rows' logits being ~0 (the other dimensions are ~1/C of it): each response token is EOS with
      probability ``1 / mean_response``, so lengths are geometric (capped by ``response_length``), the same
      distribution in vLLM, Hugging Face ``generate`` and TRL.
    """
    import math

    import torch
    from safetensors.torch import load_file, save_file

    from grpo_dist.utils.tiny_model import build_tiny_model

    marker = out / "bench_model.json"
    spec = json.dumps({"shape": shape, "vocab_size": vocab_size, "mean_response": mean_response, "version": 1},
                      sort_keys=True)
    if marker.exists() and marker.read_text() == spec:
        return out
    build_tiny_model(out, seed=0, **shape)
    files = sorted(out.glob("*.safetensors"))
    assert len(files) == 1, files
    state = load_file(str(files[0]))
    cfg = json.loads((out / "config.json").read_text())
    n, H = cfg["vocab_size"], cfg["hidden_size"]
    V = vocab_size or n
    g = torch.Generator().manual_seed(1)
    emb = torch.zeros(V, H)
    emb[:n] = state["model.embed_tokens.weight"]
    emb[n:] = 0.02 * torch.randn(V - n, H, generator=g)
    C = 50.0
    emb[:, 0] = C
    state["model.embed_tokens.weight"] = emb
    for k in list(state):
        if k.endswith("self_attn.o_proj.weight") or k.endswith("mlp.down_proj.weight"):
            w = state[k].clone()
            w[0] = 0.0
            state[k] = w
    head = torch.zeros(V, H)
    head[:n] = state["lm_head.weight"]
    head[:n, 0] = 0.0
    root_h = math.sqrt(H)
    head[n:, 0] = -60.0 / root_h
    if mean_response:
        b = math.log((n - 2) / (2 * (mean_response - 1)))
        for eos in EOS_TOKEN_IDS:
            head[eos] = 0.0
            head[eos, 0] = b / root_h
    state["lm_head.weight"] = head
    save_file({k: v.contiguous() for k, v in state.items()}, str(files[0]), metadata={"format": "pt"})
    cfg["vocab_size"] = V
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
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


def lora_alpha(w: dict) -> int:
    """The LoRA alpha of a workload with ``lora_rank`` (run_bench.py --lora-rank): twice the rank, in every program."""
    return 2 * w["lora_rank"]


def peft_lora_config(w: dict):
    """The peft ``LoraConfig`` TRL and the bare loop train with for a workload with ``lora_rank`` (grpo_dist gets the
    same through its keys: run_bench.grpo_overrides): every linear layer of the blocks, no dropout."""
    from peft import LoraConfig

    return LoraConfig(r=w["lora_rank"], lora_alpha=lora_alpha(w), lora_dropout=0.0, target_modules="all-linear",
                      task_type="CAUSAL_LM")


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
