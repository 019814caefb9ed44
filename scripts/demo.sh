#!/usr/bin/env bash
# Sluice's main job, end to end, on this machine:
#
#   bash scripts/demo.sh
#
#  1. installs what is missing (scripts/setup.sh) and builds Sluice (build/demo)
#  2. starts (or reuses) the local stack: Kafka (KRaft), Redis, PostgreSQL (scripts/stack.sh)
#  3. starts a demo receiver that verifies every Standard Webhooks signature with Sluice's own
#     sl_verify() and rejects bad ones, and registers seven demo endpoints on it:
#       demo-healthy     answers 204 at once
#       demo-slow        answers after 2.5 s (flagged by `sluicectl slow`)
#       demo-flaky       500 on 30% of attempts (retried with backoff, then delivered)
#       demo-ratelimited 429 + Retry-After above 5/s; Sluice's shared limit is 6/s, so the
#                        endpoint pushes back now and then and Sluice pauses it
#       demo-unauth      401 (permanent: dead letter at once)
#       demo-dead        nothing listens (retries, breaker opens, dead letters)
#       demo-postback    affiliate postback: GET with click_id/payout macros in the URL
#  4. starts two sluice-consumer pods, the sluice-recorder and sluice-api (the HTTP API), makes
#     an admin API key, and registers three more endpoints THROUGH THE API, each subscribed to
#     the event types `invoice.*` (demo-crm, demo-billing, demo-ledger)
#  5. publishes a stream of demo events with sluice-produce, and invoice events through the
#     API (curl, Idempotency-Key; each fans out to the three subscribers), while
#     `sluicectl top` shows the live view (delivered/s, retries, dead letters, breakers, P95)
#  6. finishes with `sluicectl health`, `slow` and `dead-letters`, and the API's delivery log
#     of one fanned-out invoice event
#  7. prints the web console's URL (served by sluice-api, /console; the admin key opens it),
#     every process's /metrics URL and Prometheus's (started with the stack: scripts/stack.sh
#     start prometheus; it scrapes the demo's processes every second and evaluates
#     ops/prometheus/sluice-alerts.yml), and keeps everything up, with events still flowing at
#     a quarter of the rate, until Ctrl-C
# Ctrl-C at any point stops everything it started and leaves the stack running (stop it with
# `bash scripts/stack.sh stop`).
#
# Env: SLUICE_DEMO_DURATION_S (60)  how long events flow
#      SLUICE_DEMO_RATE (40)        events per second
#      SLUICE_DEMO_BIN_DIR          use these built binaries instead of building build/demo
#      SLUICE_DEMO_NO_TOP=1         no live view (logs only), e.g. in tests
#      SLUICE_DEMO_API_LISTEN (127.0.0.1:18088)  where the demo's sluice-api listens
#      SLUICE_DEMO_METRICS_PORT (18090)  metrics listeners on loopback: consumers pod-a and
#                                   pod-b on +1 and +2, the recorder on +3, sluice-api on +4
#      SLUICE_DEMO_HOLD (1)         0 = exit after step 6 instead of holding until Ctrl-C
#      SLUICE_STACK_DIR, SLUICE_PORT_BASE  as for scripts/stack.sh
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
DURATION="${SLUICE_DEMO_DURATION_S:-60}"
RATE="${SLUICE_DEMO_RATE:-40}"
say() { printf '\n\033[1m==== %s\033[0m\n' "$*"; }

if [ -z "${SLUICE_DEMO_BIN_DIR:-}" ]; then
  say "setup (packages, Kafka jars) and build"
  bash scripts/setup.sh
  cmake -S . -B build/demo -DCMAKE_BUILD_TYPE=Release -DSL_TESTS=ON >/dev/null
  cmake --build build/demo -j2 --target sluice-consumer sluice-recorder sluice-produce sluicectl \
    sluice-receiver sluice-api >/dev/null
  BIN="$REPO/build/demo"
else
  BIN="$SLUICE_DEMO_BIN_DIR"
fi
CTL="$BIN/ctl/sluicectl"

say "stack: Kafka, Redis, PostgreSQL, Prometheus"
bash scripts/stack.sh start
bash scripts/stack.sh start prometheus
eval "$(bash scripts/stack.sh env)"
export SLUICE_KAFKA_BROKERS SLUICE_REDIS_URL SLUICE_PG_DSN
STACK_DIR="${SLUICE_STACK_DIR:-$REPO/.stack}"
DEMO_DIR="$STACK_DIR/demo"
mkdir -p "$DEMO_DIR"

# One master key per stack, kept beside its data (git-ignored): endpoint secrets are
# encrypted with it in PostgreSQL and on the endpoints topic.
if [ ! -s "$DEMO_DIR/master.key" ]; then
  (umask 077 && openssl rand -hex 32 > "$DEMO_DIR/master.key")
fi
export SLUICE_MASTER_KEY
SLUICE_MASTER_KEY=$(cat "$DEMO_DIR/master.key")
# The demo delivers to its own receiver on loopback: exempt 127.0.0.0/8 from SSRF refusal.
export SLUICE_SSRF_ALLOW_CIDRS=127.0.0.0/8
# Demo-sized retry and breaker timings, so retries and dead letters show within a minute.
export SLUICE_RETRY_BASE_MS=1000 SLUICE_RETRY_CAP_MS=8000 SLUICE_MAX_ATTEMPTS=4
export SLUICE_BREAKER_THRESHOLD=5 SLUICE_BREAKER_COOLDOWN_MS=5000
export SLUICE_BREAKER_COOLDOWN_MAX_MS=20000 SLUICE_HTTP_TIMEOUT_MS=5000
export SLUICE_HTTP_CONNECT_TIMEOUT_MS=1000 SLUICE_LEASE_MS=10000 SLUICE_LOG_LEVEL=warn
# Metrics listeners (docs/METRICS.md); the demo's endpoints are few, so each gets its own
# series (metrics_endpoint_top).
MPORT="${SLUICE_DEMO_METRICS_PORT:-18090}"
export SLUICE_METRICS_ENDPOINT_TOP=20
mkdir -p "$SLUICE_STACK_PROMETHEUS_TARGETS"
cat > "$SLUICE_STACK_PROMETHEUS_TARGETS/demo.json.tmp" <<EOF
[{"targets": ["127.0.0.1:$((MPORT + 1))", "127.0.0.1:$((MPORT + 2))"], "labels": {"process": "sluice-consumer"}},
 {"targets": ["127.0.0.1:$((MPORT + 3))"], "labels": {"process": "sluice-recorder"}},
 {"targets": ["127.0.0.1:$((MPORT + 4))"], "labels": {"process": "sluice-api"}}]
EOF
mv -f "$SLUICE_STACK_PROMETHEUS_TARGETS/demo.json.tmp" "$SLUICE_STACK_PROMETHEUS_TARGETS/demo.json"

PIDS=()
cleanup() {
  trap - INT TERM EXIT
  say "stopping the demo processes"
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  echo "logs: $DEMO_DIR/*.log   (stack still running: bash scripts/stack.sh stop)"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "topics"
"$CTL" topics ensure --partitions "${SLUICE_PARTITIONS:-4}"

# The endpoints' shared signing secret: the receiver must know it to verify.
if [ ! -s "$DEMO_DIR/signing.secret" ]; then
  (umask 077 && printf 'whsec_%s\n' "$(openssl rand -base64 32)" > "$DEMO_DIR/signing.secret")
fi
SECRET=$(cat "$DEMO_DIR/signing.secret")

say "demo receiver (verifies every signature with sl_verify, rejects bad ones)"
coproc RECV { exec "$BIN/tests/receiver/sluice-receiver" --port 0 --secret "$SECRET" \
  --reject-bad-sig --ledger "$DEMO_DIR/ledger.jsonl" 2>"$DEMO_DIR/receiver.log"; }
PIDS+=("$RECV_PID")
read -r line <&"${RECV[0]}"
PORT=${line#port=}
BASE="http://127.0.0.1:$PORT"
echo "receiver on $BASE"
DEAD_PORT=$((PORT == 65535 ? 65534 : PORT + 1))  # nothing listens there (checked below)
if (exec 3<>"/dev/tcp/127.0.0.1/$DEAD_PORT") 2>/dev/null; then DEAD_PORT=1; fi

say "endpoints"
register() { # id url [flags...]
  local id=$1 url=$2
  shift 2
  # subscribed to order.* only, so the API's invoice events fan out to their three
  # subscribers alone (the stream below names its endpoint: filters do not apply to it)
  set -- --types 'order.*' "$@"
  if "$CTL" endpoints show "$id" >/dev/null 2>&1; then
    "$CTL" endpoints update "$id" --url "$url" "$@" >/dev/null
    "$CTL" endpoints enable "$id" >/dev/null 2>&1 || true
  else
    "$CTL" endpoints add --id "$id" --url "$url" --secret "$SECRET" "$@" >/dev/null
  fi
  printf '  %-18s %s\n' "$id" "${url%%\?*}"
}
register demo-healthy "$BASE/ok/demo-healthy"
register demo-slow "$BASE/slow/2500/demo-slow"
register demo-flaky "$BASE/flaky/30/demo-flaky"
register demo-ratelimited "$BASE/ratelimit/5/demo-ratelimited" --rate 6 --rate-period-ms 1000 \
  --burst 6
register demo-unauth "$BASE/unauth/demo-unauth"
register demo-dead "http://127.0.0.1:$DEAD_PORT/hook"
register demo-postback "$BASE/ok/demo-postback?click_id={click_id}&payout={payout}&goal={goal}" \
  --template --method GET

say "two consumers and the recorder"
i=1
for pod in pod-a pod-b; do
  SLUICE_INSTANCE_ID=$pod SLUICE_METRICS_LISTEN="127.0.0.1:$((MPORT + i))" \
    "$BIN/consumer/sluice-consumer" 2>"$DEMO_DIR/consumer-$pod.log" &
  PIDS+=("$!")
  i=$((i + 1))
done
if [ -x "$BIN/recorder/sluice-recorder" ]; then
  SLUICE_METRICS_LISTEN="127.0.0.1:$((MPORT + 3))" \
    "$BIN/recorder/sluice-recorder" 2>"$DEMO_DIR/recorder.log" &
  PIDS+=("$!")
else
  echo "sluice-recorder not built: history commands will have nothing to show" >&2
fi

say "the HTTP API: sluice-api, an admin key, three endpoints subscribed to invoice.*"
export SLUICE_API_LISTEN="${SLUICE_DEMO_API_LISTEN:-127.0.0.1:18088}"
API="http://$SLUICE_API_LISTEN"
# an admin key per stack, kept beside its data (git-ignored); made before the API starts, as
# a running sluice-api sees a new key within api_key_refresh_ms
if [ ! -s "$DEMO_DIR/api.key" ]; then
  (umask 077 && "$CTL" keys create --name demo --scopes admin --json \
     | python3 -c 'import json,sys; print(json.load(sys.stdin)["key"])' > "$DEMO_DIR/api.key")
fi
KEY=$(cat "$DEMO_DIR/api.key")
SLUICE_METRICS_LISTEN="127.0.0.1:$((MPORT + 4))" "$BIN/api/sluice-api" 2>"$DEMO_DIR/api.log" &
PIDS+=("$!")
for _ in $(seq 100); do
  curl -sf "$API/readyz" >/dev/null && break
  sleep 0.2
done
curl -sf "$API/readyz" >/dev/null || { echo "sluice-api did not become ready: $DEMO_DIR/api.log" >&2; exit 1; }
api() { # method path [json]
  curl -sS -X "$1" "$API$2" -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
    ${3:+-d "$3"}
}
for id in demo-crm demo-billing demo-ledger; do
  body="{\"id\":\"$id\",\"url\":\"$BASE/ok/$id\",\"types\":[\"invoice.*\"]}"
  code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$API/v1/endpoints" \
    -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' -d "$body")
  if [ "$code" = 409 ]; then  # there from an earlier run: same settings, enabled
    api PATCH "/v1/endpoints/$id" "{\"url\":\"$BASE/ok/$id\",\"types\":[\"invoice.*\"]}" >/dev/null
    api POST "/v1/endpoints/$id/enable" >/dev/null
  elif [ "$code" != 201 ]; then
    echo "registering $id through the API failed (HTTP $code)" >&2; exit 1
  fi
  printf '  %-18s %s  (types invoice.*, registered with POST %s/v1/endpoints)\n' "$id" \
    "$BASE/ok/$id" "$API"
done
# The receiver verifies signatures with the demo's shared secret: give the API-made
# endpoints that secret too (sluicectl's --secret; the API generated its own).
for id in demo-crm demo-billing demo-ledger; do
  "$CTL" endpoints rotate-secret "$id" --secret "$SECRET" --overlap-s 0 >/dev/null
done
echo "API: $API  (key in $DEMO_DIR/api.key; docs/API.md, api/openapi.yaml)"
echo "one fan-out event, as an application would send it:"
echo "  curl -X POST $API/v1/events -H \"Authorization: Bearer \$KEY\" \\"
echo "       -H 'Content-Type: application/json' -H 'Idempotency-Key: inv-1' \\"
echo "       -d '{\"type\":\"invoice.paid\",\"body\":{\"invoice\":1,\"amount\":4200}}'"
RUN=$(printf '%x' "$(date +%s)")
api POST /v1/events "{\"id\":\"inv_${RUN}_0\",\"type\":\"invoice.paid\",\"body\":{\"invoice\":0}}"
echo

# api_stream SECONDS INTERVAL TAG: invoice events through the API (curl, Idempotency-Key),
# one every INTERVAL seconds; the HTTP status of each answer goes to stdout.
api_stream() {
  local n=1 end=$((SECONDS + $1))
  while [ "$SECONDS" -lt "$end" ]; do
    curl -sS -o /dev/null -w '%{http_code}\n' -X POST "$API/v1/events" \
      -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
      -H "Idempotency-Key: inv-$RUN-$3-$n" \
      -d "{\"type\":\"invoice.paid\",\"body\":{\"invoice\":$n,\"amount\":$((n * 7 % 9000 + 100))}}"
    n=$((n + 1))
    sleep "$2"
  done
}
# produce_stream SECONDS RATE: the demo's mix of events, RATE per second, into
# sluice-produce. Run it in the background: the subshell becomes sluice-produce (exec), so
# $! is sluice-produce and a TERM to it ends the stream (the generator then dies on its
# closed pipe).
produce_stream() {
  exec "$BIN/producer/sluice-produce" --quiet < <(python3 - "$1" "$2" <<'PY'
import json, random, sys, time
duration, rate = float(sys.argv[1]), float(sys.argv[2])
eps = ["demo-healthy"] * 6 + ["demo-slow", "demo-flaky", "demo-flaky", "demo-ratelimited",
       "demo-unauth", "demo-dead", "demo-postback", "demo-postback"]
run = "%x" % int(time.time() * 1000)
t0, n = time.time(), 0
while time.time() - t0 < duration:
    ep = random.choice(eps)
    ev = {"id": f"evt_{run}_{n}", "endpoint": ep, "type": "order.paid",
          "body": {"order": n, "amount": random.randint(100, 99999), "currency": "EUR"}}
    if ep == "demo-postback":
        ev["macros"] = {"click_id": f"clk-{random.getrandbits(48):x}",
                        "payout": f"{random.uniform(1, 90):.2f}", "goal": "deposit"}
    print(json.dumps(ev), flush=True)
    n += 1
    time.sleep(max(0.0, t0 + n / rate - time.time()))
PY
)
}

say "publishing ~$RATE events/s for ${DURATION}s (sluice-produce) and 2 invoice events/s (API)"
api_stream "$DURATION" 0.5 a >"$DEMO_DIR/api-publish.out" 2>&1 &
API_PUB=$!
PIDS+=("$API_PUB")
produce_stream "$DURATION" "$RATE" >"$DEMO_DIR/produce.out" 2>"$DEMO_DIR/produce.log" &
PROD=$!
PIDS+=("$PROD")

TOP_SECS=$((DURATION + 15))
if [ "${SLUICE_DEMO_NO_TOP:-0}" = 1 ]; then
  wait "$PROD" || true
  sleep 15
else
  say "live view for ${TOP_SECS}s (Ctrl-C stops the demo)"
  "$CTL" top --duration-s "$TOP_SECS" || true
fi
wait "$PROD" 2>/dev/null || true
wait "$API_PUB" 2>/dev/null || true
echo "producer: $(cat "$DEMO_DIR/produce.out")"
echo "API publishes: $(sort "$DEMO_DIR/api-publish.out" | uniq -c | awk '{printf "%s x HTTP %s  ", $1, $2}')"

say "sluicectl health"
"$CTL" health || true
say "sluicectl slow"
"$CTL" slow || true
say "sluicectl dead-letters"
"$CTL" dead-letters || true
say "the API's delivery log of the first invoice event (GET /v1/events/inv_${RUN}_0/deliveries)"
api GET "/v1/events/inv_${RUN}_0/deliveries" | python3 -c '
import json, sys
d = json.load(sys.stdin)
for x in d.get("data", []):
    a = x["attempts_log"][-1] if x["attempts_log"] else {}
    print("  %-14s %-16s attempts=%s http=%s latency_ms=%s"
          % (x["endpoint"], x["state"], x["attempts"], x["last_status"], a.get("latency_ms")))
' || true

if [ "${SLUICE_DEMO_HOLD:-1}" = 1 ]; then
  HOLD_RATE=$((RATE / 4 > 0 ? RATE / 4 : 1))
  produce_stream 31536000 "$HOLD_RATE" >"$DEMO_DIR/produce-hold.out" 2>"$DEMO_DIR/produce-hold.log" &
  PIDS+=("$!")
  api_stream 31536000 2 b >"$DEMO_DIR/api-publish-hold.out" 2>&1 &
  PIDS+=("$!")
  say "up until Ctrl-C"
  echo "web console:  $API/console/   (sign in with the admin key in $DEMO_DIR/api.key)"
  echo "metrics:      consumer pod-a  http://127.0.0.1:$((MPORT + 1))/metrics"
  echo "              consumer pod-b  http://127.0.0.1:$((MPORT + 2))/metrics"
  echo "              recorder        http://127.0.0.1:$((MPORT + 3))/metrics"
  echo "              sluice-api      http://127.0.0.1:$((MPORT + 4))/metrics"
  echo "              (and /healthz, /readyz on each)"
  echo "Prometheus:   $SLUICE_STACK_PROMETHEUS_URL   (alerts: $SLUICE_STACK_PROMETHEUS_URL/alerts)"
  echo "events keep flowing: ~$HOLD_RATE/s through sluice-produce, one invoice every 2 s through the API"
  echo "Ctrl-C stops the demo's processes (the stack and Prometheus stay up)"
  echo "by hand on this stack: export SLUICE_MASTER_KEY=\$(cat $DEMO_DIR/master.key) (its endpoints are sealed with it)"
  while :; do
    sleep 3600 &
    HOLD_SLEEP=$!
    PIDS+=("$HOLD_SLEEP")
    wait "$HOLD_SLEEP" || true
  done
fi
say "done (by hand on this stack: export SLUICE_MASTER_KEY=\$(cat $DEMO_DIR/master.key); README, \"Running the processes by hand\")"
