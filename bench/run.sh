#!/usr/bin/env bash
# The Sluice benchmark suite: one command, every figure side by side in one run on this
# machine, against a private stack it starts (and stops) itself. Not a test: it exits non-zero
# only when a run fails, never for a missed target. See bench/README.md.
#
#   bench/run.sh            full run (1,000,000 deliveries end to end; 13 to 18 minutes)
#   bench/run.sh --quick    100,000 deliveries and shorter phases, for iteration (about 5 min)
#   bench/run.sh --only wrk,produce,e2e,rss,latency,recorder,scaling,rcluster,endpoints,tls,api,scrape
#                           a subset
#   SLUICE_BENCH_CONVOY=/path/to/convoy SLUICE_BENCH_SVIX=/path/to/svix-server \
#     bench/run.sh --only peers
#                           opt-in, not in CI: the same HTTP workload through Convoy and Svix
#                           (built by bench/peers/build-convoy.sh, build-svix.sh) and through
#                           Sluice, side by side; each peer runs when its variable is set, and
#                           with neither the phase is skipped with one line
#   bench/run.sh --repeat N runs the phases N times (wrk first in each repetition, added when
#                           --only leaves it out) and reports the median and min..max of each
#                           headline figure: throughput as a ratio to the same repetition's
#                           wrk rate, latency in ms, CPU per delivery; targets judged on medians
#
# Steps: Release build into build/bench (cmake, -j2) of every binary the selected phases use
# -> sl-bench helper tool compiled against it -> private stack (scripts/stack.sh,
# SLUICE_STACK_DIR=<tmp>, SLUICE_PORT_BASE), and for the rcluster phase a Redis Cluster in a
# second private stack -> bench/bench.py runs the phases and writes
# bench/results/<date>-<host>[-quick].{json,txt} and the PNG plots -> stack stopped and its
# directory removed.
#
# Env (all optional):
#   BENCH_PORT_BASE (24000)   SLUICE_PORT_BASE of the private stack; the receiver listens on
#                             BENCH_PORT_BASE+10. Keep it below the ephemeral port range
#                             (32768-60999 here), where any client socket may hold a port
#   BENCH_RC_PORT_BASE (22000) SLUICE_PORT_BASE of the rcluster phase's Redis Cluster (a
#                             second stack.sh stack with only Redis, 3 masters + 3 replicas:
#                             nodes on base+2 and base+9..+13, cluster bus on port+10000,
#                             below the ephemeral range at this base)
#   BENCH_STACK_DIR           reuse this stack dir and leave the stack running afterwards
#                             (default: a fresh mktemp dir, stopped and removed at the end)
#   BENCH_BUILD_DIR           build dir (default <repo>/build/bench); BENCH_SKIP_BUILD=1 to
#                             use it as it is
#   BENCH_RESULTS_DIR         where results go (default <repo>/bench/results)
#   BENCH_INFLIGHT (10000)    SLUICE_MAX_INFLIGHT of the consumers (per endpoint: / 100)
#   BENCH_LATENCY_INFLIGHT (1000) SLUICE_MAX_INFLIGHT of the latency phase's consumer
#   BENCH_CONSUMER_THREADS (2) SLUICE_CONSUMER_THREADS of every consumer process: delivery
#                             loops per process (one per core of this 2-core machine)
#   BENCH_CONSUMER_SET        space-separated KEY=VALUE configuration keys (docs/CONFIG.md)
#                             for every consumer the phases start, over the phase's own
#                             choice: one binary measured with another setting, e.g.
#                             BENCH_CONSUMER_SET="adaptive_inflight=false"
#   BENCH_KEEP_TMP=1          keep the work dir (logs, raw series) under $TMPDIR
#   BENCH_KEEP_TOPICS=1       keep each phase's topics (with BENCH_STACK_DIR, read them after:
#                             sluicectl dump outcomes --topic bench.<run>.<phase>.outcomes)
#   SLUICE_BENCH_CONVOY       peers phase: path of a built convoy binary (its Redis and
#                             PostgreSQL run on BENCH_PORT_BASE+42/+43, Convoy on +50..+53)
#   SLUICE_BENCH_SVIX         peers phase: path of a built svix-server binary (its Redis
#                             and PostgreSQL run on BENCH_PORT_BASE+62/+63, Svix on +70)
#   BENCH_API_CONNS (256)     api phase: wrk connections (keep-alive, one request in flight each)
#   BENCH_PEERS_CONNS (64)    peers phase: publisher connections (one request in flight each)
#   BENCH_PEERS_CONVOY_EVENTS (10000; 3000 --quick), BENCH_PEERS_SVIX_EVENTS (40000; 10000
#                             --quick), BENCH_PEERS_SLUICE_EVENTS (200000; 50000 --quick):
#                             events published to each system
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$SCRIPT_DIR/.." && pwd)
BUILD_DIR="${BENCH_BUILD_DIR:-$REPO_DIR/build/bench}"
PORT_BASE="${BENCH_PORT_BASE:-24000}"
ARGS=("$@")

say() { printf '[bench] %s\n' "$*" >&2; }
die() { printf '[bench] ERROR: %s\n' "$*" >&2; exit 1; }

for a in "$@"; do
  case "$a" in
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  esac
done

for tool in cmake cc wrk gnuplot psql curl python3 pkg-config; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool not found: run scripts/setup.sh (wrk, gnuplot-nox and postgresql-client are Debian packages)"
done
[ -f "${SLUICE_CACHE_DIR:-${HOME:-/root}/.cache/sluice}/kafka-4.3.1/libs/kafka-clients-4.3.1.jar" ] ||
  say "Kafka jars not found in the cache: scripts/stack.sh will say what is missing (run scripts/setup.sh)"

# ---- build (Release) -------------------------------------------------------------------
# What each phase runs (build-dir relative). sl-bench (compiled below) is needed by every
# phase but produce and recorder; the libraries it links come with sluice-produce and
# sluice-api, which are therefore always built.
ONLY=""
prev=""
for a in "$@"; do
  case "$a" in
    --only=*) ONLY=${a#--only=} ;;
  esac
  [ "$prev" = --only ] && ONLY=$a
  prev=$a
done
ALL_PHASES="wrk,produce,e2e,rss,latency,recorder,scaling,rcluster,endpoints,tls,api,scrape"
CONSUMING="consumer/sluice-consumer producer/sluice-produce ctl/sluicectl tests/receiver/sluice-receiver tests/integration/sl-test-topic"
bins_of() {
  case "$1" in
    wrk) echo "tests/receiver/sluice-receiver" ;;
    produce) echo "producer/sluice-produce tests/integration/sl-test-topic" ;;
    e2e|rss|scaling|rcluster|endpoints|tls|scrape|latency) echo "$CONSUMING" ;;
    recorder) echo "recorder/sluice-recorder tests/integration/sl-test-outcomes tests/integration/sl-test-topic" ;;
    api) echo "api/sluice-api ctl/sluicectl tests/integration/sl-test-topic" ;;
    peers) echo "api/sluice-api $CONSUMING recorder/sluice-recorder" ;;
    *) die "unknown phase $1; known: $ALL_PHASES,peers" ;;
  esac
}
# always: the libraries sl-bench links, sluicectl and sl-test-topic (endpoint registration,
# topics), and wrk's receiver (--repeat adds the wrk phase to every repetition)
BINS="producer/sluice-produce api/sluice-api ctl/sluicectl tests/integration/sl-test-topic tests/receiver/sluice-receiver"
if [ "$ONLY" = peers ] && [ -z "${SLUICE_BENCH_CONVOY:-}" ] && [ -z "${SLUICE_BENCH_SVIX:-}" ]; then
  # the same line bench/peers.py prints, without building and starting a stack for nothing
  say "peers: skipped: no peer given (neither SLUICE_BENCH_CONVOY nor SLUICE_BENCH_SVIX is set; bench/peers/build-convoy.sh and bench/peers/build-svix.sh build them and print the line to set)"
  exit 0
fi
IFS=, read -r -a SELECTED <<<"${ONLY:-$ALL_PHASES}"
for p in "${SELECTED[@]}"; do
  [ -n "$p" ] && BINS="$BINS $(bins_of "$p")"
done
BINS=$(tr ' ' '\n' <<<"$BINS" | awk 'NF && !seen[$0]++' | tr '\n' ' ')
TARGETS=""
for b in $BINS; do TARGETS="$TARGETS ${b##*/}"; done

if [ "${BENCH_SKIP_BUILD:-0}" != 1 ]; then
  say "building Release into $BUILD_DIR:$TARGETS"
  cmake -S "$REPO_DIR" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DSL_TESTS=ON >/dev/null ||
    die "cmake configure failed"
  # shellcheck disable=SC2086
  cmake --build "$BUILD_DIR" -j2 --target $TARGETS >"$BUILD_DIR/bench-build.log" 2>&1 || {
    tail -n 30 "$BUILD_DIR/bench-build.log" >&2
    die "build failed (log: $BUILD_DIR/bench-build.log)"
  }
fi
for bin in $BINS; do
  [ -x "$BUILD_DIR/$bin" ] || die "$BUILD_DIR/$bin missing (build failed, or BENCH_SKIP_BUILD=1 with an incomplete build)"
done

# The helper tool links the static libraries of this build (bench/ is not a CMake subdir).
mkdir -p "$BUILD_DIR/bench"
TOOL="$BUILD_DIR/bench/sl-bench"
if [ ! -x "$TOOL" ] || [ "$SCRIPT_DIR/sl_bench.c" -nt "$TOOL" ] ||
   [ "$BUILD_DIR/common/libsluice_common.a" -nt "$TOOL" ] ||
   [ "$BUILD_DIR/producer/libsluice_producer.a" -nt "$TOOL" ] ||
   [ "$BUILD_DIR/api/libsluice_api.a" -nt "$TOOL" ]; then
  say "compiling $TOOL"
  # shellcheck disable=SC2046
  cc -O2 -g -std=c11 -D_GNU_SOURCE -DSL_VERSION='"bench"' -DOPENSSL_API_COMPAT=30000 \
     -DOPENSSL_NO_DEPRECATED -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
     -Wformat=2 -Wvla -Wconversion -Wno-sign-conversion -Wcast-qual -Wundef -Werror \
     -I"$REPO_DIR" "$SCRIPT_DIR/sl_bench.c" "$BUILD_DIR/api/libsluice_api.a" \
     "$BUILD_DIR/producer/libsluice_producer.a" "$BUILD_DIR/common/libsluice_common.a" \
     $(pkg-config --libs rdkafka hiredis libcurl libpq libcrypto msgpack jansson) -lm -lpthread \
     -o "$TOOL" || die "could not compile bench/sl_bench.c"
fi

# ---- private stack -----------------------------------------------------------------------
OWN_STACK=0
if [ -n "${BENCH_STACK_DIR:-}" ]; then
  STACK_DIR=$BENCH_STACK_DIR
else
  STACK_DIR=$(mktemp -d "${TMPDIR:-/tmp}/sluice-bench-stack.XXXXXX")
  OWN_STACK=1
fi
WORK_DIR=$(mktemp -d "${TMPDIR:-/tmp}/sluice-bench-work.XXXXXX")
stack() { SLUICE_STACK_DIR="$STACK_DIR" SLUICE_PORT_BASE="$PORT_BASE" "$REPO_DIR/scripts/stack.sh" "$@"; }
RC_DIR=""
rc_stack() {
  SLUICE_STACK_DIR="$RC_DIR" SLUICE_PORT_BASE="${BENCH_RC_PORT_BASE:-22000}" \
    SLUICE_STACK_REDIS_CLUSTER=1 "$REPO_DIR/scripts/stack.sh" "$@"
}
cleanup() {
  local rc=$?
  if [ "$OWN_STACK" = 1 ]; then
    say "stopping the private stack ($STACK_DIR)"
    stack stop >/dev/null 2>&1 || true
    rm -rf "$STACK_DIR"
  fi
  if [ -n "$RC_DIR" ]; then
    say "stopping the Redis Cluster ($RC_DIR)"
    rc_stack stop >/dev/null 2>&1 || true
    rm -rf "$RC_DIR"
  fi
  if [ "${BENCH_KEEP_TMP:-0}" = 1 ] || [ "$rc" -ne 0 ]; then
    say "work dir kept: $WORK_DIR"
  else
    rm -rf "$WORK_DIR"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "starting a private stack in $STACK_DIR (port base $PORT_BASE)"
stack start >"$WORK_DIR/stack.log" 2>&1 || { tail -n 30 "$WORK_DIR/stack.log" >&2; die "could not start the stack"; }
eval "$(stack env)"
export SLUICE_KAFKA_BROKERS SLUICE_REDIS_URL SLUICE_PG_DSN
RC_URL=""
if [[ ",${ONLY:-$ALL_PHASES}," == *,rcluster,* ]]; then
  RC_DIR=$(mktemp -d "${TMPDIR:-/tmp}/sluice-bench-rcluster.XXXXXX")
  say "starting a Redis Cluster (3 masters + 3 replicas) in $RC_DIR for the rcluster phase"
  rc_stack start redis >"$WORK_DIR/rcluster-stack.log" 2>&1 || {
    tail -n 30 "$WORK_DIR/rcluster-stack.log" >&2; die "could not start the Redis Cluster"; }
  RC_URL=$(rc_stack env | sed -n 's/^export SLUICE_REDIS_URL=//p')
fi

# ---- the phases --------------------------------------------------------------------------
# the knobs that change what is measured go into the reproduce line too
KNOBS=""
for v in BENCH_INFLIGHT BENCH_LATENCY_INFLIGHT BENCH_CONSUMER_THREADS BENCH_PORT_BASE BENCH_RC_PORT_BASE \
  SLUICE_BENCH_CONVOY SLUICE_BENCH_SVIX BENCH_PEERS_CONNS BENCH_PEERS_CONVOY_EVENTS \
  BENCH_PEERS_SVIX_EVENTS BENCH_PEERS_SLUICE_EVENTS \
  BENCH_PEERS_CONVOY_TUNING BENCH_API_CONNS BENCH_CONSUMER_SET; do
  [ -n "${!v:-}" ] && KNOBS="$KNOBS$v=$(printf %q "${!v}") "
done
CONSUMER_SET=()
for kv in ${BENCH_CONSUMER_SET:-}; do CONSUMER_SET+=(--consumer-set "$kv"); done
CMDLINE="${KNOBS}bench/run.sh${ARGS[*]:+ ${ARGS[*]}}"
PYTHONDONTWRITEBYTECODE=1 python3 "$SCRIPT_DIR/bench.py" \
  --repo "$REPO_DIR" --build "$BUILD_DIR" --tool "$TOOL" --stack-dir "$STACK_DIR" \
  --work "$WORK_DIR" --results "${BENCH_RESULTS_DIR:-$REPO_DIR/bench/results}" \
  --receiver-port $((PORT_BASE + 10)) --inflight "${BENCH_INFLIGHT:-10000}" \
  --consumer-threads "${BENCH_CONSUMER_THREADS:-2}" \
  --latency-inflight "${BENCH_LATENCY_INFLIGHT:-1000}" \
  --redis-cluster-url "$RC_URL" --redis-cluster-dir "$RC_DIR" \
  "${CONSUMER_SET[@]}" --command "$CMDLINE" "$@"
