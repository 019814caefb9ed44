#!/usr/bin/env bash
# Sluice's whole test suite, from a fresh Debian 12 machine or an existing checkout:
#
#   bash scripts/test.sh
#
#  1. scripts/setup.sh: apt packages, Kafka jars, test venv (a no-op when already there)
#  2. an isolated stack (real Kafka, Redis, PostgreSQL) under .stack/test on private ports
#  3. gcc build, warnings as errors, with the test-only fault points (-DSL_FAULT_INJECTION=ON:
#     sluice-api's SL_FAULT, used by tests/e2e/test_api.py); every ctest label: unit, component,
#     fuzz (corpus replay), integration, e2e (ctest -j 4); beside that ctest run, the e2e
#     delivery suite (test_delivery.py, test_breaker.py, test_intake.py, test_policies.py,
#     test_replay.py) again against a Redis Cluster (a second stack.sh stack under
#     .stack/test-redis-cluster with only Redis, in cluster mode: 3 masters + 3 replicas;
#     Kafka and PostgreSQL are the test stack's); then the chaos suite's CI profile
#     (tests/chaos/run.sh ci: its own stack, one fault per scenario, figures printed per
#     scenario)
#  4. clang build with ASan + UBSan; the whole suite again (ctest -j 3) except the chaos
#     suite, the clock-skew test, and the e2e files that run no C code of ours or only what
#     the others run (tests/e2e/CMakeLists.txt)
#  5. clang libFuzzer build; every fuzzer replays its corpus
#  6. source checks (clang-format, banned functions)
# The stack is stopped on exit; logs of a failed run stay under .stack/test and build/.
#
# Env: SLUICE_TEST_PORT_BASE (29100)  ports of the test stack
#      SLUICE_TEST_ONLY=gcc|asan|fuzz|lint   run one stage (after setup and stack); any other
#                                    name is refused (exit 2) before anything runs
#      SLUICE_TEST_KEEP_STACK=1      leave the stack running afterwards
#      SLUICE_TEST_LABELS=regex      ctest -L filter (default: everything)
#      SLUICE_TEST_JOBS=N            tests ctest runs at once (default 4 in the gcc stage, 3
#                                    under ASan)
#      SLUICE_TEST_CHAOS=0           skip the chaos suite (gcc stage; default 1)
#      SLUICE_TEST_REDIS_CLUSTER=0   skip the e2e delivery suite against a Redis Cluster (gcc
#                                    stage; default 1; about 4 min, beside the ctest run)
#      SLUICE_TEST_REDIS_CLUSTER_PORT_BASE (21200)  its stack's ports: Redis Cluster nodes
#                                    on base+2 and base+9..+13, cluster bus ports +10000
#      CHAOS_PORT_BASE (28000)       ports of the chaos suite's own stack
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
JOBS=2 # compilers
# ctest's parallel tests: the e2e and integration tests mostly wait (timers, timeouts, the
# broker), so more run at once than there are cores; fewer under ASan, which costs CPU
JOBS_GCC="${SLUICE_TEST_JOBS:-4}"
JOBS_ASAN="${SLUICE_TEST_JOBS:-3}"
ONLY="${SLUICE_TEST_ONLY:-}"
LABELS="${SLUICE_TEST_LABELS:-}"
t_start=$SECONDS
STAGES="gcc asan fuzz lint" # every `if stage X` below, in order

# A misspelt stage would match no `if stage X` and the run would end "all stages passed"
# having tested nothing: refuse it before anything is installed, started or built.
if [ -n "$ONLY" ]; then
  known=0
  for s in $STAGES; do
    if [ "$s" = "$ONLY" ]; then known=1; fi
  done
  if [ "$known" != 1 ]; then
    echo "scripts/test.sh: unknown stage \"$ONLY\" in SLUICE_TEST_ONLY; valid stages: $STAGES" >&2
    exit 2
  fi
fi

say() { printf '\n==== [test] %s (%ds)\n' "$*" "$((SECONDS - t_start))"; }

say "setup"
bash scripts/setup.sh

export SLUICE_STACK_DIR="$REPO/.stack/test"
export SLUICE_PORT_BASE="${SLUICE_TEST_PORT_BASE:-29100}"
say "stack on ports ${SLUICE_PORT_BASE}.. (data in $SLUICE_STACK_DIR)"
RC_STACK_DIR="$REPO/.stack/test-redis-cluster"
rc_stack() { # stack.sh on the Redis Cluster stack (Redis only)
  SLUICE_STACK_DIR="$RC_STACK_DIR" SLUICE_PORT_BASE="${SLUICE_TEST_REDIS_CLUSTER_PORT_BASE:-21200}" \
    SLUICE_STACK_REDIS_CLUSTER=1 bash scripts/stack.sh "$@"
}
rc_pid="" # the Redis Cluster e2e run beside the gcc ctest run, while it runs
stop_stack() {
  if [ -n "$rc_pid" ]; then # ended early: its process group (pytest and what it started)
    kill -TERM -- "-$rc_pid" 2>/dev/null || true
    wait "$rc_pid" 2>/dev/null || true
  fi
  if [ "${SLUICE_TEST_KEEP_STACK:-0}" != 1 ]; then
    bash scripts/stack.sh stop >/dev/null 2>&1 || true
    if [ -d "$RC_STACK_DIR" ]; then rc_stack stop redis >/dev/null 2>&1 || true; fi
  fi
}
trap stop_stack EXIT
bash scripts/stack.sh start
eval "$(bash scripts/stack.sh env)"
export SLUICE_KAFKA_BROKERS SLUICE_REDIS_URL SLUICE_PG_DSN

ctest_run() { # dir, timeout multiplier, parallel tests
  local dir=$1 mult=$2 jobs=$3
  local args=(--test-dir "$dir" --output-on-failure --no-tests=error -j "$jobs")
  [ -n "$LABELS" ] && args+=(-L "$LABELS")
  # the chaos suite restarts its own stack and wants both cores: gcc stage only
  [ -n "${LABELS_EXCLUDE:-}" ] && args+=(-LE "$LABELS_EXCLUDE")
  SL_TEST_TIMEOUT_MULT=$mult ctest "${args[@]}"
}

stage() { [ -z "$ONLY" ] || [ "$ONLY" = "$1" ]; }

if stage gcc; then
  say "gcc build (-Werror)"
  cmake -S . -B build/test-gcc -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSL_WERROR=ON -DSL_FAULT_INJECTION=ON >/dev/null
  cmake --build build/test-gcc -j "$JOBS"
  say "smoke: one record through the real broker with librdkafka (sluice-produce -> dump)"
  smoke_tag="smoke$$$(date +%s)"
  (
    export SLUICE_TOPIC_DELIVERIES="$smoke_tag.deliveries" SLUICE_TOPIC_OUTCOMES="$smoke_tag.outcomes"
    export SLUICE_TOPIC_QUARANTINE="$smoke_tag.quarantine" SLUICE_TOPIC_ENDPOINTS="$smoke_tag.endpoints"
    build/test-gcc/ctl/sluicectl topics ensure --partitions 1
    echo '{"id":"evt_smoke_1","endpoint":"smoke","type":"smoke.test","body":{"hello":"kafka"}}' \
      | build/test-gcc/producer/sluice-produce
    build/test-gcc/ctl/sluicectl dump deliveries --idle-ms 5000 | tee /dev/stderr \
      | grep -q '"id":"evt_smoke_1"' || { echo "smoke round trip failed" >&2; exit 1; }
  )
  # The e2e delivery suite once more with Redis as a cluster (issue 21): Kafka and PostgreSQL
  # stay the test stack's, Redis is a second stack's six nodes, created afresh each run. It
  # runs beside the ctest run below (the e2e tests mostly wait on timers and timeouts: the
  # machine is about 80% idle under ctest -j2), its output in a log shown when it ends.
  # One pytest process: worlds on a cluster take turns (one database, flushed per world).
  # With them the check that a master of the cluster losing its data is seen (the binding's
  # witnesses). Left out there: a stuck intake, loops within one process, records Kafka did
  # not take and endpoints that cannot send (they touch Redis as the other tests do and run
  # against one Redis in the ctest run), and the recorder's tests, which do not touch Redis.
  rc_log="$REPO/build/test-gcc/redis-cluster-e2e.log"
  if [ "${SLUICE_TEST_REDIS_CLUSTER:-1}" = 1 ] && { [ -z "$LABELS" ] || [[ e2e =~ $LABELS ]]; }; then
    say "gcc: e2e delivery suite against a Redis Cluster (3 masters + 3 replicas), beside the ctest run; log $rc_log"
    rc_stack reset >/dev/null
    rc_stack start redis
    rc_url=$(rc_stack env | sed -n 's/^export SLUICE_REDIS_URL=//p')
    case "$rc_url" in redis-cluster://*) ;; *) echo "no redis-cluster:// URL from stack.sh env: '$rc_url'" >&2; exit 1 ;; esac
    py="${SLUICE_PYTHON_TESTS:-${SLUICE_CACHE_DIR:-$HOME/.cache/sluice}/venv/bin/python}"
    # in a process group of its own (setsid), which stop_stack ends if the script stops early
    SLUICE_REDIS_URL="$rc_url" SL_BINARY_DIR="$REPO/build/test-gcc" SL_TEST_TIMEOUT_MULT=1 \
      setsid "$py" -m pytest -x -q -p no:cacheprovider tests/e2e/test_delivery.py \
      tests/e2e/test_breaker.py tests/e2e/test_intake.py tests/e2e/test_policies.py \
      tests/e2e/test_replay.py \
      tests/e2e/test_redis_pg_security.py::test_a_loss_beside_the_binding_is_seen \
      -k "not stuck_intake and not loops_of_one_process and not records_kafka_did_not_take \
          and not cannot_send and not must_be_cut and not clock_far_ahead and not lost_registry" \
      >"$rc_log" 2>&1 &
    rc_pid=$!
  fi
  say "gcc: all tests (ctest -j $JOBS_GCC)"
  ctest_rc=0
  LABELS_EXCLUDE=chaos ctest_run build/test-gcc 1 "$JOBS_GCC" || ctest_rc=$?
  if [ -n "$rc_pid" ]; then
    say "gcc: waiting for the e2e delivery suite against a Redis Cluster (log $rc_log)"
    rc_rc=0
    wait "$rc_pid" || rc_rc=$?
    rc_pid=""
    say "gcc: e2e delivery suite against a Redis Cluster: exit $rc_rc"
    cat "$rc_log"
    if [ "${SLUICE_TEST_KEEP_STACK:-0}" != 1 ]; then rc_stack stop redis; fi
    if [ "$rc_rc" != 0 ]; then
      [ "$ctest_rc" = 0 ] || echo "ctest failed in build/test-gcc (exit $ctest_rc): see its output above" >&2
      echo "the e2e delivery suite against a Redis Cluster failed (exit $rc_rc)" >&2
      exit 1
    fi
  fi
  if [ "$ctest_rc" != 0 ]; then
    echo "ctest failed in build/test-gcc (exit $ctest_rc): see its output above" >&2
    exit "$ctest_rc"
  fi
  # The chaos suite starts, kills and restarts its own stack (Kafka, Redis, PostgreSQL) and
  # wants both cores, so it runs alone, after the rest; it prints its figures per scenario.
  if [ "${SLUICE_TEST_CHAOS:-1}" = 1 ] && [ -z "$LABELS" ]; then
    say "gcc: chaos suite, CI profile (docs/CHAOS.md)"
    SL_BINARY_DIR="$REPO/build/test-gcc" CHAOS_RESULTS_DIR="$REPO/build/test-gcc/chaos-results" \
      bash tests/chaos/run.sh ci
  fi
fi

if stage asan; then
  say "clang build with ASan + UBSan"
  CC=clang cmake -S . -B build/test-asan -DCMAKE_BUILD_TYPE=Debug -DSL_WERROR=ON \
    -DSL_SANITIZE=address,undefined -DSL_FAULT_INJECTION=ON >/dev/null
  cmake --build build/test-asan -j "$JOBS"
  say "asan+ubsan: all tests"
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  export LSAN_OPTIONS="suppressions=$REPO/tests/lsan.supp:print_suppressions=0"
  LABELS_EXCLUDE=chaos ctest_run build/test-asan 4 "$JOBS_ASAN"
  unset ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS
fi

if stage fuzz; then
  say "clang libFuzzer build: corpus replay"
  CC=clang cmake -S . -B build/test-fuzz -DCMAKE_BUILD_TYPE=Debug -DSL_WERROR=ON -DSL_FUZZ=ON \
    >/dev/null
  cmake --build build/test-fuzz -j "$JOBS"
  SL_TEST_TIMEOUT_MULT=4 ctest --test-dir build/test-fuzz --output-on-failure --no-tests=error \
    -j "$JOBS" -L fuzz
fi

if stage lint; then
  say "source checks"
  bash scripts/check-src.sh
fi

say "all stages passed"
