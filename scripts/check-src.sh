#!/usr/bin/env bash
# Source checks run by scripts/test.sh: banned C functions (unbounded or unsafe),
# clang-format conformance of every C file (.clang-format at the top), and clang-tidy over the
# product code (.clang-tidy at the top: bugprone-*, cert-err33-c, cognitive complexity at most
# 30 per function except the functions in scripts/complexity-baseline.txt, which may not get
# more complex). clang-tidy reads the compile commands of a configure-only build dir,
# build/lint (nothing is compiled). SL_CHECK_SRC_TIDY=0 skips clang-tidy (quick local runs).
# pyflakes (from scripts/setup.sh's venv) over every Python file in git.
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
PY="${SLUICE_CACHE_DIR:-${HOME:-/root}/.cache/sluice}/venv/bin/python"
if [ -x "$PY" ] && "$PY" -c 'import pyflakes' 2>/dev/null; then
  mapfile -t pyfiles < <(git ls-files '*.py')
  if ! "$PY" -m pyflakes "${pyfiles[@]}" >&2; then
    echo "check-src: pyflakes findings in Python files (see above)" >&2
    status=1
  fi
else
  echo "check-src: pyflakes missing (run scripts/setup.sh)" >&2
  status=1
fi
if [ "${SL_CHECK_SRC_TIDY:-1}" = 1 ]; then
  if ! command -v clang-tidy >/dev/null 2>&1; then
    echo "check-src: clang-tidy missing (run scripts/setup.sh)" >&2
    status=1
  elif ! cmake -S . -B build/lint -DSL_WERROR=ON >/tmp/check-src-cmake.$$ 2>&1; then
    cat /tmp/check-src-cmake.$$ >&2
    echo "check-src: cmake configure of build/lint failed (clang-tidy needs its compile commands)" >&2
    status=1
  else
    mapfile -t tidy < <(git ls-files 'common/*.c' 'consumer/*.c' 'recorder/*.c' 'producer/*.c' \
      'ctl/*.c' 'api/*.c' | grep -v '^producer/examples/')
    printf '%s\n' "${tidy[@]}" | xargs -P2 -n8 clang-tidy -p build/lint --quiet \
      >/tmp/check-src-tidy.$$ 2>/dev/null || true
    # findings: file:line:col: warning|error: message [check]; complexities checked against
    # the baseline ("N path function" lines), everything else is a failure
    if ! awk -v repo="$PWD/" '
        FNR == NR { if ($0 !~ /^#/ && NF == 3) base[$2 " " $3] = $1; next }
        /: (warning|error): / {
          line = $0; sub("^" repo, "", line)
          if (line ~ /readability-function-cognitive-complexity/) {
            split(line, parts, ":"); file = parts[1]
            match(line, /function .* has cognitive complexity of [0-9]+/)
            m = substr(line, RSTART, RLENGTH)
            fn = m; sub(/^function /, "", fn); sub(/ has cognitive.*/, "", fn); gsub(/\047/, "", fn)
            n = m; sub(/.* of /, "", n); n += 0
            key = file " " fn
            if (!(key in base)) { print "check-src: " file ": " fn " has cognitive complexity " n " (at most 30; split it)"; bad = 1 }
            else if (n > base[key] + 0) { print "check-src: " file ": " fn " grew to cognitive complexity " n " (baseline " base[key] ")"; bad = 1 }
            next
          }
          print "check-src: " line; bad = 1
        }
        END { exit bad }' scripts/complexity-baseline.txt /tmp/check-src-tidy.$$ >&2; then
      echo "check-src: clang-tidy findings (see above; .clang-tidy says which checks and why)" >&2
      status=1
    fi
    rm -f /tmp/check-src-tidy.$$
  fi
  rm -f /tmp/check-src-cmake.$$
fi
[ "$status" = 0 ] && echo "check-src: ok (${#files[@]} files)"
exit "$status"
