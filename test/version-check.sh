#!/usr/bin/env bash
# `make` against a PostgreSQL version pg outbox does not support stops
# before compiling anything, with one line naming the supported versions
# (include/outbox/pg_compat.h, the Makefile's pg_version_check).  Fakes 14
# and 20 by copying the server headers of PG_CONFIG with another
# PG_VERSION_NUM, and runs make in a copy of the sources; the real headers
# pass the check.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
server=$("$PG_CONFIG" --includedir-server)
work=$(mktemp -d /tmp/outbox-version-check.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir "$work/src"
tar --exclude=./build --exclude=./.git --exclude='*.o' --exclude='*.so' -cf - . | tar -xf - -C "$work/src"

check() {  # check <PG_VERSION_NUM or "real"> <expect: ok|refused>
  local flags=(PG_CONFIG="$PG_CONFIG")
  if [ "$1" != real ]; then
    rm -rf "$work/server"
    cp -r "$server" "$work/server"
    sed -i "s/^#define PG_VERSION_NUM .*/#define PG_VERSION_NUM $1/" "$work/server/pg_config.h"
    flags+=(PG_CPPFLAGS="-I$work/server -I$work/src/include")
  fi
  local rc=0 target=all
  [ "$2" = ok ] && target=pg_version_check
  make -s -C "$work/src" $target "${flags[@]}" >"$work/out" 2>&1 || rc=$?
  if [ "$2" = ok ]; then
    [ $rc -eq 0 ] || { echo "FAIL: $1 refused:"; cat "$work/out"; exit 1; }
  else
    local lines
    lines=$(grep -v '^make' "$work/out" | wc -l)
    if [ $rc -eq 0 ] || [ "$lines" -ne 1 ] || ! grep -q '15, 16, 17, 18 and 19' "$work/out" ||
       [ -n "$(find "$work/src" -name '*.o' -print -quit)" ]; then
      echo "FAIL: $1 should stop before compiling, with one line naming 15, 16, 17, 18 and 19; got (rc $rc):"
      cat "$work/out"
      exit 1
    fi
  fi
  echo "version check: $1 $2${lines:+: $(grep -v '^make' "$work/out")}"
}
check real ok
check 140011 refused
check 200000 refused
