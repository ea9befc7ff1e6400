"""What hashing every checkpoint file costs: a SmolLM2-135M-sized training state saved by grpo_dist's own
save code with the files hashed as they are written, and without; then the full verification a resume does.

The model is SmolLM2-135M-Instruct's architecture (LlamaForCausalLM, 134.5 M parameters, tied embeddings)
built from its config with random weights (the cost does not depend on the values), float32, with AdamW's
two moments after one step: 0.54 GB of weights + 1.08 GB of optimizer state, one rank (one DCP shard).

    PYTHONPATH=$PWD python scripts/bench/checkpoint_digest.py [--dir /tmp/ckpt_bench] [--repeat 3]

Wall time and this process's CPU time (user + system, all threads) are both reported: on a shared
machine the CPU time is the steadier measure of what hashing adds. Each save goes to a fresh folder;
the page cache is not dropped (a resume usually reads a checkpoint that
an earlier run wrote on the same machine, or from a network file system, which this does not model).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import time
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from grpo_dist.trainer import checkpoint
from grpo_dist.training import checkpoint_io
from grpo_dist.utils import file_digest

warnings.filterwarnings("ignore", message="torch.distributed is disabled")


def smollm2_shaped():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                      tie_word_embeddings=True, rms_norm_eps=1e-5, rope_theta=100000.0)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).float()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    return model, opt


_HASHED = (checkpoint_io._dcp_save, checkpoint_io._torch_save)
_DIGEST_OF = file_digest.digest_of
MODES = {
    "no hash": "the writers' plain DCP / torch.save; the manifest records sizes only",
    "read back": "the writers' plain DCP / torch.save; the manifest hashes every file by reading it back",
    "as written": "grpo_dist's writers hash while writing; the manifest takes their records",
}


def set_mode(mode: str) -> None:
    if mode == "as written":
        checkpoint_io._dcp_save, checkpoint_io._torch_save = _HASHED
    else:
        checkpoint_io._dcp_save = lambda state, directory, digests: dcp.save(state, checkpoint_id=str(directory))
        checkpoint_io._torch_save = lambda obj, path, digests: torch.save(obj, path)
    file_digest.digest_of = (lambda path: "-") if mode == "no hash" else _DIGEST_OF


def one_save(root: Path, step: int, model, opt) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of writing the shards and publishing (manifest + rename)."""
    t0, c0 = time.perf_counter(), time.process_time()
    tmp = checkpoint.tmp_dir(root, step)
    checkpoint_io.save_train_state(tmp / "actor", model, opt, None, {"update_count": step})
    checkpoint.publish(root, tmp, step, {"global_step": step}, None)
    return time.perf_counter() - t0, time.process_time() - c0


def timed(fn) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def show(label: str, runs: list[tuple[float, float]]) -> None:
    w, c = statistics.median(x for x, _ in runs), statistics.median(y for _, y in runs)
    print(f"{label}: wall {w:.2f} s, CPU {c:.2f} s (median of {len(runs)}; wall "
          + ", ".join(f"{x:.2f}" for x, _ in runs) + "; CPU " + ", ".join(f"{y:.2f}" for _, y in runs) + ")")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/ckpt_digest_bench")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    root = Path(a.dir)
    shutil.rmtree(root, ignore_errors=True)
    model, opt = smollm2_shaped()
    n = sum(p.numel() for p in model.parameters())
    print(f"parameters: {n / 1e6:.1f} M; torch threads {torch.get_num_threads()}; cpus {os.cpu_count()}")

    buf = os.urandom(256 * 2**20)
    for name in ("sha256", "blake2b"):
        _, c = timed(lambda: hashlib.new(name, buf).hexdigest())
        print(f"{name}: {len(buf) / c / 1e9:.2f} GB per CPU second")

    rows: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    step = 0
    for _ in range(a.repeat):
        for mode in MODES:
            set_mode(mode)
            step += 1
            rows[mode].append(one_save(root, step, model, opt))
            ckpt = root / f"global_step_{step}"
            size = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
            shutil.rmtree(ckpt)
    set_mode("as written")
    for mode, r in rows.items():
        show(f"save, {mode:10s} ({MODES[mode]})", r)
    print(f"checkpoint size: {size / 1e9:.2f} GB")

    step += 1
    one_save(root, step, model, opt)
    ckpt = root / f"global_step_{step}"
    for label, checksums in (("verify, sizes only", False), ("verify, every file hashed", True)):
        show(label, [timed(lambda: checkpoint.verify(ckpt, checksums=checksums)) for _ in range(a.repeat)])
    assert checkpoint.verify(ckpt) is None
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
