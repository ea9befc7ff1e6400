#!/usr/bin/env bash
# GRPO on GSM8K with Qwen2.5-0.5B-Instruct on one node with 8 GPUs: the preset
# conf/recipes/gsm8k_qwen2.5_0.5b.yaml, run by python -m grpo_dist.main (no Ray cluster needed:
# the driver starts a local Ray instance). Not yet run on GPUs by this project.
#
#   bash scripts/recipes/gsm8k_qwen2.5_0.5b_1node.sh [override ...]
#
# Before: the data in ~/data/gsm8k (python scripts/data/prepare_gsm8k.py, see docs/recipes.md)
# and the model in the Hugging Face cache (huggingface-cli download Qwen/Qwen2.5-0.5B-Instruct)
# or in the folder MODEL_PATH names. Overrides (key=value, verl's keys) come last and win, e.g.
# trainer.logger=[console,file,wandb]. Checkpoints and metrics.jsonl go to
# ./checkpoints/grpo_dist_gsm8k/qwen2.5_0.5b_grpo (trainer.default_local_dir); rerunning resumes.
#
# Environment:
#   RECIPE             another preset of conf/recipes/ (default gsm8k_qwen2.5_0.5b), e.g. math_qwen2.5_1.5b
#   MODEL_PATH         the model's local folder (default: the preset's model, from the Hugging Face cache)
#   GRPO_DIST_PYTHON   python with grpo_dist installed (default: this checkout's .venv/bin/python)
#   GRPO_DIST_DRY_RUN  1: print the command instead of running it
# The command it runs:
#   python -m grpo_dist.main --config-name=recipes/gsm8k_qwen2.5_0.5b \
#       actor_rollout_ref.model.path=<local model folder> [override ...]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=scripts/recipes/common.sh
source "$root/scripts/recipes/common.sh"

if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi

recipe=${RECIPE:-gsm8k_qwen2.5_0.5b}
python=$(recipe_python "$root")
model=$(recipe_model "$python" "$recipe")

recipe_run "$python" -m grpo_dist.main "--config-name=recipes/$recipe" \
  "actor_rollout_ref.model.path=$model" "$@"
