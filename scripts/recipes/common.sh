# shellcheck shell=bash
# Helpers of the recipe launchers in scripts/recipes/ (sourced by them, not run on its own).

recipe_die() {
  printf '%s: error: %s\n' "${0##*/}" "$*" >&2
  exit 2
}

# The python that runs grpo_dist: GRPO_DIST_PYTHON, else this checkout's .venv, else python3.
recipe_python() {
  local root=$1
  if [ -n "${GRPO_DIST_PYTHON:-}" ]; then
    printf '%s\n' "$GRPO_DIST_PYTHON"
  elif [ -x "$root/.venv/bin/python" ]; then
    printf '%s\n' "$root/.venv/bin/python"
  else
    printf '%s\n' python3
  fi
}

# The local folder of a preset's model: MODEL_PATH when set, else the preset's
# actor_rollout_ref.model.path when it is a folder, else its snapshot in the Hugging Face cache
# (nothing is downloaded). grpo_dist's validation needs a folder that exists.
# With GRPO_DIST_DRY_RUN=1 a model that cannot be found is printed as the preset names it.
recipe_model() {
  local python=$1 recipe=$2
  if [ -n "${MODEL_PATH:-}" ]; then
    [ -d "$MODEL_PATH" ] || recipe_die "MODEL_PATH=$MODEL_PATH is not a folder"
    printf '%s\n' "$MODEL_PATH"
    return
  fi
  "$python" - "$recipe" "${GRPO_DIST_DRY_RUN:-0}" <<'PY' || exit 2
import os
import sys

from grpo_dist.config.loader import ConfigError, compose

recipe, dry_run = sys.argv[1], sys.argv[2] == "1"
try:
    name = str(compose([], config_name="recipes/" + recipe).actor_rollout_ref.model.path)
except ConfigError as exc:
    sys.exit(f"error: RECIPE={recipe}: {exc}")
if os.path.isdir(os.path.expanduser(name)):
    print(os.path.expanduser(name))
    sys.exit(0)
try:
    from huggingface_hub import snapshot_download

    print(snapshot_download(name, local_files_only=True))
except Exception as exc:  # not cached (LocalEntryNotFoundError), or not a hub name
    msg = (f"the model {name} is neither a local folder nor in the Hugging Face cache ({type(exc).__name__}); "
           f"download it once (huggingface-cli download {name}) or set MODEL_PATH=/path/to/model")
    if not dry_run:
        sys.exit("error: " + msg)
    print("note (dry run): " + msg, file=sys.stderr)
    print(name)
PY
}

# Run a command, or print it (quoted for the shell) when GRPO_DIST_DRY_RUN=1.
recipe_run() {
  if [ "${GRPO_DIST_DRY_RUN:-0}" = 1 ]; then
    local a line=""
    for a in "$@"; do
      if [[ $a =~ ^[A-Za-z0-9_./:=,+@%^-]+$ ]]; then line+=" $a"; else line+=" '${a//\'/\'\\\'\'}'"; fi
    done
    printf '%s\n' "${line# }"
    return 0
  fi
  exec "$@"
}
