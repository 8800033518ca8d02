#!/usr/bin/env bash
# Runs every test of pg outbox: C++ unit tests (ctest), pg_regress and
# isolation tests (make installcheck, on a temporary instance), the
# end-to-end tests against the project's test broker, and the Debian
# package.
#
# As root on a fresh Debian machine it first installs what is missing,
# builds and installs the extension.  Postgres itself always runs as the
# `postgres` user.  PG_CONFIG picks the PostgreSQL version (15, Debian 12's,
# by default); test/pgtree.sh runs this script for 17, 18 and 19 in Debian trees
# made for them.  OUTBOX_E2E names the end-to-end suites to run (e.g.
# "test_relay test_inbox"; default: every test/e2e/test_*.py);
# OUTBOX_E2E_SKIP names test classes to leave out (module.Class, the tests
# skip themselves and say so); OUTBOX_UNIT=0 leaves out the unit tests
# (test/pgtree.sh, for a second major in a tree whose first ran them; the
# build then makes only the test broker of build/); OUTBOX_REGRESS=0 and
# OUTBOX_PACKAGE=0 leave out pg_regress/isolation and the package
# (test/pgtree.sh --kafka-only: a second pass in a tree whose first ran them).
# OUTBOX_SANITIZE=1 (CI's 15 tier) runs the unit tests and the suites of
# OUTBOX_SANITIZE_E2E under AddressSanitizer and UBSan instead of plainly
# (test/sanitize.sh): the same tests, once, with the sanitizers watching.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
export PG_CONFIG

if [ "$(id -u)" -ne 0 ]; then
  exec sudo --preserve-env=PG_CONFIG,OUTBOX_E2E,OUTBOX_E2E_SKIP,OUTBOX_UNIT,OUTBOX_REGRESS,OUTBOX_PACKAGE,OUTBOX_SANITIZE,OUTBOX_SANITIZE_E2E "$0" "$@"
fi

MAJOR=$("$PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
SECONDS=0
step() { echo "== [PG $MAJOR, ${SECONDS}s] $*"; }

step "dependencies and build"
bash scripts/install-deps.sh
sanitized=
if [ "${OUTBOX_SANITIZE:-0}" = 1 ]; then
  # The plain unit tests are not built: they run sanitized below.
  OUTBOX_UNIT=0 bash scripts/build.sh
  sanitized=${OUTBOX_SANITIZE_E2E:-test_relay test_inbox_intake}
  export OUTBOX_SANITIZE_E2E=$sanitized
else
  bash scripts/build.sh
fi

step "a build against an unsupported PostgreSQL stops with one line"
bash test/version-check.sh

if [ -n "$sanitized" ]; then
  step "unit tests and the end-to-end suites $sanitized, under AddressSanitizer and UBSan"
  bash test/sanitize.sh
elif [ "${OUTBOX_UNIT:-1}" = 0 ]; then
  step "unit tests: not here (OUTBOX_UNIT=0: they ran against this librdkafka in this tree)"
else
  step "unit tests (GoogleTest)"
  (cd build && ctest --output-on-failure --timeout 300)
fi

if [ "${OUTBOX_REGRESS:-1}" = 0 ]; then
  step "pg_regress and isolation: not here (OUTBOX_REGRESS=0: they ran against this server before)"
else
  step "pg_regress and isolation tests (make installcheck)"
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
fi

if [ -z "${OUTBOX_E2E:-}" ] || [[ " $OUTBOX_E2E " == *" test_real_kafka "* ]] ||
   [[ " $OUTBOX_E2E " == *" test_exactly_once "* ]] || [[ " $OUTBOX_E2E " == *" test_ack_truth "* ]]; then
  step "Apache Kafka for the real-Kafka tier (Maven Central, into the local Maven cache)"
  # Resolved once here so that a cold cache's download is timed apart from the tests.
  time mvn -q -B -f test/kafka/pom.xml dependency:build-classpath -Dmdep.outputFile=/dev/null
fi

step "end-to-end tests (test broker + Postgres + real consumer; Apache Kafka: test_real_kafka)"
export OUTBOX_BUILD_DIR="$ROOT/build" OUTBOX_PG_BIN
OUTBOX_PG_BIN=$("$PG_CONFIG" --bindir)
# One suite at a time, each with its start time (what each costs is in the log).
suites=${OUTBOX_E2E:-$(cd test/e2e && ls test_*.py | sed 's/\.py$//' | tr '\n' ' ')}
[ "$suites" = none ] && suites=
for suite in $suites; do
  if [[ " $sanitized " == *" $suite "* ]]; then
    step "end-to-end: $suite ran under the sanitizers above"
    continue
  fi
  step "end-to-end: $suite"
  [ -f "test/e2e/$suite.py" ] || { echo "no end-to-end suite test/e2e/$suite.py" >&2; exit 1; }
  /usr/bin/python3 test/e2e/run_suite.py "$suite"
done

if [ -z "${OUTBOX_E2E:-}" ]; then
  # pg_upgrade within one major version, --link: its checks and binary-upgrade
  # restore are those of a major move (the sid tree moves 17 -> 18, copying).
  major=$("$PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
  step "pg_upgrade with pg outbox in the cluster ($major -> $major, --link)"
  bash test/major-upgrade-test.sh "$major" "$major" link
fi

if [ "${OUTBOX_PACKAGE:-1}" = 0 ]; then
  step "the Debian package: not here (OUTBOX_PACKAGE=0: built and tested for this server before)"
else
  step "the Debian package (build, apt-get install, CREATE EXTENSION and a write() from the installed files)"
  bash test/package-test.sh
fi

step "all tests passed"
