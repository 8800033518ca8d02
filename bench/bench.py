"""pg outbox benchmark: drain rate, commit-to-consumer latency, write cost,
the two ceilings, and the relay's memory.  Run it with bench/run.sh.

It starts its own test broker and Postgres cluster (extension preloaded,
fsync and synchronous_commit on, as in production) and prints medians of
several runs with min-max, each figure also as a ratio to its ceiling.
"""

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "test", "e2e"))
from harness import BUILD, PG_BIN, PgCluster, TestBroker, as_postgres, wait_until  # noqa: E402

TOPIC = "bench.events"
PARTITIONS = 8
KEYS = 1000
# {"id": 123456, "pad": "xxx..."} as jsonb prints it: 200 bytes.
PAD = 200 - len('{"id": 100000, "pad": ""}')
BACKLOG_SQL = (f"SELECT count(outbox.write('{TOPIC}', 'key-' || (i %% {KEYS}), "
               f"jsonb_build_object('id', 100000 + i, 'pad', repeat('x', {PAD})))) "
               f"FROM generate_series(1, %s) AS i")


def med(xs):
    return statistics.median(xs)


def fmt_range(xs, unit="", digits=0):
    f = f"{{:,.{digits}f}}"
    return f"{f.format(med(xs))}{unit} ({f.format(min(xs))}-{f.format(max(xs))})"


def relay_pid(pg):
    wait_until(lambda: pg.relay_pids(), 30, what="the relay")
    return pg.relay_pids()[0]


def rss_kb(pid, field="RssAnon"):
    """Private memory of the process: its heap, librdkafka's buffers, stack.
    (VmRSS would also count the shared buffers it touched.)"""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def pending(pg, db="postgres"):
    return pg.scalar("SELECT count(*) FROM outbox.outbox_message WHERE published_at IS NULL",
                     dbname=db)


# ---- drain -------------------------------------------------------------------

def drain_once(pg, n, sample_rss=False):
    """Commits a backlog of n messages at once and times the relay draining it."""
    pg.sql("TRUNCATE outbox.outbox_message")
    pg.sql("CHECKPOINT")
    pid = relay_pid(pg)
    conn = pg.connect()
    conn.autocommit = False
    with conn.cursor() as cur:
        cur.execute(BACKLOG_SQL, (n,))
    rss_before = rss_kb(pid)
    conn.commit()  # wakes the relay
    t_commit = time.time()
    conn.close()
    peak = rss_before
    while pending(pg) > 0:
        if sample_rss:
            peak = max(peak, rss_kb(pid))
        time.sleep(0.05)
    last = pg.scalar("SELECT extract(epoch FROM max(published_at)) FROM outbox.outbox_message")
    rate = n / (float(last) - t_commit)
    return rate, rss_before, peak


# ---- ceilings ----------------------------------------------------------------

DB_CEILING_SQL = """
DO $$
DECLARE
    tids tid[];
BEGIN
    LOOP
        SELECT array_agg(claimed_ctid) INTO tids FROM (
            SELECT id, message_id, topic, key, payload::text, headers::text, ctid AS claimed_ctid
              FROM outbox.outbox_message
             WHERE published_at IS NULL AND parked_at IS NULL
               AND key <> ALL('{}'::text[])
               AND (pg_catalog.hashtext(key) & 2147483647) % 1 = 0
             ORDER BY id LIMIT 1000
               FOR UPDATE SKIP LOCKED) AS claim;
        EXIT WHEN tids IS NULL;
        UPDATE outbox.outbox_message SET published_at = pg_catalog.statement_timestamp()
         WHERE ctid = ANY(tids) AND published_at IS NULL;
        COMMIT;
    END LOOP;
END $$;
"""


def db_ceiling_once(pg, n):
    """The relay's claim and mark SQL alone (no Kafka), in a database the
    relay does not serve, batches of 1000, a commit per batch."""
    pg.sql("TRUNCATE outbox.outbox_message", dbname="ceiling")
    pg.sql("CHECKPOINT")
    pg.sql(BACKLOG_SQL, (n,), dbname="ceiling")
    conn = pg.connect("ceiling")
    with conn.cursor() as cur:
        cur.execute("SET enable_seqscan = off; SET enable_bitmapscan = off")
        t0 = time.time()
        cur.execute(DB_CEILING_SQL)
        t1 = time.time()
    conn.close()
    assert pending(pg, "ceiling") == 0
    return n / (t1 - t0)


def kafka_ceiling_once(broker, n):
    out = subprocess.run([os.path.join(BUILD, "produce_ceiling"), broker.bootstrap, TOPIC, str(n),
                          str(KEYS), "200", "1000"], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[2])


# ---- latency -----------------------------------------------------------------

def latency_writer(dsn, rate, seconds, out):
    import psycopg2
    conn = psycopg2.connect(**dsn)
    conn.autocommit = True
    cur = conn.cursor()
    sent = {}
    start = time.time() + 0.5
    total = int(rate * seconds)
    for i in range(total):
        due = start + i / rate
        delay = due - time.time()
        if delay > 0:
            time.sleep(delay)
        cur.execute(f"SELECT outbox.write('{TOPIC}', %s, jsonb_build_object('id', %s, 'pad', "
                    f"repeat('x', {PAD})))::text", (f"key-{i % KEYS}", 100000 + i))
        sent[cur.fetchone()[0]] = time.time()  # commit returned (autocommit)
    conn.close()
    out.put(sent)


def latency_consumer(bootstrap, ready, stop, out):
    from confluent_kafka import OFFSET_END, Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-latency",
                  "enable.auto.commit": False, "fetch.wait.max.ms": 1, "log_level": 2,
                  "fetch.error.backoff.ms": 1})
    c.assign([TopicPartition(TOPIC, p, OFFSET_END) for p in range(PARTITIONS)])
    got = []
    deadline = time.time() + 5
    while time.time() < deadline:  # let the assignment settle before writing
        c.poll(0.05)
    ready.set()
    while not stop.is_set():
        m = c.poll(0.01)
        if m is None or m.error():
            continue
        now = time.time()
        eid = dict(m.headers() or []).get("event_id", b"").decode()
        got.append((eid, now))
    c.close()
    out.put(got)


def latency_once(pg, broker, rate, seconds):
    dsn = {"host": pg.dir, "port": pg.port, "user": "postgres", "dbname": "postgres"}
    q_sent, q_got = mp.Queue(), mp.Queue()
    ready, stop = mp.Event(), mp.Event()
    consumer = mp.Process(target=latency_consumer, args=(broker.bootstrap, ready, stop, q_got))
    consumer.start()
    ready.wait(30)
    writer = mp.Process(target=latency_writer, args=(dsn, rate, seconds, q_sent))
    writer.start()
    sent = q_sent.get()
    writer.join()
    wait_until(lambda: pending(pg) == 0, 60, what="the latency run to drain")
    time.sleep(1)
    stop.set()
    got = q_got.get()
    consumer.join()
    first = {}
    dups = 0
    for eid, t in got:
        if eid in first:
            dups += 1
        elif eid in sent:
            first[eid] = t
    lat = sorted((first[e] - sent[e]) * 1000 for e in first)
    # The relay's part alone: commit -> acknowledged and marked (published_at).
    marked = dict(pg.sql("SELECT message_id::text, extract(epoch FROM published_at)::float8 "
                         "FROM outbox.outbox_message WHERE message_id::text = ANY(%s)",
                         (list(sent),)))
    relay_lat = sorted((marked[e] - sent[e]) * 1000 for e in sent if marked.get(e))
    pg.sql("TRUNCATE outbox.outbox_message")
    lost = len(set(sent) - set(first))
    pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]  # noqa: E731
    achieved = len(sent) / seconds
    rpct = lambda q: relay_lat[min(len(relay_lat) - 1, int(q * len(relay_lat)))]  # noqa: E731
    return {"p50": pct(0.50), "p99": pct(0.99), "max": lat[-1], "lost": lost, "dups": dups,
            "n": len(sent), "rate": achieved, "relay_p50": rpct(0.5), "relay_p99": rpct(0.99)}


# ---- write cost --------------------------------------------------------------

WITH_OUTBOX = f"""\\set k random(1, {KEYS})
BEGIN;
INSERT INTO orders (customer, amount) VALUES (:k, :k);
SELECT outbox.write('{TOPIC}', 'key-' || :k,
                    jsonb_build_object('id', :k, 'pad', repeat('x', {PAD})),
                    '{{"event_type": "OrderCreated"}}');
END;
"""

WITH_PLAIN_INSERT = f"""\\set k random(1, {KEYS})
BEGIN;
INSERT INTO orders (customer, amount) VALUES (:k, :k);
INSERT INTO plain_outbox (message_id, topic, key, payload, headers)
VALUES (gen_random_uuid(), '{TOPIC}', 'key-' || :k,
        jsonb_build_object('id', :k, 'pad', repeat('x', {PAD})),
        '{{"event_type": "OrderCreated"}}');
END;
"""

WRITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, customer int, amount numeric,
                                   created_at timestamptz DEFAULT now());
CREATE TABLE IF NOT EXISTS plain_outbox (LIKE outbox.outbox_message INCLUDING ALL);
CREATE INDEX IF NOT EXISTS plain_outbox_unpublished ON plain_outbox (id)
    WHERE published_at IS NULL;
"""


def pgbench_tps(pg, script, clients, seconds):
    path = os.path.join(pg.dir, f"w-{time.monotonic_ns()}.sql")
    with open(path, "w") as f:
        f.write(script)
    os.chmod(path, 0o644)
    cmd = [os.path.join(PG_BIN, "pgbench"), "-n", "-h", pg.dir, "-p", str(pg.port), "-U",
           "postgres", "-c", str(clients), "-j", str(min(clients, 2)), "-T", str(seconds), "-f",
           path, "postgres"]
    out = subprocess.run(as_postgres(cmd), capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if line.startswith("tps ="):
            return float(line.split()[2])
    raise RuntimeError(out)


def write_cost(pg, clients, seconds, runs):
    """tx/s of CreateOrder with outbox.write() and with a plain INSERT into an
    outbox-shaped table, in pairs run back to back (order alternating), same
    cluster: the machine's drift hits both halves of a pair alike."""
    outbox, plain = [], []
    for r in range(runs):
        order = [(WITH_OUTBOX, outbox), (WITH_PLAIN_INSERT, plain)]
        if r % 2:
            order.reverse()
        for script, into in order:
            into.append(pgbench_tps(pg, script, clients, seconds))
    return outbox, plain


def extra_costs(outbox, plain):
    """Per pair: how much more a transaction with outbox.write() costs."""
    return [p / o - 1 for o, p in zip(outbox, plain)]


# ---- inbox -------------------------------------------------------------------

INBOX_TOPIC = "bench.inbox"
INBOX_SCHEMA = """
CREATE TABLE IF NOT EXISTS inbox_handled (event_id uuid PRIMARY KEY, account text, amount numeric);
CREATE OR REPLACE FUNCTION bench_handler(msg outbox.inbox_message) RETURNS void LANGUAGE sql AS $$
    INSERT INTO inbox_handled VALUES (msg.event_id, msg.key, (msg.payload->>'id')::numeric);
$$;
"""


def inbox_run(pg, broker, n):
    """A burst of n records: how fast the consumer stores them (no handler
    yet), then how fast the handler works them off."""
    pg.sql(INBOX_SCHEMA)
    pg.sql("TRUNCATE outbox.inbox_message, inbox_handled")
    pg.sql("SELECT outbox.inbox_unsubscribe(%s)", (INBOX_TOPIC,))
    t0 = time.time()
    subprocess.run([os.path.join(BUILD, "produce_ceiling"), broker.bootstrap, INBOX_TOPIC,
                    str(n), str(KEYS), "200", "0"], check=True, capture_output=True)
    wait_until(lambda: pg.scalar("SELECT count(*) FROM outbox.inbox_message") >= n, 300,
               interval=0.05, what="the burst stored")
    ingest = n / (time.time() - t0)
    t1 = time.time()
    pg.sql("SELECT outbox.inbox_subscribe(%s, 'bench_handler(outbox.inbox_message)')",
           (INBOX_TOPIC,))
    wait_until(lambda: pg.scalar("SELECT count(*) FROM inbox_handled") >= n, 600,
               interval=0.05, what="the burst handled")
    handle = n / (time.time() - t1)
    return ingest, handle


# ---- retention ---------------------------------------------------------------

def sizes(pg):
    return pg.sql("""SELECT pg_relation_size('outbox.outbox_message'),
                            pg_indexes_size('outbox.outbox_message'),
                            (SELECT count(*) FROM outbox.outbox_message)""")[0]


def retention_run(pg, seconds, rate, retention_s):
    """Writes at a steady rate with retention on; samples the table's size.
    Autovacuum runs as configured (naptime 10 s here)."""
    pg.sql("TRUNCATE outbox.outbox_message")
    pg.sql("VACUUM outbox.outbox_message")
    pg.sql(f"ALTER SYSTEM SET outbox.retention = '{retention_s}s'")
    pg.reload()
    path = os.path.join(pg.dir, "retention.sql")
    with open(path, "w") as f:
        f.write(WITH_OUTBOX)
    os.chmod(path, 0o644)
    cmd = [os.path.join(PG_BIN, "pgbench"), "-n", "-h", pg.dir, "-p", str(pg.port), "-U",
           "postgres", "-c", "2", "-j", "2", "-R", str(rate), "-T", str(seconds), "-f", path,
           "postgres"]
    p = subprocess.Popen(as_postgres(cmd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples = []
    start = time.time()
    step = max(5, seconds // 12)
    while p.poll() is None:
        time.sleep(step)
        heap, idx, rows = sizes(pg)
        samples.append((round(time.time() - start), heap, idx, rows))
    pg.sql("ALTER SYSTEM RESET outbox.retention")
    pg.reload()
    return samples


# ---- main --------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="fewer, shorter runs (smoke test)")
    args = ap.parse_args()
    runs = 2 if args.quick else args.runs
    drain_n = 20000 if args.quick else 100000
    rss_n = 100000 if args.quick else 1000000
    lat_seconds = 5 if args.quick else 20
    write_seconds = 3 if args.quick else 4

    broker = TestBroker(topics=(f"{TOPIC}:{PARTITIONS}", f"{INBOX_TOPIC}:{PARTITIONS}"))
    pg = PgCluster({"outbox.brokers": f"'{broker.bootstrap}'",
                    "fsync": "on", "synchronous_commit": "on", "autovacuum_naptime": "'10s'",
                    "outbox.inbox": "on", "outbox.inbox_topics": f"'{INBOX_TOPIC}'",
                    "shared_buffers": "'512MB'", "max_wal_size": "'8GB'",
                    "checkpoint_timeout": "'30min'"}, name="outbox-bench")
    results = {}
    try:
        pg.start()
        pg.sql("CREATE EXTENSION outbox")
        pg.sql(WRITE_SCHEMA)
        pg.sql("CREATE DATABASE ceiling")
        pg.sql("CREATE EXTENSION outbox", dbname="ceiling")
        pg.sql("SELECT 1 FROM outbox.write('warmup', 'k', '{}')")  # producer connected
        wait_until(lambda: pending(pg) == 0, 30, what="warm-up")

        # Drain and both ceilings run in turn, so that the machine's drift
        # (a shared VM here) hits them alike; ratios are taken per round.
        print(f"drain and ceilings: {runs} rounds of {drain_n:,} messages ...", flush=True)
        drains, kafka, db, ratios = [], [], [], []
        for _ in range(runs):
            drains.append(drain_once(pg, drain_n)[0])
            kafka.append(kafka_ceiling_once(broker, drain_n))
            db.append(db_ceiling_once(pg, drain_n))
            ratios.append(drains[-1] / min(kafka[-1], db[-1]))
        ceiling = min(med(kafka), med(db))
        results["drain"] = drains
        results["kafka_ceiling"] = kafka
        results["db_ceiling"] = db

        print(f"latency: {min(runs, 3)} runs of {lat_seconds} s at 1,000 msg/s, twice ...",
              flush=True)
        pg.sql("TRUNCATE outbox.outbox_message")
        lats = [latency_once(pg, broker, 1000, lat_seconds) for _ in range(min(runs, 3))]
        # The same with the relay's commits not waiting for their WAL flush.
        pg.sql("ALTER SYSTEM SET outbox.synchronous_commit = off")
        pg.reload()
        time.sleep(1)
        lats_async = [latency_once(pg, broker, 1000, lat_seconds) for _ in range(min(runs, 3))]
        pg.sql("ALTER SYSTEM RESET outbox.synchronous_commit")
        pg.reload()
        results["latency_async"] = lats_async
        results["latency"] = lats

        print(f"write cost: pgbench {write_seconds} s per run ...", flush=True)
        pg.sql("TRUNCATE outbox.outbox_message")
        wc = {}
        for relay in ("idle", "publishing", "publishing, outbox.synchronous_commit=off"):
            if relay == "idle":
                pg.sql("ALTER SYSTEM SET outbox.brokers = ''")
            else:
                pg.sql("ALTER SYSTEM RESET outbox.brokers")
            pg.sql("ALTER SYSTEM SET outbox.synchronous_commit = %s",
                   ("off" if "synchronous_commit=off" in relay else "on",))
            pg.reload()
            time.sleep(1)
            for clients in (1, 8):
                wc[(relay, clients)] = write_cost(pg, clients, write_seconds, runs)
        results["write_cost"] = {f"{k[0]}/{k[1]}": v for k, v in wc.items()}

        print(f"memory: draining {drain_n:,} and then {rss_n:,} messages ...", flush=True)
        pg.sql("TRUNCATE outbox.outbox_message, plain_outbox, orders")
        _, before_small, peak_small = drain_once(pg, drain_n, sample_rss=True)
        _, before_big, peak_big = drain_once(pg, rss_n, sample_rss=True)
        results["rss_kb"] = {"small": [before_small, peak_small], "big": [before_big, peak_big]}

        print(f"inbox: {runs} bursts of {drain_n:,} records ...", flush=True)
        inbox = [inbox_run(pg, broker, drain_n) for _ in range(runs)]
        results["inbox"] = inbox

        ret_seconds = 60 if args.quick else 240
        print(f"retention: {ret_seconds} s of writes at 1,000 msg/s, outbox.retention = 20s ...",
              flush=True)
        pg.sql("TRUNCATE outbox.outbox_message, plain_outbox, orders")
        ret = retention_run(pg, ret_seconds, 1000, 20)
        results["retention"] = ret

        # ---- report ----
        lines = ["| measure | median (min-max) | ratio to ceiling |", "|---|---|---|"]
        lines.append(f"| drain, {drain_n:,} x 200 B, {KEYS:,} keys | {fmt_range(drains, ' msg/s')} "
                     f"| {med(ratios):.0%} of the lower ceiling (median of per-round ratios, "
                     f"{min(ratios):.0%}-{max(ratios):.0%}) |")
        lines.append(f"| ceiling: test broker, plain librdkafka producer, batches of 1,000 | "
                     f"{fmt_range(kafka, ' msg/s')} | drain = {med(drains) / med(kafka):.0%} |")
        lines.append(f"| ceiling: database, the relay's claim + mark SQL alone | "
                     f"{fmt_range(db, ' msg/s')} | drain = {med(drains) / med(db):.0%} |")
        p50 = [r["p50"] for r in lats]
        p99 = [r["p99"] for r in lats]
        mx = [r["max"] for r in lats]
        lines.append(f"| latency commit->consumer at 1,000 msg/s, p50 | {fmt_range(p50, ' ms', 1)} | |")
        lines.append(f"| latency p99 | {fmt_range(p99, ' ms', 1)} | |")
        lines.append(f"| latency max | {fmt_range(mx, ' ms', 1)} | |")
        lines.append(f"| relay part: commit -> acknowledged and marked, p50 / p99 | "
                     f"{fmt_range([r['relay_p50'] for r in lats], ' ms', 1)} / "
                     f"{fmt_range([r['relay_p99'] for r in lats], ' ms', 1)} | |")
        a99 = [r["p99"] for r in lats_async]
        lines.append(f"| latency p50 / p99 with outbox.synchronous_commit = off | "
                     f"{fmt_range([r['p50'] for r in lats_async], ' ms', 1)} / "
                     f"{fmt_range(a99, ' ms', 1)} | |")
        lines.append(f"| latency runs: lost / duplicates | {sum(r['lost'] for r in lats)} / "
                     f"{sum(r['dups'] for r in lats)} of {sum(r['n'] for r in lats):,} | |")
        for (relay, clients), (ob, pl) in wc.items():
            extra = extra_costs(ob, pl)
            lines.append(f"| write, {clients} client{'s' if clients > 1 else ''}, relay {relay}: "
                         f"outbox.write() / plain INSERT | "
                         f"{fmt_range(ob, ' tx/s')} / {fmt_range(pl, ' tx/s')} | "
                         f"outbox.write() costs {med(extra):+.1%} (pairs {min(extra):+.0%} to "
                         f"{max(extra):+.0%}) |")
        lines.append(f"| inbox burst of {drain_n:,}: consumer stores | "
                     f"{fmt_range([i[0] for i in inbox], ' records/s')} | |")
        lines.append(f"| inbox burst: handler (SQL insert) works off | "
                     f"{fmt_range([i[1] for i in inbox], ' records/s')} | |")
        lines.append(f"| relay private RSS (RssAnon) draining {drain_n:,} (before -> peak) | "
                     f"{before_small / 1024:.1f} -> {peak_small / 1024:.1f} MB | |")
        lines.append(f"| relay private RSS (RssAnon) draining {rss_n:,} (before -> peak) | "
                     f"{before_big / 1024:.1f} -> {peak_big / 1024:.1f} MB | |")
        lines.append("")
        lines.append("Retention (outbox.retention = 20s, writes at 1,000 msg/s, autovacuum naptime "
                     "10s): the table stays bounded")
        lines.append("")
        lines.append("| after | rows | heap | indexes |")
        lines.append("|---|---|---|---|")
        for t, heap, idx, rows in ret:
            lines.append(f"| {t} s | {rows:,} | {heap / 1048576:.1f} MB | {idx / 1048576:.1f} MB |")
        report = "\n".join(lines)
        print()
        print(report)
        os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        with open(os.path.join(HERE, "results", f"{stamp}.md"), "w") as f:
            f.write(report + "\n")
        with open(os.path.join(HERE, "results", f"{stamp}.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)
    finally:
        pg.destroy()
        broker.stop()


if __name__ == "__main__":
    main()
