#!/usr/bin/env bash
# Source checks run by scripts/test.sh: banned C functions (unbounded or unsafe), and
# clang-format conformance of every C file (.clang-format at the top).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mapfile -t files < <(git ls-files '*.c' '*.h')
status=0
# sprintf/strcpy/strcat/gets: unbounded writes; atoi: no error detection; strtok: hidden state
if grep -nE '\b(sprintf|vsprintf|strcpy|strcat|gets|atoi|atol|strtok)\s*\(' "${files[@]}" \
     | grep -vE '^\S+:[0-9]+:\s*(\*|//)'; then
  echo "check-src: banned function used (see above)" >&2
  status=1
fi
if command -v clang-format >/dev/null 2>&1; then
  if ! clang-format --dry-run -Werror "${files[@]}" 2>/tmp/clang-format.$$; then
    head -40 /tmp/clang-format.$$ >&2
    echo "check-src: files not formatted (run: clang-format -i \$(git ls-files '*.c' '*.h'))" >&2
    status=1
  fi
  rm -f /tmp/clang-format.$$
else
  echo "check-src: clang-format missing (run scripts/setup.sh)" >&2
  status=1
fi
[ "$status" = 0 ] && echo "check-src: ok (${#files[@]} files)"
exit "$status"
