"""Exactly once under kill -9, shown on a three-node Apache Kafka cluster.

100,000 messages over 1,000 keys from 4 writers (some transactions rolled back) while the relay
is killed with SIGKILL 20 times at random moments (the postmaster then restarts the server,
as after any crash); read back by Java's kafka-clients consumer with
isolation.level=read_committed (test/kafka/KafkaTool.java), which shares no code with
librdkafka. Prints written / delivered / lost / duplicates / order violations, and how many
of the kills recovery had to settle a transaction Kafka committed and Postgres had not marked.

    sudo OUTBOX_BUILD_DIR=$PWD/build python3 bench/exactly_once_kills.py [--messages N] [--kills K]
"""

import argparse
import os
import random
import re
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "test", "e2e"))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "test", "kafka"))
from cluster import KafkaCluster  # noqa: E402
from harness import ORDERS_SCHEMA, PgCluster, Writers, wait_until  # noqa: E402
from test_real_kafka import committed_rows, verify  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=100000)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rnd = random.Random(args.seed)
    clients, keys = 4, 250  # 1,000 keys
    per_client = int(args.messages / clients / 0.9) + 1  # every 10th rolled back

    kafka = KafkaCluster(nodes=3).start()
    pg = None
    try:
        kafka.create_topic("eos.kills", partitions=8)
        kafka.create_topic("pg_outbox_progress", partitions=1, cleanup_policy="compact")
        pg = PgCluster({"outbox.brokers": f"'{kafka.bootstrap}'",
                        "outbox.delivery": "'exactly_once'", "outbox.workers": 2,
                        "outbox.batch_size": 1000, "outbox.batch_timeout": "'5s'"},
                       name="outbox-eos-kills")
        pg.start()
        pg.sql(ORDERS_SCHEMA)
        t0 = time.monotonic()
        writers = Writers(pg, clients=clients, per_client=per_client, keys=keys,
                          topic="eos.kills").start()
        kills = 0
        while kills < args.kills:
            time.sleep(rnd.uniform(0.3, 1.5))
            try:
                pids = pg.relay_pids()
            except Exception:
                continue  # the server is restarting
            if not pids:
                continue
            os.kill(rnd.choice(pids), signal.SIGKILL)
            kills += 1
            print(f"kill {kills}/{args.kills} at {time.monotonic() - t0:.1f} s, "
                  f"writes {writers.progress():,}", flush=True)
        writers.join(1800)

        def pending():
            try:
                return pg.scalar("SELECT count(*) FROM outbox.outbox_message WHERE "
                                 "published_at IS NULL AND parked_at IS NULL")
            except Exception:
                return -1  # the server is restarting after the last kill
        wait_until(lambda: pending() == 0, 900, interval=1, what="everything published")
        took = time.monotonic() - t0
        committed = committed_rows(pg, "eos.kills")
        result = verify(kafka.dump("eos.kills", "read_committed"), committed)
        settled = len(re.findall(r"which this database had not recorded", pg.log()))
        print(f"\nwritten {result['written']:,}, delivered {result['delivered']:,}, lost "
              f"{result['lost']}, duplicates {result['duplicates']}, order violations "
              f"{result['order_violations']}, unknown {result['unknown']}, mismatched "
              f"{result['mismatched']}; {kills} kills, {settled} committed transactions "
              f"settled by recovery; {took:.0f} s")
        raw = verify(kafka.dump("eos.kills", "read_uncommitted"), committed)
        print(f"the same topic read_uncommitted: duplicates {raw['duplicates']} "
              f"(records of aborted transactions)")
    finally:
        if pg:
            pg.destroy()
        kafka.stop()


if __name__ == "__main__":
    main()
