#!/usr/bin/env bash
# Submit a grpo_dist run to Slurm: sbatch scripts/slurm/grpo_dist.sbatch with the usual flags.
#
#   bash scripts/slurm/submit.sh --nodes 2 --gpus-per-node 8 --time 12:00:00 --partition gpu -- \
#       actor_rollout_ref.model.path=/shared/models/Qwen2.5-0.5B-Instruct \
#       trainer.default_local_dir=/shared/runs/grpo_qwen
#
# Flags (each also as --flag=value):
#   --nodes N            nodes (default 2)                       [GRPO_DIST_NODES]
#   --gpus-per-node G    GPUs per node (default 8)               [GRPO_DIST_GPUS_PER_NODE]
#   --cpus-per-node C    CPUs per node (default: all, --exclusive)
#   --time T             time limit, e.g. 12:00:00 (default 04:00:00)  [GRPO_DIST_TIME]
#   --partition P        partition (default: the cluster's)      [GRPO_DIST_PARTITION]
#   --account A          account (default: yours)                [GRPO_DIST_ACCOUNT]
#   --job-name NAME      job name (default grpo_dist)
#   --shared             do not ask for whole nodes (default: --exclusive --mem=0)
#   --sbatch-arg ARG     one more sbatch argument, e.g. --sbatch-arg=--qos=high (repeatable)
#   -h, --help           this text
# Everything else is a key=value override for python -m grpo_dist.main; what follows -- is
# handed to it unchecked (e.g. -- --cfg job).
# The settings of grpo_dist.sbatch (GRPO_DIST_CONTAINER_IMAGE, GRPO_DIST_IFNAME, ...) are read from
# the environment, which sbatch passes to the job. GRPO_DIST_DRY_RUN=1 prints the sbatch command
# instead of running it.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

die() {
  printf 'submit.sh: error: %s\n' "$*" >&2
  exit 2
}
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }

nodes=${GRPO_DIST_NODES:-2}
gpus=${GRPO_DIST_GPUS_PER_NODE:-8}
time_limit=${GRPO_DIST_TIME:-04:00:00}
partition=${GRPO_DIST_PARTITION:-}
account=${GRPO_DIST_ACCOUNT:-}
cpus=""
job_name=grpo_dist
exclusive=1
extra=()
overrides=()
passthrough=() # after --: handed over unchecked (e.g. --cfg job)

while [ $# -gt 0 ]; do
  arg=$1
  case "$arg" in
    --) shift; passthrough=("$@"); break ;;
    -h | --help) usage; exit 0 ;;
    --shared) exclusive=0; shift; continue ;;
    --nodes | --gpus-per-node | --cpus-per-node | --time | --partition | --account | --job-name | --sbatch-arg)
      [ $# -ge 2 ] || die "$arg needs a value"
      name=$arg value=$2
      shift 2 ;;
    --*=*) name=${arg%%=*} value=${arg#*=}; shift ;;
    -*) die "unknown flag $arg (see --help); overrides are key=value" ;;
    *) overrides+=("$arg"); shift; continue ;;
  esac
  case "$name" in
    --nodes) nodes=$value ;;
    --gpus-per-node) gpus=$value ;;
    --cpus-per-node) cpus=$value ;;
    --time) time_limit=$value ;;
    --partition) partition=$value ;;
    --account) account=$value ;;
    --job-name) job_name=$value ;;
    --sbatch-arg) extra+=("$value") ;;
    *) die "unknown flag $name (see --help)" ;;
  esac
done

[[ $nodes =~ ^[1-9][0-9]*$ ]] || die "--nodes $nodes is not a positive number"
[[ $gpus =~ ^[1-9][0-9]*$ ]] || die "--gpus-per-node $gpus is not a positive number"
if [ -n "$cpus" ] && ! [[ $cpus =~ ^[1-9][0-9]*$ ]]; then die "--cpus-per-node $cpus is not a positive number"; fi
for o in "${overrides[@]}"; do
  [[ $o == *=* ]] || die "'$o' is not an override: write key=value (e.g. data.train_batch_size=64)"
done
overrides+=("${passthrough[@]}")

log_dir=${GRPO_DIST_SLURM_OUT:-$root/logs}
cmd=(sbatch "--job-name=$job_name" "--nodes=$nodes" --ntasks-per-node=1 "--gpus-per-node=$gpus"
  "--time=$time_limit" "--output=$log_dir/%x-%j.out")
if [ -n "$partition" ]; then cmd+=("--partition=$partition"); fi
if [ -n "$account" ]; then cmd+=("--account=$account"); fi
if [ "$exclusive" = 1 ]; then cmd+=(--exclusive --mem=0); fi
if [ -n "$cpus" ]; then cmd+=("--cpus-per-task=$cpus"); fi
cmd+=("${extra[@]}" "$here/grpo_dist.sbatch" "${overrides[@]}")

# Read by grpo_dist.sbatch in the job (sbatch exports this environment; the script itself is run
# from a spool copy there, so it cannot find the checkout by its own path).
export GRPO_DIST_ROOT=${GRPO_DIST_ROOT:-$root}
export GRPO_DIST_GPUS_PER_NODE=$gpus

if [ "${GRPO_DIST_DRY_RUN:-0}" = 1 ]; then
  line=""
  for a in "${cmd[@]}"; do
    if [[ $a =~ ^[A-Za-z0-9_./:=,+@%^-]+$ ]]; then line+=" $a"; else line+=" '${a//\'/\'\\\'\'}'"; fi
  done
  echo "GRPO_DIST_ROOT=$GRPO_DIST_ROOT GRPO_DIST_GPUS_PER_NODE=$gpus"
  echo "${line# }"
  exit 0
fi
command -v sbatch >/dev/null 2>&1 || die "sbatch not found: run this on a Slurm login node (GRPO_DIST_DRY_RUN=1 prints the command)"
mkdir -p "$log_dir"
"${cmd[@]}"
echo "logs: $log_dir/$job_name-<job id>.out; Ray logs: $GRPO_DIST_ROOT/logs/slurm-<job id>/"
