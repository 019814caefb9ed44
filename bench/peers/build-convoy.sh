#!/usr/bin/env bash
# Builds Convoy (frain-dev/convoy, Go) for the peers phase of bench/run.sh, outside this
# repository, and prints the line that hands it to the phase:
#
#   bench/peers/build-convoy.sh             -> $PEERS_DIR/convoy (default $HOME/peers/convoy)
#   SLUICE_BENCH_CONVOY=$HOME/peers/convoy bench/run.sh --only peers
#
# Steps: the source at CONVOY_REV (git archive of a local git dir, or a clone of CONVOY_GIT)
# into $PEERS_DIR/convoy-src-<rev> -> optional `replace` directives in that scratch copy's
# go.mod (never in this repository) -> `go build ./cmd` (GOFLAGS=-mod=mod, nice -n 19, -p
# GO_BUILD_JOBS) -> $PEERS_DIR/convoy and $PEERS_DIR/convoy.build-info (revision, Go version,
# replacements; the peers phase records it). A cold build takes about 3.5 minutes on 2 cores.
#
# Env (all optional):
#   CONVOY_REV     revision (default 2b60cc652: tag v26.7.3 plus one commit; the phase's
#                  API calls and facts were checked against it)
#   CONVOY_GIT     a git URL or a local git directory (bare mirrors too) holding CONVOY_REV
#                  (default https://github.com/frain-dev/convoy.git)
#   PEERS_DIR      where the source and the binary go (default $HOME/peers; must be outside
#                  this repository)
#   GO_BUILD_JOBS  go build -p (default 1: the machine is shared)
#   CONVOY_REPLACE_GOPARTMAN, CONVOY_REPLACE_REQUESTMIGRATIONS
#                  for a module proxy that refuses github.com/jirevwe/gopartman or
#                  github.com/subomi/requestmigrations/v2 (403): PATH or PATH@REV, a source
#                  tree (with go.mod) or a git directory to `git archive` REV from (default
#                  HEAD), written as a `replace` directive into the scratch go.mod. With
#                  ordinary internet access neither is needed: go fetches them itself.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$SCRIPT_DIR/../.." && pwd)
REV="${CONVOY_REV:-2b60cc652}"
GIT_SRC="${CONVOY_GIT:-https://github.com/frain-dev/convoy.git}"
JOBS="${GO_BUILD_JOBS:-1}"
PEERS_TAG=build-convoy
# shellcheck source=bench/peers/lib.sh
. "$SCRIPT_DIR/lib.sh"

command -v go >/dev/null 2>&1 || die "go not found (Go 1.26 or newer: Convoy's go.mod says go 1.26.2)"
command -v git >/dev/null 2>&1 || die "git not found"
peers_dir

# ---- Convoy's source ----------------------------------------------------------------------
SRC="$PEERS_DIR/convoy-src-$REV"
gd="$PEERS_DIR/convoy.git"
if [ -d "$GIT_SRC" ] || [ ! -f "$SRC/go.mod" ]; then
  # a source exported before needs no clone (the revision is then read from the clone when
  # one is there)
  gd=$(source_git_dir "$GIT_SRC" CONVOY_GIT "$PEERS_DIR/convoy.git")
fi
if [ ! -f "$SRC/go.mod" ]; then
  say "exporting $REV into $SRC"
  export_rev "$gd" "$REV" "$SRC" go.mod
fi
full_rev=$(git --git-dir="$gd" rev-parse "$REV^{commit}" 2>/dev/null || echo "$REV")

# ---- replacements for modules the proxy refuses ---------------------------------------------
replaced=""
replace_mod() { # module spec name
  local mod=$1 spec=$2 name=$3 path rev dir
  path=${spec%@*}
  rev=HEAD
  [ "$path" != "$spec" ] && rev=${spec##*@}
  if [ -f "$path/go.mod" ]; then
    dir=$(cd "$path" && pwd)
  else
    local g=$path
    [ -d "$g/.git" ] && g="$g/.git"
    is_git_dir "$g" || die "$spec: neither a source tree with go.mod nor a git directory"
    dir="$PEERS_DIR/$name-$(git --git-dir="$g" rev-parse --short "$rev^{commit}")"
    export_rev "$g" "$rev" "$dir" go.mod
  fi
  (cd "$SRC" && go mod edit -replace "$mod=$dir") || die "go mod edit -replace $mod failed"
  replaced="$replaced $mod=>$dir"
  say "replace $mod => $dir"
}
[ -n "${CONVOY_REPLACE_GOPARTMAN:-}" ] &&
  replace_mod github.com/jirevwe/gopartman "$CONVOY_REPLACE_GOPARTMAN" gopartman
[ -n "${CONVOY_REPLACE_REQUESTMIGRATIONS:-}" ] &&
  replace_mod github.com/subomi/requestmigrations/v2 "$CONVOY_REPLACE_REQUESTMIGRATIONS" requestmigrations

# ---- build ------------------------------------------------------------------------------------
OUT="$PEERS_DIR/convoy"
say "go build ./cmd in $SRC ($(go version | cut -d' ' -f3), -p $JOBS, nice -n 19); a cold build takes minutes"
t0=$SECONDS
(cd "$SRC" && GOFLAGS="${GOFLAGS:-} -mod=mod" nice -n 19 go build -p "$JOBS" -o "$OUT.tmp" ./cmd) ||
  die "go build failed (a 403 from the module proxy for gopartman or requestmigrations: see CONVOY_REPLACE_* above)"
mv "$OUT.tmp" "$OUT"
{
  echo "frain-dev/convoy $full_rev"
  go version | cut -d' ' -f3-
  echo "replace:${replaced:- none}"
} > "$OUT.build-info"
say "built $OUT in $((SECONDS - t0)) s"
echo "export SLUICE_BENCH_CONVOY=$OUT"
