#!/usr/bin/env bash
# Set up (if needed) and run the test suite: bash scripts/test.sh [--quick] [pytest args]
# --quick: the unit tier only (tests/unit), in minutes; CI (.ci/run) runs everything.
#
# Without test paths it runs two pytest sessions, each with the arguments given: the unit tier
# (tests/unit) on two processes (pytest-xdist, -n 2), then the tiers that start the real stack
# (tests/e2e, tests/ray, tests/distributed) one test at a time. Each prints its own summary
# (and --durations table); the exit code is the first failure's, and 5 (no tests collected) only
# when neither session collected a test. With test paths (tests/e2e, tests/unit/test_x.py::test_y)
# it runs exactly those, in one session, one test at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
py=(.venv/bin/python -m pytest)
unit=(tests/unit -n 2)
if [ "${1:-}" = "--quick" ]; then
    shift
    exec "${py[@]}" "${unit[@]}" "$@"
fi
value=0
for a in "$@"; do
    if [ "$value" = 1 ]; then value=0; continue; fi  # the value of an option such as -k, -m, -p
    case "$a" in
        -k|-m|-p|-o|-c|-n|-W|-r|--deselect|--ignore|--ignore-glob|--rootdir|--basetemp|--confcutdir|--tb|--maxfail|\
        --durations|--junitxml|--timeout|--dist) value=1; continue ;;
    esac
    # a test path (a file, a folder, or a node id such as tests/unit/test_x.py::test_y)
    if [ "${a#-}" = "$a" ] && [ -e "${a%%::*}" ]; then
        exec "${py[@]}" "$@"
    fi
done
set +e
"${py[@]}" "${unit[@]}" "$@"
rc_unit=$?
"${py[@]}" tests --ignore=tests/unit "$@"
rc_rest=$?
set -e
if [ "$rc_unit" -eq 5 ] && [ "$rc_rest" -eq 5 ]; then exit 5; fi
for rc in "$rc_unit" "$rc_rest"; do
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then exit "$rc"; fi
done
exit 0
