#!/usr/bin/env bash
# Submit a grpo_dist run to a running Ray cluster as a Ray job (ray job submit):
# the entrypoint, python -m grpo_dist.main, runs on the cluster's head node and attaches to it.
# First, here, `python -m grpo_dist.main --check=config` validates the configuration and prints the
# plan; nothing is submitted when it fails (the files it names are checked on the cluster, by the
# run itself, before any worker starts).
#
#   bash scripts/ray_submit.sh --address http://127.0.0.1:8265 --nnodes 2 --gpus-per-node 8 -- \
#       actor_rollout_ref.model.path=/shared/models/Qwen2.5-0.5B-Instruct \
#       trainer.default_local_dir=/shared/runs/grpo_qwen
#
# Flags (each also as --flag=value):
#   --address URL        the cluster's job server, its dashboard (default: RAY_ADDRESS when it is
#                        an http(s) URL, else http://127.0.0.1:8265, e.g. through
#                        `kubectl port-forward svc/<cluster>-head-svc 8265:8265`)
#   --nnodes N           adds trainer.nnodes=N before the overrides
#   --gpus-per-node G    adds trainer.n_gpus_per_node=G before the overrides
#   --working-dir DIR    code uploaded with the job (default: this checkout, without .venv, .git,
#                        checkpoints, outputs, logs); the job runs in it
#   --no-working-dir     upload nothing: use the grpo_dist installed in the cluster's image
#   --env NAME[=VALUE]   an environment variable for the job (repeatable; without =VALUE, the
#                        value here). Set by default when set here: NCCL_SOCKET_IFNAME,
#                        GLOO_SOCKET_IFNAME, NCCL_IB_HCA, NCCL_DEBUG, HF_HOME, HF_HUB_OFFLINE.
#                        Values are visible in the job's description on the cluster: pass
#                        secrets (WANDB_API_KEY, HF_TOKEN) through the cluster's own environment.
#   --python PY          python on the cluster (default: python)
#   --submission-id ID   name of the job (default: Ray picks one)
#   --no-wait            return after submitting (default: follow the logs until it ends;
#                        Ctrl-C stops following, not the job: `ray job stop ID` does)
#   --no-check           submit without checking the configuration here first
#   -h, --help           this text
# Everything else is a key=value override for python -m grpo_dist.main; what follows -- is
# handed to it unchecked (e.g. -- --cfg job).
# GRPO_DIST_DRY_RUN=1 prints the check and the ray job submit commands instead of running them.
# GRPO_DIST_CHECK_PYTHON: the python that runs the check here (default: .venv/bin/python of this
# checkout, else python3); without grpo_dist importable there, the check is skipped with a note.
# GRPO_DIST_RAY: the ray CLI here (default: .venv/bin/ray of this checkout, else ray).
# Ray token authentication: the cluster's token is read from RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH
# or ~/.ray/auth_token; RAY_AUTH_MODE=token is set when one is there (RAY_AUTH_MODE=disabled: never).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

die() {
  printf 'ray_submit.sh: error: %s\n' "$*" >&2
  exit 2
}
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }

address=""
if [[ ${RAY_ADDRESS:-} == http://* || ${RAY_ADDRESS:-} == https://* ]]; then address=$RAY_ADDRESS; fi
address=${address:-http://127.0.0.1:8265}
nnodes=""
gpus=""
working_dir=$root
python=python
submission_id=""
no_wait=0
no_check=0
env_names=(NCCL_SOCKET_IFNAME GLOO_SOCKET_IFNAME NCCL_IB_HCA NCCL_DEBUG HF_HOME HF_HUB_OFFLINE)
env_pairs=()
overrides=()
passthrough=() # after --: handed over unchecked (e.g. --cfg job)

while [ $# -gt 0 ]; do
  arg=$1
  case "$arg" in
    --) shift; passthrough=("$@"); break ;;
    -h | --help) usage; exit 0 ;;
    --no-working-dir) working_dir=""; shift; continue ;;
    --no-wait) no_wait=1; shift; continue ;;
    --no-check) no_check=1; shift; continue ;;
    --address | --nnodes | --gpus-per-node | --working-dir | --env | --python | --submission-id)
      [ $# -ge 2 ] || die "$arg needs a value"
      name=$arg value=$2
      shift 2 ;;
    --*=*) name=${arg%%=*} value=${arg#*=}; shift ;;
    -*) die "unknown flag $arg (see --help); overrides are key=value" ;;
    *) overrides+=("$arg"); shift; continue ;;
  esac
  case "$name" in
    --address) address=$value ;;
    --nnodes) nnodes=$value ;;
    --gpus-per-node) gpus=$value ;;
    --working-dir) working_dir=$value ;;
    --env)
      if [[ $value == *=* ]]; then env_pairs+=("$value"); else env_pairs+=("$value=${!value-}"); fi ;;
    --python) python=$value ;;
    --submission-id) submission_id=$value ;;
    *) die "unknown flag $name (see --help)" ;;
  esac
done

if [ -n "$nnodes" ] && ! [[ $nnodes =~ ^[1-9][0-9]*$ ]]; then die "--nnodes $nnodes is not a positive number"; fi
if [ -n "$gpus" ] && ! [[ $gpus =~ ^[1-9][0-9]*$ ]]; then die "--gpus-per-node $gpus is not a positive number"; fi
if [ -n "$working_dir" ] && [ ! -d "$working_dir" ]; then die "--working-dir $working_dir is not a folder"; fi
for o in "${overrides[@]}"; do
  [[ $o == *=* ]] || die "'$o' is not an override: write key=value (e.g. data.train_batch_size=64)"
done
overrides+=("${passthrough[@]}")

# Environment of the job: the defaults that are set here, then --env (which wins).
pairs=()
for name in "${env_names[@]}"; do
  if [ -n "${!name:-}" ]; then pairs+=("$name=${!name}"); fi
done
pairs+=("${env_pairs[@]}")
for p in "${pairs[@]}"; do
  key=${p%%=*}
  [[ $key =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || die "--env $p: '$key' is not a variable name"
  case "$key" in
    TOKENIZERS_PARALLELISM | RAY_DEDUP_LOGS)
      die "--env $key: grpo_dist sets $key itself (ray.init's runtime_env); Ray refuses a job that sets it too" ;;
  esac
done

# The runtime environment as JSON, built by a JSON encoder (values may hold any character).
json_py='import json, sys
wd, pairs = sys.argv[1], sys.argv[2:]
env = {}
for p in pairs:
    k, _, v = p.partition("=")
    env[k] = v
rt = {}
if wd:
    rt["working_dir"] = wd
    rt["excludes"] = [".git", ".venv", "checkpoints", "outputs", "logs", "runs", "__pycache__", "*.egg-info", ".pytest_cache"]
if env:
    rt["env_vars"] = env
print(json.dumps(rt, separators=(",", ":")))'
json_python=python3
if [ -x "$root/.venv/bin/python" ]; then json_python=$root/.venv/bin/python; fi
runtime_env=$("$json_python" -c "$json_py" "$working_dir" "${pairs[@]}") || die "could not write the runtime environment (needs python3)"

# Ray's CLI sends the cluster's token only in token mode: turn it on when a token is at hand.
if [ -z "${RAY_AUTH_MODE:-}" ] && { [ -n "${RAY_AUTH_TOKEN:-}" ] || [ -n "${RAY_AUTH_TOKEN_PATH:-}" ] || [ -f "$HOME/.ray/auth_token" ]; }; then
  export RAY_AUTH_MODE=token
fi

ray=${GRPO_DIST_RAY:-}
if [ -z "$ray" ]; then
  if [ -x "$root/.venv/bin/ray" ]; then ray=$root/.venv/bin/ray; else ray=ray; fi
fi

cmd=("$ray" job submit "--address=$address")
if [ "$runtime_env" != "{}" ]; then cmd+=("--runtime-env-json=$runtime_env"); fi
if [ -n "$submission_id" ]; then cmd+=("--submission-id=$submission_id"); fi
if [ "$no_wait" = 1 ]; then cmd+=(--no-wait); fi
cmd+=(-- "$python" -m grpo_dist.main)
if [ -n "$nnodes" ]; then cmd+=("trainer.nnodes=$nnodes"); fi
if [ -n "$gpus" ]; then cmd+=("trainer.n_gpus_per_node=$gpus"); fi
cmd+=("${overrides[@]}")

# The check, here: the same arguments as the job's entrypoint.
check_python=${GRPO_DIST_CHECK_PYTHON:-}
if [ -z "$check_python" ]; then
  if [ -x "$root/.venv/bin/python" ]; then check_python=$root/.venv/bin/python; else check_python=python3; fi
fi
n=${#cmd[@]}
for ((i = 0; i < n; i++)); do if [ "${cmd[$i]}" = grpo_dist.main ]; then break; fi; done
check_cmd=("$check_python" -m grpo_dist.main --check=config "${cmd[@]:i+1}")

quote() {
  local a line=""
  for a in "$@"; do
    if [[ $a =~ ^[A-Za-z0-9_./:=,+@%^-]+$ ]]; then line+=" $a"; else line+=" '${a//\'/\'\\\'\'}'"; fi
  done
  echo "${line# }"
}

if [ "${GRPO_DIST_DRY_RUN:-0}" = 1 ]; then
  if [ "$no_check" = 0 ]; then echo "check: $(quote "${check_cmd[@]}")"; fi
  quote "${cmd[@]}"
  exit 0
fi
if [ "$no_check" = 0 ]; then
  if (cd "$root" && "$check_python" -c 'import grpo_dist.main' 2>/dev/null); then
    rc=0
    (cd "$root" && "${check_cmd[@]}") || rc=$?
    if [ "$rc" != 0 ]; then
      printf 'ray_submit.sh: the configuration check failed (exit code %s); nothing was submitted\n' "$rc" >&2
      exit "$rc"
    fi
  else
    printf 'ray_submit.sh: note: %s cannot import grpo_dist here, so the configuration is checked on the cluster only (GRPO_DIST_CHECK_PYTHON)\n' "$check_python" >&2
  fi
fi
command -v "$ray" >/dev/null 2>&1 || die "'$ray' not found: run bash scripts/setup.sh, or set GRPO_DIST_RAY (GRPO_DIST_DRY_RUN=1 prints the command)"
exec "${cmd[@]}"
