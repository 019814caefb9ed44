# Shared by bench/peers/build-*.sh (sourced, not run): messages, the build directory outside
# the repository, and a peer's sources from git (a URL cloned bare once, or a local git dir).
# The sourcing script sets PEERS_TAG (its message prefix) and REPO_DIR first.

say() { printf '[%s] %s\n' "$PEERS_TAG" "$*" >&2; }
die() { printf '[%s] ERROR: %s\n' "$PEERS_TAG" "$*" >&2; exit 1; }

# PEERS_DIR (default $HOME/peers) made absolute; refused inside the repository
peers_dir() {
  PEERS_DIR="${PEERS_DIR:-${HOME:-/root}/peers}"
  mkdir -p "$PEERS_DIR"
  PEERS_DIR=$(cd "$PEERS_DIR" && pwd)
  case "$PEERS_DIR/" in
    "$REPO_DIR"/*) die "PEERS_DIR=$PEERS_DIR is inside the repository; put it elsewhere" ;;
  esac
}

is_git_dir() { git --git-dir="$1" rev-parse --git-dir >/dev/null 2>&1; }

# export_rev GIT_DIR REV DST MARKER: `git archive` REV into DST once (DST/MARKER tells it is
# there), through DST.tmp so that an interrupted export is never taken for a whole one
export_rev() {
  local gd=$1 rev=$2 dst=$3 marker=$4
  [ -f "$dst/$marker" ] && return 0
  rm -rf "$dst.tmp"
  mkdir -p "$dst.tmp"
  git --git-dir="$gd" archive "$rev" | tar -x -C "$dst.tmp" || die "git archive $rev from $gd failed"
  rm -rf "$dst"
  mv "$dst.tmp" "$dst"
}

# source_git_dir SRC VAR CLONE: prints the git directory of SRC (VAR names it in messages):
# SRC itself when it is a local directory (a work tree's .git or a bare one), else a bare,
# blob-less clone of the URL SRC at CLONE, made once
source_git_dir() {
  local src=$1 var=$2 clone=$3 gd
  if [ -d "$src" ]; then
    gd=$src
    [ -d "$gd/.git" ] && gd="$gd/.git"
    is_git_dir "$gd" || die "$var=$src is a directory but not a git repository"
  else
    gd=$clone
    if [ ! -d "$gd" ]; then
      say "cloning $src (bare, no blobs until needed)"
      git clone --bare --filter=blob:none "$src" "$gd" >&2 || die "git clone $src failed"
    fi
  fi
  echo "$gd"
}
