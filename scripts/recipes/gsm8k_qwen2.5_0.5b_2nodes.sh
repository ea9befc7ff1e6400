#!/usr/bin/env bash
# GRPO on GSM8K with Qwen2.5-0.5B-Instruct on 2 nodes x 8 GPUs: the preset
# conf/recipes/gsm8k_qwen2.5_0.5b.yaml with trainer.nnodes=2 (16 data-parallel ranks; the same
# global batch sizes, so the same update as on one node). Not yet run on GPUs by this project.
#
#   bash scripts/recipes/gsm8k_qwen2.5_0.5b_2nodes.sh slurm [override ...]   (the default)
#   bash scripts/recipes/gsm8k_qwen2.5_0.5b_2nodes.sh ray [override ...]
#
# slurm: submits with scripts/slurm/submit.sh --nodes 2 --gpus-per-node 8, which starts a Ray
#        cluster over the allocation and runs the driver on its first node (docs/cluster.md).
#        Run it on a login node, from a checkout on shared storage.
# ray:   runs the driver here, on the head node of a Ray cluster of 2 nodes x 8 GPUs that you
#        started by hand (docs/cluster.md, "Several nodes, Ray by hand"); it attaches with
#        ray_kwargs.ray_init.address=auto (override it with HEAD_IP:6379 if needed).
#
# Every node must read the model and the data at the same paths, and trainer.default_local_dir
# (RUN_DIR) must be on storage every node writes to. Rerunning the same command resumes.
#
# Environment:
#   RECIPE             another preset of conf/recipes/ (default gsm8k_qwen2.5_0.5b)
#   MODEL_PATH         the model's local folder (default: the preset's model, from the Hugging Face
#                      cache of this machine; the other nodes need the same path)
#   RUN_DIR            trainer.default_local_dir (default: <checkout>/checkpoints/recipes/<RECIPE>_2nodes)
#   GRPO_DIST_TIME     Slurm time limit (default 24:00:00); GRPO_DIST_PARTITION, GRPO_DIST_ACCOUNT
#                      and the GRPO_DIST_* settings of scripts/slurm/grpo_dist.sbatch apply too
#   GRPO_DIST_PYTHON   python with grpo_dist installed (default: this checkout's .venv/bin/python)
#   GRPO_DIST_DRY_RUN  1: print the command (slurm: the sbatch command) instead of running it
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=scripts/recipes/common.sh
source "$root/scripts/recipes/common.sh"

mode=slurm
case "${1:-}" in
  -h | --help)
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
    exit 0 ;;
  slurm | ray) mode=$1; shift ;;
  *=* | "") ;;
  *) recipe_die "unknown mode '$1': slurm | ray (then key=value overrides)" ;;
esac

nodes=2
gpus_per_node=8
recipe=${RECIPE:-gsm8k_qwen2.5_0.5b}
run_dir=${RUN_DIR:-$root/checkpoints/recipes/${recipe}_2nodes}
python=$(recipe_python "$root")
model=$(recipe_model "$python" "$recipe")

preset_args=("--config-name=recipes/$recipe" "actor_rollout_ref.model.path=$model"
  "trainer.default_local_dir=$run_dir")

if [ "$mode" = slurm ]; then
  # submit.sh puts trainer.nnodes, trainer.n_gpus_per_node and the Ray address before these;
  # it prints the sbatch command itself when GRPO_DIST_DRY_RUN=1.
  exec bash "$root/scripts/slurm/submit.sh" --nodes "$nodes" --gpus-per-node "$gpus_per_node" \
    --time "${GRPO_DIST_TIME:-24:00:00}" --job-name "grpo_${recipe//./_}" -- "${preset_args[@]}" "$@"
fi

recipe_run "$python" -m grpo_dist.main "${preset_args[@]}" "trainer.nnodes=$nodes" \
  "trainer.n_gpus_per_node=$gpus_per_node" trainer.device=cuda ray_kwargs.ray_init.address=auto "$@"
