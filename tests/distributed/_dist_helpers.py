"""Helpers for the multi-process FSDP2 tests: a tiny model, fake batches, and a gloo process launcher.

Importable by the ranks' processes (the repository root is on the ``sys.path`` that multiprocessing
passes to them), unlike ``conftest.py``.
"""

from __future__ import annotations

import faulthandler
import os
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

VOCAB = 64


def build_tiny_model(directory: str | os.PathLike, *, seed: int = 0, tie_word_embeddings: bool = False) -> Path:
    """A 2-layer Qwen2 (vocab 64, hidden 64, head_dim 64) and a word-level tokenizer, saved to ``directory``
    (the output layer tied to the input embeddings with ``tie_word_embeddings``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    directory = Path(directory)
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=64,
        intermediate_size=128,
        tie_word_embeddings=tie_word_embeddings,
    )
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():  # non-zero biases, so a wrong (sharded / stale) copy cannot look right by accident
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.02)
    model.save_pretrained(directory)
    vocab = {"<pad>": 0, "<unk>": 1} | {f"t{i}": i for i in range(2, VOCAB)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>").save_pretrained(directory)
    return directory


def make_batch(
    seed: int,
    *,
    rows: int = 8,
    prompt_len: int = 6,
    response_len: int = 8,
    prompt_lengths: list[int] | None = None,
    response_lengths: list[int] | None = None,
    tool_tokens: bool = False,
) -> dict[str, torch.Tensor]:
    """A verl-layout batch: left-padded prompts, right-padded responses, advantages per row.

    Lengths are random (>= 1) unless given. Pad tokens are random ids (they must not matter). With
    ``tool_tokens``, rows as agent-loop trajectories: response tokens 2-3 of every response longer than 5 are
    a tool's (attended, ``response_mask`` 0).
    Keys: input_ids, attention_mask, position_ids, responses, response_mask, advantages.
    """
    g = torch.Generator().manual_seed(seed)
    P, R = prompt_len, response_len
    input_ids = torch.randint(0, VOCAB, (rows, P + R), generator=g)
    attention_mask = torch.zeros(rows, P + R, dtype=torch.long)
    response_mask = torch.zeros(rows, R, dtype=torch.float32)
    for i in range(rows):
        pl = prompt_lengths[i] if prompt_lengths else int(torch.randint(1, P + 1, (1,), generator=g))
        rl = response_lengths[i] if response_lengths else int(torch.randint(1, R + 1, (1,), generator=g))
        attention_mask[i, P - pl : P + rl] = 1
        response_mask[i, :rl] = 1
        if tool_tokens and rl > 5:
            response_mask[i, 2:4] = 0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    advantages = torch.randn(rows, 1, generator=g).expand(rows, R).contiguous()
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "responses": input_ids[:, P:].clone(),
        "response_mask": response_mask,
        "advantages": advantages,
    }


def noise(seed: int, shape: tuple[int, ...], scale: float) -> torch.Tensor:
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def rows(data: dict[str, torch.Tensor], index: list[int]) -> dict[str, torch.Tensor]:
    idx = torch.as_tensor(index, dtype=torch.long)
    return {k: v[idx] for k, v in data.items()}


def _entry(rank: int, fn: Callable[..., Any], world_size: int, port: int, out_dir: str, args: tuple) -> None:
    # A rank that dies in native code (gloo, libtorch) leaves no Python traceback: its stderr (where
    # "terminate called ..." goes) and faulthandler's dump of every thread's Python stack land in a
    # file the launcher reads back.
    native = open(os.path.join(out_dir, f"stderr{rank}.txt"), "w")  # noqa: SIM115 - lives as long as the rank
    os.dup2(native.fileno(), 2)
    faulthandler.enable(file=native, all_threads=True)
    torch.set_num_threads(1)
    from grpo_dist.distributed.process_group import destroy, init_process_group

    try:
        init_process_group(
            backend="gloo", rank=rank, world_size=world_size, master_addr="127.0.0.1", master_port=port, timeout_s=120
        )
        result = fn(rank, world_size, *args)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    except BaseException:
        with open(os.path.join(out_dir, f"error{rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
        raise
    finally:
        destroy()


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 240) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` spawned processes joined by gloo.

    ``fn`` must be a module-level function; its return value (torch-saveable) comes back per rank.
    A rank that fails or a run past ``timeout_s`` fails the caller with the ranks' tracebacks and
    native output. A run whose rank was killed by a signal in native code, with no Python error on
    any rank, is run once more (with a warning carrying what the crash printed): such a crash is the
    process launcher's or gloo's, and a second one fails the test like any other failure.
    """
    try:
        return _run_ranks_once(fn, world_size, args, timeout_s)
    except _NativeCrash as crash:
        warnings.warn(f"{fn.__name__} crashed in native code; running it once more:\n{crash}", stacklevel=2)
    try:
        return _run_ranks_once(fn, world_size, args, timeout_s)
    except _NativeCrash as crash:
        raise RuntimeError(f"{fn.__name__} failed on {world_size} ranks twice:\n{crash}") from None


class _NativeCrash(RuntimeError):
    """A rank killed by a signal with no Python exception on any rank (the ranks' native output attached)."""


#: What the ranks' processes find imported: they are forked from multiprocessing's fork server, which imports these
#: once per test session (a fresh process per rank, as with ``spawn``, without its ~4 s of imports per rank).
PRELOAD = ["torch", "torch.distributed.fsdp", "torch.distributed.tensor", "torch.distributed.checkpoint.state_dict",
           "transformers", "transformers.models.qwen2.modeling_qwen2", "peft", "tests.distributed._dist_helpers"]


def _start_method() -> str:
    if "forkserver" not in mp.get_all_start_methods():
        return "spawn"
    mp.set_forkserver_preload(PRELOAD)  # (no effect once the server runs: it then has what it had)
    return "forkserver"


def _run_ranks_once(fn: Callable[..., Any], world_size: int, args: tuple, timeout_s: float) -> list[Any]:
    from grpo_dist.distributed.process_group import free_port

    with tempfile.TemporaryDirectory() as out_dir:
        ctx = mp.start_processes(
            _entry,
            args=(fn, world_size, free_port(), out_dir, args),
            nprocs=world_size,
            join=False,
            start_method=_start_method(),
        )
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{fn.__name__} on {world_size} ranks ran past {timeout_s} s")
        except BaseException as exc:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            python_errors = [_read(out_dir, f"error{r}.txt") for r in range(world_size)]
            native = [_read(out_dir, f"stderr{r}.txt") for r in range(world_size)]
            details = "\n".join(
                f"--- rank {r}: {kind} ---\n{text}"
                for r in range(world_size)
                for kind, text in (("python error", python_errors[r]), ("native output", native[r][-4000:]))
                if text
            )
            if isinstance(exc, mp.ProcessExitedException) and exc.signal_name and not any(python_errors):
                raise _NativeCrash(f"{exc}\n{details}") from exc
            raise RuntimeError(f"{fn.__name__} failed on {world_size} ranks:\n{details}") from exc
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(world_size)]


def _read(directory: str, name: str) -> str:
    path = Path(directory, name)
    return path.read_text(errors="replace").strip() if path.exists() else ""
