#!/usr/bin/env bash
# Installs the Debian packages pg outbox needs to build, test and demo, for
# one PostgreSQL major version: PG_MAJOR, else the one PG_CONFIG names,
# else 15 (Debian 12's).  Idempotent: does nothing when everything is
# already there.  Needs root.
#   scripts/install-deps.sh          install what is missing
#   scripts/install-deps.sh --list   print the packages, comma-separated
#                                    (test/pgtree.sh makes its trees with them)
set -euo pipefail

if [ -z "${PG_MAJOR:-}" ]; then
  if [ -n "${PG_CONFIG:-}" ] && [ -x "$PG_CONFIG" ]; then
    PG_MAJOR=$("$PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
  else
    PG_MAJOR=15
  fi
fi

PACKAGES=(
  "postgresql-$PG_MAJOR" "postgresql-server-dev-$PG_MAJOR"  # the server, PGXS, pg_regress, isolation tester
  librdkafka-dev nlohmann-json3-dev        # the extension's dependencies
  g++ make cmake pkg-config libgtest-dev   # building, unit tests
  kcat                                     # the demo shows Kafka records with it
  python3 python3-psycopg2 python3-confluent-kafka python3-yaml  # end-to-end test driver
  libipc-run-perl                          # Postgres TAP modules
)
# The real-Kafka tier (Apache Kafka from Maven Central) and the demo run on
# the machine's own Debian 12 with 15; the 17/18/19 trees (test/pgtree.sh,
# another Debian suite, another Java) run without it.
if [ "$PG_MAJOR" = 15 ]; then
  PACKAGES+=(openjdk-17-jdk-headless maven openssl)
fi

if [ "${1:-}" = --list ]; then
  (IFS=,; echo "${PACKAGES[*]}")
  exit 0
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing packages: ${missing[*]} (run as root to install them)" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
