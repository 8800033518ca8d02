#!/usr/bin/python3
"""What a Kafka transaction costs and does, with the librdkafka this machine
has (python3-confluent-kafka: Debian 12's 2.0.2) against the Apache Kafka
of test/kafka/pom.xml (one KRaft node on loopback): the groundwork for
exactly-once delivery, before the relay uses transactions.

Checks (exits 1 when one fails): a transaction's records reach a
read_committed consumer once committed, an aborted one's never; a second
producer with the same transactional.id fences the first, whose commit then
fails with librdkafka's fatal _FENCED.  Measures, per transaction of 1, 100
and 5,000 records (200 bytes, 1,000 keys), back to back and with 50 ms
between transactions: flush() (the partitions' registration with the
transaction coordinator, then the records' acknowledgements) and
commit_transaction() (EndTxn) apart; beside them an idempotent producer's
flush() of 100, as today's relay pays.

    bench/kafka_txn_cost.py [--rounds 15]
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "kafka"))
from cluster import KafkaCluster  # noqa: E402

import confluent_kafka  # noqa: E402
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition  # noqa: E402


def read_all(bootstrap, level, partitions):
    cons = Consumer({"bootstrap.servers": bootstrap, "group.id": "txn-cost",
                     "isolation.level": level, "enable.auto.commit": False})
    cons.assign([TopicPartition("txn.events", p, 0) for p in range(partitions)])
    seen, idle = [], 0
    while idle < 6:
        m = cons.poll(0.5)
        if m is None:
            idle += 1
            continue
        idle = 0
        if not m.error():
            seen.append(m.value().decode())
    cons.close()
    return seen


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--sizes", default="1,100,5000", help="records per transaction")
    ap.add_argument("--pauses", default="0,50", help="ms between transactions")
    ap.add_argument("--nodes", type=int, default=1, help="Kafka nodes (replication factor too)")
    ap.add_argument("--config", action="append", default=[],
                    help="a producer setting, key=value (repeatable), e.g. socket.nagle.disable=true")
    args = ap.parse_args()
    print("librdkafka", confluent_kafka.libversion()[0])
    extra = dict(kv.split("=", 1) for kv in args.config)
    if extra:
        print("producer settings:", extra)
    cluster = KafkaCluster(nodes=args.nodes, auto_create=False)
    cluster.start()
    failures = []
    try:
        bs = cluster.bootstrap
        cluster.create_topic("txn.events", partitions=4, replicas=args.nodes)
        cluster.create_topic("txn.progress", partitions=1, replicas=args.nodes,
                             **{"cleanup.policy": "compact"})

        def producer(tid):
            return Producer({"bootstrap.servers": bs, "transactional.id": tid, "linger.ms": 0,
                             **extra})

        p1 = producer("txn-cost-fence")
        p1.init_transactions(30)
        p1.begin_transaction()
        for i in range(10):
            p1.produce("txn.events", key=b"k%d" % i, value=b"committed")
        p1.commit_transaction(30)
        p1.begin_transaction()
        for i in range(5):
            p1.produce("txn.events", key=b"a%d" % i, value=b"aborted")
        p1.flush(10)
        p1.abort_transaction(30)
        p1.begin_transaction()
        p1.produce("txn.events", key=b"z", value=b"zombie")
        p2 = producer("txn-cost-fence")
        p2.init_transactions(30)
        try:
            p1.commit_transaction(10)
            failures.append("the fenced producer committed")
        except KafkaException as e:
            err = e.args[0]
            print(f"fenced producer's commit: {err.name()} (fatal: {err.fatal()})")
            if err.name() != "_FENCED" or not err.fatal():
                failures.append(f"fencing gave {err.name()}, not a fatal _FENCED")
        committed = read_all(bs, "read_committed", 4)
        uncommitted = read_all(bs, "read_uncommitted", 4)
        print(f"read_committed sees {len(committed)} records ({sorted(set(committed))}); "
              f"read_uncommitted {len(uncommitted)}")
        if sorted(set(committed)) != ["committed"] or len(committed) != 10:
            failures.append("read_committed did not see exactly the 10 committed records")

        p = producer("txn-cost")
        p.init_transactions(30)
        print("| records per transaction | between transactions | flush() median (max) | "
              "commit_transaction() median (max) |")
        print("|---|---|---|---|")
        for n in [int(x) for x in args.sizes.split(",")]:
            for pause in [int(x) / 1000 for x in args.pauses.split(",")]:
                flushes, commits = [], []
                for _ in range(args.rounds):
                    time.sleep(pause)
                    p.begin_transaction()
                    for i in range(n):
                        p.produce("txn.events", key=b"k%d" % (i % 1000), value=b"x" * 200)
                    p.produce("txn.progress", key=b"txn-cost", value=b"progress")
                    t = time.perf_counter()
                    p.flush(30)
                    flushes.append((time.perf_counter() - t) * 1000)
                    t = time.perf_counter()
                    p.commit_transaction(30)
                    commits.append((time.perf_counter() - t) * 1000)
                f, c = flushes[3:], commits[3:]
                print(f"| {n:,} | {pause * 1000:.0f} ms | {statistics.median(f):.1f} ms "
                      f"({max(f):.1f}) | {statistics.median(c):.1f} ms ({max(c):.1f}) |")
        idem = Producer({"bootstrap.servers": bs, "linger.ms": 0, "enable.idempotence": True,
                         **extra})
        times = []
        for _ in range(args.rounds):
            for i in range(100):
                idem.produce("txn.events", key=b"k%d" % i, value=b"x" * 200)
            t = time.perf_counter()
            idem.flush(30)
            times.append((time.perf_counter() - t) * 1000)
        print(f"| idempotent producer, 100 | — | {statistics.median(times[3:]):.1f} ms "
              f"({max(times[3:]):.1f}) | — |")
    finally:
        cluster.stop()
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
