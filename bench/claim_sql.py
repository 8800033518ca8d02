"""The relay's claim statement of two versions side by side in one server:
its cost per claimed row on a backlog, with nothing in flight (the relay's
steady state), with keys in flight (one, and a batch's 1,000), and with
something waiting for a retry.  Interleaved runs of the same prepared
generic plans, medians.

    OUTBOX_PG_BIN=... python3 bench/claim_sql.py [--old REV] [--rounds N]

Both texts are read from sql/plans.sql, which pins the relay's own
(include/outbox/queries/relay_sql.h): the old one from git revision REV
(default HEAD), the new one from the working tree.  From 1.6 the claim
compares "topic key" with the keys in flight (order is per (topic, key)),
before it compared the bare key: each version gets its own form of the
same keys."""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "e2e"))
from harness import ROOT, PgCluster  # noqa: E402

TOPIC = "order.events"


def claim_of(plans_sql):
    return re.search(r"PREPARE claim\([^)]*\) AS (.*?);\n", plans_sql).group(1)


def in_flight(claim, keys):
    """The in-flight list as this version of the claim compares it."""
    per_topic = "(topic || ' ' || key)" in claim
    items = [f"{TOPIC} {k}" if per_topic else k for k in keys]
    return "ARRAY[" + ",".join("'" + i + "'" for i in items) + "]::text[]"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", default="HEAD")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    old = claim_of(subprocess.run(["git", "-C", ROOT, "show", f"{args.old}:sql/plans.sql"],
                                  check=True, capture_output=True, text=True).stdout)
    with open(os.path.join(ROOT, "sql", "plans.sql")) as f:
        new = claim_of(f.read())
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
        cur.execute(f"PREPARE old(int, text[], int, int, bigint, boolean) AS {old}")
        cur.execute(f"PREPARE new(int, text[], int, int, bigint, boolean) AS {new}")
        batch = [f"k{i}" for i in range(0, 1000, 2)]  # half the keys: the other half's rows claimed
        cases = {}
        for name in ("old", "new"):
            claim = old if name == "old" else new
            cases[f"{name}, nothing in flight"] = f"EXECUTE {name}(5000, '{{}}', 1, 0, 0, true)"
            cases[f"{name}, 1 key in flight"] = f"EXECUTE {name}(5000, {in_flight(claim, ['k7'])}, 1, 0, 0, true)"
            cases[f"{name}, 500 keys in flight"] = f"EXECUTE {name}(5000, {in_flight(claim, batch)}, 1, 0, 0, true)"
            cases[f"{name}, something waits"] = f"EXECUTE {name}(5000, '{{}}', 1, 0, 0, false)"
        times = {name: [] for name in cases}
        for _ in range(args.rounds):
            for name, stmt in cases.items():
                cur.execute("BEGIN")
                t = time.perf_counter()
                cur.execute(stmt)
                rows = len(cur.fetchall())
                times[name].append((time.perf_counter() - t) / rows * 1e6)
                cur.execute("ROLLBACK")
        print(f"old: {args.old}'s sql/plans.sql; new: the working tree's")
        print(f"| claim of 5,000 pending rows | µs per row, median of {args.rounds} (min-max) | new / old |")
        print("|---|---|---|")
        for name, ts in times.items():
            m = statistics.median(ts)
            twin = statistics.median(times[name.replace("new,", "old,")]) if name.startswith("new") else m
            print(f"| {name} | {m:.2f} ({min(ts):.2f}-{max(ts):.2f}) | {m / twin:.2f}x |")
    finally:
        pg.destroy()


if __name__ == "__main__":
    main()
