#!/usr/bin/env bash
# Run the chaos suite by hand: tests/chaos/run.sh [ci|soak] [pytest args...]
#
#   ci    the short profile (what ctest -L chaos runs; ~6 minutes on 2 cores)
#   soak  more events and repeated faults (CHAOS_SCALE=5, CHAOS_REPEATS=3 by default)
#
# Env: SL_BINARY_DIR (default <repo>/build-chaos; built here when missing), CHAOS_PORT_BASE
# (28000; see docs/CHAOS.md), CHAOS_RESULTS_DIR (default <build>/chaos-results/<profile>-<time>),
# CHAOS_SCALE, CHAOS_REPEATS, CHAOS_KEEP=1 (leave the stack running and its dir in place),
# CHAOS_STACK_DIR (reuse a stack dir). The report is written as report.json and report.txt in
# the results dir, next to one directory per scenario with its process logs, ledger and
# outcomes.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
profile=${1:-ci}
case "$profile" in
  ci|soak) shift || true ;;
  -*) profile=ci ;;  # only pytest args
  *) echo "usage: $0 [ci|soak] [pytest args]" >&2; exit 2 ;;
esac
export SL_BINARY_DIR=${SL_BINARY_DIR:-$REPO/build-chaos}
if [ ! -x "$SL_BINARY_DIR/consumer/sluice-consumer" ]; then
  cmake -S "$REPO" -B "$SL_BINARY_DIR" -DSL_TESTS=ON >/dev/null
  cmake --build "$SL_BINARY_DIR" -j2
fi
PY=${SLUICE_PYTHON_TESTS:-${SLUICE_CACHE_DIR:-$HOME/.cache/sluice}/venv/bin/python}
export CHAOS_PROFILE=$profile
exec "$PY" -m pytest -q -p no:cacheprovider "$REPO/tests/chaos" "$@"
