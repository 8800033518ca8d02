#!/usr/bin/python3
"""What the relay's mark costs the server, before and after schema 1.6's offset-bearing mark.

The mark is the relay's one statement per batch that marks the acknowledged rows. Before 1.6:
`UPDATE ... SET published_at = ... WHERE ctid = ANY($1)`; from 1.6 it also stores each row's
Kafka partition and offset, joining the rows' ctids with two arrays (relay_sql.h). This times both
statements, the workers' exact texts, prepared as the workers prepare them (generic plans), on the
same backlog, alternately, each inside a transaction that is rolled back (so every round marks
the same pending rows of the same table), and reports the median time per batch and the WAL each
writes. No Kafka: the statement's cost alone.

    bench/mark_cost.py [--rows 200000] [--batch 1000] [--rounds 41]

Needs the extension installed (scripts/build.sh) and runs its own Postgres cluster as `postgres`.
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "e2e"))
from harness import PgCluster  # noqa: E402

BEFORE = ("UPDATE outbox.outbox_message SET published_at = pg_catalog.statement_timestamp()"
          " WHERE ctid = ANY($1)")
AFTER = ("UPDATE outbox.outbox_message m SET published_at = pg_catalog.statement_timestamp(),"
         " published_partition = a.p, published_offset = a.o"
         " FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.tid[]),"
         " pg_catalog.unnest($2::pg_catalog.int4[]), pg_catalog.unnest($3::pg_catalog.int8[]))"
         " AS a(t, p, o) WHERE m.ctid = a.t")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=41)
    args = ap.parse_args()
    pg = PgCluster({"outbox.brokers": "''", "shared_buffers": "'256MB'",
                    "plan_cache_mode": "force_generic_plan"}, name="outbox-mark-cost")
    try:
        pg.start()
        pg.sql("CREATE EXTENSION outbox")
        pg.sql("SELECT outbox.write('bench.mark', 'k' || (g %% 1000), "
               "jsonb_build_object('n', g, 'pad', repeat('x', 150))) "
               "FROM generate_series(1, %s) g", (args.rows,))
        pg.sql("VACUUM ANALYZE outbox.outbox_message")
        conn = pg.connect()
        conn.autocommit = False
        cur = conn.cursor()
        cur.execute(f"PREPARE before_mark(tid[]) AS {BEFORE}")
        cur.execute(f"PREPARE after_mark(tid[], int4[], int8[]) AS {AFTER}")
        conn.commit()
        times = {"before": [], "after": []}
        wal = {"before": [], "after": []}
        for r in range(args.rounds):
            start = (r * args.batch) % (args.rows - args.batch)
            for kind in (("before", "after") if r % 2 == 0 else ("after", "before")):
                cur.execute("SELECT array_agg(ctid ORDER BY id) FROM outbox.outbox_message "
                            "WHERE id > %s AND id <= %s", (start, start + args.batch))
                ctids = cur.fetchone()[0]
                cur.execute("SELECT pg_current_wal_insert_lsn()")
                lsn0 = cur.fetchone()[0]
                t0 = time.perf_counter()
                if kind == "before":
                    cur.execute("EXECUTE before_mark(%s::tid[])", (ctids,))
                else:
                    cur.execute("EXECUTE after_mark(%s::tid[], %s::int4[], %s::int8[])",
                                (ctids, [i % 6 for i in range(args.batch)],
                                 list(range(start, start + args.batch))))
                elapsed = time.perf_counter() - t0
                marked = cur.rowcount
                cur.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", (lsn0,))
                wal[kind].append(float(cur.fetchone()[0]) / max(marked, 1))
                conn.rollback()
                if marked != args.batch:
                    raise SystemExit(f"{kind}: marked {marked} of {args.batch}")
                if r > 0:  # the first round warms the plans and caches
                    times[kind].append(elapsed * 1000)
        b, a = statistics.median(times["before"]), statistics.median(times["after"])
        print(f"mark of {args.batch} rows, {args.rows} rows in the table, {args.rounds - 1} rounds "
              f"each, alternating:")
        print(f"  before 1.6 (ctid = ANY):          median {b:.2f} ms, "
              f"WAL {statistics.median(wal['before']):.0f} bytes/row")
        print(f"  1.6 (with partition and offset):  median {a:.2f} ms, "
              f"WAL {statistics.median(wal['after']):.0f} bytes/row")
        print(f"  ratio 1.6 / before: time {a / b:.2f}x, WAL "
              f"{statistics.median(wal['after']) / statistics.median(wal['before']):.2f}x")
    finally:
        pg.destroy()


if __name__ == "__main__":
    main()
