"""Checkpoint I/O of an FSDP2-trained model: the training state (sharded), and the Hugging Face export.

For any trainable model (the policy, and later a value or reward model):

- :func:`save_train_state` / :func:`load_train_state`: model + optimizer shards with
  ``torch.distributed.checkpoint`` (DCP, under ``directory/dcp``; loadable on another world size),
  and per rank a small file ``directory/extra_rank{r}.pt`` with the LR scheduler's state, the RNG
  states and the caller's counters.
- ``trainable_only``: the model and optimizer shards of the trainable parameters alone (a LoRA
  policy's adapters: the frozen base is the model folder's and is not written), and
  :func:`write_adapter_layout` / :func:`read_adapter_layout`: ``directory/lora.json``, what such a
  checkpoint's adapters are (rank, alpha, adapted modules), checked before anything is loaded.
- :func:`export_hf`: a Hugging Face model directory (config, safetensors, generation config and a
  verbatim copy of the tokenizer files) that transformers and vLLM load; :func:`export_adapter`: a peft
  adapter folder (``adapter_config.json`` + ``adapter_model.safetensors`` + the tokenizer files).

Every file written here is hashed as it is written (:mod:`grpo_dist.utils.file_digest`): DCP's shards
and metadata through :class:`HashingWriter`, the per-rank files through a hashing stream; the Hugging
Face export, which safetensors writes itself, right after it is written. Each rank leaves the record of
its files in the folder, and the driver's manifest (grpo_dist/trainer/checkpoint.py) gathers them.

Nothing is unpickled with code: the per-rank files load with ``torch.load(weights_only=True)``, DCP's
metadata with an unpickler that allows only DCP's metadata types, and DCP's non-tensor entries with
``weights_only=True`` as well; anything else is refused with :class:`UnsafeCheckpointError`.

Everything here that touches a sharded model is COLLECTIVE: every rank of the mesh must call it, in
the same order, or the job hangs. ``directory`` must be on a file system every rank sees.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import pickle
import random
import re
import shutil
from collections.abc import Generator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint._traverse import set_element
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)
from torch.optim.lr_scheduler import LRScheduler

from grpo_dist.training.dtypes import to_dtype
from grpo_dist.training.errors import UnsafeCheckpointError
from grpo_dist.training.fsdp import full_state_dict
from grpo_dist.utils.file_digest import DIGESTS_PREFIX, Digests, HashingStream, hashing_open

__all__ = [
    "save_train_state",
    "load_train_state",
    "save_sharded",
    "load_sharded",
    "saved_parts",
    "ALL_PARTS",
    "save_model_sharded",
    "load_model_sharded",
    "rng_state",
    "set_rng_state",
    "TOKENIZER_FILES",
    "copy_tokenizer_files",
    "export_hf",
    "export_adapter",
    "LAYOUT_FILE",
    "write_adapter_layout",
    "read_adapter_layout",
]

_SCHEDULER_KEY, _RNG_KEY = "lr_scheduler", "rng"


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _extra_path(directory: Path, rank: int) -> Path:
    return directory / f"extra_rank{rank}.pt"


# --------------------------------------------------------------------------------------------------
# RNG
# --------------------------------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """This process's RNG states: torch (CPU), Python ``random``, numpy, and CUDA when available, as
    tensors and plain values only (so that they load with ``torch.load(weights_only=True)``)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": {"name": str(name), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`rng_state` returned (CUDA's only when both sides have CUDA)."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state(
        (n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --------------------------------------------------------------------------------------------------
# loading without running code from disk
# --------------------------------------------------------------------------------------------------
# what DCP's .metadata file may name (besides builtin containers): its metadata classes, the
# filesystem reader's storage record, torch dtypes and sizes, and paths
_DCP_METADATA_MODULES = ("torch.distributed.checkpoint.metadata",)
_DCP_METADATA_GLOBALS = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        allowed = (
            (module in _DCP_METADATA_MODULES and isinstance(getattr(importlib.import_module(module), name, None), type))
            or (module, name) in _DCP_METADATA_GLOBALS
            or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))
        )
        if not allowed:
            raise UnsafeCheckpointError(f"names {module}.{name}, which is not a checkpoint metadata type")
        return super().find_class(module, name)


def read_dcp_metadata(path: str | os.PathLike) -> Any:
    """DCP's ``.metadata`` file, unpickled with only DCP's metadata types allowed
    (:class:`UnsafeCheckpointError` naming the file and the refused name otherwise)."""
    try:
        with open(path, "rb") as f:
            return _MetadataUnpickler(f).load()
    except UnsafeCheckpointError as e:
        raise UnsafeCheckpointError(f"refusing to load {path}: it {e}") from None


def safe_torch_load(path: str | os.PathLike) -> Any:
    """``torch.load(path, weights_only=True)``: tensors and plain Python values only; anything else is
    refused with :class:`UnsafeCheckpointError` naming the file (never unpickled)."""
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UnsafeCheckpointError(
            f"refusing to load {path}: it holds Python objects other than tensors and plain values "
            f"({first}); checkpoint files are never unpickled with code"
        ) from None


class _SafeReader(dcp.FileSystemReader):
    """DCP's file reader with the metadata read by :func:`read_dcp_metadata`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        rank = kwargs.get("rank")
        metadata = read_dcp_metadata(self._get_metadata_path(rank))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _SafePlanner(DefaultLoadPlanner):
    """DCP's default load planner with non-tensor entries (optimizer hyper-parameters, step
    counters) read by ``torch.load(weights_only=True)`` instead of a full unpickle."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as e:
            raise UnsafeCheckpointError(
                f"refusing to load the entry {read_item.dest_index.fqn!r} of a checkpoint: it holds Python "
                f"objects other than tensors and plain values ({str(e).strip().splitlines()[0]})"
            ) from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def safe_dcp_load(state: dict[str, Any], checkpoint_dir: str | os.PathLike) -> None:
    """``dcp.load(state, checkpoint_dir)`` (collective, in place) with the metadata and every non-tensor
    entry read without running code (:class:`UnsafeCheckpointError` otherwise)."""
    try:
        dcp.load(state, storage_reader=_SafeReader(str(checkpoint_dir)), planner=_SafePlanner())
    except (Exception, CheckpointException) as e:  # DCP wraps failures in a CheckpointException (a BaseException)
        failures = getattr(e, "failures", None) or {}
        text = " ".join([str(e), *(str(f) for f in failures.values())])
        at = text.find("refusing to load")
        if at < 0:
            raise
        raise UnsafeCheckpointError(re.split(r"[;\n]", text[at:])[0].strip()) from None


# --------------------------------------------------------------------------------------------------
# writing with checksums
# --------------------------------------------------------------------------------------------------
class _HashingFileSystem(FileSystem):
    """DCP's local file system whose files opened for writing are hashed as written."""

    def __init__(self, digests: Digests) -> None:
        super().__init__()
        self.digests = digests

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[Any, None, None]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with HashingStream(open(path, mode), path, self.digests) as stream:
            yield stream

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        super().rename(path, new_path)
        self.digests.rename(path, new_path)  # DCP writes .metadata.tmp, then renames it


class HashingWriter(dcp.FileSystemWriter):
    """DCP's file writer (one file per rank, fsync'd) with every file it writes hashed as written:
    its shard files on every rank, and the ``.metadata`` file on the coordinator; ``digests`` receives
    their sizes and SHA-256s."""

    def __init__(self, path: str | os.PathLike, digests: Digests) -> None:
        super().__init__(path)
        self.fs = _HashingFileSystem(digests)
        self.path = self.fs.init_path(path)


def _dcp_save(state: dict[str, Any], directory: Path, digests: Digests) -> None:
    dcp.save(state, storage_writer=HashingWriter(directory, digests))


def _torch_save(obj: Any, path: Path, digests: Digests) -> None:
    with HashingStream(open(path, "wb"), path, digests) as f:
        torch.save(obj, f)


# --------------------------------------------------------------------------------------------------
# sharded model + optimizer
# --------------------------------------------------------------------------------------------------
ALL_PARTS = ("model", "optimizer", "extra")
"""What a training-state checkpoint can hold (verl's ``checkpoint.save_contents`` / ``load_contents``
without ``hf_model``): the model's shards, the optimizer's shards, and ``extra`` (the LR scheduler and
the RNG states)."""


def _options(trainable_only: bool) -> StateDictOptions:
    """DCP's state-dict options: the frozen parameters left out with ``trainable_only``; a state dict
    without them is loaded non-strictly (DCP itself refuses a checkpoint that lacks an asked-for key)."""
    return StateDictOptions(ignore_frozen_params=trainable_only, strict=not trainable_only)


def save_sharded(directory: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer,
                 parts: tuple[str, ...] = ("model", "optimizer"), digests: Digests | None = None,
                 *, trainable_only: bool = False) -> None:
    """Collective: write the ``parts`` (model and/or optimizer) shards with DCP under ``directory/dcp``,
    hashed as written into ``digests`` (stored in ``directory`` when none is given). ``trainable_only``:
    the parameters with ``requires_grad`` alone (the frozen ones are not written)."""
    directory = Path(directory)
    mine = digests is None
    digests = Digests() if digests is None else digests
    directory.mkdir(parents=True, exist_ok=True)
    options = _options(trainable_only)
    if "optimizer" in parts:
        model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
        state = {k: v for k, v in (("model", model_sd), ("optimizer", optim_sd)) if k in parts}
    else:
        state = {"model": get_model_state_dict(model, options=options)} if "model" in parts else {}
    if not state:
        return
    try:
        _dcp_save(state, directory / "dcp", digests)
    except CheckpointException as e:
        # DCP gathers every rank's failure into a CheckpointException, a BaseException that would end
        # the worker process instead of reaching the driver as an error: raise the first rank's own
        # exception (an OSError for a full disk or an unwritable folder) instead.
        raise _first_failure(e) from None
    if mine:
        digests.store(directory)


def _first_failure(e: CheckpointException) -> Exception:
    for rank in sorted(e.failures):
        exc = e.failures[rank][0]
        if isinstance(exc, Exception):
            return exc
    return RuntimeError(" ".join(str(e).split())[:500])


def saved_parts(directory: str | os.PathLike) -> set[str]:
    """Which of model / optimizer a checkpoint's DCP shards hold (read from DCP's metadata)."""
    meta = Path(directory) / "dcp" / ".metadata"
    if not meta.exists():
        return set()
    keys = read_dcp_metadata(meta).state_dict_metadata.keys()
    return {part for part in ("model", "optimizer") if any(k == part or k.startswith(part + ".") for k in keys)}


def load_sharded(directory: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer,
                 parts: tuple[str, ...] = ("model", "optimizer"), *, trainable_only: bool = False) -> None:
    """Collective: load the ``parts`` (model and/or optimizer) :func:`save_sharded` wrote into ``model``
    and ``optimizer`` (in place); what is not asked for keeps its current state. ``trainable_only``: as
    saved, the trainable parameters alone (the frozen ones keep what ``model`` holds).

    The mesh size may differ from the one that saved (DCP reshards). ``FileNotFoundError`` when
    ``directory/dcp`` is missing or lacks an asked-for part.
    """
    directory = Path(directory)
    if not (directory / "dcp").is_dir():
        raise FileNotFoundError(f"no sharded checkpoint at {directory / 'dcp'}")
    missing = [p for p in parts if p in ("model", "optimizer") and p not in saved_parts(directory)]
    if missing:
        raise FileNotFoundError(f"the checkpoint {directory} holds no {' or '.join(missing)} state (it was saved "
                                "without it: checkpoint.save_contents); leave it out of checkpoint.load_contents")
    options = _options(trainable_only)
    if "optimizer" in parts:
        # get_state_dict initialises the optimizer state (a zero-lr step) so DCP has tensors to load into.
        model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
        state = {k: v for k, v in (("model", model_sd), ("optimizer", optim_sd)) if k in parts}
    else:  # the optimizer is left exactly as it is (fresh on a resume)
        state = {"model": get_model_state_dict(model, options=options)} if "model" in parts else {}
    safe_dcp_load(state, directory / "dcp")
    if "model" in state and "optimizer" in state:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                       options=options)
    elif "model" in state:
        set_model_state_dict(model, state["model"], options=options)
    elif "optimizer" in state:
        set_optimizer_state_dict(model, optimizer, state["optimizer"], options=options)


def save_model_sharded(directory: str | os.PathLike, model: nn.Module) -> None:
    """Collective: write a model's shards (no optimizer: a frozen model whose weights change, such as a
    reference reset to the policy) with DCP under ``directory/dcp``; ends with a barrier."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    digests = Digests()
    _dcp_save({"model": get_model_state_dict(model)}, directory / "dcp", digests)
    digests.store(directory)
    if dist.is_initialized():
        dist.barrier()


def load_model_sharded(directory: str | os.PathLike, model: nn.Module) -> None:
    """Collective: load what :func:`save_model_sharded` wrote into ``model`` (in place; the mesh size
    may differ). ``FileNotFoundError`` when ``directory/dcp`` is missing."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    directory = Path(directory)
    if not (directory / "dcp").is_dir():
        raise FileNotFoundError(f"no sharded checkpoint at {directory / 'dcp'}")
    state = {"model": get_model_state_dict(model)}
    safe_dcp_load(state, directory / "dcp")
    set_model_state_dict(model, state["model"])


def save_train_state(
    directory: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler | None,
    extra: Mapping[str, Any],
    contents: tuple[str, ...] = ALL_PARTS,
    *,
    trainable_only: bool = False,
) -> None:
    """Collective: what is needed to continue training ``model`` where it is (``contents``: the parts
    of :data:`ALL_PARTS` to write; all of them for an exact continuation).

    Writes the model and/or optimizer shards (:func:`save_sharded`) and, per rank,
    ``extra_rank{r}.pt`` holding the small picklable objects of ``extra`` (counters) and, with
    ``"extra"`` in ``contents``, ``scheduler.state_dict()`` (when a scheduler is given) and this rank's
    RNG states; ends with a barrier, so the folder is complete on return. ``extra`` may not use the
    names ``lr_scheduler`` or ``rng`` (``ValueError``). ``trainable_only``: the shards of the trainable
    parameters alone (:func:`save_sharded`).
    """
    clash = sorted({_SCHEDULER_KEY, _RNG_KEY} & set(extra))
    if clash:
        raise ValueError(f"save_train_state: extra may not use the reserved names {clash}")
    directory = Path(directory)
    digests = Digests()
    save_sharded(directory, model, optimizer, tuple(p for p in contents if p in ("model", "optimizer")), digests,
                 trainable_only=trainable_only)
    directory.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = dict(extra)
    if "extra" in contents:
        record[_RNG_KEY] = rng_state()
        if scheduler is not None:
            record[_SCHEDULER_KEY] = scheduler.state_dict()
    _torch_save(record, _extra_path(directory, _rank()), digests)
    digests.store(directory)
    if dist.is_initialized():
        dist.barrier()


def load_train_state(
    directory: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler | None,
    contents: tuple[str, ...] = ALL_PARTS,
    *,
    trainable_only: bool = False,
) -> dict[str, Any]:
    """Collective: restore the ``contents`` parts of what :func:`save_train_state` wrote; returns the
    ``extra`` it was given.

    Model and optimizer are loaded in place (the world size may differ from the one that saved); a
    part left out of ``contents`` keeps its fresh state. With ``"extra"``, the scheduler state and the
    RNG come from this rank's file; a rank that did not exist when the checkpoint was written reads
    rank 0's file and keeps its own RNG stream (another rank's would not be its own).
    ``FileNotFoundError`` when the folder lacks an asked-for part or rank 0's file. ``trainable_only``: as
    it was saved (:func:`load_sharded`).
    """
    directory = Path(directory)
    load_sharded(directory, model, optimizer, tuple(p for p in contents if p in ("model", "optimizer")),
                 trainable_only=trainable_only)
    mine = _extra_path(directory, _rank())
    if mine.exists():
        record = safe_torch_load(mine)
    else:
        rank0 = _extra_path(directory, 0)
        if not rank0.exists():
            raise FileNotFoundError(f"no scheduler/RNG state in {directory} (expected {rank0.name})")
        record = safe_torch_load(rank0)
        record.pop(_RNG_KEY, None)
    if "extra" in contents:
        if scheduler is not None:
            if _SCHEDULER_KEY not in record:
                raise FileNotFoundError(f"the checkpoint {directory} holds no LR-scheduler state (it was saved without "
                                        "extra: checkpoint.save_contents); leave extra out of checkpoint.load_contents")
            scheduler.load_state_dict(record[_SCHEDULER_KEY])
        if _RNG_KEY in record:
            set_rng_state(record[_RNG_KEY])
    return {k: v for k, v in record.items() if k not in (_SCHEDULER_KEY, _RNG_KEY)}


# --------------------------------------------------------------------------------------------------
# the adapters' layout of a trainable-only (LoRA) checkpoint
# --------------------------------------------------------------------------------------------------
LAYOUT_FILE = "lora.json"
"""In a checkpoint of a LoRA policy: what its adapters are (:func:`grpo_dist.training.lora.lora_layout`);
absent from a checkpoint of a fully fine-tuned model."""


def write_adapter_layout(directory: str | os.PathLike, layout: Mapping[str, Any]) -> None:
    """Collective: rank 0 writes ``layout`` as ``directory/lora.json`` (hashed as written, its record left in
    ``directory``); ends with a barrier."""
    if _rank() == 0:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        digests = Digests()
        with hashing_open(directory / LAYOUT_FILE, digests) as f:
            f.write(json.dumps(dict(layout), indent=1, sort_keys=True).encode())
        digests.store(directory)
    if dist.is_initialized():
        dist.barrier()


def read_adapter_layout(directory: str | os.PathLike) -> dict[str, Any] | None:
    """What :func:`write_adapter_layout` wrote in ``directory``; None when the checkpoint has no
    ``lora.json`` (a fully fine-tuned model's)."""
    path = Path(directory) / LAYOUT_FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text())


# --------------------------------------------------------------------------------------------------
# Hugging Face export
# --------------------------------------------------------------------------------------------------
TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)


def copy_tokenizer_files(source: str | os.PathLike, directory: str | os.PathLike) -> list[str]:
    """Copy the tokenizer files of a local model directory verbatim (no re-serialisation, so the
    copy is exactly what the rollout engine and the data pipeline were given). Returns their names."""
    source = Path(source)
    found = [name for name in TOKENIZER_FILES if (source / name).is_file()]
    if not found:
        raise FileNotFoundError(f"no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, ...) in {source}")
    for name in found:
        shutil.copyfile(source / name, Path(directory) / name)
    return found


def _own_storage(t: torch.Tensor) -> torch.Tensor:
    """``t``, copied when it is a view into a larger storage: gathering a parameter with fewer rows
    than ranks (a value head's [1, hidden] weight) leaves it in a padded buffer, which safetensors
    refuses to write."""
    if t.untyped_storage().nbytes() != t.numel() * t.element_size():
        return t.clone()
    return t


def export_hf(
    directory: str | os.PathLike,
    model: nn.Module,
    *,
    config: Any,
    tokenizer_path: str | os.PathLike | None = None,
    generation_config_path: str | os.PathLike | None = None,
    dtype: str | torch.dtype | None = None,
    max_shard_size: str = "5GB",
    state_dict: dict[str, torch.Tensor] | None = None,
) -> None:
    """Collective: write a Hugging Face model directory that transformers and vLLM can load.

    Every rank takes part in gathering the full state dict; rank 0 writes ``config.json``, the
    weights as safetensors (``model.safetensors``, or shards + index above ``max_shard_size``), a copy
    of ``generation_config.json`` from ``generation_config_path`` and a verbatim copy of the tokenizer
    files of the local directory ``tokenizer_path`` when given. ``dtype`` casts the weights (default: their training dtype).
    ``state_dict``: the full state dict to write, already gathered by the caller (rank 0's; e.g. the merged
    weights of a LoRA policy); None: ``model``'s.
    """
    from huggingface_hub import save_torch_state_dict

    sd = full_state_dict(model) if state_dict is None else state_dict
    if _rank() == 0:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        target = to_dtype(dtype) if dtype is not None else None
        if getattr(config, "tie_word_embeddings", False):
            # transformers re-ties lm_head to the input embedding on load
            sd = {k: v for k, v in sd.items() if k != "lm_head.weight"}
        sd = {k: _own_storage((v.to(target) if target is not None and v.is_floating_point() else v).contiguous())
              for k, v in sd.items()}
        floating = [v.dtype for v in sd.values() if v.is_floating_point()]
        config = type(config).from_dict(config.to_dict())  # a copy: the caller's config is left as is
        if floating:
            config.dtype = floating[0]
        config.save_pretrained(directory)
        save_torch_state_dict(sd, directory, max_shard_size=max_shard_size, metadata={"format": "pt"})
        if generation_config_path is not None and (Path(generation_config_path) / "generation_config.json").exists():
            from transformers import GenerationConfig

            GenerationConfig.from_pretrained(generation_config_path).save_pretrained(directory)
        if tokenizer_path is not None:
            copy_tokenizer_files(tokenizer_path, directory)
        # safetensors writes its files itself (from Rust, to a path), so they cannot be hashed as a
        # stream: they are hashed now, while their pages are still in the page cache
        digests = Digests()
        for p in sorted(q for q in directory.rglob("*") if q.is_file() and not q.name.startswith(DIGESTS_PREFIX)):
            digests.add_written(p)
        digests.store(directory)
    if dist.is_initialized():
        dist.barrier()


def export_adapter(
    directory: str | os.PathLike,
    model: nn.Module,
    *,
    config: Mapping[str, Any],
    saved_names: Mapping[str, str],
    tokenizer_path: str | os.PathLike | None = None,
) -> None:
    """Collective: write a peft adapter folder that ``PeftModel.from_pretrained(base, directory)`` loads.

    Every rank takes part in gathering the trainable parameters (only they: the frozen base is not
    gathered); rank 0 writes ``adapter_model.safetensors`` (the tensors under ``saved_names``, peft's saved
    name -> state-dict key), ``adapter_config.json`` (``config``) and a verbatim copy of the tokenizer files
    of ``tokenizer_path`` when given, every file hashed (its record left in ``directory``).
    """
    from grpo_dist.rollout.adapters import write_adapter

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True,
                                                              ignore_frozen_params=True))
    if _rank() == 0:
        directory = Path(directory)
        write_adapter(directory, ((name, _own_storage(sd[key])) for name, key in saved_names.items()), dict(config))
        if tokenizer_path is not None:
            copy_tokenizer_files(tokenizer_path, directory)
        digests = Digests()
        for p in sorted(q for q in directory.iterdir() if q.is_file() and not q.name.startswith(DIGESTS_PREFIX)):
            digests.add_written(p)
        digests.store(directory)
    if dist.is_initialized():
        dist.barrier()
