#!/usr/bin/env bash
# ctest lsan_openssl_ctx_leak (label unit; registered in ASan builds only, so it runs in the
# asan stage of scripts/test.sh): tests/lsan.supp may hide OpenSSL's one-time initialisation,
# never a leak of a context we create. lsan_openssl_leak keys an HMAC-SHA256 the way
# common/sl_sign.c does (two SHA-256 contexts) and drops it; under the suppression file
# LeakSanitizer must report it:
#
#   * with ASan's default fast unwinder (what the suite runs with: the stack stops at
#     CRYPTO_zalloc, because Debian's OpenSSL has no frame pointers);
#   * with the slow unwinder (fast_unwind_on_malloc=0), whose report goes on past
#     CRYPTO_zalloc to padded_state (common/sl_sign.c; EVP_MD_CTX_new's frame is a tail call);
#
# and the same program freeing its contexts exits 0 with no report under both unwinders (the
# suppressions cover what OpenSSL itself keeps; nothing else is reported).
#
#   lsan_openssl.sh HELPER SUPPRESSIONS_FILE
set -euo pipefail
helper=$1
supp=$2
[ -x "$helper" ] || { echo "FAIL: $helper is not an executable" >&2; exit 1; }
[ -r "$supp" ] || { echo "FAIL: cannot read $supp" >&2; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
failures=0

fail() {
  echo "FAIL: $*" >&2
  echo "---- its output:" >&2
  cat "$out" >&2
  failures=$((failures + 1))
}

# run MODE UNWIND: the helper under LeakSanitizer with the suppression file; sets rc.
# exitcode=23 tells a leak report apart from the helper's own failures (1, 2).
run() {
  local fast=1
  [ "$2" = slow ] && fast=0
  rc=0
  ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1:exitcode=23:fast_unwind_on_malloc=$fast" \
    LSAN_OPTIONS="suppressions=$supp:print_suppressions=0" \
    "$helper" "$1" >"$out" 2>&1 || rc=$?
}

for unwind in fast slow; do
  run leak "$unwind"
  if [ "$rc" != 23 ] || ! grep -q "ERROR: LeakSanitizer: detected memory leaks" "$out"; then
    fail "leaked EVP_MD_CTX not reported ($unwind unwinder, exit $rc; want 23 and a report)"
  elif ! grep -q "Direct leak of .* byte(s) in 1 object(s)" "$out" ||
    ! grep -q "in CRYPTO_zalloc" "$out"; then
    fail "the report does not show the context's allocation ($unwind unwinder)"
  elif [ "$unwind" = slow ] && ! grep -q "in padded_state .*common/sl_sign.c" "$out"; then
    fail "the slow unwinder's report does not name padded_state"
  else
    echo "ok: leaked context reported ($unwind unwinder)"
  fi

  run clean "$unwind"
  if [ "$rc" != 0 ] || grep -q "LeakSanitizer" "$out"; then
    fail "a program that frees its context got a report ($unwind unwinder, exit $rc)"
  else
    echo "ok: nothing reported when the context is freed ($unwind unwinder)"
  fi
done
[ "$failures" = 0 ] || exit 1
