#!/usr/bin/env bash
# Runs every test of pg outbox: C++ unit tests (ctest), pg_regress and
# isolation tests (make installcheck, on a temporary instance), and the
# end-to-end tests against the project's test broker.
#
# As root on a fresh Debian 12 machine it first installs what is missing,
# builds and installs the extension.  Postgres itself always runs as the
# `postgres` user.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
export PG_CONFIG

if [ "$(id -u)" -ne 0 ]; then
  exec sudo --preserve-env=PG_CONFIG "$0" "$@"
fi

bash scripts/install-deps.sh
bash scripts/build.sh

echo "== unit tests (GoogleTest)"
(cd build && ctest --output-on-failure --timeout 300)

echo "== pg_regress and isolation tests (make installcheck)"
# pg_regress writes results next to the tests and initdb refuses root:
# run a postgres-owned copy of the tree.
regress_dir=$(mktemp -d /tmp/pg_outbox_regress.XXXXXX)
trap 'rm -rf "$regress_dir"' EXIT
tar --exclude=./build --exclude=./.git -cf - . | tar -xf - -C "$regress_dir"
chown -R postgres:postgres "$regress_dir"
if ! runuser -u postgres -- make -s -C "$regress_dir" installcheck PG_CONFIG="$PG_CONFIG"; then
  cat "$regress_dir"/regression.diffs "$regress_dir"/output_iso/regression.diffs 2>/dev/null || true
  exit 1
fi

echo "== Apache Kafka for the real-Kafka tier (Maven Central, into the local Maven cache)"
# Resolved once here so that a cold cache's download is timed apart from the tests.
time mvn -q -B -f test/kafka/pom.xml dependency:build-classpath -Dmdep.outputFile=/dev/null

echo "== end-to-end tests (test broker + Postgres + real consumer; Apache Kafka: test_real_kafka)"
OUTBOX_BUILD_DIR="$ROOT/build" /usr/bin/python3 -m unittest discover -s test/e2e -p 'test_*.py' -v

echo "== the Debian package (build, apt-get install, CREATE EXTENSION from the installed files)"
bash test/package-test.sh

echo "== all tests passed"
