#!/usr/bin/env bash
# The pg outbox demo, on a fresh Debian 12 machine:
#   installs what is missing, builds and installs the extension, starts the
#   project's test Kafka broker and a Postgres 15 cluster with
#   shared_preload_libraries = 'outbox', runs an order service's CreateOrder flow in
#   SQL (some transactions rolled back on purpose) and shows the records
#   that reached Kafka with kcat.
# Kafka is Apache Kafka itself, one KRaft node from Maven Central
# (test/kafka/cluster.py); --mock uses the project's test broker instead (no Java).
# KEEP=1 leaves the broker and the cluster running afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
export PG_CONFIG
if [ "$(id -u)" -ne 0 ]; then
  exec sudo --preserve-env=PG_CONFIG,KEEP "$0" "$@"
fi

bash scripts/install-deps.sh
bash scripts/build.sh

BIN=$("$PG_CONFIG" --bindir)
DEMO=/tmp/pg_outbox_demo
PORT=${PORT:-5544}
rm -rf "$DEMO"
mkdir -p "$DEMO"
chown postgres:postgres "$DEMO"
pg() { runuser -u postgres -- "$@"; }

cleanup() {
  if [ "${KEEP:-0}" = 1 ]; then
    echo
    echo "left running: psql -h $DEMO -p $PORT -U postgres   |   kcat -b $BOOTSTRAP -C -t order.events"
    echo "stop with:    runuser -u postgres -- $BIN/pg_ctl -D $DEMO/data stop; kill $BROKER_PID"
    return
  fi
  pg "$BIN/pg_ctl" -D "$DEMO/data" -m fast stop >/dev/null 2>&1 || true
  kill "$BROKER_PID" 2>/dev/null && wait "$BROKER_PID" 2>/dev/null || true
}

if [ "${1:-}" = --mock ]; then
  echo "== starting the test Kafka broker (librdkafka's mock cluster, see test/broker/)"
  build/outbox_test_broker --topic order.events:4 --bootstrap-file "$DEMO/bootstrap" \
    --control "$DEMO/broker.sock" >/dev/null 2>"$DEMO/broker.log" &
  BROKER_PID=$!
  trap cleanup EXIT
  for _ in $(seq 100); do [ -s "$DEMO/bootstrap" ] && break; sleep 0.1; done
  BOOTSTRAP=$(cat "$DEMO/bootstrap")
else
  echo "== starting Apache Kafka, one KRaft node (test/kafka/cluster.py; Maven Central on first run)"
  started=$SECONDS
  /usr/bin/python3 test/kafka/cluster.py --nodes 1 >"$DEMO/kafka.out" 2>"$DEMO/kafka.log" &
  BROKER_PID=$!
  trap cleanup EXIT
  until grep -q '^bootstrap=' "$DEMO/kafka.out" 2>/dev/null; do
    kill -0 "$BROKER_PID" 2>/dev/null || { cat "$DEMO/kafka.log"; exit 1; }
    sleep 0.2
  done
  BOOTSTRAP=$(sed -n 's/^bootstrap=//p' "$DEMO/kafka.out")
  echo "   Kafka serves after $((SECONDS - started)) s"
fi
echo "   bootstrap servers: $BOOTSTRAP"

echo "== starting Postgres 15 with the extension preloaded ($DEMO/data, port $PORT)"
pg "$BIN/initdb" -D "$DEMO/data" -A trust -U postgres >/dev/null
cat >> "$DEMO/data/postgresql.conf" <<CONF
port = $PORT
listen_addresses = ''
unix_socket_directories = '$DEMO'
shared_preload_libraries = 'outbox'
outbox.database = 'postgres'
outbox.brokers = '$BOOTSTRAP'
CONF
pg "$BIN/pg_ctl" -D "$DEMO/data" -l "$DEMO/postgres.log" -w start >/dev/null

PSQL=(runuser -u postgres -- "$BIN/psql" -h "$DEMO" -p "$PORT" -U postgres -X -q -v ON_ERROR_STOP=1)

echo "== a service writing orders (demo/create_orders.sql)"
"${PSQL[@]}" -f demo/create_orders.sql

echo "== the outbox table: committed messages, published by the relay worker"
for _ in $(seq 100); do
  pending=$("${PSQL[@]}" -At -c "SELECT count(*) FROM outbox.outbox_message WHERE published_at IS NULL")
  [ "$pending" = 0 ] && break
  sleep 0.1
done
"${PSQL[@]}" -c "SELECT id, key, CASE WHEN is_binary THEN 'tombstone' ELSE payload->>'amount' END AS amount,
                        round(extract(epoch FROM published_at - created_at) * 1000, 1) AS ms_to_kafka
                   FROM outbox.outbox_message ORDER BY id"

echo "== what Kafka holds (kcat): 5 orders and 1 tombstone (value NULL), none of the 2 rolled-back orders"
timeout 30 kcat -b "$BOOTSTRAP" -C -t order.events -o beginning -c 6 -q -Z \
  -f 'partition %p offset %o\n  key:     %k\n  headers: %h\n  value:   %s\n'

committed=$("${PSQL[@]}" -At -c "SELECT count(*) FROM outbox.outbox_message")
in_kafka=$(timeout 15 kcat -b "$BOOTSTRAP" -C -t order.events -o beginning -e -q -f '%k\n' | grep -c . || true)
echo "== messages committed: $committed (5 orders, 1 tombstone), records in Kafka: $in_kafka"
[ "$committed" = "$in_kafka" ]
