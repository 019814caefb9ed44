#!/usr/bin/env bash
# Builds Svix's server (svix/svix-webhooks, Rust) for the peers phase of bench/run.sh, outside
# this repository, and prints the line that hands it to the phase:
#
#   bench/peers/build-svix.sh               -> $PEERS_DIR/svix-server (default $HOME/peers)
#   SLUICE_BENCH_SVIX=$HOME/peers/svix-server bench/run.sh --only peers
#
# Steps: the source at SVIX_REV (git archive of a local git dir, or a clone of SVIX_GIT) into
# $PEERS_DIR/svix-src-<rev> -> optional [patch] sections in that scratch copy's server/Cargo.toml
# for the three crates Svix takes from git repositories (never in this repository) ->
# `cargo build --release --bin svix-server` (nice -n 19, -j CARGO_BUILD_JOBS) ->
# $PEERS_DIR/svix-server and $PEERS_DIR/svix-server.build-info (revision, rustc, patches; the
# peers phase records it). A cold build took 8 minutes on 2 cores (AMD EPYC vCPUs).
#
# Env (all optional):
#   SVIX_REV          revision (default 4fc0cfb8b: server 1.100.0; the phase's API calls were
#                     checked against it)
#   SVIX_GIT          a git URL or a local git directory (bare mirrors too) holding SVIX_REV
#                     (default https://github.com/svix/svix-webhooks.git)
#   PEERS_DIR         where the source and the binary go (default $HOME/peers; outside this
#                     repository)
#   CARGO_BUILD_JOBS  cargo -j (default 2)
#   SVIX_OMNIQUEUE, SVIX_EXECMETA
#                     for a machine that reaches crates.io but not GitHub: a source tree or a
#                     git directory (PATH or PATH@REV, default the revision Svix pins) of
#                     svix/omniqueue-rs and svix/rust-executable-metadata, written as a [patch]
#                     of that git source
#   SVIX_HYPER        the same for Svix's fork of hyper (two commits on hyper 1.11.0 that make
#                     hyper::ext::HeaderCaseMap public, with `get` and `From<HeaderMap<Bytes>>`):
#                     a source tree of that fork, or `crates-io`: hyper 1.11.0 from crates.io
#                     with that change applied here
# With ordinary internet access none of them is needed: cargo fetches the git sources itself.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$SCRIPT_DIR/../.." && pwd)
REV="${SVIX_REV:-4fc0cfb8b}"
GIT_SRC="${SVIX_GIT:-https://github.com/svix/svix-webhooks.git}"
JOBS="${CARGO_BUILD_JOBS:-2}"
OMNIQUEUE_REV=acb40983ed65f6cbebb19c05d590249306674a33
EXECMETA_REV=7a32435fbdab53f33e6abab9c1ab500afef0a7a8
HYPER_VERSION=1.11.0
PEERS_TAG=build-svix
# shellcheck source=bench/peers/lib.sh
. "$SCRIPT_DIR/lib.sh"

command -v cargo >/dev/null 2>&1 || die "cargo not found (Rust 1.88 or newer: svix-server's rust-version)"
command -v git >/dev/null 2>&1 || die "git not found"
peers_dir

# ---- Svix's source --------------------------------------------------------------------------
SRC="$PEERS_DIR/svix-src-$REV"
gd=$(source_git_dir "$GIT_SRC" SVIX_GIT "$PEERS_DIR/svix-webhooks.git")
if ! git --git-dir="$gd" cat-file -e "$REV^{commit}" 2>/dev/null && [ ! -d "$GIT_SRC" ]; then
  say "fetching $GIT_SRC ($REV is not in $gd)"
  git --git-dir="$gd" fetch -q origin '+refs/heads/*:refs/heads/*' '+refs/tags/*:refs/tags/*' ||
    die "git fetch $GIT_SRC failed"
fi
full_rev=$(git --git-dir="$gd" rev-parse "$REV^{commit}" 2>/dev/null) || die "$REV is not a commit of $GIT_SRC"
if [ ! -f "$SRC/server/Cargo.toml.orig" ]; then
  say "exporting $REV into $SRC"
  rm -rf "$SRC.tmp" && mkdir -p "$SRC.tmp"
  git --git-dir="$gd" archive "$REV" server | tar -x -C "$SRC.tmp" || die "git archive $REV from $gd failed"
  # the manifest as Svix has it: every run starts its [patch] sections from this copy
  cp "$SRC.tmp/server/Cargo.toml" "$SRC.tmp/server/Cargo.toml.orig"
  rm -rf "$SRC"
  mv "$SRC.tmp" "$SRC"
fi
MANIFEST="$SRC/server/Cargo.toml"
cp "$SRC/server/Cargo.toml.orig" "$MANIFEST"

# ---- patches for git sources this machine cannot reach ---------------------------------------
patched=""
# source_dir SPEC NAME DEFAULT_REV -> prints a directory holding that crate's source
source_dir() {
  local spec=$1 name=$2 defrev=$3 path rev
  path=${spec%@*}
  rev=$defrev
  [ "$path" != "$spec" ] && rev=${spec##*@}
  if [ -f "$path/Cargo.toml" ]; then
    (cd "$path" && pwd)
    return
  fi
  local g=$path
  [ -d "$g/.git" ] && g="$g/.git"
  is_git_dir "$g" || die "$spec: neither a source tree with Cargo.toml nor a git directory"
  local dir
  dir="$PEERS_DIR/$name-$(git --git-dir="$g" rev-parse --short "$rev^{commit}")"
  export_rev "$g" "$rev" "$dir" Cargo.toml
  echo "$dir"
}

if [ -n "${SVIX_OMNIQUEUE:-}" ]; then
  dir=$(source_dir "$SVIX_OMNIQUEUE" omniqueue "$OMNIQUEUE_REV")
  [ -f "$dir/omniqueue/Cargo.toml" ] && dir="$dir/omniqueue"
  printf '\n[patch."https://github.com/svix/omniqueue-rs"]\nomniqueue = { path = "%s" }\n' "$dir" >> "$MANIFEST"
  patched="$patched omniqueue=>$dir"
  say "patch omniqueue => $dir"
fi
if [ -n "${SVIX_EXECMETA:-}" ]; then
  dir=$(source_dir "$SVIX_EXECMETA" rust-executable-metadata "$EXECMETA_REV")
  printf '\n[patch."https://github.com/svix/rust-executable-metadata"]\nrust-executable-metadata = { path = "%s" }\n' \
    "$dir" >> "$MANIFEST"
  patched="$patched rust-executable-metadata=>$dir"
  say "patch rust-executable-metadata => $dir"
fi
if [ -n "${SVIX_HYPER:-}" ]; then
  command -v python3 >/dev/null 2>&1 || die "python3 not found (SVIX_HYPER edits the manifest with it)"
  if [ "$SVIX_HYPER" = crates-io ]; then
    dir="$PEERS_DIR/hyper-$HYPER_VERSION-headercasemap"
    if [ ! -f "$dir/Cargo.toml" ]; then
      command -v curl >/dev/null 2>&1 || die "curl not found"
      rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
      curl -fsSL "https://static.crates.io/crates/hyper/hyper-$HYPER_VERSION.crate" |
        tar -xz -C "$dir.tmp" --strip-components=1 || die "download of hyper $HYPER_VERSION from crates.io failed"
      # Svix's fork: HeaderCaseMap public, with get() and From<HeaderMap<Bytes>>
      python3 - "$dir.tmp/src/ext/mod.rs" <<'EOF' || die "hyper $HYPER_VERSION: src/ext/mod.rs is not as expected"
import sys
p = sys.argv[1]
s = open(p).read()
a = "pub(crate) struct HeaderCaseMap(HeaderMap<Bytes>);"
b = "impl HeaderCaseMap {\n"
if s.count(a) != 1 or s.count(b) != 1:
    sys.exit(1)
s = s.replace(a, "pub struct HeaderCaseMap(HeaderMap<Bytes>);")
s = s.replace(b, b + "    /// The first spelling of that header name.\n"
              "    pub fn get(&self, key: HeaderName) -> Option<&Bytes> {\n"
              "        self.0.get(key)\n    }\n\n", 1)
s += ("\n#[cfg(all(any(feature = \"client\", feature = \"server\"), feature = \"http1\"))]\n"
      "impl From<HeaderMap<Bytes>> for HeaderCaseMap {\n"
      "    fn from(hdr_map: HeaderMap<Bytes>) -> Self {\n        Self(hdr_map)\n    }\n}\n")
open(p, "w").write(s)
EOF
      mv "$dir.tmp" "$dir"
    fi
  else
    [ -f "$SVIX_HYPER/Cargo.toml" ] || die "SVIX_HYPER=$SVIX_HYPER: not a source tree with Cargo.toml"
    dir=$(cd "$SVIX_HYPER" && pwd)
  fi
  python3 - "$MANIFEST" "$dir" <<'EOF' || die "server/Cargo.toml: no [patch.crates-io] hyper line to replace"
import re, sys
p, d = sys.argv[1], sys.argv[2]
s = open(p).read()
s2, n = re.subn(r'(?m)^hyper = \{ git = "https://github.com/svix/hyper.git".*$',
                'hyper = { path = "%s" }' % d, s)
if n != 1:
    sys.exit(1)
open(p, "w").write(s2)
EOF
  patched="$patched hyper=>$dir"
  say "patch hyper => $dir"
fi

# ---- build ------------------------------------------------------------------------------------
OUT="$PEERS_DIR/svix-server"
say "cargo build --release --bin svix-server in $SRC/server ($(rustc --version | cut -d' ' -f2), -j $JOBS, nice -n 19); a cold build takes minutes"
t0=$SECONDS
(cd "$SRC/server" && nice -n 19 cargo build --release -j "$JOBS" --bin svix-server --target-dir "$SRC/server/target") ||
  die "cargo build failed (a git source GitHub refuses: see SVIX_OMNIQUEUE, SVIX_EXECMETA, SVIX_HYPER above)"
cp "$SRC/server/target/release/svix-server" "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
{
  echo "svix/svix-webhooks $full_rev"
  rustc --version
  echo "patch:${patched:- none}"
} > "$OUT.build-info"
say "built $OUT in $((SECONDS - t0)) s"
echo "export SLUICE_BENCH_SVIX=$OUT"
