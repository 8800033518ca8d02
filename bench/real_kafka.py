"""The benchmark against Apache Kafka beside the test broker, in one run.

Starts the project's test broker (librdkafka's mock cluster) and a three-node
Apache Kafka cluster (test/kafka/cluster.py: replication factor 3,
min.insync.replicas=2; the relay produces with acks=all, as always), one
Postgres cluster (fsync and synchronous_commit on), and measures, switching
outbox.brokers between the two in turns so that the machine's drift hits both:
  - drain of a 100,000-message backlog;
  - commit -> consumer latency at 1,000 msg/s (p50 / p99 / max);
  - 4 writers at full speed, relay idle / publishing (the rate kept).
Prints the figures side by side and saves them in bench/results/.

    bench/run.sh --real-kafka [--quick] [--runs N]

With --exactly-once, the two columns are the relay's two delivery modes on the
same three-node cluster (outbox.delivery = at_least_once / exactly_once,
switched by reload in turns); the latency consumer reads read_committed in both.
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "test", "kafka"))
import bench  # noqa: E402
from bench import (KEYS, PARTITIONS, TOPIC, drain_once, fmt_range, latency_once, med,  # noqa: E402
                   pending, writers_run)
from cluster import KafkaCluster  # noqa: E402
from harness import PgCluster, TestBroker, wait_until  # noqa: E402


def use(pg, broker, delivery="at_least_once"):
    """Points the relay at a broker in a delivery mode (reload) and waits until it publishes
    there."""
    pg.append_conf({"outbox.brokers": f"'{broker.bootstrap}'", "outbox.delivery": f"'{delivery}'"})
    pg.reload()
    time.sleep(1)
    pg.sql(f"SELECT 1 FROM outbox.write('{TOPIC}', 'warmup', '{{}}')")
    wait_until(lambda: pending(pg) == 0, 120, what="the relay publishing to the new brokers")
    pg.sql("TRUNCATE outbox.outbox_message")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="fewer, shorter runs (smoke test)")
    ap.add_argument("--exactly-once", action="store_true",
                    help="compare the delivery modes on Apache Kafka instead of the brokers")
    args = ap.parse_args()
    runs = 1 if args.quick else args.runs
    drain_n = 20000 if args.quick else 100000
    lat_seconds = 5 if args.quick else 20
    w_seconds = 5 if args.quick else 10

    t0 = time.monotonic()
    kafka = KafkaCluster(nodes=3).start()
    kafka.create_topic(TOPIC, partitions=PARTITIONS)
    print(f"Apache Kafka, 3 nodes, ready in {time.monotonic() - t0:.0f} s", flush=True)
    mock = TestBroker(topics=(f"{TOPIC}:{PARTITIONS}",))
    targets = {"test broker (mock)": (mock, "at_least_once"),
               "Apache Kafka 4.1.1, 3 nodes, RF 3": (kafka, "at_least_once")}
    if args.exactly_once:
        kafka.create_topic("pg_outbox_progress", partitions=1, cleanup_policy="compact")
        targets = {"at_least_once, Apache Kafka 4.1.1, 3 nodes": (kafka, "at_least_once"),
                   "exactly_once, same cluster": (kafka, "exactly_once")}
    pg = PgCluster({**bench.COMMIT_TS, "outbox.brokers": f"'{mock.bootstrap}'", "fsync": "on",
                    "synchronous_commit": "on", "autovacuum_naptime": "'10s'",
                    "shared_buffers": "'512MB'", "max_wal_size": "'8GB'",
                    "checkpoint_timeout": "'30min'"}, name="outbox-bench-real")
    res = {name: {"drain": [], "latency": [], "idle": [], "publishing": []} for name in targets}
    try:
        pg.start()
        pg.sql("CREATE EXTENSION outbox")
        pg.sql(bench.WRITE_SCHEMA)
        # One untimed drain per target first: the first drains after the brokers start run at a
        # fifth of the rate (their JVMs warming up), whichever mode comes first.
        for name, (broker, delivery) in targets.items():
            print(f"warm-up, {name}: drain of {drain_n:,} (not counted)", flush=True)
            use(pg, broker, delivery)
            drain_once(pg, drain_n)
        for r in range(runs):
            order = list(targets.items())
            if r % 2:
                order.reverse()
            for name, (broker, delivery) in order:
                print(f"round {r + 1}/{runs}, {name}: drain of {drain_n:,}, latency "
                      f"{lat_seconds} s at 1,000 msg/s, writers 1 pair of {w_seconds} s ...",
                      flush=True)
                use(pg, broker, delivery)
                res[name]["drain"].append(drain_once(pg, drain_n)[0])
                res[name]["latency"].append(latency_once(pg, broker, 1000, lat_seconds))
                idle, publishing = writers_run(pg, 4, w_seconds, 1)
                res[name]["idle"] += idle
                res[name]["publishing"] += publishing
        names = list(targets)
        lines = [f"| measure | {names[0]} | {names[1]} |", "|---|---|---|"]

        def row(label, f):
            lines.append(f"| {label} | {f(res[names[0]])} | {f(res[names[1]])} |")

        row(f"drain of a {drain_n:,} backlog (200 B, {KEYS:,} keys)",
            lambda x: fmt_range(x["drain"], " msg/s"))
        lines.append(f"| the second's drain rate as a share of the first's, per round |  | "
                     + ", ".join(f"{b / a:.1%}" for a, b in zip(res[names[0]]["drain"],
                                                                res[names[1]]["drain"]))
                     + " |")
        row("commit -> consumer at 1,000 msg/s, p50 / p99 / max",
            lambda x: " / ".join(fmt_range([l[k] for l in x["latency"]], " ms", 1)
                                 for k in ("p50", "p99", "max")))
        row("of which the relay (commit -> acknowledged and marked), p50 / p99",
            lambda x: " / ".join(fmt_range([l[k] for l in x["latency"]], " ms", 1)
                                 for k in ("relay_p50", "relay_p99")))
        row("latency runs: lost / duplicates",
            lambda x: f"{sum(l['lost'] for l in x['latency'])} / "
                      f"{sum(l['dups'] for l in x['latency'])} of "
                      f"{sum(l['n'] for l in x['latency']):,}")
        row("4 writers at full speed: relay idle / publishing, rate kept",
            lambda x: f"{fmt_range(x['idle'], ' tx/s')} / {fmt_range(x['publishing'], ' tx/s')}, "
                      f"{med([p / i for i, p in zip(x['idle'], x['publishing'])]):.1%}")
        report = "\n".join(lines)
        print()
        print(report)
        os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        kind = "exactly-once" if args.exactly_once else "real-kafka"
        with open(os.path.join(HERE, "results", f"{stamp}-{kind}.md"), "w") as f:
            f.write(report + "\n")
        with open(os.path.join(HERE, "results", f"{stamp}-{kind}.json"), "w") as f:
            json.dump(res, f, indent=1, default=str)
    finally:
        pg.destroy()
        mock.stop()
        kafka.stop()


if __name__ == "__main__":
    main()
