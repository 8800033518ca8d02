"""The inbox consumer's memory while a topic of 1 MB records drains.

    OUTBOX_PG_BIN=... OUTBOX_BUILD_DIR=... python3 bench/inbox_rss.py [--batch-bytes 16MB]
        [--records 240] [--round 48]

Starts the test broker (16 partitions, written in turn: it keeps about 5 MB a partition) and a
cluster with the inbox on, produces `--records` records of 1 MB (JSON
values) in rounds of `--round` (each round waits until the previous one is
stored, so librdkafka has a whole round queued while the consumer works),
and samples the consumer's RSS every 50 ms.  Prints the RSS before, the
peak of each round and the process's high-water mark (VmHWM), and the same
for its private memory (RssAnon: RSS also counts the shared buffers the
process has touched, which grows as the table does).
`--batch-bytes 1GB` gives the consumer no byte bound: its batches are then
bounded by outbox.batch_size only, as before 1.4.
"""

import argparse
import os
import sys
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "test", "e2e"))
from harness import PgCluster, TestBroker, wait_until  # noqa: E402
from confluent_kafka import Producer  # noqa: E402

TOPIC = "rss.events"
PARTITIONS = 16


def status(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) // 1024  # MB
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-bytes", default="16MB")
    ap.add_argument("--records", type=int, default=240)
    ap.add_argument("--round", type=int, default=48)
    args = ap.parse_args()

    broker = TestBroker(topics=(f"{TOPIC}:{PARTITIONS}",))
    pg = PgCluster({"outbox.brokers": f"'{broker.bootstrap}'", "outbox.inbox": "on",
                    "outbox.inbox_topics": f"'{TOPIC}'",
                    "outbox.inbox_batch_bytes": f"'{args.batch_bytes}'"}, name="outbox-inbox-rss")
    pg.start()
    try:
        pg.sql("CREATE EXTENSION outbox")
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5,
                             "message.max.bytes": 4 * 1024 * 1024, "log_level": 2})
        producer.produce(TOPIC, key=b"warm", value=b"{}", headers=[("event_id", str(uuid.uuid4()))])
        producer.flush(30)
        wait_until(lambda: pg.scalar("SELECT count(*) FROM outbox.inbox_message") == 1, 60,
                   what="the consumer up")
        pid = pg.scalar("SELECT pid FROM pg_stat_activity "
                        "WHERE backend_type = 'pg outbox inbox consumer'")
        before = status(pid, "VmRSS")
        before_anon = status(pid, "RssAnon")
        peaks, anon, stop = [0], [0], threading.Event()

        def sample():
            while not stop.is_set():
                try:
                    peaks[-1] = max(peaks[-1], status(pid, "VmRSS"))
                    anon[-1] = max(anon[-1], status(pid, "RssAnon"))
                except OSError:
                    return
                time.sleep(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        value = b'{"pad": "' + b"x" * (1024 * 1024 - 12) + b'"}'
        stored = 1
        started = time.monotonic()
        for r in range(0, args.records, args.round):
            n = min(args.round, args.records - r)
            for i in range(n):
                producer.produce(TOPIC, key=b"k%d" % (r + i), value=value,
                                 partition=(r + i) % PARTITIONS,
                                 headers=[("event_id", str(uuid.uuid4()))])
                producer.poll(0)
            producer.flush(120)
            stored += n
            try:
                wait_until(lambda: pg.scalar("SELECT count(*) FROM outbox.inbox_message")
                           == stored, 300, interval=0.2, what="the round stored")
            except AssertionError:
                print("stored", pg.scalar("SELECT count(*) FROM outbox.inbox_message"), "of",
                      stored, pg.sql("SELECT role, last_error FROM outbox.worker_stats"))
                print(pg.log()[-3000:])
                raise
            peaks.append(0)
            anon.append(0)
        elapsed = time.monotonic() - started
        stop.set()
        sampler.join(5)
        hwm = status(pid, "VmHWM")
        batches = pg.sql("SELECT count(*) FROM outbox.inbox_message GROUP BY received_at "
                         "ORDER BY 1 DESC LIMIT 1")[0][0]
        print(f"outbox.inbox_batch_bytes = {args.batch_bytes}: {args.records} records of 1 MB "
              f"in rounds of {args.round}, {elapsed:.0f} s")
        print(f"  consumer RSS before: {before} MB; peak per round: "
              f"{', '.join(str(p) for p in peaks[:-1])} MB; VmHWM {hwm} MB; "
              f"largest batch {batches} records")
        print(f"  of which private (RssAnon; the rest is shared buffers touched): before "
              f"{before_anon} MB; peak per round: {', '.join(str(p) for p in anon[:-1])} MB")
    finally:
        pg.destroy()
        broker.stop()


if __name__ == "__main__":
    main()
