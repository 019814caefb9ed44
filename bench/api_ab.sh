#!/usr/bin/env bash
# sluice-api A/B (not a test): two or more sluice-api binaries, or one binary under different
# settings, in turn on one warm stack, publishing 512-byte events to one explicit endpoint
# with wrk over keep-alive connections; prints for each run the publishes/s (every 202 is
# Kafka-acknowledged), the non-2xx count, sluice-api's CPU per request and, when the broker
# listens on this machine, the broker's CPU per request. Rounds alternate
# the candidates so that a drift of the machine falls on all of them; compare CPU per
# request first (rates move with the machine and, below saturation, with the linger).
#
#   bench/api_ab.sh OLD_BINARY NEW_BINARY
#   bench/api_ab.sh 'SLUICE_API_LINGER_MS=5 build/bench/api/sluice-api' \
#                   'SLUICE_API_LINGER_MS=1 build/bench/api/sluice-api'
#
# A candidate is a binary path, optionally preceded by VAR=value settings (one shell word:
# quote it). Env (all optional):
#   SLUICE_KAFKA_BROKERS / SLUICE_REDIS_URL / SLUICE_PG_DSN  the stack; unset = the local stack
#                          (scripts/stack.sh start)
#   SLUICE_BUILD_DIR       where ctl/sluicectl is (default <repo>/build/bench, then <repo>/build)
#   BENCH_ROUNDS (3)       rounds; each runs every candidate once
#   BENCH_CONNS (256)      wrk connections
#   BENCH_SECONDS (15)     measured seconds per run, after 5 s of warm-up on the same server
#   BENCH_PORT (18080)     sluice-api's listen port
#   BENCH_DELAY_MS (0)     pacing: each connection waits uniformly 0..2x this many ms between
#                          requests (a moderate load instead of as fast as Kafka answers)
#   BENCH_RAW (0)          1: each run also measures GET /healthz (the api phase's raw rate)
#                          for BENCH_SECONDS right after the publishes, on the same server,
#                          and prints the publish rate's ratio to it
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$SCRIPT_DIR/.." && pwd)
ROUNDS="${BENCH_ROUNDS:-3}"
CONNS="${BENCH_CONNS:-256}"
SECS="${BENCH_SECONDS:-15}"
PORT="${BENCH_PORT:-18080}"
DELAY="${BENCH_DELAY_MS:-0}"
RAW="${BENCH_RAW:-0}"

die() { printf 'bench/api_ab.sh: %s\n' "$*" >&2; exit 1; }

[ $# -ge 1 ] || die "usage: bench/api_ab.sh CANDIDATE [CANDIDATE ...] (see the top of this file)"
command -v wrk >/dev/null || die "wrk not found (scripts/setup.sh installs it)"
# shellcheck source=bench/lib.sh
. "$SCRIPT_DIR/lib.sh"
CTL="$(bench_build_dir ctl/sluicectl)/ctl/sluicectl" || exit 1
bench_stack SLUICE_REDIS_URL SLUICE_PG_DSN
export SLUICE_MASTER_KEY="${SLUICE_MASTER_KEY:-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')}"
export SLUICE_LOG_LEVEL=warn SLUICE_API_LISTEN="127.0.0.1:$PORT" SLUICE_API_MAX_CONNECTIONS=4096
# the endpoint registered below is on loopback, which the SSRF rules refuse by default
export SLUICE_SSRF_ALLOW_CIDRS="${SLUICE_SSRF_ALLOW_CIDRS:-127.0.0.0/8}"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/sluice-api-ab.XXXXXX")
API_PID=""
cleanup() {
  [ -n "$API_PID" ] && kill "$API_PID" 2>/dev/null && wait "$API_PID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

run_id="ab$(date +%s)"
"$CTL" topics ensure --partitions 8 >/dev/null
"$CTL" endpoints add --id "$run_id" --url "http://127.0.0.1:9/ok/$run_id" >/dev/null
key=$("$CTL" keys create --name "api-ab $run_id" --scopes publish --json |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["key"])')
python3 - "$WORK/one.lua" "$run_id" "$key" "$DELAY" <<'PYEOF'
import json, sys
path, ep, key, delay = sys.argv[1:]
body = json.dumps({"type": "bench.one", "endpoint": ep, "body": {"seq": 1, "data": "x" * 492}})
with open(path, "w") as f:
    f.write('wrk.method = "POST"\n')
    f.write(f"wrk.body = {json.dumps(body)}\n")
    f.write('wrk.headers["Content-Type"] = "application/json"\n')
    f.write(f'wrk.headers["Authorization"] = "Bearer {key}"\n')
    if int(delay) > 0:
        f.write(f"function delay() return math.random(0, {2 * int(delay)}) end\n")
PYEOF

per_req() { awk -v t="$1" -v hz="$(getconf CLK_TCK)" -v n="$2" 'BEGIN { printf "%.1f", t / hz / n * 1e6 }'; }
BROKER=$(bench_broker_pid)
url="http://127.0.0.1:$PORT/v1/events"
hdr="candidate | publishes/s | non-2xx | sluice-api CPU us per request | broker CPU us per request"
[ "$RAW" = 1 ] && hdr="$hdr | /healthz req/s | publish / healthz"
echo "$hdr"
for r in $(seq 1 "$ROUNDS"); do
  for cand in "$@"; do
    # shellcheck disable=SC2086 # a candidate is settings then a path, split on purpose
    env $cand >"$WORK/api.log" 2>&1 &
    API_PID=$!
    for _ in $(seq 100); do
      curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null && break
      kill -0 "$API_PID" 2>/dev/null || die "candidate '$cand' exited: $(tail -3 "$WORK/api.log")"
      sleep 0.2
    done
    wrk -t2 -c"$CONNS" -d5s -s "$WORK/one.lua" "$url" >/dev/null
    t0=$(bench_ticks "$API_PID")
    b0=$(bench_ticks $BROKER)
    out=$(wrk -t2 -c"$CONNS" -d"${SECS}s" -s "$WORK/one.lua" "$url")
    t1=$(bench_ticks "$API_PID")
    b1=$(bench_ticks $BROKER)
    raw=""
    if [ "$RAW" = 1 ]; then
      raw=$(wrk -t2 -c"$CONNS" -d"${SECS}s" "http://127.0.0.1:$PORT/healthz" |
        awk '/Requests\/sec/ { print $2 }')
    fi
    kill "$API_PID"
    wait "$API_PID" 2>/dev/null || true
    API_PID=""
    rps=$(awk '/Requests\/sec/ { print $2 }' <<<"$out")
    n=$(awk '/requests in/ { print $1 }' <<<"$out")
    bad=$(awk '/Non-2xx/ { print $5 }' <<<"$out")
    broker="-"
    [ -n "$BROKER" ] && broker=$(per_req "$((b1 - b0))" "$n")
    line="$cand | $rps | ${bad:-0} | $(per_req "$((t1 - t0))" "$n") | $broker"
    [ "$RAW" = 1 ] && line="$line | $raw | $(awk -v a="$rps" -v b="$raw" 'BEGIN { printf "%.3f", a / b }')"
    echo "$line"
  done
done
echo "machine: $(nproc) x $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "reproduce: BENCH_ROUNDS=$ROUNDS BENCH_CONNS=$CONNS BENCH_SECONDS=$SECS BENCH_DELAY_MS=$DELAY BENCH_RAW=$RAW bench/api_ab.sh $(printf "%q " "$@")"
