#!/usr/bin/env bash
# Recorder throughput benchmark (not a test): sl-test-outcomes --generate-outcomes publishes N
# synthetic outcome records (the consumer's output: deliveries, retries, dead letters with env,
# duplicates, deferrals) to a private topic; then sluice-recorder, in a fresh consumer group,
# writes them into PostgreSQL. Prints outcomes/s from the recorder's start to the moment every
# row is committed in PostgreSQL (offsets are committed within the next second), checks the
# row counts exactly, and prints the CPU split (recorder, its PostgreSQL backends), the WAL
# written, the recorder's peak RSS, the machine, and the exact command to reproduce.
#
#   bench/recorder.sh                    # 1,000,000 outcomes, 1000 endpoints
#
# Env (all optional):
#   SLUICE_KAFKA_BROKERS / SLUICE_PG_DSN   the stack to use; unset = the local stack
#                          (scripts/stack.sh start, which honours SLUICE_STACK_DIR /
#                          SLUICE_PORT_BASE)
#   SLUICE_BUILD_DIR       build dir with recorder/sluice-recorder and
#                          tests/integration/sl-test-{outcomes,topic} (default
#                          <repo>/build/bench, then <repo>/build)
#   SLUICE_MASTER_KEY      the recorder's (it signs the endpoint records it disables); unset =
#                          a random key for this run
#   SLUICE_RECORDER_BATCH  rows per batch (the recorder's own option; default 20000)
#   SLUICE_RECORDER_LANES  parallel write lanes (the recorder's own option; default 2)
#   BENCH_LOG=FILE         keep the recorder's log (debug, db context) in FILE
#   BENCH_RECORDS (1000000) BENCH_ENDPOINTS (1000) BENCH_PARTITIONS (4)
#   BENCH_TARGET (100000)  outcomes/s the report compares against
#   BENCH_KEEP_ROWS=1      keep the benchmark's rows in PostgreSQL (default: deleted afterwards,
#                          then the tables vacuumed so the next run starts from the same state)
#   BENCH_KEEP_TOPIC=1     keep the topic
#   BENCH_PG_ICU_LOCALE=L  run against a database of the run's own, on the same server, whose
#                          default collation is ICU's for locale L (en-US, de-DE...), with every
#                          migration of sql/ applied, dropped afterwards: most installations
#                          sort text linguistically, the local stack's database sorts bytes (C).
#                          Needs SLUICE_PG_DSN in key=value form.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$SCRIPT_DIR/.." && pwd)
N="${BENCH_RECORDS:-1000000}"
ENDPOINTS="${BENCH_ENDPOINTS:-1000}"
PARTITIONS="${BENCH_PARTITIONS:-4}"
TARGET="${BENCH_TARGET:-100000}"

die() { printf 'bench/recorder.sh: %s\n' "$*" >&2; exit 1; }

# shellcheck source=bench/lib.sh
. "$SCRIPT_DIR/lib.sh"
BUILD_DIR=$(bench_build_dir recorder/sluice-recorder tests/integration/sl-test-outcomes \
  tests/integration/sl-test-topic) || exit 1
RECORDER="$BUILD_DIR/recorder/sluice-recorder"
GEN="$BUILD_DIR/tests/integration/sl-test-outcomes"
TOPIC_TOOL="$BUILD_DIR/tests/integration/sl-test-topic"
command -v psql >/dev/null || die "psql not found (apt package postgresql-client-15)"
bench_stack SLUICE_PG_DSN
export SLUICE_MASTER_KEY="${SLUICE_MASTER_KEY:-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')}"
pg() { PGCONNECT_TIMEOUT=5 psql -X -q -At -v ON_ERROR_STOP=1 "$SLUICE_PG_DSN" "$@"; }
private_db=""
given_dsn="$SLUICE_PG_DSN" # the one to print: a private database is made anew by each run
if [ -n "${BENCH_PG_ICU_LOCALE:-}" ]; then
  [[ "$BENCH_PG_ICU_LOCALE" =~ ^[A-Za-z0-9_-]+$ ]] \
    || die "BENCH_PG_ICU_LOCALE: '$BENCH_PG_ICU_LOCALE' is not a locale name (en-US, de-DE...)"
  [[ "$SLUICE_PG_DSN" != *://* ]] || die "BENCH_PG_ICU_LOCALE needs SLUICE_PG_DSN in key=value form"
  admin_dsn="$SLUICE_PG_DSN dbname=postgres" # libpq: a keyword given twice takes the last value
  private_db="bench_icu_$(date +%s)_$$"
  PGCONNECT_TIMEOUT=5 psql -X -q -v ON_ERROR_STOP=1 "$admin_dsn" -c "create database $private_db \
    template template0 locale_provider icu icu_locale '$BENCH_PG_ICU_LOCALE' locale 'C'" \
    || die "could not create a database with ICU locale $BENCH_PG_ICU_LOCALE"
  SLUICE_PG_DSN="$SLUICE_PG_DSN dbname=$private_db"
  bash "$REPO_DIR/scripts/migrate.sh" "$SLUICE_PG_DSN" >/dev/null || {
    psql -X -q "$admin_dsn" -c "drop database if exists $private_db" >/dev/null 2>&1 || true
    die "the migrations of sql/ failed on the private database"
  }
fi
pg -c 'select 1 from delivery_attempts limit 0' >/dev/null \
  || die "no delivery_attempts table at SLUICE_PG_DSN: apply sql/ (scripts/stack.sh start does)"


prefix="bench$(date +%s)x$$"
group="$prefix-recorder"
topic=$("$TOPIC_TOOL" name bench.recorder)
"$TOPIC_TOOL" create "$topic" "$PARTITIONS" || die "could not create topic $topic"
logf=$(mktemp)
rec_pid=""
cleanup() {
  if [ -n "$rec_pid" ] && kill -0 "$rec_pid" 2>/dev/null; then
    kill -TERM "$rec_pid"; wait "$rec_pid" 2>/dev/null || true
  fi
  [ "${BENCH_KEEP_TOPIC:-0}" = 1 ] || "$TOPIC_TOOL" delete "$topic" >/dev/null 2>&1 || true
  if [ -n "$private_db" ]; then
    PGCONNECT_TIMEOUT=5 psql -X -q "$admin_dsn" -c "drop database if exists $private_db with (force)" \
      >/dev/null 2>&1 || true
  elif [ "${BENCH_KEEP_ROWS:-0}" != 1 ]; then
    pg -c "delete from delivery_attempts where event_id like '$prefix-%'" \
       -c "delete from endpoint_latency where endpoint_id like '$prefix-%'" \
       -c "delete from deliveries where event_id like '$prefix-%'" \
       -c "delete from dead_letters where event_id like '$prefix-%'" \
       -c "delete from endpoint_health where endpoint_id like '$prefix-%'" \
       >/dev/null 2>&1 || true
    # the deleted rows are dead tuples until vacuumed: left to autovacuum, that work ran during
    # the next run and slowed it (36-41k outcomes/s on a database after three runs, 54-65k
    # with the tables vacuumed first, same code, same hour)
    pg -c "vacuum (analyze) delivery_attempts, endpoint_latency, deliveries, dead_letters, endpoint_health" \
       >/dev/null 2>&1 || true
  fi
  if [ -n "${BENCH_LOG:-}" ]; then cp "$logf" "$BENCH_LOG" 2>/dev/null || true; fi
  rm -f "$logf"
}
trap cleanup EXIT

echo "publishing $N outcome records to $topic ..." >&2
gen_out=$("$GEN" --generate-outcomes "$N" --topic "$topic" --endpoints "$ENDPOINTS" \
          --prefix "$prefix" 2>/dev/null) || die "sl-test-outcomes failed"
field() { sed -n "s/.*$1=\([^ ]*\).*/\1/p" <<<"$gen_out"; }
events=$(field events); dead=$(field dead_letters); samples=$(field samples)

# Start right after a checkpoint: the WAL files written since the previous one are then recycled
# for this run's WAL, as on a server that has been writing for a while. A server that has not
# (a fresh stack) has none to recycle: the run creates its files, 13-18% slower (bench/README.md,
# "recorder.sh"); bench/run.sh makes one unjudged run first for that.
if pg -c checkpoint >/dev/null 2>&1; then ckpt="done"; else ckpt="not run (needs superuser or pg_checkpoint)"; fi
wal_files() { pg -c "select count(*) from pg_ls_waldir()" 2>/dev/null || echo "?"; }
wal_files0=$(wal_files)
collation=$(pg -c "select case when datlocprovider = 'i' then 'default collation ICU ' || daticulocale else 'default collation ' || datcollate || ' (libc)' end from pg_database where datname = current_database()")
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
echo "recording ..." >&2
wal0=$(pg -c "select pg_current_wal_lsn()")
t0=$(date +%s.%N)
SLUICE_TOPIC_OUTCOMES="$topic" SLUICE_RECORDER_GROUP="$group" SLUICE_LOG_LEVEL=debug \
  SLUICE_DEBUG=db "$RECORDER" 2>"$logf" &
rec_pid=$!
rows=0
deadline=$((SECONDS + 1800))
while :; do
  sleep 0.2
  kill -0 "$rec_pid" 2>/dev/null || die "sluice-recorder exited early; log: $(tail -5 "$logf")"
  # every "batch_written" line is a committed transaction; its rows are all present
  rows=$({ grep -o '"event":"batch_written","msg":"rows [0-9]*' "$logf" || true; } | awk '{ s += $NF } END { print s + 0 }')
  [ "$rows" -ge "$N" ] && break
  [ "$SECONDS" -lt "$deadline" ] || die "only $rows of $N rows after 30 minutes"
done
t1=$(date +%s.%N)
wal_bytes=$(pg -c "select pg_wal_lsn_diff(pg_current_wal_lsn(), '$wal0')::bigint")
wal_files1=$(wal_files)
backends=$(pg -c "select string_agg(pid::text, ' ') from pg_stat_activity where application_name = 'sluice-recorder'")
rec_cpu=$(bench_ticks "$rec_pid"); pg_cpu=$(bench_ticks $backends)
rec_hwm_kb=$(awk '/^VmHWM:/ { print $2 }' "/proc/$rec_pid/status" 2>/dev/null || echo 0)
kill -TERM "$rec_pid"; wait "$rec_pid" || die "sluice-recorder exited non-zero on SIGTERM"
rec_pid=""

tck=$(getconf CLK_TCK)
elapsed=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
rate=$(awk -v n="$N" -v e="$elapsed" 'BEGIN { printf "%.0f", n / e }')
range="event_id like '$prefix-%'"
got_attempts=$(pg -c "select count(*) from delivery_attempts where $range")
got_deliveries=$(pg -c "select count(*) from deliveries where $range")
got_dead=$(pg -c "select count(*) from dead_letters where $range")
got_samples=$(pg -c "select count(*) from endpoint_latency where endpoint_id like '$prefix-%'")
check="ok"
[ "$got_attempts" = "$N" ] && [ "$got_deliveries" = "$events" ] && [ "$got_dead" = "$dead" ] \
  && [ "$got_samples" = "$samples" ] || check="MISMATCH"

echo "== sluice-recorder benchmark =="
echo "generator:    $gen_out"
echo "outcomes/s:   $rate  ($N outcomes in $elapsed s from recorder start to the last row committed; target $TARGET)"
echo "rows:         delivery_attempts $got_attempts/$N, deliveries $got_deliveries/$events, dead_letters $got_dead/$dead, endpoint_latency $got_samples/$samples: $check"
echo "CPU:          recorder $(awk -v t="$rec_cpu" -v k="$tck" 'BEGIN { printf "%.2f", t / k }') s, its PostgreSQL backends $(awk -v t="$pg_cpu" -v k="$tck" 'BEGIN { printf "%.2f", t / k }') s (pids $backends)"
# wall time the write lanes spent per phase (summed over lanes; from the batch_written lines)
phases=$(sed -n 's/.*"event":"batch_written","msg":"rows [0-9]* .*copy \([0-9]*\) us apply \([0-9]*\) us dead \([0-9]*\) us commit \([0-9]*\) us.*/\1 \2 \3 \4/p' "$logf" \
  | awk '{ c += $1; a += $2; d += $3; m += $4; n++ } END { printf "%d transactions: copy %.2f s, apply %.2f s, dead letters %.2f s, commit %.2f s", n, c / 1e6, a / 1e6, d / 1e6, m / 1e6 }')
echo "WAL:          $(awk -v w="$wal_bytes" -v n="$N" 'BEGIN { printf "%.0f MB, %.0f bytes per outcome", w / 1e6, w / n }') (the whole server's, recorder start to last commit); WAL files $wal_files0 before, $wal_files1 after (more: created rather than recycled); checkpoint before the run: $ckpt"
echo "memory:       recorder peak RSS $(( ${rec_hwm_kb:-0} / 1024 )) MB (VmHWM, read before SIGTERM)"
echo "lanes:        ${SLUICE_RECORDER_LANES:-2} (SLUICE_RECORDER_LANES); $phases"
echo "machine:      nproc $(nproc), $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1), load average before run $load_before, after $(cut -d' ' -f1-3 /proc/loadavg)"
echo "batch:        ${SLUICE_RECORDER_BATCH:-20000} rows (SLUICE_RECORDER_BATCH)"
echo "database:     $collation"
echo "reproduce:    SLUICE_KAFKA_BROKERS=$SLUICE_KAFKA_BROKERS SLUICE_PG_DSN='$given_dsn' BENCH_RECORDS=$N BENCH_ENDPOINTS=$ENDPOINTS BENCH_PARTITIONS=$PARTITIONS${SLUICE_RECORDER_BATCH:+ SLUICE_RECORDER_BATCH=$SLUICE_RECORDER_BATCH}${SLUICE_RECORDER_LANES:+ SLUICE_RECORDER_LANES=$SLUICE_RECORDER_LANES}${BENCH_PG_ICU_LOCALE:+ BENCH_PG_ICU_LOCALE=$BENCH_PG_ICU_LOCALE} SLUICE_BUILD_DIR=$BUILD_DIR $SCRIPT_DIR/recorder.sh"
[ "$check" = ok ] || { echo "result:       row counts do not match" >&2; exit 1; }
if [ "$rate" -ge "$TARGET" ]; then
  echo "result:       target met ($rate >= $TARGET outcomes/s)"
else
  echo "result:       target missed ($rate < $TARGET outcomes/s)"
fi
