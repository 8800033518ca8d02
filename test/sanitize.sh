#!/usr/bin/env bash
# Memory and undefined-behaviour errors, found by the compiler's sanitizers
# (AddressSanitizer with LeakSanitizer, UndefinedBehaviorSanitizer):
#   1. the C++ unit tests built with -fsanitize=address,undefined and run:
#      ASan stops at its first report, UBSan too (-fno-sanitize-recover),
#      LeakSanitizer reports at exit; any report fails the run;
#   2. the extension built with -fsanitize=undefined, installed into a
#      private copy of the PostgreSQL that PG_CONFIG names, and short
#      end-to-end suites run against it (the relay, the inbox's intake and
#      handlers, with the test broker): any report in the server's sanitizer
#      logs fails the run.
# Not yet: AddressSanitizer inside the server.  It needs its runtime
# preloaded into the postmaster, and on Debian 12 (glibc 2.36, GCC 12's
# libasan 8) `postgres -V` and `psql -V` then hang at start, before any of
# our code runs: bindtextdomain() waits on glibc's _nl_state_lock, whose
# reader count has gone negative (gdb: __readers = 4294967290).  `ls` and
# `pg_config` run under the same preload.  OUTBOX_SANITIZE_SERVER=address,undefined
# tries it (with LD_PRELOAD) where that works.
# Usage (root, after scripts/install-deps.sh):  test/sanitize.sh
# OUTBOX_SANITIZE_E2E: the suites of part 2 (default: test_relay test_inbox_intake);
# OUTBOX_SANITIZE_UNIT=0 leaves part 1's run out (a developer's second try).
set -euo pipefail
cd "$(dirname "$0")/.."
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
JOBS=$(nproc 2>/dev/null || echo 2)
SAN=address,undefined
SERVER_SAN=${OUTBOX_SANITIZE_SERVER:-undefined}
work=$(mktemp -d /tmp/outbox-sanitize.XXXXXX)
trap 'rm -rf "$work"' EXIT
SECONDS=0

echo "== sanitize: unit tests with -fsanitize=$SAN"
cmake -S . -B "$work/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPG_CONFIG="$PG_CONFIG" \
  "-DCMAKE_CXX_FLAGS=-fsanitize=$SAN -fno-omit-frame-pointer -fno-sanitize-recover=all" \
  "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=$SAN" >/dev/null
cmake --build "$work/build" -j"$JOBS" --target outbox_unit_tests outbox_test_broker >/dev/null
echo "   built in ${SECONDS}s"
if [ "${OUTBOX_SANITIZE_UNIT:-1}" = 1 ]; then
  ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$work/build/outbox_unit_tests" --gtest_brief=1
  echo "   unit tests clean under the sanitizers (${SECONDS}s)"
fi

echo "== sanitize: the extension with -fsanitize=$SERVER_SAN, loaded into PostgreSQL"
pgdir=$(dirname "$("$PG_CONFIG" --bindir)")            # /usr/lib/postgresql/15
sharedir=$("$PG_CONFIG" --sharedir)                     # /usr/share/postgresql/15
priv=$work/pg
mkdir -p "$priv$(dirname "$pgdir")" "$priv$(dirname "$sharedir")" "$work/ext"
cp -a "$pgdir" "$priv$(dirname "$pgdir")/"
cp -a "$sharedir" "$priv$(dirname "$sharedir")/"
# A copy of the sources without build outputs (a VPATH build would take the
# plain objects of the source tree as up to date).
tar --exclude=./build --exclude=./.git --exclude='*.o' --exclude='*.so' --exclude='*.bc' -cf - . |
  tar -xf - -C "$work/ext"
make -s -C "$work/ext" PG_CONFIG="$PG_CONFIG" OUTBOX_WERROR=1 OUTBOX_SANITIZERS=$SERVER_SAN -j"$JOBS" >/dev/null
make -s -C "$work/ext" PG_CONFIG="$PG_CONFIG" OUTBOX_SANITIZERS=$SERVER_SAN install DESTDIR="$priv" >/dev/null
# (Not `ldd | grep -q`: grep's early exit can fail ldd with SIGPIPE, and pipefail with it.)
libs=$(ldd "$work/ext/outbox.so")
[[ $libs == *libubsan* ]] || { echo "the module is not linked with libubsan" >&2; exit 1; }
mkdir -m 1777 "$work/reports"
chmod -R a+rX "$work"
echo "   built in ${SECONDS}s"
# The server's options: stop at the first error, each report into reports/
# (one file per process).  ASan (when asked for) needs its runtime first in
# the process, and finds no leaks worth the name in a server that frees by
# memory context.
server_env="UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:log_path=$work/reports/ubsan"
if [[ $SERVER_SAN == *address* ]]; then
  server_env+=" LD_PRELOAD=$(awk '/libasan/ {print $3}' <<<"$libs")"
  server_env+=" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:log_path=$work/reports/asan"
fi
rc=0
for suite in ${OUTBOX_SANITIZE_E2E:-test_relay test_inbox_intake}; do
  echo "-- $suite (sanitized extension)"
  OUTBOX_BUILD_DIR="$work/build" OUTBOX_PG_BIN="$priv$pgdir/bin" OUTBOX_PG_ENV="$server_env" \
    ASAN_OPTIONS=detect_leaks=0 /usr/bin/python3 test/e2e/run_suite.py "$suite" || rc=1
done
reports=$(find "$work/reports" -type f | sort)
if [ -n "$reports" ]; then
  for f in $reports; do echo "---- $f"; cat "$f"; done
  echo "== sanitize: the sanitizers reported the errors above"
  exit 1
fi
[ "$rc" -eq 0 ] || { echo "== sanitize: an end-to-end suite failed (no sanitizer report)"; exit 1; }
echo "== sanitize: no report, unit tests and end-to-end (${SECONDS}s)"
