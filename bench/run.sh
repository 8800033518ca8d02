#!/usr/bin/env bash
# The pg outbox benchmark, one command: builds and installs the extension,
# starts its own test broker and Postgres cluster, and prints the table of
# figures (medians of several runs, with min-max, and ratios to ceilings).
#   bench/run.sh            # full: 5 runs each, ~10 minutes
#   bench/run.sh --quick    # smoke: 2 short runs
#   bench/run.sh --real-kafka [--quick]   # drain, latency, writers: test broker beside a
#                                         # 3-node Apache Kafka (bench/real_kafka.py)
#   bench/run.sh --real-kafka --exactly-once   # the same, at_least_once beside exactly_once
#   bench/run.sh --soak [--rate 500] [--minutes 120] [--retention 5min]   # hours of writes,
#                                         # retention, inbox and faults, sampled each minute
# The table is also saved in bench/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
export PG_CONFIG
if [ "$(id -u)" -ne 0 ]; then
  exec sudo --preserve-env=PG_CONFIG "$0" "$@"
fi
bash scripts/install-deps.sh
bash scripts/build.sh
if [ "${1:-}" = --soak ]; then
  shift
  OUTBOX_BUILD_DIR="$PWD/build" exec /usr/bin/python3 bench/soak.py "$@"
fi
if [ "${1:-}" = --real-kafka ]; then
  shift
  OUTBOX_BUILD_DIR="$PWD/build" exec /usr/bin/python3 bench/real_kafka.py "$@"
fi
OUTBOX_BUILD_DIR="$PWD/build" /usr/bin/python3 bench/bench.py "$@"
