#!/usr/bin/env bash
# Run test_recorder against a private stack (Kafka + Redis + PostgreSQL from scripts/stack.sh in
# a temp dir), then stop the stack. The stack dir is kept when the test fails, for its logs.
#
#   tests/integration/run_recorder.sh [BUILD_DIR]      (default: build)
#
# Env: SLUICE_PORT_BASE (default 27200; uses 4 ports from there), SL_TEST_TIMEOUT_MULT.
# To run against a stack you already have: eval "$(scripts/stack.sh env)"; ctest -R test_recorder
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${1:-build}
case "$BUILD" in /*) ;; *) BUILD="$REPO/$BUILD" ;; esac
TEST="$BUILD/tests/integration/test_recorder"
[ -x "$TEST" ] || { echo "run_recorder: $TEST not built (cmake --build $BUILD)" >&2; exit 1; }
[ -x "$BUILD/recorder/sluice-recorder" ] || { echo "run_recorder: $BUILD/recorder/sluice-recorder not built" >&2; exit 1; }

export SLUICE_STACK_DIR
SLUICE_STACK_DIR=$(mktemp -d /tmp/sl_rec_stack.XXXXXX)
export SLUICE_PORT_BASE=${SLUICE_PORT_BASE:-27200}
stop() { "$REPO/scripts/stack.sh" stop >/dev/null 2>&1 || true; }
trap stop EXIT

"$REPO/scripts/stack.sh" start
eval "$("$REPO/scripts/stack.sh" env)"
if "$TEST"; then
  stop
  trap - EXIT
  rm -rf "$SLUICE_STACK_DIR"
  echo "run_recorder: passed"
else
  rc=$?
  echo "run_recorder: FAILED (exit $rc); stack logs kept in $SLUICE_STACK_DIR" >&2
  exit "$rc"
fi
