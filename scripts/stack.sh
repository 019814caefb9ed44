#!/usr/bin/env bash
# Sluice local stack: REAL Apache Kafka (KRaft), Redis and PostgreSQL on 127.0.0.1, private
# ports, all data and logs under one directory. No Docker. Prerequisite: scripts/setup.sh.
#
#   scripts/stack.sh start    start what is down, wait until ready, create topics, migrate db
#   scripts/stack.sh stop     stop all three (SIGTERM, bounded wait, then SIGKILL)
#   scripts/stack.sh status   one line per service; exit 1 if any is down
#   scripts/stack.sh reset    stop, then delete the stack's data and logs
#   scripts/stack.sh env      print `export` lines: eval "$(scripts/stack.sh env)"
#
# Optional service, never started by default: Prometheus (Debian's package), scraping every
# 1 s the targets listed in $STACK_DIR/prometheus/targets/*.json (file-based discovery,
# written by the demo and tests: [{"targets": ["127.0.0.1:PORT"], "labels": {"process":
# "sluice-consumer"}}]) and evaluating ops/prometheus/sluice-alerts.yml (docs/OPERATIONS.md,
# "Monitoring"). Data and log under $STACK_DIR/prometheus.
#   scripts/stack.sh start --prometheus   the stack plus Prometheus (or SLUICE_STACK_PROMETHEUS=1)
#   scripts/stack.sh start|stop SERVICE.. only those of kafka, redis, postgres, prometheus
#                                         (`start prometheus` next to a running stack; a
#                                         second start of a running Prometheus reloads its
#                                         configuration and rules)
#
# Env (all optional):
#   SLUICE_STACK_DIR       data+logs (default <repo>/.stack, git-ignored)
#   SLUICE_PORT_BASE=N     kafka N, kafka controller N+1, redis N+2, postgres N+3 (prometheus N+4)
#   SLUICE_KAFKA_PORT (19092) SLUICE_KAFKA_CONTROLLER_PORT (19093) SLUICE_REDIS_PORT (16379)
#   SLUICE_PG_PORT (15432)  -- explicit ports beat SLUICE_PORT_BASE, which beats the ports
#                              recorded in the stack dir by its last start, which beat defaults
#   SLUICE_STACK_PROMETHEUS_PORT (19090)  Prometheus's HTTP port, recorded like the others
#   SLUICE_STACK_PROMETHEUS=1  start Prometheus too (as --prometheus)
#   SLUICE_STACK_PROMETHEUS_READY_TIMEOUT  seconds (default 60)
#   SLUICE_STACK_PROMETHEUS_RULES  rule file (default <repo>/ops/prometheus/sluice-alerts.yml)
#   (Prometheus's variables are SLUICE_STACK_*: the processes refuse unknown SLUICE_* names)
#   SLUICE_STACK_KAFKA_NODES=1|3  one Kafka node (default) or a three-node cluster with
#                          replication factor 3 and min.insync.replicas 2 (also start
#                          --kafka-nodes=3; recorded like the ports; nodes 2 and 3 listen on
#                          SLUICE_PORT_BASE+5/+6 and +7/+8, or 19097/19098 and 19099/19100)
#   SLUICE_STACK_REDIS_CLUSTER=0|1  one Redis (default) or a Redis Cluster of six
#                          redis-server processes, 3 masters + 3 replicas (also start
#                          --redis-cluster; recorded like the ports). Node 1 listens on the
#                          Redis port (SLUICE_PORT_BASE+2), nodes 2..6 on SLUICE_PORT_BASE+9..+13
#                          (without a base: Redis port+7..+11, 16386..16390); each node's
#                          cluster bus on its port+10000. Nodes 1-3 start as the masters and
#                          are the seeds in `env`'s SLUICE_REDIS_URL=redis-cluster://...
#   SLUICE_STACK_REDIS_READY_TIMEOUT  seconds for a Redis Cluster to reach cluster_state:ok
#                          on every node (default 60)
#   SLUICE_PARTITIONS      partitions of sluice.deliveries and sluice.outcomes (default 4)
#   SLUICE_CACHE_DIR       where setup.sh put the Kafka jars (default $HOME/.cache/sluice)
#   SLUICE_KAFKA_HEAP      broker heap flags (default "-Xms512m -Xmx512m")
#   SLUICE_KAFKA_READY_TIMEOUT  seconds (default 120)
#   SLUICE_PG_BIN          PostgreSQL 15 server binaries (default /usr/lib/postgresql/15/bin)
#   SLUICE_PG_OS_USER      OS user that runs postgres when this script runs as root (default sluice)
#   SLUICE_SQL_DIR         migrations sql/NNNN_*.sql (default <repo>/sql)
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$SCRIPT_DIR/.." && pwd)
KAFKA_VERSION=4.3.1
CACHE_DIR="${SLUICE_CACHE_DIR:-${HOME:-/root}/.cache/sluice}"
KAFKA_HOME_DIR="$CACHE_DIR/kafka-$KAFKA_VERSION"
KAFKA_LIBS="$KAFKA_HOME_DIR/libs"
STACK_DIR="${SLUICE_STACK_DIR:-$REPO_DIR/.stack}"
case "$STACK_DIR" in /*) ;; *) STACK_DIR="$PWD/$STACK_DIR" ;; esac
STACK_DIR="${STACK_DIR%/}"
PG_BIN="${SLUICE_PG_BIN:-/usr/lib/postgresql/15/bin}"
SQL_DIR="${SLUICE_SQL_DIR:-$REPO_DIR/sql}"
PARTITIONS="${SLUICE_PARTITIONS:-4}"
KAFKA_READY_TIMEOUT="${SLUICE_KAFKA_READY_TIMEOUT:-120}"
KAFKA_HEAP="${SLUICE_KAFKA_HEAP:--Xms512m -Xmx512m}"
STOP_TIMEOUT="${SLUICE_STOP_TIMEOUT:-60}"
LC_COLLATE=C   # glob order of sql/NNNN_*.sql

K_DIR="$STACK_DIR/kafka"; K_CONF="$K_DIR/config"; K_DATA="$K_DIR/data"
K_LOG="$K_DIR/broker.out"; K_PID="$K_DIR/kafka.pid"; K_READY="$K_DIR/ready.pid"
R_DIR="$STACK_DIR/redis"; R_CONF="$R_DIR/redis.conf"; R_LOG="$R_DIR/redis.log"; R_PID="$R_DIR/redis.pid"
P_DIR="$STACK_DIR/pg"; P_DATA="$P_DIR/data"; P_SOCK="$P_DIR/run"; P_LOG="$P_DIR/postgres.log"
PR_DIR="$STACK_DIR/prometheus"; PR_CONF="$PR_DIR/prometheus.yml"; PR_DATA="$PR_DIR/data"
PR_LOG="$PR_DIR/prometheus.log"; PR_PID="$PR_DIR/prometheus.pid"; PR_TARGETS="$PR_DIR/targets"
PR_RULES="${SLUICE_STACK_PROMETHEUS_RULES:-$REPO_DIR/ops/prometheus/sluice-alerts.yml}"
PR_READY_TIMEOUT="${SLUICE_STACK_PROMETHEUS_READY_TIMEOUT:-60}"
PORTS_FILE="$STACK_DIR/ports.env"

say()  { printf '[stack] %s\n' "$*"; }
warn() { printf '[stack] WARNING: %s\n' "$*" >&2; }
die()  { printf '[stack] ERROR: %s\n' "$*" >&2; exit 1; }
# fail SERVICE LOGFILE MESSAGE: name the service and its log, show the log's tail, exit 1.
fail() {
  local svc=$1 log=$2; shift 2
  printf '[stack] ERROR: %s: %s\n' "$svc" "$*" >&2
  if [ -n "$log" ]; then
    printf '[stack] %s log: %s\n' "$svc" "$log" >&2
    if [ -s "$log" ]; then
      printf -- '----- last 40 lines of %s -----\n' "$log" >&2
      tail -n 40 "$log" >&2
      if grep -qE ' (ERROR|FATAL) |Exception|Error:' "$log"; then
        printf -- '----- first error lines of %s -----\n' "$log" >&2
        grep -m 10 -E ' (ERROR|FATAL) |Exception|Error:' "$log" >&2 || true
      fi
      printf -- '-----\n' >&2
    fi
  fi
  local p
  for p in ${FAIL_KILL_PID:-}; do
    if kill -0 "$p" 2>/dev/null; then
      printf '[stack] %s: stopping the half-started process (pid %s)\n' "$svc" "$p" >&2
      stop_pid "$svc" "$p" 15
    fi
  done
  exit 1
}

# fail_pre SERVICE LOGFILE MESSAGE: a precondition failed before the service was launched,
# so its log (if any) is from an earlier run: name it, do not dump it.
fail_pre() {
  printf '[stack] ERROR: %s: %s\n[stack] %s log: %s (not written by this run)\n' "$1" "$3" "$1" "$2" >&2
  exit 1
}

# ------------------------------------------------------------------------- ports
valid_port() { [[ "$1" =~ ^[0-9]+$ ]] && [ "$1" -ge 1 ] && [ "$1" -le 65535 ]; }

resolve_ports() {
  local rk="" rc="" rr="" rp="" rm="" rn="" rrc="" key val
  if [ -f "$PORTS_FILE" ]; then
    while IFS='=' read -r key val; do
      case "$key" in
        kafka) rk=$val ;; kafka_controller) rc=$val ;; redis) rr=$val ;; postgres) rp=$val ;;
        prometheus) rm=$val ;; kafka_nodes) rn=$val ;; redis_cluster) rrc=$val ;;
      esac
    done < "$PORTS_FILE"
  fi
  local dk=19092 dc=19093 dr=16379 dp=15432 dm=19090
  if [ -n "${SLUICE_PORT_BASE:-}" ]; then
    valid_port "$SLUICE_PORT_BASE" || die "SLUICE_PORT_BASE=$SLUICE_PORT_BASE is not a port number"
    dk=$SLUICE_PORT_BASE; dc=$((SLUICE_PORT_BASE + 1)); dr=$((SLUICE_PORT_BASE + 2)); dp=$((SLUICE_PORT_BASE + 3))
    dm=$((SLUICE_PORT_BASE + 4))
  elif [ -n "$rk$rc$rr$rp$rm" ]; then
    dk=${rk:-$dk}; dc=${rc:-$dc}; dr=${rr:-$dr}; dp=${rp:-$dp}; dm=${rm:-$dm}
  fi
  KAFKA_PORT="${SLUICE_KAFKA_PORT:-$dk}"
  KAFKA_CPORT="${SLUICE_KAFKA_CONTROLLER_PORT:-$dc}"
  REDIS_PORT="${SLUICE_REDIS_PORT:-$dr}"
  PG_PORT="${SLUICE_PG_PORT:-$dp}"
  PROM_PORT="${SLUICE_STACK_PROMETHEUS_PORT:-$dm}"
  local p
  for p in "$KAFKA_PORT" "$KAFKA_CPORT" "$REDIS_PORT" "$PG_PORT" "$PROM_PORT"; do
    valid_port "$p" || die "invalid port '$p' (check SLUICE_*_PORT / SLUICE_PORT_BASE)"
  done
  KAFKA_NODES="${KAFKA_NODES_ARG:-${SLUICE_STACK_KAFKA_NODES:-${rn:-1}}}"
  case "$KAFKA_NODES" in 1|3) ;; *) die "Kafka nodes '$KAFKA_NODES': expected 1 or 3 (SLUICE_STACK_KAFKA_NODES / --kafka-nodes)" ;; esac
  local n
  for ((n = 2; n <= KAFKA_NODES; n++)); do
    valid_port "$(kcport "$n")" || die "Kafka node $n's ports $(kport "$n")/$(kcport "$n") are out of range"
  done
  REDIS_CLUSTER="${REDIS_CLUSTER_ARG:-${SLUICE_STACK_REDIS_CLUSTER:-${rrc:-0}}}"
  case "$REDIS_CLUSTER" in 0|1) ;; *) die "Redis cluster '$REDIS_CLUSTER': expected 0 or 1 (SLUICE_STACK_REDIS_CLUSTER / --redis-cluster)" ;; esac
  if [ "$REDIS_CLUSTER" = 1 ]; then
    for ((n = 1; n <= REDIS_CLUSTER_NODES; n++)); do
      valid_port "$(($(rport "$n") + 10000))" || die "Redis Cluster node $n's port $(rport "$n") leaves no room for its cluster bus port (+10000): pick a lower SLUICE_PORT_BASE"
    done
  fi
  # What the running services were started with (for mismatch detection).
  REC_KAFKA=$rk; REC_REDIS=$rr; REC_PG=$rp; REC_PROM=$rm
}

record_ports() {
  printf 'kafka=%s\nkafka_controller=%s\nredis=%s\npostgres=%s\nprometheus=%s\nkafka_nodes=%s\nredis_cluster=%s\n' \
    "$KAFKA_PORT" "$KAFKA_CPORT" "$REDIS_PORT" "$PG_PORT" "$PROM_PORT" "$KAFKA_NODES" "$REDIS_CLUSTER" > "$PORTS_FILE.tmp"
  mv -f "$PORTS_FILE.tmp" "$PORTS_FILE"
}

# Is anything listening on 127.0.0.1:PORT (or the wildcard address)?
port_busy() {
  if command -v ss >/dev/null 2>&1; then
    [ -n "$(ss -Hltn "sport = :$1" 2>/dev/null)" ]
  else
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
  fi
}
port_owner() {
  if command -v ss >/dev/null 2>&1; then
    ss -Hltnp "sport = :$1" 2>/dev/null | sed -n 's/.*users:((\(.*\)))/\1/p' | head -n1
  fi
}
check_port_free() { # SERVICE PORT LOG
  if port_busy "$2"; then
    local who; who=$(port_owner "$2")
    fail_pre "$1" "$3" "port $2 on 127.0.0.1 is already in use by another process${who:+ ($who)}; pick other ports with SLUICE_PORT_BASE or SLUICE_*_PORT"
  fi
}

# ------------------------------------------------------------------------- process helpers
proc_cmdline() { tr '\0' ' ' < "/proc/$1/cmdline" 2>/dev/null || true; }
# alive PID: running, and not a zombie waiting to be reaped (a killed daemon whose parent has
# not reaped it yet still answers kill -0; taking it for running would skip a restart)
alive() {
  kill -0 "$1" 2>/dev/null || return 1
  local st; st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
  [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}
read_pid() { local p=""; [ -f "$1" ] && read -r p < "$1" 2>/dev/null; [[ "$p" =~ ^[0-9]+$ ]] && echo "$p"; }

kafka_pid_of() { # I
  local N_DIR N_CONF N_DATA N_LOG N_PID N_PORT N_CPORT pid
  kafka_node_vars "$1"
  pid=$(read_pid "$N_PID") || return 1
  alive "$pid" || return 1
  [[ "$(proc_cmdline "$pid")" == *"kafka.Kafka $N_CONF/server.properties"* ]] || return 1
  echo "$pid"
}
kafka_pid() { kafka_pid_of 1; }
redis_pid() {
  local pid; pid=$(read_pid "$R_PID") || return 1
  alive "$pid" || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = redis-server ] || return 1
  echo "$pid"
}
pg_pid() {
  local pid; pid=$(read_pid "$P_DATA/postmaster.pid") || return 1
  alive "$pid" || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = postgres ] || return 1
  echo "$pid"
}
prom_pid() {
  local pid; pid=$(read_pid "$PR_PID") || return 1
  alive "$pid" || return 1
  [[ "$(proc_cmdline "$pid")" == *"--config.file=$PR_CONF "* ]] || return 1
  echo "$pid"
}

# stop_pid NAME PID TIMEOUT: SIGTERM, wait up to TIMEOUT s, then SIGKILL.
stop_pid() {
  local name=$1 pid=$2 timeout=$3 i
  kill -TERM "$pid" 2>/dev/null || return 0
  for ((i = 0; i < timeout * 5; i++)); do
    alive "$pid" || return 0
    sleep 0.2
  done
  warn "$name (pid $pid) still running after ${timeout}s, sending SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do alive "$pid" || return 0; sleep 0.1; done
  warn "$name (pid $pid) survived SIGKILL"
}

# ------------------------------------------------------------------------- Kafka
# Kafka runs as one node (the default) or as a cluster of SLUICE_STACK_KAFKA_NODES=3 nodes
# (or `start --kafka-nodes=3`): every node a combined broker+controller, all nodes voters of
# one static KRaft quorum. Node 1 lives in $K_DIR with the ports above; node i > 1 lives in
# $K_DIR/node<i> with broker port KAFKA_PORT+2i+1 and controller port KAFKA_PORT+2i+2 (with
# SLUICE_PORT_BASE=N: node 2 on N+5/N+6, node 3 on N+7/N+8). A cluster replicates every
# topic three times and acknowledges a write once two replicas have it
# (default.replication.factor=3, min.insync.replicas=2), as production clusters do.
kport() { if [ "$1" = 1 ]; then echo "$KAFKA_PORT"; else echo $((KAFKA_PORT + 2 * $1 + 1)); fi; }
kcport() { if [ "$1" = 1 ]; then echo "$KAFKA_CPORT"; else echo $((KAFKA_PORT + 2 * $1 + 2)); fi; }
kname() { if [ "$1" = 1 ]; then echo kafka; else echo "kafka-$1"; fi; }
# kafka_node_vars I: N_DIR N_CONF N_DATA N_LOG N_PID N_PORT N_CPORT of node I
kafka_node_vars() {
  if [ "$1" = 1 ]; then N_DIR=$K_DIR; else N_DIR="$K_DIR/node$1"; fi
  N_CONF="$N_DIR/config"; N_DATA="$N_DIR/data"; N_LOG="$N_DIR/broker.out"; N_PID="$N_DIR/kafka.pid"
  N_PORT=$(kport "$1"); N_CPORT=$(kcport "$1")
}
kafka_bootstrap() {
  local i out=""
  for ((i = 1; i <= KAFKA_NODES; i++)); do out="$out${out:+,}127.0.0.1:$(kport "$i")"; done
  echo "$out"
}

java_tool() { # run a short-lived Kafka tool JVM (StorageTool, KafkaReady); extra classpath in $JT_CP
  java -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
    -Dlog4j2.configurationFile="$K_CONF/log4j2-tools.properties" \
    -cp "${JT_CP:+$JT_CP:}$KAFKA_LIBS/*" "$@"
}

kafka_prereqs() {
  command -v java >/dev/null 2>&1 || fail_pre kafka "$K_LOG" "java not found (apt package openjdk-17-jdk-headless; run scripts/setup.sh)"
  if [ ! -f "$KAFKA_HOME_DIR/.complete" ] || [ ! -f "$KAFKA_LIBS/kafka_2.13-$KAFKA_VERSION.jar" ]; then
    fail_pre kafka "$K_LOG" "Kafka $KAFKA_VERSION jars missing or incomplete in $KAFKA_LIBS: run scripts/setup.sh"
  fi
}

kafka_write_config() { # I
  local i=$1 j voters="" rf=1 isr=1
  for ((j = 1; j <= KAFKA_NODES; j++)); do voters="$voters${voters:+,}$j@127.0.0.1:$(kcport "$j")"; done
  if [ "$KAFKA_NODES" -ge 3 ]; then rf=3; isr=2; fi
  kafka_node_vars "$i"
  mkdir -p "$N_CONF" "$N_DATA"
  # Static quorum (controller.quorum.voters) rather than --standalone's dynamic quorum: the
  # voter endpoints then live in this file, not in the metadata log, so a later start with
  # other ports still works on the same data dirs.
  cat > "$N_CONF/server.properties" <<EOF
# Written by scripts/stack.sh on every start. Node $i of $KAFKA_NODES, combined
# broker+controller (KRaft), loopback only. Based on Kafka 4.x config/server.properties.
process.roles=broker,controller
node.id=$i
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$N_PORT,CONTROLLER://127.0.0.1:$N_CPORT
advertised.listeners=PLAINTEXT://127.0.0.1:$N_PORT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$N_DATA
num.partitions=1
auto.create.topics.enable=false
default.replication.factor=$rf
min.insync.replicas=$isr
offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$isr
share.coordinator.state.topic.num.partitions=1
group.initial.rebalance.delay.ms=0
# The log cleaner allocates this buffer on the heap at start-up (default 128 MiB).
log.cleaner.dedupe.buffer.size=33554432
EOF
  cat > "$N_CONF/log4j2-server.properties" <<'EOF'
status = warn
name = sluice-kafka-broker
appender.out.type = Console
appender.out.name = STDOUT
appender.out.target = SYSTEM_OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = STDOUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.reqchan.name = kafka.network.RequestChannel$
logger.reqchan.level = WARN
EOF
  cat > "$N_CONF/log4j2-tools.properties" <<'EOF'
status = warn
name = sluice-kafka-tools
appender.err.type = Console
appender.err.name = STDERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = STDERR
EOF
}

# kafka_format I...: format the data dir of every listed node that has none, all with the
# cluster id kept in $K_DIR/cluster.id (made on the first format). Formats run in parallel.
kafka_format() {
  local i cid todo=() pids=() log="$K_DIR/format.log"
  for i in "$@"; do
    kafka_node_vars "$i"
    [ -f "$N_DATA/meta.properties" ] || todo+=("$i")
  done
  [ "${#todo[@]}" -gt 0 ] || return 0
  if [ -s "$K_DIR/cluster.id" ]; then
    cid=$(cat "$K_DIR/cluster.id")
  else
    cid=$(java_tool kafka.tools.StorageTool random-uuid 2>"$log") || fail kafka "$log" "StorageTool random-uuid failed"
    echo "$cid" > "$K_DIR/cluster.id"
  fi
  for i in "${todo[@]}"; do
    kafka_node_vars "$i"
    say "$(kname "$i"): formatting $N_DATA (cluster id $cid)"
    java_tool kafka.tools.StorageTool format -t "$cid" -c "$N_CONF/server.properties" >"$N_DIR/format.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!todo[@]}"; do
    kafka_node_vars "${todo[$i]}"
    wait "${pids[$i]}" || fail "$(kname "${todo[$i]}")" "$N_DIR/format.log" "StorageTool format failed"
  done
}

# Compile scripts/KafkaReady.java once per content hash into the cache (javac is part of the
# JDK); falls back to single-file source launch when that is not possible.
kafka_ready_tool() {
  local src="$SCRIPT_DIR/KafkaReady.java" sum dir tmp
  sum=$(sha256sum "$src" | cut -c1-16)
  dir="$KAFKA_HOME_DIR/tools/kafkaready-$sum"
  if [ ! -f "$dir/KafkaReady.class" ] && command -v javac >/dev/null 2>&1; then
    tmp="$dir.tmp.$$"
    rm -rf "$tmp"; mkdir -p "$tmp"
    if javac -nowarn -cp "$KAFKA_LIBS/*" -d "$tmp" "$src" >"$K_DIR/javac.log" 2>&1; then
      mv -T "$tmp" "$dir" 2>/dev/null || rm -rf "$tmp"   # lost a race with a parallel start: fine
    else
      rm -rf "$tmp"
      warn "javac of $src failed (see $K_DIR/javac.log); using source launch"
    fi
  fi
  if [ -f "$dir/KafkaReady.class" ]; then
    KR_CP=$dir; KR_MAIN=KafkaReady
  else
    KR_CP=""; KR_MAIN=$src
  fi
}

# The node count a data dir was formatted for must not change under it (the quorum's voters
# are part of every node's identity): refuse, and say how to get the other shape.
kafka_check_shape() {
  local had=""
  if [ -s "$K_DIR/nodes" ]; then
    had=$(cat "$K_DIR/nodes")
  elif [ -f "$K_DATA/meta.properties" ]; then
    had=1
  fi
  if [ -n "$had" ] && [ "$had" != "$KAFKA_NODES" ]; then
    fail_pre kafka "$K_LOG" "the Kafka data in $K_DIR is for $had node(s), not $KAFKA_NODES: run '$0 reset' first, or start with SLUICE_STACK_KAFKA_NODES=$had"
  fi
  mkdir -p "$K_DIR"
  echo "$KAFKA_NODES" > "$K_DIR/nodes"
}

kafka_launch() {
  local i pid down=() heap=$KAFKA_HEAP
  for ((i = 1; i <= KAFKA_NODES; i++)); do
    if pid=$(kafka_pid_of "$i"); then
      if [ "$i" = 1 ] && [ -n "$REC_KAFKA" ] && [ "$REC_KAFKA" != "$KAFKA_PORT" ]; then
        fail_pre kafka "$K_LOG" "already running on port $REC_KAFKA (pid $pid), not $KAFKA_PORT: run stop first"
      fi
      say "$(kname "$i"): already running (pid $pid, port $(kport "$i"))"
    else
      down+=("$i")
    fi
  done
  [ "${#down[@]}" -gt 0 ] || return 0
  kafka_prereqs
  kafka_check_shape
  for i in "${down[@]}"; do
    kafka_node_vars "$i"
    check_port_free "$(kname "$i")" "$N_PORT" "$N_LOG"
    check_port_free "$(kname "$i")" "$N_CPORT" "$N_LOG"
    kafka_write_config "$i"
  done
  kafka_format "${down[@]}"
  # three JVMs share the machine: a smaller heap each unless one was asked for
  if [ "$KAFKA_NODES" -gt 1 ] && [ -z "${SLUICE_KAFKA_HEAP:-}" ]; then heap="-Xms384m -Xmx384m"; fi
  for i in "${down[@]}"; do
    kafka_node_vars "$i"
    [ -f "$N_LOG" ] && mv -f "$N_LOG" "$N_LOG.prev"
    # shellcheck disable=SC2086  # heap is a list of JVM flags
    setsid java $heap -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
      -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -XX:MaxInlineLevel=15 \
      -Djava.awt.headless=true -Dkafka.logs.dir="$N_DIR" \
      -Dlog4j2.configurationFile="$N_CONF/log4j2-server.properties" \
      -cp "$KAFKA_LIBS/*" kafka.Kafka "$N_CONF/server.properties" \
      >"$N_LOG" 2>&1 </dev/null 9>&- &
    echo $! > "$N_PID"
    # if anything in this start fails, do not leave the brokers it launched behind
    FAIL_KILL_PID="${FAIL_KILL_PID:-}${FAIL_KILL_PID:+ }$!"
    say "$(kname "$i"): launched pid $! (log $N_LOG)"
  done
  rm -f "$K_READY"
  KAFKA_LAUNCHED_PIDS=$FAIL_KILL_PID
  KAFKA_T0=$SECONDS
}

# Readiness: each node's own "Kafka Server started" line, then a real client round trip
# (kcat metadata request listing every node), then topics (created idempotently, leaders
# elected, replicas in sync).
kafka_wait_ready() {
  local i pid pids="" t0=${KAFKA_T0:-$SECONDS} bootstrap
  local deadline=$((t0 + KAFKA_READY_TIMEOUT))
  bootstrap=$(kafka_bootstrap)
  for ((i = 1; i <= KAFKA_NODES; i++)); do
    kafka_node_vars "$i"
    pid=$(read_pid "$N_PID") || fail "$(kname "$i")" "$N_LOG" "no pid file"
    pids="$pids${pids:+ }$pid"
  done
  if [ -f "$K_READY" ] && [ "$(cat "$K_READY")" = "$pids" ]; then
    return 0   # readiness + topics already done for these broker processes
  fi
  # Brokers launched by this run that do not get ready are stopped again on failure.
  FAIL_KILL_PID=${KAFKA_LAUNCHED_PIDS:-}
  for ((i = 1; i <= KAFKA_NODES; i++)); do
    kafka_node_vars "$i"
    until grep -q 'Kafka Server started' "$N_LOG" 2>/dev/null; do
      # the pid file's process itself, not kafka_pid_of: until a just-launched child has
      # exec'd, its command line is still this script's (see prom_start)
      alive "$(read_pid "$N_PID")" || fail "$(kname "$i")" "$N_LOG" "broker process exited during start-up"
      [ "$SECONDS" -lt "$deadline" ] || fail "$(kname "$i")" "$N_LOG" "not started after ${KAFKA_READY_TIMEOUT}s"
      sleep 0.25
    done
  done
  local ver
  ver=$(grep -m1 'Kafka version' "$K_LOG" || true)
  say "kafka: broker log: ${ver:-<no 'Kafka version' line>}"
  if command -v kcat >/dev/null 2>&1; then
    local md="" ok
    while :; do
      ok=0
      if md=$(kcat -b "$bootstrap" -L -m 5 2>&1); then
        ok=1
        for ((i = 1; i <= KAFKA_NODES; i++)); do
          [[ "$md" == *"broker $i at 127.0.0.1:$(kport "$i")"* ]] || ok=0
        done
      fi
      [ "$ok" = 1 ] && break
      [ "$SECONDS" -lt "$deadline" ] || fail kafka "$K_LOG" "kcat metadata request to $bootstrap failed or lists fewer than $KAFKA_NODES brokers: $md"
      sleep 0.5
    done
    say "kafka: kcat metadata ok ($(printf '%s\n' "$md" | grep -m1 'brokers:' | sed 's/^ *//') $(printf '%s\n' "$md" | grep -m1 'broker 1 at' | sed 's/^ *//'))"
  else
    warn "kcat not installed: skipping the kcat round trip (KafkaReady below still uses a real client)"
  fi
  local left=$((deadline - SECONDS)) out
  # records up to 20 MiB (common/sl_kafka.h SL_KAFKA_MAX_MESSAGE_BYTES): 1 MiB bodies plus
  # the record, and dead-letter outcomes that carry the whole delivery
  local MAXMSG=max.message.bytes=20971520 rf=1
  if [ "$KAFKA_NODES" -ge 3 ]; then rf=3; MAXMSG="$MAXMSG,min.insync.replicas=2"; fi
  [ "$left" -ge 15 ] || left=15
  kafka_ready_tool
  if ! out=$(JT_CP=$KR_CP java_tool "$KR_MAIN" "$bootstrap" "$left" "--replicas=$rf" \
        "sluice.deliveries:$PARTITIONS:$MAXMSG" "sluice.outcomes:$PARTITIONS:$MAXMSG" \
        "sluice.quarantine:1:$MAXMSG" "sluice.endpoints:1:cleanup.policy=compact,$MAXMSG" \
        2>&1); then
    printf '%s\n' "$out" >&2
    fail kafka "$K_LOG" "topic creation / readiness check failed"
  fi
  printf '%s\n' "$out" | sed 's/^/[stack] kafka: /'
  echo "$pids" > "$K_READY"
  FAIL_KILL_PID=""
  say "kafka: ready on $bootstrap in $((SECONDS - t0))s"
}

# Every node at once (SIGTERM, bounded wait, then SIGKILL). The nodes of a cluster stop in
# parallel: stopped one after another, the last ones would wait for a quorum that is gone.
kafka_stop() {
  local i pid waits=() nodes=$KAFKA_NODES t=$STOP_TIMEOUT
  # a node left alone without its quorum can wait long for it: bound that unless asked
  if [ "$KAFKA_NODES" -gt 1 ] && [ -z "${SLUICE_STOP_TIMEOUT:-}" ]; then t=20; fi
  # nodes of a cluster whose ports.env was lost still have their dirs: stop them too
  for ((i = nodes + 1; i <= 3; i++)); do [ -d "$K_DIR/node$i" ] && nodes=$i; done
  for ((i = 1; i <= nodes; i++)); do
    kafka_node_vars "$i"
    if pid=$(kafka_pid_of "$i"); then
      say "$(kname "$i"): stopping pid $pid"
      stop_pid "$(kname "$i")" "$pid" "$t" &
      waits+=($!)
    else
      say "$(kname "$i"): not running"
    fi
    rm -f "$N_PID"
  done
  for pid in "${waits[@]}"; do wait "$pid" || true; done
  rm -f "$K_READY"
}

# ------------------------------------------------------------------------- Redis
redis_start() {
  local pid i
  if pid=$(redis_pid); then
    if [ -n "$REC_REDIS" ] && [ "$REC_REDIS" != "$REDIS_PORT" ]; then
      fail_pre redis "$R_LOG" "already running on port $REC_REDIS (pid $pid), not $REDIS_PORT: run stop first"
    fi
    say "redis: already running (pid $pid, port $REDIS_PORT)"
    return 0
  fi
  command -v redis-server >/dev/null 2>&1 || fail_pre redis "$R_LOG" "redis-server not found (apt package redis-server; run scripts/setup.sh)"
  check_port_free redis "$REDIS_PORT" "$R_LOG"
  mkdir -p "$R_DIR/data"
  rm -f "$R_PID"
  cat > "$R_CONF" <<EOF
# Written by scripts/stack.sh on every start.
bind 127.0.0.1
port $REDIS_PORT
protected-mode yes
daemonize yes
supervised no
pidfile $R_PID
logfile $R_LOG
dir $R_DIR/data
appendonly yes
appendfsync everysec
appenddirname appendonlydir
# AOF is the persistence; no RDB snapshots on a timer.
save ""
always-show-logo no
EOF
  redis-server "$R_CONF" >>"$R_LOG" 2>&1 </dev/null 9>&- || fail redis "$R_LOG" "redis-server exited with an error"
  for ((i = 0; i < 100; i++)); do
    [ "$(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" PING 2>/dev/null)" = PONG ] && break
    sleep 0.1
  done
  [ "$(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" PING 2>/dev/null)" = PONG ] \
    || fail redis "$R_LOG" "no PONG from 127.0.0.1:$REDIS_PORT after 10s"
  say "redis: ready on 127.0.0.1:$REDIS_PORT (pid $(read_pid "$R_PID" || echo '?'), appendonly yes)"
}

# ------------------------------------------------------------------------- Redis Cluster
# With SLUICE_STACK_REDIS_CLUSTER=1 (or `start --redis-cluster`) Redis runs as a cluster of
# six redis-server processes instead of the single one: node i lives in $R_DIR/node<i>
# (redis.conf, redis.pid, redis.log, data/ with its AOF and nodes.conf). Node 1 listens on
# REDIS_PORT, node i > 1 on REDIS_PORT+5+i (with SLUICE_PORT_BASE=N: N+2, then N+9..N+13),
# each with its cluster bus on port+10000. The first start creates the cluster
# (redis-cli --cluster create, one replica per master: nodes 1-3 masters, 4-6 replicas) and
# writes $R_DIR/cluster.created; later starts reuse nodes.conf and the AOF, as the single
# Redis reuses its AOF. Failovers may move the master role; the seeds in `env` stay nodes 1-3.
REDIS_CLUSTER_NODES=6
REDIS_READY_TIMEOUT="${SLUICE_STACK_REDIS_READY_TIMEOUT:-60}"
rport() { if [ "$1" = 1 ]; then echo "$REDIS_PORT"; else echo $((REDIS_PORT + 5 + $1)); fi; }
# redis_node_vars I: RN_DIR RN_CONF RN_LOG RN_PID RN_PORT of cluster node I
redis_node_vars() {
  RN_DIR="$R_DIR/node$1"; RN_CONF="$RN_DIR/redis.conf"; RN_LOG="$RN_DIR/redis.log"
  RN_PID="$RN_DIR/redis.pid"; RN_PORT=$(rport "$1")
}
redis_node_pid() { # I
  local RN_DIR RN_CONF RN_LOG RN_PID RN_PORT pid
  redis_node_vars "$1"
  pid=$(read_pid "$RN_PID") || return 1
  alive "$pid" || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = redis-server ] || return 1
  echo "$pid"
}
redis_cluster_seeds() {
  local i out=""
  for ((i = 1; i <= 3; i++)); do out="$out${out:+,}127.0.0.1:$(rport "$i")"; done
  echo "$out"
}
redis_cluster_ports() {
  local i out=""
  for ((i = 1; i <= REDIS_CLUSTER_NODES; i++)); do out="$out${out:+ }$(rport "$i")"; done
  echo "$out"
}
rcli() { # PORT ARGS...: one redis-cli command against a node, bounded
  local port=$1; shift
  timeout 5 redis-cli -h 127.0.0.1 -p "$port" "$@" 2>/dev/null
}
# "master" or "replica of 127.0.0.1:PORT" (nothing when the node does not answer)
redis_node_role() {
  local role
  role=$(rcli "$1" ROLE) || return 0
  case "$role" in
    master*) echo master ;;
    slave*) printf 'replica of %s:%s\n' "$(sed -n 2p <<<"$role")" "$(sed -n 3p <<<"$role")" ;;
  esac
}

# The Redis data dir's shape (one Redis or a cluster) must not change under it: refuse, and
# say how to get the other shape.
redis_check_shape() {
  local had="" want=single log=$R_LOG other=0
  if [ "$REDIS_CLUSTER" = 1 ]; then want=cluster; fi
  if [ -s "$R_DIR/shape" ]; then
    had=$(cat "$R_DIR/shape")
  elif [ -d "$R_DIR/node1" ]; then
    had=cluster
  elif [ -d "$R_DIR/data" ]; then
    had=single
  fi
  if [ -n "$had" ] && [ "$had" != "$want" ]; then
    local what="one Redis, not a Redis Cluster"
    if [ "$had" = cluster ]; then log="$R_DIR/node1/redis.log"; other=1; what="a Redis Cluster, not one Redis"; fi
    fail_pre redis "$log" "the Redis data in $R_DIR is for $what: run '$0 reset' first, or start with SLUICE_STACK_REDIS_CLUSTER=$other"
  fi
  mkdir -p "$R_DIR"
  echo "$want" > "$R_DIR/shape"
}

redis_cluster_write_config() { # I
  local RN_DIR RN_CONF RN_LOG RN_PID RN_PORT
  redis_node_vars "$1"
  mkdir -p "$RN_DIR/data"
  cat > "$RN_CONF" <<EOF
# Written by scripts/stack.sh on every start. Redis Cluster node $1 of $REDIS_CLUSTER_NODES.
bind 127.0.0.1
port $RN_PORT
protected-mode yes
daemonize no
supervised no
logfile $RN_LOG
dir $RN_DIR/data
cluster-enabled yes
cluster-config-file nodes.conf
cluster-node-timeout 2000
appendonly yes
appendfsync everysec
appenddirname appendonlydir
# AOF is the persistence; no RDB snapshots on a timer (a replica's full sync still makes one).
save ""
always-show-logo no
EOF
}

# Wait until every node says cluster_state:ok, knows all six nodes and sees all 16384 slots
# assigned, sees three masters and three replicas none of them failing, and every replica's
# link to its master is up.
redis_cluster_wait_ok() { # DEADLINE (in $SECONDS)
  local deadline=$1 i port info nodes repl bad RN_DIR RN_CONF RN_LOG RN_PID RN_PORT
  while :; do
    bad=""
    for ((i = 1; i <= REDIS_CLUSTER_NODES; i++)); do
      port=$(rport "$i")
      if ! redis_node_pid "$i" >/dev/null; then
        redis_node_vars "$i"
        fail "redis-$i" "$RN_LOG" "redis-server exited while the cluster was getting ready"
      fi
      info=$(rcli "$port" CLUSTER INFO | tr -d '\r') || info=""
      if [[ "$info" != *"cluster_state:ok"* ]] || [[ "$info" != *"cluster_slots_assigned:16384"* ]] \
        || [[ "$info" != *"cluster_known_nodes:$REDIS_CLUSTER_NODES"* ]]; then
        bad="node $i (port $port) says $(grep -E '^cluster_(state|slots_assigned|known_nodes):' <<<"$info" | tr '\n' ' ')"
        break
      fi
      nodes=$(rcli "$port" CLUSTER NODES | awk '{ print $3 }' | tr ',' ' ') || nodes=""
      if [ "$(grep -cw master <<<"$nodes")" != 3 ] || [ "$(grep -cw slave <<<"$nodes")" != 3 ] \
        || grep -qwE 'fail\??|handshake|noaddr' <<<"$nodes"; then
        bad="node $i (port $port) sees nodes with the flags $(tr '\n' ';' <<<"$nodes")"
        break
      fi
      repl=$(rcli "$port" INFO replication | tr -d '\r') || repl=""
      if [[ "$repl" == *"role:slave"* ]] && [[ "$repl" != *"master_link_status:up"* ]]; then
        bad="node $i (port $port): the replica's link to its master is not up"
        break
      fi
    done
    [ -z "$bad" ] && return 0
    if [ "$SECONDS" -ge "$deadline" ]; then
      redis_node_vars "$i"
      fail "redis-$i" "$RN_LOG" "the Redis Cluster is not ready after ${REDIS_READY_TIMEOUT}s: $bad"
    fi
    sleep 0.2
  done
}

redis_cluster_start() {
  local i pid down=() t0=$SECONDS RN_DIR RN_CONF RN_LOG RN_PID RN_PORT
  [[ "$REDIS_READY_TIMEOUT" =~ ^[0-9]+$ ]] || die "SLUICE_STACK_REDIS_READY_TIMEOUT=$REDIS_READY_TIMEOUT is not a number of seconds"
  for ((i = 1; i <= REDIS_CLUSTER_NODES; i++)); do
    if pid=$(redis_node_pid "$i"); then
      if [ "$i" = 1 ] && [ -n "$REC_REDIS" ] && [ "$REC_REDIS" != "$REDIS_PORT" ]; then
        redis_node_vars 1
        fail_pre redis "$RN_LOG" "already running on port $REC_REDIS (pid $pid), not $REDIS_PORT: run stop first"
      fi
      say "redis-$i: already running (pid $pid, port $(rport "$i"))"
    else
      down+=("$i")
    fi
  done
  if [ "${#down[@]}" -gt 0 ]; then
    redis_node_vars 1
    command -v redis-server >/dev/null 2>&1 || fail_pre redis "$RN_LOG" "redis-server not found (apt package redis-server; run scripts/setup.sh)"
    command -v redis-cli >/dev/null 2>&1 || fail_pre redis "$RN_LOG" "redis-cli not found (apt package redis-tools; run scripts/setup.sh)"
    redis_check_shape
    # nodes.conf names every node by its address: a cluster made on other ports cannot run here
    if [ -s "$R_DIR/cluster.created" ] && [ "$(cat "$R_DIR/cluster.created")" != "$(redis_cluster_ports)" ]; then
      fail_pre redis "$RN_LOG" "the Redis Cluster in $R_DIR was created on ports $(cat "$R_DIR/cluster.created"), not $(redis_cluster_ports): run '$0 reset' first, or start it on its ports"
    fi
    for i in "${down[@]}"; do
      redis_node_vars "$i"
      check_port_free "redis-$i" "$RN_PORT" "$RN_LOG"
      check_port_free "redis-$i" "$((RN_PORT + 10000))" "$RN_LOG"
    done
    for i in "${down[@]}"; do
      redis_cluster_write_config "$i"
      redis_node_vars "$i"
      [ -f "$RN_LOG" ] && mv -f "$RN_LOG" "$RN_LOG.prev"
      setsid redis-server "$RN_CONF" >>"$RN_LOG" 2>&1 </dev/null 9>&- &
      echo $! > "$RN_PID"
      # if anything in this start fails, do not leave the nodes it launched behind
      FAIL_KILL_PID="${FAIL_KILL_PID:-}${FAIL_KILL_PID:+ }$!"
    done
    say "redis: launched cluster node(s) ${down[*]} (logs $R_DIR/node<i>/redis.log)"
    for i in "${down[@]}"; do
      redis_node_vars "$i"
      until [ "$(rcli "$RN_PORT" PING)" = PONG ]; do
        # the launched pid, not redis_node_pid: before its exec the child is not yet named
        # redis-server (see prom_start)
        alive "$(read_pid "$RN_PID")" || fail "redis-$i" "$RN_LOG" "redis-server exited during start-up"
        [ "$((SECONDS - t0))" -lt 10 ] || fail "redis-$i" "$RN_LOG" "no PONG from 127.0.0.1:$RN_PORT after 10s"
        sleep 0.1
      done
    done
  fi
  if [ ! -s "$R_DIR/cluster.created" ]; then
    # First start, or a creation that did not finish: empty every node, then create.
    local addrs=()
    for ((i = 1; i <= REDIS_CLUSTER_NODES; i++)); do
      redis_node_vars "$i"
      rcli "$RN_PORT" FLUSHALL >/dev/null || true   # a replica refuses; the reset makes it a master
      if [ "$(rcli "$RN_PORT" CLUSTER RESET HARD)" != OK ]; then
        rcli "$RN_PORT" FLUSHALL >/dev/null || true
        [ "$(rcli "$RN_PORT" CLUSTER RESET HARD)" = OK ] || fail "redis-$i" "$RN_LOG" "CLUSTER RESET HARD failed before the cluster's creation"
      fi
      addrs+=("127.0.0.1:$RN_PORT")
    done
    say "redis: creating the cluster: redis-cli --cluster create ${addrs[*]} --cluster-replicas 1"
    timeout 120 redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes \
      >"$R_DIR/create.log" 2>&1 </dev/null || fail redis "$R_DIR/create.log" "redis-cli --cluster create failed"
    redis_cluster_ports > "$R_DIR/cluster.created"
  fi
  redis_cluster_wait_ok "$((SECONDS + REDIS_READY_TIMEOUT))"
  FAIL_KILL_PID=""
  local masters="" replicas=""
  for ((i = 1; i <= REDIS_CLUSTER_NODES; i++)); do
    if [ "$(redis_node_role "$(rport "$i")")" = master ]; then
      masters="$masters${masters:+,}$(rport "$i")"
    else
      replicas="$replicas${replicas:+,}$(rport "$i")"
    fi
  done
  say "redis: cluster ready in $((SECONDS - t0))s: cluster_state:ok on all $REDIS_CLUSTER_NODES nodes, masters on $masters, replicas on $replicas (appendonly yes)"
}

# Every node at once (SIGTERM, bounded wait, then SIGKILL), also the nodes of a cluster whose
# ports.env was lost (their dirs are there).
redis_cluster_stop() {
  local i pid waits=() RN_DIR RN_CONF RN_LOG RN_PID RN_PORT
  for ((i = 1; i <= REDIS_CLUSTER_NODES; i++)); do
    redis_node_vars "$i"
    [ -d "$RN_DIR" ] || continue
    if pid=$(redis_node_pid "$i"); then
      say "redis-$i: stopping pid $pid"
      stop_pid "redis-$i" "$pid" 20 &
      waits+=($!)
    else
      say "redis-$i: not running"
    fi
    rm -f "$RN_PID"
  done
  for pid in "${waits[@]}"; do wait "$pid" || true; done
}

# ------------------------------------------------------------------------- PostgreSQL
PG_OS_USER=""
PG_CAP=0
as_pg() { # run a PostgreSQL server tool as the non-root cluster owner
  if [ -z "$PG_OS_USER" ]; then
    "$@"
  elif [ "$PG_CAP" = 1 ]; then
    # Stack dir below a directory the owner may not search (e.g. /root, mode 0700): keep
    # CAP_DAC_READ_SEARCH (search/read only, no write) as an ambient capability for the
    # postgres processes rather than loosening permissions of directories we do not own.
    (cd / && setpriv --reuid="$PG_OS_USER" --regid="$PG_OS_USER" --init-groups \
       --inh-caps=+dac_read_search --ambient-caps=+dac_read_search -- "$@")
  else
    (cd / && runuser -u "$PG_OS_USER" -- "$@")
  fi
}
# Decide how the cluster owner reaches $P_DIR (must exist and be owned by it).
pg_access_mode() {
  PG_CAP=0
  [ -n "$PG_OS_USER" ] || return 0
  # A real chdir+create, not test -w: access(2) ignores capabilities for non-root users.
  # shellcheck disable=SC2016  # $1 is expanded by the inner sh
  local probe='cd "$1" && : > .sluice-probe && rm -f .sluice-probe'
  as_pg sh -c "$probe" sh "$P_DIR" 2>/dev/null && return 0
  PG_CAP=1
  if command -v setpriv >/dev/null 2>&1 && as_pg sh -c "$probe" sh "$P_DIR" 2>/dev/null; then
    return 0
  fi
  PG_CAP=0
  fail_pre postgres "$P_LOG" "user $PG_OS_USER cannot reach $P_DIR (a parent directory is not searchable by it) and setpriv with CAP_DAC_READ_SEARCH is not available; put SLUICE_STACK_DIR elsewhere (e.g. under /tmp)"
}
pg_setup_user() {
  [ "$(id -u)" -eq 0 ] || return 0   # not root: run postgres as ourselves
  PG_OS_USER="${SLUICE_PG_OS_USER:-sluice}"
  if ! id -u "$PG_OS_USER" >/dev/null 2>&1; then
    useradd --system --user-group --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin "$PG_OS_USER" 2>/dev/null || true
    id -u "$PG_OS_USER" >/dev/null 2>&1 || fail postgres "" "could not create system user $PG_OS_USER"
    say "postgres: created system user $PG_OS_USER (postgres refuses to run as root)"
  fi
}
psql_q() { # psql against database $1 (rest: psql args)
  local db=$1; shift
  PGCONNECT_TIMEOUT=5 PGOPTIONS="-c client_min_messages=warning" psql -X -q -v ON_ERROR_STOP=1 \
    "host=127.0.0.1 port=$PG_PORT dbname=$db user=sluice" "$@"
}

pg_start() {
  local pid
  pg_setup_user
  if pid=$(pg_pid); then
    if [ -n "$REC_PG" ] && [ "$REC_PG" != "$PG_PORT" ]; then
      fail_pre postgres "$P_LOG" "already running on port $REC_PG (pid $pid), not $PG_PORT: run stop first"
    fi
    say "postgres: already running (pid $pid, port $PG_PORT)"
    pg_migrate   # cheap; picks up migrations added since the last start
    return 0
  fi
  [ -x "$PG_BIN/postgres" ] || fail_pre postgres "$P_LOG" "$PG_BIN/postgres not found (apt package postgresql-15; run scripts/setup.sh)"
  command -v psql >/dev/null 2>&1 || fail_pre postgres "$P_LOG" "psql not found (apt package postgresql-client-15)"
  check_port_free postgres "$PG_PORT" "$P_LOG"
  mkdir -p "$P_DIR"
  if [ -n "$PG_OS_USER" ]; then
    chown "$PG_OS_USER:" "$P_DIR"
    # The stack dir is ours (e.g. mktemp -d, mode 0700): let others search (not list) it.
    chmod o+x "$STACK_DIR"
    pg_access_mode
    if [ "$PG_CAP" = 1 ]; then
      say "postgres: $P_DIR is below a directory $PG_OS_USER cannot search; running postgres with ambient CAP_DAC_READ_SEARCH"
    fi
  fi
  if [ ! -f "$P_DATA/PG_VERSION" ]; then
    say "postgres: initdb $P_DATA"
    rm -rf "$P_DATA"
    as_pg "$PG_BIN/initdb" -D "$P_DATA" -U sluice -A trust -E UTF8 --no-locale --no-sync \
      >"$P_DIR/initdb.log" 2>&1 || fail postgres "$P_DIR/initdb.log" "initdb failed"
    cat > "$P_DATA/pg_hba.conf" <<'EOF'
# Written by scripts/stack.sh: throwaway test cluster, trust on the unix socket and loopback only.
local   all          all                  trust
host    all          all   127.0.0.1/32   trust
local   replication  all                  trust
host    replication  all   127.0.0.1/32   trust
EOF
    echo "include_if_exists = 'sluice-stack.conf'" >> "$P_DATA/postgresql.conf"
  fi
  mkdir -p "$P_SOCK"
  local sockdir="$P_SOCK"
  if [ "$(( ${#P_SOCK} + 15 ))" -gt 107 ]; then   # sun_path limit: <dir>/.s.PGSQL.NNNNN
    warn "postgres: socket dir path too long for a unix socket, TCP only: $P_SOCK"
    sockdir=""
  fi
  cat > "$P_DATA/sluice-stack.conf" <<EOF
# Written by scripts/stack.sh on every start.
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$sockdir'
max_connections = 200
# The recorder's COPY batches write a lot: with 128 MB the backends wrote back dirty buffers
# themselves, and 1 GB of WAL forced a checkpoint every few seconds of ingest.
shared_buffers = 512MB
max_wal_size = 4GB
checkpoint_timeout = 15min
log_line_prefix = '%m [%p] %q%u@%d '
log_min_messages = warning
EOF
  if [ -n "$PG_OS_USER" ]; then
    chown -R "$PG_OS_USER:" "$P_DIR"
  fi
  as_pg "$PG_BIN/pg_ctl" -D "$P_DATA" -l "$P_LOG" -w -t 60 -s start >/dev/null 2>>"$P_DIR/pg_ctl.log" 9>&- \
    || fail postgres "$P_LOG" "pg_ctl start failed (also see $P_DIR/pg_ctl.log)"
  local i
  for ((i = 0; i < 60; i++)); do
    [ "$(psql_q postgres -Atc 'select 1' 2>/dev/null)" = 1 ] && break
    sleep 0.5
  done
  [ "$(psql_q postgres -Atc 'select 1' 2>&1)" = 1 ] || fail postgres "$P_LOG" "psql -c 'select 1' on 127.0.0.1:$PG_PORT failed"
  if [ -z "$(psql_q postgres -Atc "select 1 from pg_database where datname = 'sluice'")" ]; then
    psql_q postgres -c 'create database sluice' || fail postgres "$P_LOG" "create database sluice failed"
  fi
  say "postgres: ready on 127.0.0.1:$PG_PORT (pid $(pg_pid || echo '?'), os user ${PG_OS_USER:-$(id -un)})"
  pg_migrate
}

# Apply sql/NNNN_*.sql in order, each once, each in one transaction together with its
# schema_migrations row (scripts/migrate.sh, which operators run against their database too).
# A migration must not BEGIN/COMMIT itself.
pg_migrate() {
  SLUICE_SQL_DIR="$SQL_DIR" bash "$SCRIPT_DIR/migrate.sh" \
    "host=127.0.0.1 port=$PG_PORT dbname=sluice user=sluice" >"$P_DIR/migrate.log" 2>&1 \
    || { cat "$P_DIR/migrate.log" >&2; fail postgres "$P_DIR/migrate.log" "migrations failed"; }
  sed -n 's/^\[migrate\] /[stack] postgres: /p' "$P_DIR/migrate.log"
}

# ------------------------------------------------------------------------- Prometheus
# Optional: only with `start --prometheus`, SLUICE_STACK_PROMETHEUS=1 or `start prometheus`.
prom_write_config() {
  mkdir -p "$PR_DATA" "$PR_TARGETS"
  cat > "$PR_CONF.tmp" <<EOF
# Written by scripts/stack.sh on every start of Prometheus. Local stack: scrape every second
# whatever the demo and tests list in $PR_TARGETS/*.json.
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s   # the sluice rule group sets its own interval
rule_files:
  - $PR_RULES
scrape_configs:
  - job_name: sluice
    # Targets carry a process label (sluice-consumer, sluice-recorder, sluice-api);
    # sluice_build_info exports the same label with the same value, kept as it is rather than
    # renamed exported_process.
    honor_labels: true
    file_sd_configs:
      - files:
          - $PR_TARGETS/*.json
        refresh_interval: 5s
EOF
  mv -f "$PR_CONF.tmp" "$PR_CONF"
}

prom_start() {
  local pid i t0=$SECONDS
  [[ "$PR_READY_TIMEOUT" =~ ^[0-9]+$ ]] || die "SLUICE_STACK_PROMETHEUS_READY_TIMEOUT=$PR_READY_TIMEOUT is not a number of seconds"
  [ -f "$PR_RULES" ] || fail_pre prometheus "$PR_LOG" "rule file $PR_RULES not found"
  if pid=$(prom_pid); then
    if [ -n "$REC_PROM" ] && [ "$REC_PROM" != "$PROM_PORT" ]; then
      fail_pre prometheus "$PR_LOG" "already running on port $REC_PROM (pid $pid), not $PROM_PORT: run stop first"
    fi
    prom_write_config
    kill -HUP "$pid" 2>/dev/null || true
    say "prometheus: already running (pid $pid, port $PROM_PORT); configuration and rules reloaded"
    return 0
  fi
  command -v prometheus >/dev/null 2>&1 || fail_pre prometheus "$PR_LOG" "prometheus not found (apt package prometheus; run scripts/setup.sh)"
  command -v curl >/dev/null 2>&1 || fail_pre prometheus "$PR_LOG" "curl not found (apt package curl; run scripts/setup.sh)"
  check_port_free prometheus "$PROM_PORT" "$PR_LOG"
  prom_write_config
  [ -f "$PR_LOG" ] && mv -f "$PR_LOG" "$PR_LOG.prev"
  setsid prometheus --config.file="$PR_CONF" --storage.tsdb.path="$PR_DATA" \
    --storage.tsdb.retention.time=2d --web.listen-address="127.0.0.1:$PROM_PORT" \
    >"$PR_LOG" 2>&1 </dev/null 9>&- &
  echo $! > "$PR_PID"
  FAIL_KILL_PID=$!   # a Prometheus that does not get ready is not left behind
  say "prometheus: launched pid $FAIL_KILL_PID (log $PR_LOG)"
  for ((i = 0; ; i++)); do
    curl -fsS -m 2 -o /dev/null "http://127.0.0.1:$PROM_PORT/-/ready" 2>/dev/null && break
    # the launched pid itself, not prom_pid: until the child has exec'd, its command line is
    # still this script's, and a loaded machine can hold it there past the first probe
    alive "$FAIL_KILL_PID" || fail prometheus "$PR_LOG" "exited during start-up"
    [ "$((SECONDS - t0))" -lt "$PR_READY_TIMEOUT" ] || fail prometheus "$PR_LOG" "/-/ready did not answer 200 within ${PR_READY_TIMEOUT}s"
    sleep 0.25
  done
  FAIL_KILL_PID=""
  say "prometheus: ready on http://127.0.0.1:$PROM_PORT in $((SECONDS - t0))s (targets $PR_TARGETS/*.json, rules $PR_RULES)"
}

prom_stop() {
  local pid
  if pid=$(prom_pid); then
    say "prometheus: stopping pid $pid"
    stop_pid prometheus "$pid" 30
  else
    say "prometheus: not running"
  fi
  rm -f "$PR_PID"
}

# ------------------------------------------------------------------------- commands
# parse_services COMMAND ARGS...: the services a start or stop acts on, into SERVICES
# (" kafka redis postgres " by default; stop also stops Prometheus when it was started).
SERVICES=""
parse_services() {
  local cmd=$1 a named="" prom=${SLUICE_STACK_PROMETHEUS:-0}; shift
  case "$prom" in 0|1) ;; *) die "SLUICE_STACK_PROMETHEUS=$prom: expected 0 or 1" ;; esac
  for a in "$@"; do
    case "$a" in
      --prometheus) [ "$cmd" = start ] || usage_exit; prom=1 ;;
      --kafka-nodes=*) [ "$cmd" = start ] || usage_exit; KAFKA_NODES_ARG=${a#--kafka-nodes=} ;;
      --redis-cluster) [ "$cmd" = start ] || usage_exit; REDIS_CLUSTER_ARG=1 ;;
      kafka|redis|postgres|prometheus) named="$named $a" ;;
      *) usage_exit ;;
    esac
  done
  SERVICES="${named:- kafka redis postgres} "
  if [ "$cmd" = start ] && [ "$prom" = 1 ]; then SERVICES="$SERVICES prometheus "; fi
  if [ "$cmd" = stop ] && [ -z "$named" ]; then SERVICES="$SERVICES prometheus "; fi
}
want() { [[ "$SERVICES" == *" $1 "* ]]; }
usage_exit() {
  echo "usage: $0 start [--prometheus] [--kafka-nodes=1|3] [--redis-cluster] [SERVICE...]|stop [SERVICE...]|status|reset|env" >&2
  echo "       SERVICE: kafka redis postgres prometheus" >&2
  exit 2
}

take_lock() {
  command -v flock >/dev/null 2>&1 || return 0
  exec 9>"$STACK_DIR/.lock"
  flock -w 300 9 || die "another stack.sh holds $STACK_DIR/.lock"
}

cmd_start() {
  local t0=$SECONDS
  mkdir -p "$STACK_DIR"
  [ -w "$STACK_DIR" ] || die "stack dir not writable: $STACK_DIR"
  take_lock
  resolve_ports
  local nodes=""
  if [ "$KAFKA_NODES" -gt 1 ]; then nodes=" and $((KAFKA_NODES - 1)) more nodes: $(kafka_bootstrap)"; fi
  local redis="redis $REDIS_PORT"
  if [ "$REDIS_CLUSTER" = 1 ]; then redis="redis cluster on $(redis_cluster_ports | tr ' ' ',')"; fi
  say "stack dir $STACK_DIR (kafka $KAFKA_PORT/$KAFKA_CPORT$nodes, $redis, postgres $PG_PORT$(want prometheus && echo ", prometheus $PROM_PORT"))"
  if want kafka; then kafka_launch; fi   # JVM boots in the background while Redis and PostgreSQL start
  if want redis && [ "$REDIS_CLUSTER" = 1 ]; then
    redis_cluster_start
  elif want redis; then
    redis_check_shape
    redis_start
  fi
  if want postgres; then pg_start; fi
  record_ports
  if want kafka; then kafka_wait_ready; fi
  if want prometheus; then prom_start; fi
  say "all services up in $((SECONDS - t0))s; clients: eval \"\$($0 env)\""
}

cmd_stop() {
  if [ ! -d "$STACK_DIR" ]; then say "nothing to stop ($STACK_DIR does not exist)"; return 0; fi
  take_lock
  resolve_ports
  local pid
  # Prometheus first (it scrapes the others); quiet about it when this stack never ran one
  if want prometheus && { [ -d "$PR_DIR" ] || [[ "$SERVICES" != *" kafka "* ]]; }; then prom_stop; fi
  if want kafka; then kafka_stop; fi
  if ! want redis; then
    :
  elif pid=$(redis_pid); then
    say "redis: stopping pid $pid"
    stop_pid redis "$pid" 20
  elif [ "$REDIS_CLUSTER" != 1 ]; then
    say "redis: not running"
  fi
  if want redis; then rm -f "$R_PID"; fi
  # a cluster's nodes (also when ports.env says one Redis: its dirs are there)
  if want redis && { [ "$REDIS_CLUSTER" = 1 ] || [ -d "$R_DIR/node1" ]; }; then redis_cluster_stop; fi
  if ! want postgres; then
    :
  elif pid=$(pg_pid); then
    say "postgres: stopping pid $pid"
    pg_setup_user
    pg_access_mode
    if ! as_pg "$PG_BIN/pg_ctl" -D "$P_DATA" -m fast -w -t 30 -s stop >/dev/null 2>&1; then
      warn "postgres: fast shutdown failed, trying immediate"
      as_pg "$PG_BIN/pg_ctl" -D "$P_DATA" -m immediate -w -t 10 -s stop >/dev/null 2>&1 || stop_pid postgres "$pid" 5
    fi
  else
    say "postgres: not running"
  fi
  say "stopped"
}

status_line() { # NAME PORT PID-OR-EMPTY EXTRA
  local name=$1 port=$2 pid=$3 extra=$4
  if [ -n "$pid" ] && port_busy "$port"; then
    printf '%-9s running  port %-5s pid %-7s %s\n' "$name" "$port" "$pid" "$extra"
    return 0
  elif [ -n "$pid" ]; then
    printf '%-9s starting port %-5s pid %-7s (process up, port not listening) %s\n' "$name" "$port" "$pid" "$extra"
    return 1
  fi
  printf '%-9s stopped  port %-5s\n' "$name" "$port"
  return 1
}

cmd_status() {
  resolve_ports
  local down=0
  local i
  for ((i = 1; i <= KAFKA_NODES; i++)); do
    kafka_node_vars "$i"
    status_line "$(kname "$i")" "$N_PORT" "$(kafka_pid_of "$i" || true)" "controller $N_CPORT, log $N_LOG" || down=1
  done
  if [ "$REDIS_CLUSTER" = 1 ]; then
    local pid state="" role
    for ((i = 1; i <= REDIS_CLUSTER_NODES; i++)); do
      redis_node_vars "$i"
      role=""; state=""
      if pid=$(redis_node_pid "$i"); then
        role=$(redis_node_role "$RN_PORT")
        state=$(rcli "$RN_PORT" CLUSTER INFO | tr -d '\r' | grep -m1 '^cluster_state:') || state=""
      fi
      status_line "redis-$i" "$RN_PORT" "${pid:-}" "${role:+$role, }${state:+$state, }log $RN_LOG" || down=1
      if [ -n "$pid" ] && [ "$state" != cluster_state:ok ]; then down=1; fi
      pid=""
    done
  else
    status_line redis "$REDIS_PORT" "$(redis_pid || true)" "log $R_LOG" || down=1
  fi
  status_line postgres "$PG_PORT" "$(pg_pid || true)" "log $P_LOG" || down=1
  # optional: down only when it was started and not stopped (its pid file is still there)
  if [ -f "$PR_PID" ] || prom_pid >/dev/null; then
    status_line prometheus "$PROM_PORT" "$(prom_pid || true)" "targets $PR_TARGETS, log $PR_LOG" || down=1
  else
    printf '%-9s off      port %-5s (optional: %s start --prometheus)\n' prometheus "$PROM_PORT" "$0"
  fi
  return "$down"
}

cmd_reset() {
  cmd_stop
  [ -d "$STACK_DIR" ] || return 0
  case "$STACK_DIR" in
    /|"$HOME"|"$REPO_DIR") die "refusing to reset STACK_DIR=$STACK_DIR" ;;
  esac
  rm -rf "$K_DIR" "$R_DIR" "$P_DIR" "$PR_DIR" "$PORTS_FILE" "$STACK_DIR/.lock"
  rmdir "$STACK_DIR" 2>/dev/null || true
  say "reset: deleted data and logs in $STACK_DIR"
}

cmd_env() {
  resolve_ports
  printf "export SLUICE_KAFKA_BROKERS=%s\n" "$(kafka_bootstrap)"
  if [ "$REDIS_CLUSTER" = 1 ]; then
    printf "export SLUICE_REDIS_URL=redis-cluster://%s\n" "$(redis_cluster_seeds)"
  else
    printf "export SLUICE_REDIS_URL=redis://127.0.0.1:%s\n" "$REDIS_PORT"
  fi
  printf "export SLUICE_PG_DSN='host=127.0.0.1 port=%s dbname=sluice user=sluice'\n" "$PG_PORT"
  if prom_pid >/dev/null; then   # SLUICE_STACK_*: names the processes ignore
    printf "export SLUICE_STACK_PROMETHEUS_URL=http://127.0.0.1:%s\n" "$PROM_PORT"
    printf "export SLUICE_STACK_PROMETHEUS_TARGETS='%s'\n" "$PR_TARGETS"
  fi
}

case "${1:-}" in
  start)  parse_services "$@"; cmd_start ;;
  stop)   parse_services "$@"; cmd_stop ;;
  status) cmd_status ;;
  reset)  parse_services stop; cmd_reset ;;
  env)    cmd_env ;;
  *) usage_exit ;;
esac
