"""What outbox.wait_for_standbys costs: commit-to-consumer latency at 1,000
msg/s, and the drain of a backlog, with a healthy streaming standby, the
setting on and off, in one run.

    OUTBOX_BUILD_DIR=build python3 bench/standby_latency.py [--runs 3] [--seconds 10]
                                                          [--drain 100000]

A primary and an asynchronous standby on this machine (fsync on both, as in
production), the test broker, bench.py's latency writer and consumer.  Runs
alternate off / on so that the machine's drift hits both alike; prints the
median p50 and p99 of each and their ratio.
"""

import argparse
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "test", "e2e"))
import bench  # noqa: E402
from harness import PG_BIN, PgCluster, TestBroker, as_postgres, wait_until  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--drain", type=int, default=100000, help="backlog size; 0: no drain runs")
    args = ap.parse_args()
    broker = TestBroker(topics=(f"{bench.TOPIC}:{bench.PARTITIONS}",))
    primary = PgCluster({"outbox.brokers": f"'{broker.bootstrap}'", "fsync": "on",
                         "synchronous_commit": "on", "wal_level": "replica",
                         "max_wal_senders": 4}, name="outbox-bench-primary")
    standby = None
    try:
        primary.start()
        primary.sql("CREATE EXTENSION outbox")
        with open(os.path.join(primary.data, "pg_hba.conf"), "a") as f:
            f.write("local replication all trust\n")
        primary.reload()
        standby = PgCluster({}, name="outbox-bench-standby")
        subprocess.run(as_postgres(["rm", "-rf", standby.data]), check=True)
        subprocess.run(as_postgres([os.path.join(PG_BIN, "pg_basebackup"), "-h", primary.dir,
                                    "-p", str(primary.port), "-U", "postgres", "-D", standby.data,
                                    "-R", "-X", "stream"]), check=True)
        standby.append_conf({"port": standby.port, "unix_socket_directories": f"'{standby.dir}'",
                             "cluster_name": "'standby1'"})
        standby.start()
        wait_until(lambda: primary.scalar("SELECT count(*) FROM pg_stat_replication "
                                          "WHERE application_name = 'standby1'") == 1, 60,
                   what="the standby to stream")
        primary.sql("SELECT 1 FROM outbox.write('warmup', 'k', '{}')")
        wait_until(lambda: bench.pending(primary) == 0, 30, what="warm-up")
        results = {"off": [], "on": []}
        for _ in range(args.runs):
            for mode in ("off", "on"):
                value = "standby1" if mode == "on" else ""
                primary.sql(f"ALTER SYSTEM SET outbox.wait_for_standbys = '{value}'")
                primary.reload()
                r = bench.latency_once(primary, broker, 1000, args.seconds)
                results[mode].append(r)
                print(f"  {mode:3}: p50 {r['p50']:.1f} ms, p99 {r['p99']:.1f} ms, "
                      f"lost {r['lost']}, duplicates {r['dups']}", flush=True)
        med = {m: {q: statistics.median(r[q] for r in rs) for q in ("p50", "p99")}
               for m, rs in results.items()}
        print("| outbox.wait_for_standbys | p50 | p99 |")
        print("|---|---|---|")
        for m, label in (("off", "'' (off)"), ("on", "'standby1' (flush)")):
            print(f"| {label} | {med[m]['p50']:.1f} ms | {med[m]['p99']:.1f} ms |")
        print(f"| on / off | {med['on']['p50'] / med['off']['p50']:.2f}x | "
              f"{med['on']['p99'] / med['off']['p99']:.2f}x |")
        lost = sum(r["lost"] for rs in results.values() for r in rs)
        dups = sum(r["dups"] for rs in results.values() for r in rs)
        print(f"lost {lost}, duplicates {dups} over {2 * args.runs} runs")
        if args.drain:
            rates = {"off": [], "on": []}
            for _ in range(args.runs):
                for mode in ("off", "on"):
                    value = "standby1" if mode == "on" else ""
                    primary.sql(f"ALTER SYSTEM SET outbox.wait_for_standbys = '{value}'")
                    primary.reload()
                    rate = bench.drain_once(primary, args.drain)[0]
                    rates[mode].append(rate)
                    print(f"  drain {mode:3}: {rate:,.0f} msg/s", flush=True)
            off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
            print(f"| drain of {args.drain:,} | off {off:,.0f} msg/s | on {on:,.0f} msg/s | "
                  f"on / off {on / off:.2f} |")
    finally:
        if standby:
            standby.destroy()
        primary.destroy()
        broker.stop()


if __name__ == "__main__":
    main()
