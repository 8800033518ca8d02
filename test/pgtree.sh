#!/usr/bin/env bash
# Builds and tests pg outbox for another PostgreSQL major version, in a
# Debian tree made for it with mmdebstrap (the machine's own apt sources are
# never touched), then removes the tree:
#   test/pgtree.sh trixie   PostgreSQL 17 (Debian 13), librdkafka 2.8
#   test/pgtree.sh sid      PostgreSQL 18 (unstable), librdkafka 2.14; with
#                           trixie's 17 beside it for the 17 -> 18 move, and
#                           experimental's 19 for 19 (build, pg_regress and
#                           isolation, the suites of OUTBOX_E2E_NEXT, the
#                           package) and the 18 -> 19 move
#   test/pgtree.sh experimental
#                           PostgreSQL 19 (experimental, over unstable: only
#                           postgresql-19's packages and the libpq they need
#                           come from experimental, the rest, librdkafka
#                           too, is sid's); with sid's 18 beside it for the
#                           18 -> 19 move
# In the tree, as root, test/run-all.sh runs: the build, the unit tests,
# pg_regress and isolation, the end-to-end suites of OUTBOX_E2E (default:
# the tree subset below) against the test broker built there, and the
# Debian package of that version.  sid (17 -> 18) and experimental
# (18 -> 19) also run test/major-upgrade-test.sh.
# OUTBOX_TREE_DIR picks where the tree goes; --keep keeps it.  --make-only
# makes the tree and stops (.ci/run makes both trees while the PostgreSQL 15
# tier runs); --reuse takes a tree --make-only made, else makes one.
# --no-kafka runs all of the above but the suites that start Apache Kafka;
# --kafka-only runs only those, after a build (.ci/run runs the first beside
# the 15 tier, the second after it, in one kept tree).  Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
suite=${1:?usage: test/pgtree.sh trixie|sid|experimental [--keep]}
keep= make_only= reuse= part=
for a in "${@:2}"; do
  case $a in
    --keep) keep=--keep ;;
    --make-only) make_only=1 keep=--keep ;;
    --reuse) reuse=1 ;;
    --no-kafka|--kafka-only) part=$a ;;
    *) echo "pgtree: unknown option '$a'" >&2; exit 2 ;;
  esac
done
MIRROR=http://deb.debian.org/debian

# The end-to-end suites each tree runs: delivery and order, faults, the
# inbox, the workers' life cycle, hostile roles, encodings, backups,
# failover (its walsender and backend-status reads differ by version), and
# exactly-once on a real three-node Kafka (the transactional API of that
# release's librdkafka).  The rest (test_operations, test_storage,
# test_inbox_scale, test_inbox_intake, test_native, test_real_kafka) run on
# 15 only (test/README.md).
# trixie (17, librdkafka 2.8) runs what depends on the server's version:
# delivery, workers, backups, failover, encodings.  What depends on the
# Kafka client's release (exactly-once's use of the transactional API, the
# acknowledgement proofs, faults), the inbox and the hostile-role suites run
# on 15 and 18, the oldest and newest of both (librdkafka 2.0.2 and 2.14),
# not a third time: the tree needs no JDK and no Kafka cluster.
case $suite in
  trixie) E2E_DEFAULT="test_relay test_workers test_encoding test_backup test_failover"
          SKIP_DEFAULT= ;;
  # test_ack_truth.LeaderChange (a second three-node cluster, 80 s) runs in CI on 15 only;
  # run it here with OUTBOX_E2E_SKIP= (docs/delivery.md gives its figures on 2.14).
  *) E2E_DEFAULT="test_relay test_faults test_inbox test_workers test_hostile test_hostile_settings test_encoding test_backup test_failover test_exactly_once test_ack_truth"
     SKIP_DEFAULT="test_ack_truth.LeaderChange" ;;
esac
E2E=${OUTBOX_E2E:-$E2E_DEFAULT}
E2E_SKIP=${OUTBOX_E2E_SKIP-$SKIP_DEFAULT}
# The suites that start Apache Kafka (a JDK, three broker JVMs).
KAFKA_SUITES="test_exactly_once test_real_kafka test_ack_truth"
is_kafka_suite() { [[ " $KAFKA_SUITES " == *" $1 "* ]]; }
# The tree's packages follow the suites it may run: those picked and the
# default ones (so that --no-kafka and --kafka-only share one tree).
all_e2e="$E2E $E2E_DEFAULT"
# A tier in two passes, so that CI can run the light one beside the 15 tier
# (.ci/run): --no-kafka runs everything but the suites that start Kafka
# (build, unit, pg_regress, isolation, the other suites, the package, the
# moves, the next major); --kafka-only runs those suites alone on the
# tree's major, after a build of it (no unit, pg_regress, package or move).
case $part in
  --no-kafka) kept=; for t in $E2E; do is_kafka_suite "$t" || kept+="$t "; done; E2E=${kept:-none}; E2E=${E2E% } ;;
  --kafka-only) kept=; for t in $E2E; do is_kafka_suite "$t" && kept+="$t "; done; E2E=${kept% } ;;
esac
# 19 in the sid tree: what its server changes (background workers, the
# walsender and backend-status reads); the rest runs on 18 beside it.
E2E_NEXT=${OUTBOX_E2E_NEXT:-test_workers test_failover}
# Suites that start Apache Kafka need a JDK and Maven in the tree (that
# release's packages); Kafka's jars come from this machine's Maven cache,
# mounted in the tree (filled from Maven Central when cold).
need_kafka= run_kafka=
for t in $all_e2e; do is_kafka_suite "$t" && need_kafka=1; done
for t in $E2E; do is_kafka_suite "$t" && run_kafka=1; done
M2=${HOME:-/root}/.m2

next=
case $suite in
  trixie) major=17; upgrade_from=; sources=("deb $MIRROR trixie main") ;;
  sid) major=18; upgrade_from=17; next=19
       sources=("deb $MIRROR sid main" "deb $MIRROR trixie main" "deb $MIRROR experimental main") ;;
  experimental) major=19; upgrade_from=18; sources=("deb $MIRROR sid main" "deb $MIRROR experimental main") ;;
  *) echo "pgtree: unknown suite '$suite' (trixie, sid or experimental)" >&2; exit 2 ;;
esac
# experimental is NotAutomatic (priority 1): apt takes from it only what the
# tree's own preferences raise, here postgresql-19's server, client and
# headers and the libpq (library and headers) they depend on (>= 19~rc1).
# The tree base is sid's.
pin=()
mmsuite=$suite
if [ "$suite" = experimental ] || [ "$suite" = sid ]; then
  mmsuite=sid
  pin=(--setup-hook='mkdir -p "$1/etc/apt/preferences.d" && printf "%s\n" "Package: postgresql-19 postgresql-client-19 postgresql-server-dev-19 libpq5 libpq-dev" "Pin: release a=experimental" "Pin-Priority: 500" >"$1/etc/apt/preferences.d/postgresql-19"')
fi
tree=${OUTBOX_TREE_DIR:-/tmp/outbox-tree-$suite}
SECONDS=0
say() { echo "== [pgtree $suite, ${SECONDS}s] $*"; }

if [ "$(id -u)" -ne 0 ]; then
  echo "pgtree: needs root (mmdebstrap, chroot)" >&2
  exit 1
fi
command -v mmdebstrap >/dev/null ||
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null

# Processes still running in the tree (a failed test's server or broker)
# hold its mounts: end them, by their root directory, then unmount.  Also
# run before the tree is made: a run that was killed (its EXIT trap never
# ran) leaves /proc mounted in the old tree, and a plain rm -rf would walk
# into the host's /proc and fail.  rm never crosses into a mount.
release_tree() {
  [ -d "$tree" ] || return 0
  local p m
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/root" 2>/dev/null)" = "$tree" ] && kill -9 "${p#/proc/}" 2>/dev/null
  done
  sleep 0.5
  for m in "$tree/root/.m2" "$tree/dev/shm" "$tree/proc"; do
    if mountpoint -q "$m"; then
      umount "$m" 2>/dev/null || umount -l "$m"
    fi
  done
  ! mountpoint -q "$tree/proc" && ! mountpoint -q "$tree/dev/shm" && ! mountpoint -q "$tree/root/.m2"
}
remove_tree() {
  if release_tree; then
    rm -rf --one-file-system "$tree"
  else
    echo "pgtree: $tree is still mounted: not removed" >&2
    return 1
  fi
}
cleanup() {
  local rc=$?
  if [ "$keep" = --keep ]; then
    release_tree || true
    say "tree kept in $tree"
  else
    remove_tree || true
  fi
  say "done (exit $rc)"
}

pkgs="$(PG_MAJOR=$major bash scripts/install-deps.sh --list),$(bash scripts/build-deb.sh --list-deps)"
[ -n "$upgrade_from" ] && pkgs+=",postgresql-$upgrade_from,postgresql-server-dev-$upgrade_from"
[ -n "$next" ] && pkgs+=",postgresql-$next,postgresql-server-dev-$next"
[ -n "$need_kafka" ] && pkgs+=",openjdk-21-jdk-headless,maven"
ready="$tree/.outbox-tree-ready"
if [ -n "$reuse" ] && [ -f "$ready" ] && [ "$(cat "$ready")" = "$pkgs" ]; then
  say "the tree made before ($tree): $(chroot "$tree" dpkg-query -W -f='${Package} ${Version}\n' "postgresql-$major" librdkafka1 | tr '\n' ' ')"
  trap cleanup EXIT
else
  say "making the tree ($tree): PostgreSQL $major${upgrade_from:+ and $upgrade_from}${next:+ and $next}"
  remove_tree
  trap cleanup EXIT
  # sid's index may carry an expired Valid-Until.
  mmdebstrap --quiet --variant=apt --aptopt='Acquire::Check-Valid-Until "false"' --include="$pkgs" \
    "${pin[@]}" "$mmsuite" "$tree" "${sources[@]}"
  echo "$pkgs" > "$ready"
  say "tree made: $(chroot "$tree" dpkg-query -W -f='${Package} ${Version}\n' "postgresql-$major" librdkafka1 | tr '\n' ' ')"
fi
[ -n "$make_only" ] && exit 0
mount -t proc proc "$tree/proc"
mount -t tmpfs -o mode=1777 shm "$tree/dev/shm"
if [ -n "$run_kafka" ]; then
  mkdir -p "$M2" "$tree/root/.m2"
  mount --bind "$M2" "$tree/root/.m2"
  # Maven in the tree reaches Maven Central for what the cache lacks.
  cp -L /etc/resolv.conf "$tree/etc/resolv.conf"
fi

# The sources as they are here (tracked and new files, not build outputs).
rm -rf "$tree/src"
mkdir "$tree/src"
if git rev-parse --git-dir >/dev/null 2>&1; then
  git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$tree/src"
else
  tar --exclude=./build --exclude=./.git --exclude=./dist -cf - . | tar -xf - -C "$tree/src"
fi

in_tree() {  # in_tree <major> <command...>
  local m=$1
  shift
  chroot "$tree" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    PG_CONFIG="/usr/lib/postgresql/$m/bin/pg_config" OUTBOX_E2E="$E2E" OUTBOX_E2E_SKIP="$E2E_SKIP" "$@"
}
if [ "$part" = --kafka-only ]; then
  if [ -z "$E2E" ]; then
    say "no suite of this tier starts Kafka: nothing to run"
    exit 0
  fi
  in_tree "$major" env OUTBOX_UNIT=0 OUTBOX_REGRESS=0 OUTBOX_PACKAGE=0 bash /src/test/run-all.sh
  say "the Kafka suites passed on PostgreSQL $major"
  exit 0
fi
in_tree "$major" bash /src/test/run-all.sh
if [ -n "$upgrade_from" ]; then
  say "PostgreSQL $upgrade_from -> $major"
  in_tree "$major" bash /src/test/major-upgrade-test.sh "$upgrade_from" "$major"
fi
say "all tests passed on PostgreSQL $major"
if [ -n "$next" ]; then
  # The same sources built again for the next major, in place: the unit tests
  # (they do not link the server) and the suites not in OUTBOX_E2E_NEXT ran
  # on $major above.  The $major extension stays installed for the move.
  say "PostgreSQL $next (experimental) in the same tree"
  in_tree "$next" make -s -C /src clean
  in_tree "$next" env OUTBOX_UNIT=0 OUTBOX_E2E="$E2E_NEXT" bash /src/test/run-all.sh
  say "PostgreSQL $major -> $next"
  in_tree "$next" env OUTBOX_OLD_INSTALLED=1 bash /src/test/major-upgrade-test.sh "$major" "$next"
  say "all tests passed on PostgreSQL $next"
fi
