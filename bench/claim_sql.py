"""The relay's claim statement, before and after 1.3, side by side in one
server: its cost per claimed row on a backlog, with nothing waiting (the
relay's steady state) and with a key in flight.  Interleaved runs of the
same prepared generic plans, medians.

    OUTBOX_PG_BIN=... python3 bench/claim_sql.py

The 1.2 text is the claim as it was (key <> ALL($2), no retry check); the
1.3 text is the relay's own (include/outbox/queries/relay_sql.h, read from
the plans test that pins it)."""

import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "e2e"))
from harness import ROOT, PgCluster  # noqa: E402

OLD = ("SELECT id, message_id, topic, key, payload, headers, ctid AS claimed_ctid, is_binary,"
       " key_bytes, value, kafka_partition FROM outbox.outbox_message WHERE published_at IS NULL"
       " AND parked_at IS NULL AND id >= $5 AND key <> ALL($2)"
       " AND (pg_catalog.hashtext(key) & 2147483647) % $3 = $4 ORDER BY id LIMIT $1"
       " FOR UPDATE SKIP LOCKED")


def new_claim():
    with open(os.path.join(ROOT, "sql", "plans.sql")) as f:
        return re.search(r"PREPARE claim\([^)]*\) AS (.*?);\n", f.read()).group(1)


def main():
    pg = PgCluster({}, name="outbox-claim-bench")
    pg.start()
    try:
        pg.sql("CREATE EXTENSION outbox")
        pg.sql("SELECT count(outbox.write('order.events', 'k' || (g % 1000),"
               " jsonb_build_object('g', g, 'pad', repeat('x', 150))))"
               " FROM generate_series(1, 5000) g")
        pg.sql("VACUUM ANALYZE outbox.outbox_message")
        conn = pg.connect()
        cur = conn.cursor()
        cur.execute("SET plan_cache_mode = force_generic_plan; SET enable_seqscan = off;"
                    " SET enable_bitmapscan = off; SET search_path = pg_catalog, pg_temp")
        cur.execute(f"PREPARE old(int, text[], int, int, bigint) AS {OLD}")
        cur.execute(f"PREPARE new(int, text[], int, int, bigint, boolean) AS {new_claim()}")
        cases = {
            "old, nothing in flight": "EXECUTE old(5000, '{}', 1, 0, 0)",
            "new, nothing in flight": "EXECUTE new(5000, '{}', 1, 0, 0, true)",
            "old, 1 key in flight": "EXECUTE old(5000, '{k7}', 1, 0, 0)",
            "new, 1 key in flight": "EXECUTE new(5000, '{k7}', 1, 0, 0, true)",
            "new, something waits": "EXECUTE new(5000, '{}', 1, 0, 0, false)",
        }
        times = {name: [] for name in cases}
        for _ in range(15):
            for name, stmt in cases.items():
                cur.execute("BEGIN")
                t = time.perf_counter()
                cur.execute(stmt)
                rows = len(cur.fetchall())
                times[name].append((time.perf_counter() - t) / rows * 1e6)
                cur.execute("ROLLBACK")
        base = statistics.median(times["old, nothing in flight"])
        print("| claim of 5,000 pending rows | µs per row, median of 15 (min-max) | vs old, nothing in flight |")
        print("|---|---|---|")
        for name, ts in times.items():
            m = statistics.median(ts)
            print(f"| {name} | {m:.2f} ({min(ts):.2f}-{max(ts):.2f}) | {m / base:.2f}x |")
    finally:
        pg.destroy()


if __name__ == "__main__":
    main()
