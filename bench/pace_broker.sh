#!/usr/bin/env bash
# The broker's CPU under a paced publisher (not a test): sl-bench pace publishes 512-byte
# deliveries for 100 endpoints at a moderate rate through the producer library, into a topic of
# P partitions with the library lingering L ms, and the broker's CPU over the run is divided by
# the records. librdkafka 2.0.2 sends one ProduceRequest per partition, so below the rate at
# which batches fill, a publisher sends up to P x 1000 / L requests per second whatever the
# rate, and the broker's CPU follows the requests, not the records. Rounds alternate the
# candidates so that a drift of the machine falls on all of them.
#
#   bench/pace_broker.sh 8:5 8:10 8:20 2:5      # candidates PARTITIONS:LINGER_MS
#
# Env (all optional):
#   SLUICE_KAFKA_BROKERS   the broker (its first address must listen on this machine, to read
#                          its CPU); unset = the local stack (scripts/stack.sh start)
#   SLUICE_BUILD_DIR       where bench/sl-bench and ctl/sluicectl are (default
#                          <repo>/build/bench, then <repo>/build)
#   BENCH_RATE (9000)      records/s
#   BENCH_SECONDS (20)     seconds per run
#   BENCH_ROUNDS (2)       rounds; each runs every candidate once
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$SCRIPT_DIR/.." && pwd)
RATE="${BENCH_RATE:-9000}"
SECS="${BENCH_SECONDS:-20}"
ROUNDS="${BENCH_ROUNDS:-2}"

die() { printf 'bench/pace_broker.sh: %s\n' "$*" >&2; exit 1; }

[ $# -ge 1 ] || die "usage: bench/pace_broker.sh PARTITIONS:LINGER_MS [...] (see the top of this file)"
for cand in "$@"; do
  [[ "$cand" =~ ^[0-9]+:[0-9]+$ ]] || die "bad candidate '$cand': expected PARTITIONS:LINGER_MS, e.g. 8:5"
done
# shellcheck source=bench/lib.sh
. "$SCRIPT_DIR/lib.sh"
BIN=$(bench_build_dir bench/sl-bench ctl/sluicectl) || exit 1
bench_stack
export SLUICE_LOG_LEVEL=warn
BROKER=$(bench_broker_pid)
[ -n "$BROKER" ] || die "no broker listens on the first address of SLUICE_KAFKA_BROKERS ($SLUICE_KAFKA_BROKERS) on this machine: its CPU cannot be read"
count=$((RATE * SECS))
run_id="pb$(date +%s)"
# every topic first: a topic's first seconds (leader election, metadata) are not measured
for cand in "$@"; do
  parts=${cand%%:*}
  for r in $(seq 1 "$ROUNDS"); do
    SLUICE_TOPIC_DELIVERIES="$run_id.$parts.$r.${cand##*:}" "$BIN/ctl/sluicectl" topics ensure \
      --partitions "$parts" >/dev/null || die "could not create a topic of $parts partitions"
  done
done
sleep 5
echo "partitions:linger_ms | broker cores | broker CPU us per record | ack P50 / P99 ms"
for r in $(seq 1 "$ROUNDS"); do
  for cand in "$@"; do
    parts=${cand%%:*}
    linger=${cand##*:}
    b0=$(bench_ticks "$BROKER")
    out=$(SLUICE_TOPIC_DELIVERIES="$run_id.$parts.$r.$linger" "$BIN/bench/sl-bench" pace \
      --rate "$RATE" --count "$count" --endpoints 100 --body-bytes 512 --linger-ms "$linger" |
      tail -1)
    b1=$(bench_ticks "$BROKER")
    python3 - "$cand" "$((b1 - b0))" "$(getconf CLK_TCK)" "$SECS" "$count" "$out" <<'PYEOF'
import json, sys
cand, ticks, hz, secs, n, out = sys.argv[1:]
m = json.loads(out)
cpu = int(ticks) / int(hz)
if m.get("published") != int(n):
    raise SystemExit(f"bench/pace_broker.sh: {cand}: published {m.get('published')} of {n}")
ack = m.get("ack_ms", {})
print(f"{cand} | {cpu / int(secs):.2f} | {cpu / int(n) * 1e6:.1f} | {ack.get('p50')} / {ack.get('p99')}")
PYEOF
  done
done
echo "machine: $(nproc) x $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "reproduce: BENCH_RATE=$RATE BENCH_SECONDS=$SECS BENCH_ROUNDS=$ROUNDS bench/pace_broker.sh $*"
