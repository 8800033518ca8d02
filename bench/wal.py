#!/usr/bin/python3
"""WAL per message, by phase of a message's life, beside a plain insert of the same row.

A message costs the database WAL four times: `outbox.write()` inserts it, the relay claims it
(`FOR UPDATE SKIP LOCKED`: a lock record per row) and marks it published, retention deletes it,
and vacuum cleans up after the mark and the delete. This measures each phase alone, in one
cluster, with `pg_current_wal_insert_lsn()` before and after, and breaks each down by WAL record
type (`pg_walinspect`):

  plain     the same rows inserted once into a table with the same columns and only a primary
            key, one transaction per row (the floor: what the row costs anyway)
  write     outbox.write(), one transaction per message, the relay stopped (outbox.brokers '')
  relay     the relay drains them: claims, produces to the test broker, marks (per delivery mode)
  retention the maintenance worker deletes them (outbox.retention 1 s)
  vacuum    VACUUM of the outbox table after the delete (autovacuum is off for the table while
            the phases run, so that each phase's WAL is its own)

No checkpoint happens inside the phases (checkpoint_timeout 1 h, max_wal_size 8 GB), so the
figures carry no full-page images unless a phase writes them itself; the FPI bytes are shown.

    bench/wal.py [--messages 50000] [--delivery at_least_once,exactly_once] [--variant schema,hot]

--variant hot is an experiment, not a supported layout: the same schema with no index that names
published_at (the partial index of pending rows dropped, the two indexes of waiting rows
filtered on next_attempt_at alone), so that the mark can be a HOT update; the relay's claim then
walks the primary key from its low-water mark. It shows what the mark's index entries cost.

Needs the extension installed (scripts/build.sh; bench/run.sh does both) and runs its own test
broker and Postgres cluster as `postgres`. Results are printed as a Markdown table.
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "test", "e2e"))
from harness import PgCluster, TestBroker, wait_until  # noqa: E402

TOPIC = "bench.wal"
KEYS = 1000
# The benchmark's message (bench.py): {"id": 123456, "pad": "xxx..."}, 200 bytes as jsonb prints it.
PAD = 200 - len('{"id": 100000, "pad": ""}')
PAYLOAD = f"jsonb_build_object('id', 100000 + i, 'pad', repeat('x', {PAD}))"

# The plain table: outbox_message's columns (schema 1.6), a primary key and nothing else.
PLAIN_TABLE = """
CREATE TABLE plain_message (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id uuid NOT NULL, topic text NOT NULL, key text, payload jsonb NOT NULL,
    headers jsonb NOT NULL DEFAULT '{}', created_at timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz, attempts integer NOT NULL DEFAULT 0, last_error text,
    parked_at timestamptz, is_binary boolean NOT NULL DEFAULT false, key_bytes bytea,
    value bytea, kafka_partition integer, next_attempt_at timestamptz,
    published_partition integer, published_offset bigint)
    WITH (autovacuum_enabled = false)
"""

# One transaction per row, as services write: a procedure that commits after each.
PLAIN_LOOP = f"""
DO $$ BEGIN
  FOR i IN 1..__N__ LOOP
    INSERT INTO plain_message (message_id, topic, key, payload)
    VALUES (gen_random_uuid(), '{TOPIC}', 'key-' || (i % {KEYS}), {PAYLOAD});
    COMMIT;
  END LOOP;
END $$"""
WRITE_LOOP = f"""
DO $$ BEGIN
  FOR i IN 1..__N__ LOOP
    PERFORM outbox.write('{TOPIC}', 'key-' || (i % {KEYS}), {PAYLOAD});
    COMMIT;
  END LOOP;
END $$"""


def lsn(pg):
    return pg.scalar("SELECT pg_current_wal_insert_lsn()::text")


def wal_between(pg, start, end):
    """Total bytes, and (record type, count, bytes, fpi bytes) rows, largest first."""
    total = pg.scalar("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)::bigint", (end, start))
    rows = pg.sql('SELECT "resource_manager/record_type", count, record_size + fpi_size, fpi_size'
                  " FROM pg_get_wal_stats(%s::pg_lsn, %s::pg_lsn, true) WHERE count > 0"
                  " ORDER BY 3 DESC", (start, end))
    return int(total), rows


def phase(pg, name, n, action):
    """Runs action(), waits for its WAL to be flushed, returns the phase's figures."""
    start = lsn(pg)
    t0 = time.time()
    action()
    seconds = time.time() - t0
    end = lsn(pg)
    # pg_walinspect reads only flushed WAL.
    pg.sql("SELECT txid_current()")  # a commit: flushes what came before it
    total, rows = wal_between(pg, start, end)
    return {"phase": name, "bytes": total, "per_msg": total / n, "seconds": seconds,
            "records": rows}


def pending(pg):
    return pg.scalar("SELECT count(*) FROM outbox.outbox_message WHERE published_at IS NULL")


# The experiment: nothing indexed names published_at (see the docstring).
HOT_VARIANT = """
DROP INDEX outbox.ix_outbox_message_unpublished;
DROP INDEX outbox.ix_outbox_message_waiting;
CREATE INDEX ix_outbox_message_waiting ON outbox.outbox_message (key, topic, id)
    WHERE next_attempt_at IS NOT NULL;
DROP INDEX outbox.ix_outbox_message_retry_at;
CREATE INDEX ix_outbox_message_retry_at ON outbox.outbox_message (next_attempt_at)
    WHERE next_attempt_at IS NOT NULL;
"""


def run(delivery, n, broker, variant="schema"):
    settings = {"outbox.brokers": "''", "outbox.delivery": f"'{delivery}'",
                "fsync": "on", "synchronous_commit": "on", "shared_buffers": "'512MB'",
                "max_wal_size": "'8GB'", "checkpoint_timeout": "'1h'",
                "wal_level": "replica", "autovacuum_naptime": "'1h'"}
    if delivery == "exactly_once":
        settings["outbox.kafka_config"] = "'transaction.timeout.ms=60000'"
    pg = PgCluster(settings, name=f"outbox-wal-{delivery}")
    try:
        pg.start()
        pg.sql("CREATE EXTENSION outbox")
        pg.sql("CREATE EXTENSION pg_walinspect")
        pg.sql(PLAIN_TABLE)
        pg.sql("ALTER TABLE outbox.outbox_message SET (autovacuum_enabled = false)")
        if variant == "hot":
            pg.sql(HOT_VARIANT)
        # Warm-up: the relay connected and its first transaction done, so that its start-up
        # (producer id, recovery) is no phase's cost; then an empty table.
        pg.sql(f"ALTER SYSTEM SET outbox.brokers = '{broker.bootstrap}'")
        pg.reload()
        pg.sql(f"SELECT outbox.write('{TOPIC}', 'warm', '{{}}')")
        wait_until(lambda: pending(pg) == 0, 60, what="the warm-up message published")
        pg.sql("ALTER SYSTEM SET outbox.brokers = ''")
        pg.reload()
        time.sleep(1)
        pg.sql("TRUNCATE outbox.outbox_message")
        pg.sql("CHECKPOINT")
        out = []
        out.append(phase(pg, "plain insert", n, lambda: pg.sql(PLAIN_LOOP.replace("__N__", str(n)))))
        out.append(phase(pg, "write", n, lambda: pg.sql(WRITE_LOOP.replace("__N__", str(n)))))

        def drain():
            pg.sql(f"ALTER SYSTEM SET outbox.brokers = '{broker.bootstrap}'")
            pg.reload()
            wait_until(lambda: pending(pg) == 0, 600, interval=0.2, what="the relay draining")
            time.sleep(1)  # the relay's last mark committed and nothing else to do
        out.append(phase(pg, "relay: claim + mark", n, drain))

        def retention():
            time.sleep(1.5)
            pg.sql("ALTER SYSTEM SET outbox.retention = '1s'")
            pg.reload()
            wait_until(lambda: pg.scalar("SELECT count(*) FROM outbox.outbox_message") == 0, 600,
                       interval=0.2, what="retention deleting every row")
            pg.sql("ALTER SYSTEM SET outbox.retention = '0'")
            pg.reload()
            time.sleep(0.5)
        out.append(phase(pg, "retention: delete", n, retention))
        out.append(phase(pg, "vacuum", n, lambda: pg.sql("VACUUM outbox.outbox_message")))
        return out
    finally:
        pg.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=50000)
    ap.add_argument("--delivery", default="at_least_once,exactly_once")
    ap.add_argument("--variant", default="schema", help="schema (as installed), hot (see above)")
    ap.add_argument("--top", type=int, default=4, help="record types shown per phase")
    args = ap.parse_args()
    broker = TestBroker(topics=(f"{TOPIC}:8", "pg_outbox_progress:1"))
    try:
        for delivery, variant in [(d, v) for v in args.variant.split(",")
                                  for d in args.delivery.split(",")]:
            phases = run(delivery, args.messages, broker, variant)
            floor = phases[0]["per_msg"]
            life = sum(p["per_msg"] for p in phases[1:])
            print(f"\n### WAL per message, {delivery}, {args.messages:,} messages of 200 B, "
                  f"one transaction each" + (", variant hot" if variant == "hot" else "") + "\n")
            print("| phase | bytes/msg | × plain insert | largest record types (bytes/msg; FPI) |")
            print("|---|---|---|---|")
            for p in phases:
                parts = ", ".join(f"{r[0]} {r[2] / args.messages:.0f}"
                                  + (f" (FPI {r[3] / args.messages:.0f})" if r[3] else "")
                                  for r in p["records"][:args.top])
                print(f"| {p['phase']} | {p['per_msg']:.0f} | {p['per_msg'] / floor:.2f} | {parts} |")
            print(f"| **a message's life** (write + relay + retention + vacuum) | **{life:.0f}** | "
                  f"**{life / floor:.2f}** | |")
            print(f"\nrelay drain: {phases[2]['seconds']:.1f} s for {args.messages:,} (from the "
                  f"reload that gives it the brokers; {args.messages / phases[2]['seconds']:,.0f} msg/s)",
                  flush=True)
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
