#!/usr/bin/env bash
# producer_install (ctest, label component; needs no services): libsluice_producer as an
# application gets it.
#
#   producer_install.sh SRC_DIR BUILD_DIR CC VERSION SOVERSION LIBDIR [SANITIZE_FLAGS]
#
#  1. `cmake --install BUILD_DIR --prefix <temp>`; the layout: header, libsluice_producer.so
#     (SONAME libsluice_producer.so.SOVERSION, symlinks) and .a, sluice_producer.pc, the
#     CMake package SluiceProducer (config, version file, targets)
#  2. the installed header is self-contained: no "..." includes, compiles alone as C11
#     (-pedantic) and as C++
#  3. exports: `nm -D` of the .so and the global symbols of the .a are exactly the functions
#     the header declares (all sluice_*; no common/ internals)
#  4. producer/examples/sluice_publish.c built against the installed copy four ways:
#     pkg-config shared, pkg-config static, find_package(SluiceProducer) with
#     Sluice::producer and with Sluice::producer_static; each is checked to link the
#     installed library (or none, when static) and run: --version, configuration errors from
#     sluice_config_set / the environment / the security cross-check (exit 78), records
#     refused synchronously by a real producer (exit 1, the field named), none of which needs
#     a broker (127.0.0.1:1 is never answered, nothing is published)
#
# Sanitizer builds pass their -fsanitize flags as SANITIZE_FLAGS: the installed library is
# instrumented, so every example is compiled and linked with the same flags (the runtime
# comes with the executable), and all four combinations run. The temp dir is removed on
# success and kept (path printed) on failure.
set -euo pipefail

SRC=$1 BUILD=$2 CC=$3 VERSION=$4 SOVERSION=$5 LIBDIR=$6 SAN=${7:-}
WORK=$(mktemp -d /tmp/sl_producer_install.XXXXXX)
PREFIX=$WORK/prefix
LIB=$PREFIX/$LIBDIR
ok=0
finish() {
  if [ "$ok" = 1 ]; then rm -rf "$WORK"; else echo "producer_install: FAILED; kept $WORK" >&2; fi
}
trap finish EXIT
fail() { echo "producer_install: $*" >&2; exit 1; }
step() { echo "== $*"; }

# ==== 1. install and layout ====
step "cmake --install $BUILD --prefix $PREFIX"
cmake --install "$BUILD" --prefix "$PREFIX" >"$WORK/install.log" ||
  { cat "$WORK/install.log" >&2; fail "cmake --install failed"; }
for f in include/sluice_producer.h "$LIBDIR/libsluice_producer.a" \
         "$LIBDIR/libsluice_producer.so.$VERSION" "$LIBDIR/pkgconfig/sluice_producer.pc" \
         "$LIBDIR/cmake/SluiceProducer/SluiceProducerConfig.cmake" \
         "$LIBDIR/cmake/SluiceProducer/SluiceProducerConfigVersion.cmake" \
         "$LIBDIR/cmake/SluiceProducer/SluiceProducerTargets.cmake" bin/sluice-produce; do
  [ -e "$PREFIX/$f" ] || fail "not installed: $f"
done
[ "$(readlink "$LIB/libsluice_producer.so")" = "libsluice_producer.so.$SOVERSION" ] ||
  fail "libsluice_producer.so does not point at libsluice_producer.so.$SOVERSION"
[ "$(readlink "$LIB/libsluice_producer.so.$SOVERSION")" = "libsluice_producer.so.$VERSION" ] ||
  fail "libsluice_producer.so.$SOVERSION does not point at libsluice_producer.so.$VERSION"
soname=$(readelf -d "$LIB/libsluice_producer.so.$VERSION" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libsluice_producer.so.$SOVERSION" ] || fail "SONAME is \"$soname\""
echo "layout ok; SONAME $soname"

# ==== 2. the header stands alone ====
HDR=$PREFIX/include/sluice_producer.h
if grep -n '#include "' "$HDR"; then fail "the installed header includes project headers"; fi
STRICT=(-std=c11 -pedantic -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes
        -Wconversion -Wno-sign-conversion -Wcast-qual -Wundef -Werror)
printf '#include <sluice_producer.h>\n' >"$WORK/alone.c"
"$CC" "${STRICT[@]}" -I"$PREFIX/include" -fsyntax-only "$WORK/alone.c" ||
  fail "the header does not compile on its own as C11"
printf '#include <sluice_producer.h>\nint f(sluice_err_t *e);\nint f(sluice_err_t *e) { return sluice_producer_flush(nullptr, 0, e); }\n' \
  >"$WORK/alone.cc"
c++ -std=c++11 -Wall -Wextra -Werror -I"$PREFIX/include" -fsyntax-only "$WORK/alone.cc" ||
  fail "the header does not compile as C++"
echo "header ok: standard headers only, C11 and C++"

# ==== 3. exports ====
"$CC" -E -P -I"$PREFIX/include" "$WORK/alone.c" | grep -oE '\bsluice_[a-z0-9_]+[[:space:]]*\(' |
  tr -d ' (' | sort -u >"$WORK/declared.txt"
[ "$(wc -l <"$WORK/declared.txt")" -ge 10 ] || fail "found too few declarations in the header"
nm -D -g --defined-only --format=posix "$LIB/libsluice_producer.so.$VERSION" | awk '{print $1}' |
  sort -u >"$WORK/exported_so.txt"
diff -u "$WORK/declared.txt" "$WORK/exported_so.txt" ||
  fail "nm -D of libsluice_producer.so differs from the header's functions (above)"
nm -g --defined-only --format=posix "$LIB/libsluice_producer.a" | awk 'NF >= 2 {print $1}' |
  grep -v ':$' | sort -u >"$WORK/exported_a.txt"
diff -u "$WORK/declared.txt" "$WORK/exported_a.txt" ||
  fail "the global symbols of libsluice_producer.a differ from the header's functions (above)"
echo "exports ok: $(wc -l <"$WORK/declared.txt") functions, all sluice_*, in .so and .a"

# ==== 4. the example, four ways ====
EX=$SRC/producer/examples
read -r -a SANF <<<"$SAN"
export PKG_CONFIG_PATH=$LIB/pkgconfig
[ "$(pkg-config --modversion sluice_producer)" = "$VERSION" ] || fail "pkg-config --modversion"
read -r -a PC_CFLAGS <<<"$(pkg-config --cflags sluice_producer)"
read -r -a PC_LIBS <<<"$(pkg-config --libs sluice_producer)"
read -r -a PC_STATIC <<<"$(pkg-config --static --libs sluice_producer)"
step "pkg-config: shared"
"$CC" "${STRICT[@]}" "${SANF[@]}" "${PC_CFLAGS[@]}" "$EX/sluice_publish.c" -o "$WORK/pc-shared" \
  "${PC_LIBS[@]}" -Wl,-rpath,"$LIB" "${SANF[@]}"
step "pkg-config: static"
# the archive by name, then `--static --libs` for the private dependencies (its own
# -lsluice_producer then finds nothing left to resolve: --as-needed drops the .so)
"$CC" "${STRICT[@]}" "${SANF[@]}" "${PC_CFLAGS[@]}" "$EX/sluice_publish.c" -o "$WORK/pc-static" \
  -Wl,-Bstatic -lsluice_producer -Wl,-Bdynamic -Wl,--as-needed "${PC_STATIC[@]}" "${SANF[@]}"
step "find_package(SluiceProducer): Sluice::producer and Sluice::producer_static"
cmake -S "$EX" -B "$WORK/cmake" -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_C_COMPILER="$CC" \
  -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS="${STRICT[*]} $SAN" \
  -DCMAKE_EXE_LINKER_FLAGS="$SAN" >"$WORK/cmake.log" ||
  { cat "$WORK/cmake.log" >&2; fail "configuring producer/examples failed"; }
cmake --build "$WORK/cmake" -j1 >>"$WORK/cmake.log" ||
  { cat "$WORK/cmake.log" >&2; fail "building producer/examples failed"; }

# Run with only what the run needs in the environment: nothing of the stack leaks in.
keep=(PATH="$PATH")
for v in ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS; do
  [ -n "${!v:-}" ] && keep+=("$v=${!v}")
done
run() { # expected-status stderr-substring binary args... (env assignments: RUN_ENV array)
  local want=$1 needle=$2 bin=$3 rc=0
  shift 3
  env -i "${keep[@]}" "${RUN_ENV[@]}" "$bin" "$@" >"$WORK/out" 2>"$WORK/err" || rc=$?
  if [ "$rc" != "$want" ] || ! grep -qF -- "$needle" "$WORK/err" "$WORK/out"; then
    echo "--- stdout"; cat "$WORK/out"; echo "--- stderr"; cat "$WORK/err"
    fail "$(basename "$bin") $*: exit $rc (want $want), expected \"$needle\""
  fi
}

for bin in "$WORK/pc-shared" "$WORK/pc-static" "$WORK/cmake/sluice-publish" \
           "$WORK/cmake/sluice-publish-static"; do
  name=$(basename "$(dirname "$bin")")/$(basename "$bin")
  step "$name"
  needed=$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  case "$bin" in
    *static)
      if grep -q libsluice_producer <<<"$needed"; then fail "$name needs the shared library"; fi
      nm "$bin" >"$WORK/nm.txt"
      grep -q ' T sluice_producer_publish$' "$WORK/nm.txt" || fail "$name lacks the library's code"
      ;;
    *)
      grep -qx "libsluice_producer.so.$SOVERSION" <<<"$needed" ||
        fail "$name does not need libsluice_producer.so.$SOVERSION"
      resolved=$(ldd "$bin" | awk '/libsluice_producer/ {print $3}')
      [ "$resolved" = "$(cd "$LIB" && pwd)/libsluice_producer.so.$SOVERSION" ] ||
        fail "$name loads \"$resolved\", not the installed copy"
      ;;
  esac
  RUN_ENV=()
  run 0 "sluice_producer $VERSION" "$bin" --version
  run 78 'unknown option "no_such_option"' "$bin" -c no_such_option=1 ep_1 t.x '{}'
  RUN_ENV=(SLUICE_MAX_BODY_BYTES=12k)
  run 78 'invalid value for SLUICE_MAX_BODY_BYTES (env): "12k"' "$bin" ep_1 t.x '{}'
  RUN_ENV=()
  run 78 "kafka_ssl_key_password is set but kafka_ssl_key_file is empty" \
    "$bin" -c kafka_security_protocol=ssl -c kafka_ssl_key_password=pw-xyz ep_1 t.x '{}'
  run 1 'field "ep" must contain only A-Z a-z 0-9 _ -' \
    "$bin" -c kafka_brokers=127.0.0.1:1 'ep 1' t.x '{}'
  run 1 'field "body" is 5 bytes, limit 4' \
    "$bin" -c kafka_brokers=127.0.0.1:1 -c max_body_bytes=4 ep_1 t.x 12345
  grep -qF "size limit exceeded" "$WORK/err" || fail "$name: sluice_strerror missing"
  run 2 "usage:" "$bin" ep_1
done

ok=1
echo "producer_install: ok (pkg-config and find_package, shared and static${SAN:+, with $SAN})"
