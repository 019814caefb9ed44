#!/usr/bin/env bash
# Producer throughput benchmark (not a test): sluice-produce --generate publishes N synthetic
# deliveries (no JSON parsing, so this measures the producer, not the parser) to a private
# topic on a real broker and waits for every acknowledgement (acks=all, idempotent).
# Prints records/s, the producer's peak RSS and CPU, the broker's CPU over the run, the
# machine, and the exact command to reproduce.
#
#   bench/produce.sh                     # 1,000,000 x 512-byte bodies, 1000 endpoints
#
# Env (all optional):
#   SLUICE_KAFKA_BROKERS   broker to use; unset = the local stack (scripts/stack.sh start,
#                          which honours SLUICE_STACK_DIR / SLUICE_PORT_BASE)
#   SLUICE_BUILD_DIR       build dir holding producer/sluice-produce and
#                          tests/integration/sl-test-topic (default <repo>/build/bench, then
#                          <repo>/build)
#   BENCH_RECORDS (1000000) BENCH_BODY_BYTES (512) BENCH_ENDPOINTS (1000)
#   BENCH_PARTITIONS (4)   partitions of the private topic
#   BENCH_TARGET (100000)  records/s the report compares against
#   BENCH_KEEP_TOPIC=1     do not delete the topic afterwards
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$SCRIPT_DIR/.." && pwd)
N="${BENCH_RECORDS:-1000000}"
BODY="${BENCH_BODY_BYTES:-512}"
ENDPOINTS="${BENCH_ENDPOINTS:-1000}"
PARTITIONS="${BENCH_PARTITIONS:-4}"
TARGET="${BENCH_TARGET:-100000}"

die() { printf 'bench/produce.sh: %s\n' "$*" >&2; exit 1; }

# shellcheck source=bench/lib.sh
. "$SCRIPT_DIR/lib.sh"
BUILD_DIR=$(bench_build_dir producer/sluice-produce tests/integration/sl-test-topic) || exit 1
PRODUCE="$BUILD_DIR/producer/sluice-produce"
TOPIC_TOOL="$BUILD_DIR/tests/integration/sl-test-topic"
[ -x /usr/bin/time ] || die "/usr/bin/time not found (apt package time)"
bench_stack

# The broker's process, when it runs on this machine (for its CPU time; optional).
broker_pid=$(bench_broker_pid)

topic=$("$TOPIC_TOOL" name bench.produce)
"$TOPIC_TOOL" create "$topic" "$PARTITIONS" || die "could not create topic $topic"
cleanup() {
  [ "${BENCH_KEEP_TOPIC:-0}" = 1 ] || "$TOPIC_TOOL" delete "$topic" >/dev/null 2>&1 || true
  rm -f "${timef:-}" "${outf:-}"
}
trap cleanup EXIT

timef=$(mktemp); outf=$(mktemp)
cmd=(env SLUICE_TOPIC_DELIVERIES="$topic" /usr/bin/time -v -o "$timef"
     "$PRODUCE" --generate "$N" --endpoints "$ENDPOINTS" --body-bytes "$BODY" --quiet)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
b0=$(bench_ticks "$broker_pid")
set +e
"${cmd[@]}" >"$outf"
rc=$?
set -e
b1=$(bench_ticks "$broker_pid")
summary=$(cat "$outf")

field() { sed -n "s/.*$1=\([^ ]*\).*/\1/p" <<<"$summary"; }
tfield() { sed -n "s/^[[:space:]]*$1: //p" "$timef" | head -n1; }
rate=$(field records_per_s); published=$(field published); elapsed=$(field elapsed_s)
rss_kb=$(tfield 'Maximum resident set size (kbytes)')
user_s=$(tfield 'User time (seconds)'); sys_s=$(tfield 'System time (seconds)')
cpu_pct=$(tfield 'Percent of CPU this job got')
tck=$(getconf CLK_TCK)
broker_cpu="n/a (broker not on this machine)"
if [ -n "$broker_pid" ]; then
  broker_cpu=$(awk -v a="$b0" -v b="$b1" -v t="$tck" 'BEGIN { printf "%.2f s", (b - a) / t }')
fi

echo "== sluice-produce benchmark =="
echo "summary:      $summary"
echo "records/s:    ${rate:-?}  (published ${published:-?} of $N in ${elapsed:-?} s; target $TARGET)"
echo "peak RSS:     ${rss_kb:-?} KiB (producer, /usr/bin/time -v Maximum resident set size)"
echo "producer CPU: user ${user_s:-?} s + sys ${sys_s:-?} s (${cpu_pct:-?} of one core over the run)"
echo "broker CPU:   $broker_cpu over the run (pid ${broker_pid:-?})"
echo "machine:      nproc $(nproc), $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1), load average before run $load_before"
echo "broker:       $SLUICE_KAFKA_BROKERS topic $topic ($PARTITIONS partitions)"
echo "reproduce:    SLUICE_KAFKA_BROKERS=$SLUICE_KAFKA_BROKERS BENCH_RECORDS=$N BENCH_BODY_BYTES=$BODY BENCH_ENDPOINTS=$ENDPOINTS BENCH_PARTITIONS=$PARTITIONS SLUICE_BUILD_DIR=$BUILD_DIR $SCRIPT_DIR/produce.sh"
echo "  (runs:      SLUICE_TOPIC_DELIVERIES=<new topic> $PRODUCE --generate $N --endpoints $ENDPOINTS --body-bytes $BODY --quiet)"
if [ "$rc" -ne 0 ]; then
  echo "result:       sluice-produce exited $rc" >&2
  exit "$rc"
fi
if [ -n "$rate" ] && [ "${rate%.*}" -ge "$TARGET" ]; then
  echo "result:       target met ($rate >= $TARGET records/s)"
else
  echo "result:       target missed (${rate:-?} < $TARGET records/s)"
fi
