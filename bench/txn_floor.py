#!/usr/bin/python3
"""The floor under exactly-once latency, without Postgres or the relay: how
long a record takes from produce() to a read_committed consumer when sent
(a) by an idempotent producer (at-least-once's path: produce, acknowledgement)
and (b) in a Kafka transaction of its own with a progress record beside it
(exactly-once's path: registration, produce, EndTxn, markers), on the same
warm cluster, in alternating blocks so both see the same minutes of the
machine.

Librdkafka is this machine's (python3-confluent-kafka: Debian 12's 2.0.2);
Kafka is test/kafka's (three KRaft nodes, replication factor 3, min ISR 2,
on the same VM).  The consumer runs in its own process and stamps arrival
with the same clock the producer stamped the record with.  Sends are paced:
the next send starts a gap (`--gaps`) after the previous one finished (its
acknowledgement, or its commit), as the relay lets the coordinator settle
between transactions.

    bench/txn_floor.py [--warm 30] [--blocks 10] [--per-block 50] [--gaps 10,25,50]

The idempotent producer is paced by the first gap; transactions are measured
at every gap given.  Prints p50 / p99 of each and their ratios to the
idempotent producer's.  Exits 1 if a record is
lost or seen twice.
"""

import argparse
import multiprocessing
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "kafka"))
from cluster import KafkaCluster  # noqa: E402

import confluent_kafka  # noqa: E402
from confluent_kafka import OFFSET_END, Consumer, Producer, TopicPartition  # noqa: E402

TOPIC = "floor.events"
PARTITIONS = 4


def consume(bootstrap, expected, ready, out):
    cons = Consumer({"bootstrap.servers": bootstrap, "group.id": "floor",
                     "isolation.level": "read_committed", "enable.auto.commit": False,
                     "fetch.wait.max.ms": 5, "socket.nagle.disable": True})
    cons.assign([TopicPartition(TOPIC, p, OFFSET_END) for p in range(PARTITIONS)])
    # Let the assignment resolve its offsets before the producer starts.
    t_end = time.time() + 5
    while time.time() < t_end:
        cons.poll(0.1)
    ready.set()
    seen = {}
    deadline = None
    while True:
        m = cons.poll(0.05)
        now = time.time_ns()
        if m is not None and not m.error():
            mode, n, stamp = m.value().decode().split(":")
            key = (mode, int(n))
            seen[key] = seen.get(key, 0) + 1
            if seen[key] == 1:
                out.put((mode, int(n), (now - int(stamp)) / 1e6))
        if len(seen) >= expected and deadline is None:
            deadline = time.time() + 2
        if deadline is not None and time.time() > deadline:
            break
    dups = sum(c - 1 for c in seen.values())
    out.put(("done", dups, len(seen)))
    cons.close()


def pct(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--warm", type=float, default=30, help="seconds of unmeasured traffic first")
    ap.add_argument("--blocks", type=int, default=10, help="blocks per mode, alternating")
    ap.add_argument("--per-block", type=int, default=50)
    ap.add_argument("--gaps", default="10,25,50",
                    help="ms between sends: the first for both modes, the rest for transactions")
    args = ap.parse_args()
    print("librdkafka", confluent_kafka.libversion()[0])
    cluster = KafkaCluster(nodes=3, auto_create=False)
    cluster.start()
    rc = 0
    try:
        bs = cluster.bootstrap
        cluster.create_topic(TOPIC, partitions=PARTITIONS, replicas=3)
        cluster.create_topic("floor.progress", partitions=1, replicas=3,
                             **{"cleanup.policy": "compact"})
        common = {"bootstrap.servers": bs, "linger.ms": 0, "socket.nagle.disable": True}
        idem = Producer({**common, "enable.idempotence": True})
        txn = Producer({**common, "transactional.id": "floor"})
        txn.init_transactions(60)
        gaps = [float(g) for g in args.gaps.split(",")]
        modes = ["alo"] + [f"eos{g:g}" for g in gaps]

        def send(mode, n):
            value = f"{mode}:{n}:{time.time_ns()}".encode()
            key = b"k%d" % (n % 1000)
            if mode.endswith("alo"):
                gap = gaps[0]
                idem.produce(TOPIC, key=key, value=value)
                idem.flush(30)
            else:
                gap = float(mode.split("eos")[1])
                txn.begin_transaction()
                txn.produce(TOPIC, key=key, value=value)
                txn.produce("floor.progress", key=b"floor", value=b"%d" % n)
                txn.commit_transaction(30)
            time.sleep(gap / 1000)

        t_end = time.time() + args.warm
        n = 0
        while time.time() < t_end:
            send("warm-alo" if n % 2 else f"warm-eos{gaps[0]:g}", n)
            n += 1
        expected = len(modes) * args.blocks * args.per_block
        ready = multiprocessing.Event()
        out = multiprocessing.Queue()
        proc = multiprocessing.Process(target=consume, args=(bs, expected, ready, out))
        proc.start()
        ready.wait(60)
        for b in range(args.blocks):
            for mode in modes[b % len(modes):] + modes[:b % len(modes)]:
                for i in range(args.per_block):
                    send(mode, b * args.per_block + i)
        lat = {m: [] for m in modes}
        dups = seen = None
        while True:
            item = out.get(timeout=120)
            if item[0] == "done":
                _, dups, seen = item
                break
            if item[0] in lat:
                lat[item[0]].append(item[2])
        proc.join(10)
        print(f"{args.blocks} blocks of {args.per_block} per mode, after {args.warm:g} s of warm-up")
        print("| produce → read_committed consumer | p50 | p99 | max | p50 / p99 ratio |")
        print("|---|---|---|---|---|")
        a = lat["alo"]
        for mode in modes:
            v = lat[mode]
            if mode == "alo":
                label = f"idempotent producer, 1 record, {gaps[0]:g} ms apart"
            else:
                label = f"a transaction of 1 record + progress record, {mode[3:]} ms apart"
            ratio = "" if mode == "alo" else (
                f"{statistics.median(v) / statistics.median(a):.1f}× / {pct(v, 0.99) / pct(a, 0.99):.1f}×")
            print(f"| {label} | {statistics.median(v):.1f} ms | {pct(v, 0.99):.1f} ms | "
                  f"{max(v):.1f} ms | {ratio} |")
        lost = expected - sum(len(v) for v in lat.values())
        print(f"lost {lost}, duplicates {dups}")
        if lost or dups:
            rc = 1
    finally:
        cluster.stop()
    return rc


if __name__ == "__main__":
    sys.exit(main())
