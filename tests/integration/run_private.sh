#!/usr/bin/env bash
# Run one integration test against a private stack (Kafka + Redis + PostgreSQL from
# scripts/stack.sh in a temp dir), then stop the stack. The stack dir is kept when the test
# fails, for its logs.
#
#   tests/integration/run_private.sh TEST [BUILD_DIR]     e.g. test_recorder, test_endpoints
#                                                         (BUILD_DIR default: build)
#
# Env: SLUICE_PORT_BASE (default 27200; uses 4 ports from there), SL_TEST_TIMEOUT_MULT.
# To run against a stack you already have: eval "$(scripts/stack.sh env)"; ctest -R TEST
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
NAME=${1:?usage: run_private.sh TEST [BUILD_DIR]}
BUILD=${2:-build}
case "$BUILD" in /*) ;; *) BUILD="$REPO/$BUILD" ;; esac
TEST="$BUILD/tests/integration/$NAME"
[ -x "$TEST" ] || { echo "run_private: $TEST not built (cmake --build $BUILD)" >&2; exit 1; }
# the binaries the tests drive
for bin in recorder/sluice-recorder ctl/sluicectl; do
  [ -x "$BUILD/$bin" ] || { echo "run_private: $BUILD/$bin not built" >&2; exit 1; }
done

export SLUICE_STACK_DIR
SLUICE_STACK_DIR=$(mktemp -d /tmp/sl_it_stack.XXXXXX)
export SLUICE_PORT_BASE=${SLUICE_PORT_BASE:-27200}
stop() { "$REPO/scripts/stack.sh" stop >/dev/null 2>&1 || true; }
trap stop EXIT

"$REPO/scripts/stack.sh" start
eval "$("$REPO/scripts/stack.sh" env)"
if "$TEST"; then
  stop
  trap - EXIT
  rm -rf "$SLUICE_STACK_DIR"
  echo "run_private: $NAME passed"
else
  rc=$?
  echo "run_private: $NAME FAILED (exit $rc); stack logs kept in $SLUICE_STACK_DIR" >&2
  exit "$rc"
fi
