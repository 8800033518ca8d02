#!/usr/bin/env bash
# The Debian package: builds it (scripts/build-deb.sh), installs it with
# apt-get on this machine, and runs CREATE EXTENSION from the installed
# files in a throwaway cluster, with a write() that reaches the test broker
# and is read back by a consumer of its own; then removes it and puts the
# source tree's build back (make install), as the other tests expect.
# For the PostgreSQL version PG_CONFIG names (15 by default; 17, 18 and 19 in
# their trees, test/pgtree.sh).  Needs root, and build/outbox_test_broker.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
BIN=$("$PG_CONFIG" --bindir)
MAJOR=$("$PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
PACKAGE=postgresql-$MAJOR-outbox

rm -rf dist
# The package of the version under test only: postgresql-common builds for
# its release's default version (sid: 18), not for a newer one installed
# beside it (19 from experimental) unless PG_SUPPORTED_VERSIONS names it.
PG_SUPPORTED_VERSIONS=$MAJOR bash scripts/build-deb.sh >/dev/null
deb=$(ls dist/${PACKAGE}_*_amd64.deb)
echo "package: $deb"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 "./$deb" >/dev/null
restore() {
  DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq -o DPkg::Lock::Timeout=600 "$PACKAGE" >/dev/null 2>&1 || true
  make -s install PG_CONFIG="$PG_CONFIG" >/dev/null
}
trap restore EXIT

# The version is written once, in outbox.control (test/version-test.py).
want=$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$ROOT/outbox.control")
# The files dpkg says it installed are the ones Postgres loads.
for f in "$("$PG_CONFIG" --pkglibdir)/outbox.so" "$("$PG_CONFIG" --sharedir)/extension/outbox--$want.sql" \
         "$("$PG_CONFIG" --sharedir)/extension/outbox.control"; do
  owner=$(dpkg -S "$f" | cut -d: -f1)
  [ "$owner" = "$PACKAGE" ] || { echo "FAIL: $f belongs to '$owner'"; exit 1; }
done

dir=$(mktemp -d /tmp/outbox-package.XXXXXX)
chown postgres "$dir"
build/outbox_test_broker --brokers 1 --topic order.events:1 --bootstrap-file "$dir/bootstrap" \
  --control "$dir/broker.sock" >/dev/null 2>"$dir/broker.log" &
broker=$!
for _ in $(seq 100); do [ -s "$dir/bootstrap" ] && break; sleep 0.1; done
bootstrap=$(cat "$dir/bootstrap")
pg() { runuser -u postgres -- "$@"; }
pg "$BIN/initdb" -D "$dir/data" -A trust -U postgres >/dev/null
cat >> "$dir/data/postgresql.conf" <<CONF
listen_addresses = ''
unix_socket_directories = '$dir'
port = 5432
shared_preload_libraries = 'outbox'
outbox.brokers = '$bootstrap'
CONF
stop() {
  pg "$BIN/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
  kill "$broker" 2>/dev/null || true
  wait "$broker" 2>/dev/null || true
  rm -rf "$dir"
  restore
}
trap stop EXIT
pg "$BIN/pg_ctl" -D "$dir/data" -l "$dir/log" -w start >/dev/null
psql=(runuser -u postgres -- "$BIN/psql" -h "$dir" -U postgres -X -q -At -v ON_ERROR_STOP=1)
version=$("${psql[@]}" -c "CREATE EXTENSION outbox" -c "SELECT extversion FROM pg_extension WHERE extname = 'outbox'")
[ "$version" = "$want" ] || { echo "FAIL: extension version '$version', not '$want'"; exit 1; }
id=$("${psql[@]}" -c "SELECT outbox.write('order.events', 'package-key', '{\"from\": \"$PACKAGE\"}')")
# The relay marks a row published only once the broker acknowledged it.
for _ in $(seq 300); do
  [ "$("${psql[@]}" -c "SELECT published_at IS NOT NULL FROM outbox.outbox_message WHERE message_id = '$id'")" = t ] && break
  sleep 0.1
done
[ "$("${psql[@]}" -c "SELECT published_at IS NOT NULL FROM outbox.outbox_message WHERE message_id = '$id'")" = t ] ||
  { echo "FAIL: the write was not published"; cat "$dir/log"; exit 1; }
# And Kafka holds it: read back by a consumer that shares none of our code.
/usr/bin/python3 - "$bootstrap" "$id" "$PACKAGE" <<'PY'
import json, sys
from confluent_kafka import Consumer, TopicPartition, OFFSET_BEGINNING
bootstrap, message_id, package = sys.argv[1:]
c = Consumer({"bootstrap.servers": bootstrap, "group.id": "package-test", "enable.auto.commit": False})
c.assign([TopicPartition("order.events", 0, OFFSET_BEGINNING)])
m = c.poll(30)
c.close()
assert m is not None and m.error() is None, f"no record in Kafka ({m and m.error()})"
assert m.key() == b"package-key" and json.loads(m.value()) == {"from": package}, (m.key(), m.value())
assert dict(m.headers() or [])["event_id"].decode() == message_id, m.headers()
PY
echo "package test passed: $(basename "$deb") installs, CREATE EXTENSION outbox gives $version," \
     "a write() reaches the test broker"
