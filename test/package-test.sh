#!/usr/bin/env bash
# The Debian package: builds it (scripts/build-deb.sh), installs it with
# apt-get on this machine, and runs CREATE EXTENSION from the installed
# files in a throwaway cluster; then removes it and puts the source tree's
# build back (make install), as the other tests expect.  Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
BIN=$("$PG_CONFIG" --bindir)

rm -rf dist
bash scripts/build-deb.sh >/dev/null
deb=$(ls dist/postgresql-15-outbox_*_amd64.deb)
echo "package: $deb"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "./$deb" >/dev/null
restore() {
  DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq postgresql-15-outbox >/dev/null 2>&1 || true
  make -s install PG_CONFIG="$PG_CONFIG" >/dev/null
}
trap restore EXIT

# The files dpkg says it installed are the ones Postgres loads.
for f in "$("$PG_CONFIG" --pkglibdir)/outbox.so" "$("$PG_CONFIG" --sharedir)/extension/outbox--1.3.sql" \
         "$("$PG_CONFIG" --sharedir)/extension/outbox.control"; do
  owner=$(dpkg -S "$f" | cut -d: -f1)
  [ "$owner" = postgresql-15-outbox ] || { echo "FAIL: $f belongs to '$owner'"; exit 1; }
done

dir=$(mktemp -d /tmp/outbox-package.XXXXXX)
chown postgres "$dir"
pg() { runuser -u postgres -- "$@"; }
pg "$BIN/initdb" -D "$dir/data" -A trust -U postgres >/dev/null
cat >> "$dir/data/postgresql.conf" <<CONF
listen_addresses = ''
unix_socket_directories = '$dir'
port = 5432
shared_preload_libraries = 'outbox'
CONF
pg "$BIN/pg_ctl" -D "$dir/data" -l "$dir/log" -w start >/dev/null
stop() { pg "$BIN/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$dir"; restore; }
trap stop EXIT
psql=(runuser -u postgres -- "$BIN/psql" -h "$dir" -U postgres -X -q -At -v ON_ERROR_STOP=1)
version=$("${psql[@]}" -c "CREATE EXTENSION outbox" -c "SELECT extversion FROM pg_extension WHERE extname = 'outbox'")
[ "$version" = "1.3" ] || { echo "FAIL: extension version '$version'"; exit 1; }
"${psql[@]}" -c "SELECT outbox.write('order.events', 'k', '{}') IS NOT NULL" | grep -qx t
"${psql[@]}" -c "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg outbox relay'" | grep -qx 1
echo "package test passed: $(basename "$deb") installs, CREATE EXTENSION outbox gives $version, the relay runs"
