# bench/lib.sh: what the stand-alone bench scripts (api_ab.sh, pace_broker.sh, produce.sh,
# recorder.sh) share; sourced, not run. The sourcing script sets REPO_DIR and die() first.
#
#   bench_build_dir REL...  the first of $SLUICE_BUILD_DIR, <repo>/build/bench, <repo>/build
#                           holding every REL as an executable (printed), or die naming them
#   bench_stack [VAR...]    unless SLUICE_KAFKA_BROKERS (and every VAR) is set, start the
#                           local stack (scripts/stack.sh, which honours SLUICE_STACK_DIR) and
#                           take its addresses; setting only some of them is an error
#   bench_broker_pid        the pid listening on the first address of SLUICE_KAFKA_BROKERS
#                           when the broker runs on this machine, else empty
#   bench_ticks PID...      summed user+system CPU of the pids in clock ticks (0 for none)

bench_build_dir() {
  local d rel ok
  for d in "${SLUICE_BUILD_DIR:-}" "$REPO_DIR/build/bench" "$REPO_DIR/build"; do
    [ -n "$d" ] || continue
    ok=1
    for rel in "$@"; do [ -x "$d/$rel" ] || ok=0; done
    [ "$ok" = 1 ] && { echo "$d"; return 0; }
  done
  die "$* not found in \$SLUICE_BUILD_DIR, $REPO_DIR/build/bench or $REPO_DIR/build: run bench/run.sh once (it builds them), or set SLUICE_BUILD_DIR"
}

bench_stack() {
  local v set=0 unset=0
  for v in SLUICE_KAFKA_BROKERS "$@"; do
    if [ -n "${!v:-}" ]; then set=$((set + 1)); else unset=$((unset + 1)); fi
  done
  if [ "$set" = 0 ]; then
    "$REPO_DIR/scripts/stack.sh" start >&2 || die "could not start the local stack"
    eval "$("$REPO_DIR/scripts/stack.sh" env)"
  elif [ "$unset" != 0 ]; then
    die "set all of SLUICE_KAFKA_BROKERS $* or none (then the local stack is used)"
  fi
  export SLUICE_KAFKA_BROKERS SLUICE_REDIS_URL SLUICE_PG_DSN
}

bench_broker_pid() {
  local port=${SLUICE_KAFKA_BROKERS%%,*}
  port=${port##*:}
  ss -Hltnp "sport = :$port" 2>/dev/null | sed -n 's/.*pid=\([0-9]*\).*/\1/p' | head -n1 || true
}

bench_ticks() {
  local t=0 x v
  for x in "$@"; do
    v=$(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$x/stat" 2>/dev/null || echo 0)
    t=$((t + ${v:-0}))
  done
  echo "$t"
}
