#!/usr/bin/env bash
# Set up (if needed) and run the test suite: bash scripts/test.sh [--quick] [pytest args]
# --quick: the unit tier only (tests/unit), in minutes; CI (.ci/run) runs everything.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "${1:-}" = "--quick" ]; then
    shift
    exec .venv/bin/python -m pytest tests/unit "$@"
fi
exec .venv/bin/python -m pytest "$@"
