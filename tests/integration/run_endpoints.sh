#!/usr/bin/env bash
# Run test_endpoints against a private stack (Kafka + Redis + PostgreSQL from scripts/stack.sh
# in a temp dir), then stop the stack. The stack dir is kept when the test fails, for its logs.
#
#   tests/integration/run_endpoints.sh [BUILD_DIR]      (default: build)
#
# Env: SLUICE_PORT_BASE (default 27100; uses 4 ports from there), SL_TEST_TIMEOUT_MULT.
# To run against a stack you already have: eval "$(scripts/stack.sh env)"; ctest -R test_endpoints
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${1:-build}
case "$BUILD" in /*) ;; *) BUILD="$REPO/$BUILD" ;; esac
TEST="$BUILD/tests/integration/test_endpoints"
[ -x "$TEST" ] || { echo "run_endpoints: $TEST not built (cmake --build $BUILD)" >&2; exit 1; }
[ -x "$BUILD/ctl/sluicectl" ] || { echo "run_endpoints: $BUILD/ctl/sluicectl not built" >&2; exit 1; }

export SLUICE_STACK_DIR
SLUICE_STACK_DIR=$(mktemp -d /tmp/sl_ep_stack.XXXXXX)
export SLUICE_PORT_BASE=${SLUICE_PORT_BASE:-27100}
stop() { "$REPO/scripts/stack.sh" stop >/dev/null 2>&1 || true; }
trap stop EXIT

"$REPO/scripts/stack.sh" start
eval "$("$REPO/scripts/stack.sh" env)"
if "$TEST"; then
  stop
  trap - EXIT
  rm -rf "$SLUICE_STACK_DIR"
  echo "run_endpoints: passed"
else
  rc=$?
  echo "run_endpoints: FAILED (exit $rc); stack logs kept in $SLUICE_STACK_DIR" >&2
  exit "$rc"
fi
