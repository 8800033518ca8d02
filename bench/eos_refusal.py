#!/usr/bin/python3
"""What a refusal costs another role, in exactly-once mode (issue 43) or at-least-once
(--delivery at_least_once; issue 39).

One three-node cluster (test/kafka), one Postgres per run with
outbox.delivery = 'exactly_once' and one relay.  The other role writes
20 msg/s to its own topic; 5 s after its first record arrived (before: the
baseline) the refusal starts, for --seconds (during):

  internal   one row on '__consumer_offsets' (Kafka refuses to add the partition to any
             transaction), inserted by the table's owner: write() refuses it from 1.6
  too_large  20 rows/s of 3 kB to a topic with max.message.bytes=1000, until the end
  unknown_topic
             20 rows/s to a topic the cluster does not have (auto-create off)
  unknown_bulk
             one statement of 20,000 rows to a topic the cluster does not have
  keyless_compacted
             20 rows/s without a key (write_bytes) to a compacted topic

A read_committed consumer (python3-confluent-kafka, in this process) stamps
each of the other role's records on arrival; commit-to-consumer is arrival
minus the time its write's commit returned.  Prints, per run: the other
role's p50 / p99 before, and during: messages written, delivered by the end
(plus --grace seconds), p50 / p99 / max of commit-to-consumer, rows parked,
and how often the relay registered its transactional id (its start included).

    OUTBOX_PG_BIN=... bench/eos_refusal.py [--scenarios internal,too_large] [--seconds 30]

Runs each scenario once per OUTBOX_PG_BIN given in --bins (comma-separated;
default: the environment's).
"""

import argparse
import json
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "test", "kafka"))
sys.path.insert(0, os.path.join(HERE, "..", "test", "e2e"))

from cluster import KafkaCluster  # noqa: E402
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition  # noqa: E402

PROGRESS = "pg_outbox_progress"


def pct(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def run(kafka, scenario, seconds, grace, bin_dir, delivery):
    os.environ["OUTBOX_PG_BIN"] = bin_dir
    import importlib
    import harness
    importlib.reload(harness)
    other = f"bench.other.{scenario}.{int(time.time())}"
    kafka.create_topic(other, partitions=2)
    pg = harness.PgCluster({"outbox.brokers": f"'{kafka.bootstrap}'",
                            "outbox.delivery": f"'{delivery}'", "outbox.workers": 1,
                            "outbox.batch_size": 500, "outbox.batch_timeout": "'5s'",
                            "outbox.max_attempts": 3}, name="outbox-bench-43")
    pg.start()
    pg.sql("CREATE EXTENSION IF NOT EXISTS outbox")
    committed = {}
    arrived = {}
    stop = threading.Event()
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "bench-43",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "fetch.wait.max.ms": 10, "log_level": 2})
    consumer.assign([TopicPartition(other, p, OFFSET_BEGINNING) for p in range(2)])

    def consume():
        while not stop.is_set() or time.time() < consume.until:
            for m in consumer.consume(num_messages=500, timeout=0.05):
                if not m.error():
                    arrived.setdefault(json.loads(m.value())["i"], time.time())
    consume.until = float("inf")

    def other_role():
        conn = pg.connect()
        conn.autocommit = True
        cur = conn.cursor()
        i = 0
        while not stop.is_set():
            cur.execute("SELECT outbox.write(%s, %s, %s::jsonb)", (other, f"k{i % 5}",
                                                                 json.dumps({"i": i})))
            committed[i] = time.time()
            i += 1
            time.sleep(0.05)
        conn.close()

    threads = [threading.Thread(target=consume, daemon=True),
               threading.Thread(target=other_role, daemon=True)]
    for t in threads:
        t.start()
    # The relay's start (recovery) is not the refusal's cost: measure from 5 s after the
    # first record arrived.
    deadline = time.time() + 120
    while not arrived and time.time() < deadline:
        time.sleep(0.1)
    warm = time.time() + 1
    time.sleep(5)
    t0 = time.time()
    conn = pg.connect()
    conn.autocommit = True
    cur = conn.cursor()
    if scenario == "internal":
        cur.execute("INSERT INTO outbox.outbox_message (message_id, topic, key, payload)"
                    " VALUES (gen_random_uuid(), '__consumer_offsets', 'a-1', '{}')")
    elif scenario == "unknown_bulk":
        cur.execute("SELECT count(outbox.write('bench.nowhere', 'k' || g, '{}'))"
                    " FROM generate_series(1, 20000) g")
    n = 0
    while time.time() - t0 < seconds:
        if scenario == "too_large":
            cur.execute("SELECT outbox.write('bench.small', %s, %s::jsonb)",
                        (f"s-{n}", json.dumps({"pad": "x" * 3000})))
        elif scenario == "unknown_topic":
            cur.execute("SELECT outbox.write('bench.nowhere', %s, '{}')", (f"u-{n}",))
        elif scenario == "keyless_compacted":
            cur.execute("SELECT outbox.write_bytes('bench.compact', NULL, %s::bytea)", (f"v{n}".encode(),))
        n += 1
        time.sleep(0.05)
    conn.close()
    consume.until = time.time() + grace
    stop.set()
    for t in threads:
        t.join()
    consumer.close()
    before = [(arrived[i] - committed[i]) * 1000 for i in committed
              if warm <= committed[i] < t0 and i in arrived]
    during = [i for i in committed if committed[i] >= t0]
    lat = [(arrived[i] - committed[i]) * 1000 for i in during if i in arrived]
    parked = pg.scalar("SELECT count(*) FROM outbox.outbox_message WHERE parked_at IS NOT NULL")
    replaced = pg.log().count("publishing exactly once as transactional id")
    pg.destroy()
    return {"scenario": scenario, "delivery": delivery, "bin": bin_dir,
            "before_p50_ms": round(pct(before, 0.5), 1), "before_p99_ms": round(pct(before, 0.99), 1),
            "written": len(during), "delivered": len(lat), "p50_ms": round(pct(lat, 0.5), 1),
            "p99_ms": round(pct(lat, 0.99), 1), "max_ms": round(max(lat) if lat else 0, 1),
            "parked": parked, "recoveries": replaced}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenarios", default="internal,too_large")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--grace", type=float, default=5)
    ap.add_argument("--bins", default=os.environ.get("OUTBOX_PG_BIN", ""))
    ap.add_argument("--delivery", default="exactly_once", choices=["exactly_once", "at_least_once"])
    args = ap.parse_args()
    kafka = KafkaCluster(nodes=3).start()
    try:
        kafka.create_topic(PROGRESS, partitions=1, cleanup_policy="compact")
        kafka.create_topic("bench.small", partitions=2, max_message_bytes=1000)
        kafka.create_topic("bench.compact", partitions=2, cleanup_policy="compact")
        kafka.group_offsets("bench-43-probe")  # __consumer_offsets exists
        for scenario in args.scenarios.split(","):
            for b in args.bins.split(","):
                print(json.dumps(run(kafka, scenario, args.seconds, args.grace, b, args.delivery)),
                      flush=True)
    finally:
        kafka.stop()


if __name__ == "__main__":
    main()
