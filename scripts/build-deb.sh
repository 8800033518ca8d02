#!/usr/bin/env bash
# Builds the Debian packages postgresql-NN-outbox_<version>_amd64.deb from
# debian/ (Debian's conventions for PostgreSQL extensions: pg_buildext,
# debian/pgversions), in a copy of the tree; the packages land in dist/.
# One package per PostgreSQL version that is both in debian/pgversions
# (15, 17, 18, 19) and supported by the machine's postgresql-common: 15 on
# Debian 12, 17 on Debian 13, 18 on unstable (19 from experimental when
# PG_SUPPORTED_VERSIONS names it, as test/package-test.sh does).
#   sudo scripts/build-deb.sh
#   sudo apt-get install ./dist/postgresql-15-outbox_*.deb
#   scripts/build-deb.sh --list-deps   the build dependencies, comma-separated
# Needs root to install the build dependencies it lacks.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

BUILD_DEPS=(build-essential debhelper dpkg-dev fakeroot postgresql-server-dev-all librdkafka-dev nlohmann-json3-dev g++ make)
if [ "${1:-}" = --list-deps ]; then
  (IFS=,; echo "${BUILD_DEPS[*]}")
  exit 0
fi
missing=()
for p in "${BUILD_DEPS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "build-deb: missing packages: ${missing[*]} (run as root to install them)" >&2
    exit 1
  fi
  echo "build-deb: installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

version=$(dpkg-parsechangelog -l debian/changelog -S Version)
work=$(mktemp -d /tmp/pg-outbox-deb.XXXXXX)
trap 'rm -rf "$work"' EXIT
src="$work/pg-outbox-$version"
mkdir -p "$src"
# What is committed, not what a local build left (objects, build/, results).
if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
  git -C "$ROOT" ls-files -z | (cd "$ROOT" && xargs -0 tar -cf - --) | tar -xf - -C "$src"
else
  tar --exclude=./build --exclude=./.git --exclude=./dist -cf - . | tar -xf - -C "$src"
fi
cd "$src"
pg_buildext updatecontrol
DEB_BUILD_OPTIONS="parallel=$(nproc 2>/dev/null || echo 2)" dpkg-buildpackage -us -uc -b >"$work/build.log" 2>&1 || {
  tail -40 "$work/build.log" >&2
  exit 1
}
mkdir -p "$ROOT/dist"
cp "$work"/*.deb "$ROOT/dist/"
ls "$ROOT"/dist/*.deb
