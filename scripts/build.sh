#!/usr/bin/env bash
# Builds and installs the extension (PGXS), and builds the unit tests and
# the test broker (CMake, in build/).  Installing needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
JOBS=$(nproc 2>/dev/null || echo 2)

make -s -j"$JOBS" PG_CONFIG="$PG_CONFIG" OUTBOX_WERROR=1
make -s install PG_CONFIG="$PG_CONFIG" >/dev/null
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPG_CONFIG="$PG_CONFIG" >/dev/null
# OUTBOX_UNIT=0 (a tier that runs no unit tests): only what the end-to-end
# suites need from build/, the test broker.
if [ "${OUTBOX_UNIT:-1}" = 0 ]; then
  cmake --build build -j"$JOBS" --target outbox_test_broker >/dev/null
else
  cmake --build build -j"$JOBS" >/dev/null
fi
echo "build: extension installed into $("$PG_CONFIG" --pkglibdir); tools in build/"
