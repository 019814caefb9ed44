#!/usr/bin/env bash
# Sluice: one-shot, idempotent setup of a Debian 12 machine (dev box or CI runner).
#
#   bash scripts/setup.sh
#
# 1. apt packages (build tool chain, C -dev libraries, Redis, PostgreSQL 15 binaries, Java 17,
#    Maven, kcat, wrk, ...). dpkg-query decides what is missing; apt is not called at all when
#    nothing is (so a second run does no network access and takes well under a second).
# 2. Apache Kafka broker jars from Maven Central (no tarball, no Docker) into
#    ${SLUICE_CACHE_DIR:-$HOME/.cache/sluice}/kafka-<version>/libs, used by scripts/stack.sh.
# 3. A Python venv at ${SLUICE_CACHE_DIR}/venv with the test-only pip packages.
# 4. kustomize (pinned), built with Go into ${SLUICE_CACHE_DIR}/bin, for the checks of ops/k8s/.
#
# Env: SLUICE_CACHE_DIR   cache root (default $HOME/.cache/sluice)
#      SLUICE_SKIP_APT=1  skip step 1 (e.g. machine prepared another way)
# The venv uses Debian's /usr/bin/python3 (python3-venv), else the first python3 on PATH.
# (No other SLUICE_* knobs on purpose: the Sluice binaries reject unknown SLUICE_* variables.)
# Safe as root without a tty (CI): DEBIAN_FRONTEND=noninteractive, stdin from /dev/null.
# Services are NOT started: apt's postinst start of redis-server/postgresql is suppressed
# with a temporary policy-rc.d; scripts/stack.sh runs private instances instead.
set -euo pipefail

KAFKA_VERSION=4.3.1
KAFKA_SCRAM_VERSION=3.9.1 # a second broker, for the SCRAM login test only (step_kafka_scram)
LOG4J_VERSION=2.25.4     # what Kafka 4.3.x builds with (gradle/dependencies.gradle)
SLF4J_VERSION=1.7.36     # Kafka uses SLF4J 1.7 -> the 1.x binding log4j-slf4j-impl
DEP_PLUGINS=(org.apache.maven.plugins:maven-dependency-plugin:3.8.1
             org.apache.maven.plugins:maven-dependency-plugin:3.7.1)
# test-only Python packages (docs/DEPENDENCIES.md); kubernetes-validate bundles Kubernetes' JSON
# schemas (nothing is downloaded at test time) for tests/ops/test_k8s.py
PIP_REQUIREMENTS=(standardwebhooks==1.1.0 pytest==9.2.0 schemathesis==4.32.5 playwright==1.65.2
  cryptography==46.0.3 kubernetes-validate==1.37.0 pyflakes==4.1.0)
# The kustomize that `kubectl apply -k` embeds from kubectl 1.27 on; it builds with Debian 12's
# Go 1.19 as well as with newer ones (later kustomize releases need a newer Go).
KUSTOMIZE_VERSION=v5.0.1

APT_PACKAGES=(
  build-essential cmake pkg-config
  clang llvm libclang-rt-14-dev clang-format clang-tidy
  librdkafka-dev libhiredis-dev libcurl4-openssl-dev libpq-dev libssl-dev
  libmsgpack-dev libcmocka-dev libmicrohttpd-dev libjansson-dev
  redis-server postgresql-15
  openjdk-17-jdk-headless maven
  kcat wrk gnuplot-nox jq python3 python3-venv curl faketime
  prometheus chromium chromium-driver fonts-dejavu-core tinyproxy-bin
  microsocks stunnel4
)
# Go builds kustomize (step 4): Debian's golang-go only where no Go toolchain is installed.
if ! command -v go >/dev/null 2>&1 && [ ! -x /usr/local/go/bin/go ]; then
  APT_PACKAGES+=(golang-go)
fi

CACHE_DIR="${SLUICE_CACHE_DIR:-${HOME:-/root}/.cache/sluice}"
KAFKA_HOME_DIR="$CACHE_DIR/kafka-$KAFKA_VERSION"
KAFKA_LIBS="$KAFKA_HOME_DIR/libs"
KAFKA_MARKER="$KAFKA_HOME_DIR/.complete"
VENV_DIR="$CACHE_DIR/venv"

export DEBIAN_FRONTEND=noninteractive
STEP="init"
T0=$SECONDS

say() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] FAILED in step "%s": %s\n' "$STEP" "$*" >&2; exit 1; }
trap 'rc=$?; [ "$rc" -eq 0 ] || printf "[setup] FAILED in step \"%s\" (exit %s)\n" "$STEP" "$rc" >&2' EXIT

# ---------------------------------------------------------------- 1. apt packages
step_apt() {
  STEP="apt packages"
  if [ "${SLUICE_SKIP_APT:-0}" = 1 ]; then say "apt: skipped (SLUICE_SKIP_APT=1)"; return 0; fi
  command -v dpkg-query >/dev/null 2>&1 || die "dpkg-query not found: this script targets Debian 12"
  local -A installed=()
  local pkg status
  # One dpkg-query for all names; unknown packages print nothing (stderr dropped).
  while read -r pkg status; do
    [ "$status" = "ii" ] && installed[$pkg]=1
  done < <(dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' "${APT_PACKAGES[@]}" 2>/dev/null || true)
  local missing=()
  for pkg in "${APT_PACKAGES[@]}"; do
    [ -n "${installed[$pkg]:-}" ] || missing+=("$pkg")
  done
  if [ "${#missing[@]}" -eq 0 ]; then
    say "apt: all ${#APT_PACKAGES[@]} packages present"
    return 0
  fi
  say "apt: installing ${#missing[@]} missing package(s): ${missing[*]}"
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "not root and no sudo; install as root: apt-get install ${missing[*]}"
    sudo=(sudo -n DEBIAN_FRONTEND=noninteractive)
  fi
  # Keep apt from starting the Debian redis-server / postgresql services (we run our own,
  # on private ports, from scripts/stack.sh). Only when no policy-rc.d exists already
  # (Docker images usually ship one that denies everything).
  local policy=/usr/sbin/policy-rc.d created_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# temporary, written by sluice scripts/setup.sh\nexit 101\n' \
      | "${sudo[@]}" tee "$policy" >/dev/null
    "${sudo[@]}" chmod 0755 "$policy"
    created_policy=1
  fi
  local rc=0
  # DPkg::Lock::Timeout: wait for another apt/dpkg run instead of failing at once.
  "${sudo[@]}" apt-get -q -o DPkg::Lock::Timeout=600 update < /dev/null || rc=$?
  if [ "$rc" -eq 0 ]; then
    "${sudo[@]}" apt-get -q -y -o DPkg::Lock::Timeout=600 -o Dpkg::Use-Pty=0 \
      -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
      install --no-install-recommends "${missing[@]}" < /dev/null || rc=$?
  fi
  if [ "$created_policy" = 1 ]; then "${sudo[@]}" rm -f "$policy"; fi
  [ "$rc" -eq 0 ] || die "apt-get failed (exit $rc) installing: ${missing[*]}"
  say "apt: done"
}

# ---------------------------------------------------------------- 2. Kafka jars
kafka_libs_complete() {
  [ -f "$KAFKA_MARKER" ] && [ -f "$KAFKA_LIBS/kafka_2.13-$KAFKA_VERSION.jar" ]
}

write_pom() {
  cat > "$1" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by sluice scripts/setup.sh. Throwaway POM: only used to resolve and copy the
     Kafka broker's runtime jars (the kafka_2.13 POM lacks the log4j2 SLF4J binding that the
     release tarball adds; see /work/shared/reference/kafka-local.md section 2). -->
<project>
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.sluice</groupId>
  <artifactId>kafka-broker-libs</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId><version>$SLF4J_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-api</artifactId><version>$LOG4J_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>$LOG4J_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>$LOG4J_VERSION</version></dependency>
  </dependencies>
</project>
EOF
}

# Copy the runtime dependencies of POM $1 into $2 (log $3); prints the plugin that worked.
mvn_copy_deps() {
  local pom="$1" out="$2" log="$3" plugin
  : > "$log"
  for plugin in "${DEP_PLUGINS[@]}"; do
    # Plugin pinned by full coordinates: no prefix resolution, no project plugins needed.
    if mvn -B -ntp -f "$pom" "$plugin:copy-dependencies" \
         -DincludeScope=runtime -DoutputDirectory="$out" >> "$log" 2>&1 < /dev/null; then
      echo "$plugin"
      return 0
    fi
    say "jars: $plugin failed, trying next" >&2
    rm -rf "$out"
  done
  tail -n 30 "$log" >&2
  die "mvn copy-dependencies failed (full log: $log)"
}

step_kafka() {
  STEP="kafka jars"
  if kafka_libs_complete; then
    say "kafka $KAFKA_VERSION jars: present ($KAFKA_LIBS)"
    return 0
  fi
  command -v mvn >/dev/null 2>&1 || die "mvn not found (apt package maven)"
  command -v java >/dev/null 2>&1 || die "java not found (apt package openjdk-17-jdk-headless)"
  mkdir -p "$KAFKA_HOME_DIR"
  local tmp="$KAFKA_HOME_DIR/libs.tmp.$$" pom="$KAFKA_HOME_DIR/pom.xml" log="$KAFKA_HOME_DIR/mvn.log"
  write_pom "$pom"
  rm -rf "$tmp"
  say "kafka $KAFKA_VERSION jars: fetching from Maven Central (log: $log)"
  local plugin
  plugin=$(mvn_copy_deps "$pom" "$tmp" "$log")
  local must
  for must in "kafka_2.13-$KAFKA_VERSION.jar" "kafka-clients-$KAFKA_VERSION.jar" \
              "kafka-server-$KAFKA_VERSION.jar" "kafka-metadata-$KAFKA_VERSION.jar" \
              "kafka-raft-$KAFKA_VERSION.jar" "log4j-api-$LOG4J_VERSION.jar" \
              "log4j-core-$LOG4J_VERSION.jar" "log4j-slf4j-impl-$LOG4J_VERSION.jar" \
              "slf4j-api-$SLF4J_VERSION.jar"; do
    [ -f "$tmp/$must" ] || die "jar missing after mvn: $must (log: $log)"
  done
  compgen -G "$tmp/scala-library-*.jar" >/dev/null || die "scala-library jar missing (log: $log)"
  # Exactly one SLF4J binding, else SLF4J picks one at random (or NOP).
  local bindings
  bindings=$(find "$tmp" -maxdepth 1 \( -name 'slf4j-reload4j-*.jar' -o -name 'slf4j-log4j12-*.jar' \
             -o -name 'log4j-slf4j2-impl-*.jar' -o -name 'slf4j-simple-*.jar' -o -name 'logback-classic-*.jar' \) | wc -l)
  [ "$bindings" -eq 0 ] || die "unexpected extra SLF4J binding(s) in $tmp"
  rm -rf "$KAFKA_LIBS"
  mv "$tmp" "$KAFKA_LIBS"
  {
    echo "kafka=$KAFKA_VERSION log4j=$LOG4J_VERSION slf4j=$SLF4J_VERSION plugin=$plugin"
    echo "fetched=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    (cd "$KAFKA_LIBS" && ls -1)
  } > "$KAFKA_MARKER"
  say "kafka jars: $(find "$KAFKA_LIBS" -maxdepth 1 -name '*.jar' | wc -l) jars, $(du -sh "$KAFKA_LIBS" | cut -f1) in $KAFKA_LIBS"
}

# A Kafka 3.9 broker for one test only: librdkafka before 2.6.1 (Debian 12 ships 2.0.2) ends
# the SCRAM exchange in a form Kafka 4 refuses and Kafka 3.x accepts, so SCRAM logins are
# tested against this one (tests/e2e/test_kafka_tls.py; docs/OPERATIONS.md "Security").
step_kafka_scram() {
  STEP="kafka $KAFKA_SCRAM_VERSION jars (SCRAM test broker)"
  local home="$CACHE_DIR/kafka-$KAFKA_SCRAM_VERSION" libs marker
  libs="$home/libs"
  marker="$home/.complete"
  if [ -f "$marker" ] && [ -f "$libs/kafka_2.13-$KAFKA_SCRAM_VERSION.jar" ]; then
    say "kafka $KAFKA_SCRAM_VERSION jars: present ($libs)"
    return 0
  fi
  mkdir -p "$home"
  local tmp="$home/libs.tmp.$$" pom="$home/pom.xml" log="$home/mvn.log"
  cat > "$pom" <<XML
<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by sluice scripts/setup.sh: the runtime jars of a Kafka $KAFKA_SCRAM_VERSION broker
     (log4j 1 through reload4j, as its release tarball has it). -->
<project>
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.sluice</groupId>
  <artifactId>kafka-scram-broker-libs</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$KAFKA_SCRAM_VERSION</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-reload4j</artifactId><version>$SLF4J_VERSION</version></dependency>
  </dependencies>
</project>
XML
  rm -rf "$tmp"
  say "kafka $KAFKA_SCRAM_VERSION jars: fetching from Maven Central (log: $log)"
  local plugin
  plugin=$(mvn_copy_deps "$pom" "$tmp" "$log")
  local must
  for must in "kafka_2.13-$KAFKA_SCRAM_VERSION.jar" "kafka-clients-$KAFKA_SCRAM_VERSION.jar" \
              "kafka-server-$KAFKA_SCRAM_VERSION.jar" "kafka-raft-$KAFKA_SCRAM_VERSION.jar" \
              "slf4j-reload4j-$SLF4J_VERSION.jar"; do
    [ -f "$tmp/$must" ] || die "jar missing after mvn: $must (log: $log)"
  done
  rm -rf "$libs"
  mv "$tmp" "$libs"
  printf 'kafka=%s plugin=%s fetched=%s\n' "$KAFKA_SCRAM_VERSION" "$plugin" \
    "$(date -u +%Y-%m-%dT%H:%M:%SZ)" > "$marker"
  say "kafka $KAFKA_SCRAM_VERSION jars: $(find "$libs" -maxdepth 1 -name '*.jar' | wc -l) jars in $libs"
}

# ---------------------------------------------------------------- 3. Python venv
step_venv() {
  STEP="python venv"
  local want="${PIP_REQUIREMENTS[*]}" marker="$VENV_DIR/.sluice-requirements"
  if [ -x "$VENV_DIR/bin/python" ] && [ -f "$marker" ] && [ "$(cat "$marker")" = "$want" ] \
     && "$VENV_DIR/bin/python" -c 'import standardwebhooks' 2>/dev/null; then
    say "venv: present ($VENV_DIR: $want)"
    return 0
  fi
  local py
  if [ -x /usr/bin/python3 ]; then py=/usr/bin/python3; else py=$(command -v python3 || true); fi
  [ -n "$py" ] || die "python3 not found"
  if [ ! -x "$VENV_DIR/bin/python" ]; then
    say "venv: creating $VENV_DIR with $py"
    "$py" -m venv "$VENV_DIR" || die "python3 -m venv failed (apt package python3-venv?)"
  fi
  say "venv: pip install $want"
  "$VENV_DIR/bin/python" -m pip install -q --disable-pip-version-check --no-input "${PIP_REQUIREMENTS[@]}" < /dev/null \
    || die "pip install ${PIP_REQUIREMENTS[*]} failed"
  "$VENV_DIR/bin/python" -c 'import standardwebhooks' || die "standardwebhooks does not import"
  printf '%s' "$want" > "$marker"
}

# ---------------------------------------------------------------- 4. kustomize
# Renders the overlays of ops/k8s/ in the suite (tests/ops/test_k8s.py). Built from source
# through the Go module proxy with the Go toolchain already there (PATH, /usr/local/go), else
# Debian's golang-go (step 1). A minute or two once; a marker names the version built.
step_kustomize() {
  STEP="kustomize"
  local bindir="$CACHE_DIR/bin" go
  local bin="$bindir/kustomize" marker="$bindir/.kustomize-version" log="$bindir/kustomize-build.log"
  if [ -x "$bin" ] && [ "$(cat "$marker" 2>/dev/null)" = "$KUSTOMIZE_VERSION" ]; then
    say "kustomize $KUSTOMIZE_VERSION: present ($bin)"
    return 0
  fi
  go=$(command -v go || true)
  if [ -z "$go" ] && [ -x /usr/local/go/bin/go ]; then go=/usr/local/go/bin/go; fi
  [ -n "$go" ] || die "no Go toolchain to build kustomize (apt package golang-go)"
  mkdir -p "$bindir"
  say "kustomize $KUSTOMIZE_VERSION: building with $("$go" version) (log: $log)"
  # GOTOOLCHAIN=local: the installed Go, never a download; GOFLAGS emptied so that a user's
  # settings cannot change the build; outside any Go module (cd).
  if ! (cd "$bindir" && GOBIN="$bindir" GOFLAGS= GOTOOLCHAIN=local CGO_ENABLED=0 \
        "$go" install "sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION") > "$log" 2>&1 < /dev/null; then
    tail -n 20 "$log" >&2
    die "go install kustomize $KUSTOMIZE_VERSION failed (log: $log)"
  fi
  "$bin" build --help > /dev/null || die "$bin does not run"
  printf '%s' "$KUSTOMIZE_VERSION" > "$marker"
  say "kustomize $KUSTOMIZE_VERSION: $bin"
}

say "cache dir: $CACHE_DIR"
step_apt
step_kafka
step_kafka_scram
step_venv
step_kustomize
STEP="done"
say "ok in $((SECONDS - T0))s (java: $(java -version 2>&1 | head -n1))"
