#!/usr/bin/env bash
# Installs the Debian 12 packages pg outbox needs to build, test and demo.
# Idempotent: does nothing when everything is already there.  Needs root.
set -euo pipefail

PACKAGES=(
  postgresql-15 postgresql-server-dev-15   # the server, PGXS, pg_regress, isolation tester
  librdkafka-dev nlohmann-json3-dev        # the extension's dependencies
  g++ make cmake pkg-config libgtest-dev   # building, unit tests
  kcat                                     # the demo shows Kafka records with it
  python3 python3-psycopg2 python3-confluent-kafka  # end-to-end test driver
  libipc-run-perl                          # Postgres TAP modules
  openjdk-17-jdk-headless maven openssl    # the real-Kafka tier: Apache Kafka from Maven Central
)

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
