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
import uuid

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
    """The relay of the benchmark's database (the ceiling database has its
    own, idle one)."""
    wait_until(lambda: pg.relay_pids("postgres"), 30, what="the relay")
    return pg.relay_pids("postgres")[0]


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


# When a row became published for everyone: the commit of the transaction
# that marked it (track_commit_timestamp, on in the benchmark's clusters).
# published_at is the mark's statement time, and in exactly-once mode the
# mark is written while Kafka still commits (docs/exactly-once.md): its
# commit comes later, and timing by published_at would flatter that mode.
MARKED_AT = "coalesce(pg_catalog.pg_xact_commit_timestamp(xmin), published_at)"
COMMIT_TS = {"track_commit_timestamp": "on"}


class DrainWatch:
    """Tells, cheaply, whether everything is published, while a drain is
    timed: one connection, and a walk of the partial index from the first
    row that was still pending at the last look (as the relay's own
    low-water mark does).  count(*) over a 10M-row table is a parallel
    scan of all of it: polled every half second it took a core from the
    relay it was timing."""

    FIRST_PENDING = ("SELECT id FROM outbox.outbox_message"
                     " WHERE published_at IS NULL AND id >= %s ORDER BY id LIMIT 1")

    def __init__(self, pg, db="postgres"):
        self.conn = pg.connect(db)
        self.low = 0

    def drained(self):
        with self.conn.cursor() as cur:
            cur.execute(self.FIRST_PENDING, (self.low,))
            row = cur.fetchone()
        if row is None:
            return True
        self.low = row[0]
        return False

    def close(self):
        self.conn.close()


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
    watch = DrainWatch(pg)
    while not watch.drained():
        if sample_rss:
            peak = max(peak, rss_kb(pid))
        time.sleep(0.05)
    watch.close()
    last = pg.scalar(f"SELECT extract(epoch FROM max({MARKED_AT})) FROM outbox.outbox_message")
    rate = n / (float(last) - t_commit)
    return rate, rss_before, peak


# ---- ceilings ----------------------------------------------------------------

# The relay's claim (payload rendered as text) and its mark by ctid, in
# batches of the relay's default size, a commit each.
DB_CEILING_SQL = """
DO $$
DECLARE
    tids tid[];
BEGIN
    LOOP
        SELECT array_agg(claimed_ctid) INTO tids FROM (
            SELECT id, message_id, topic, key, payload::text, headers::text, ctid AS claimed_ctid
              FROM outbox.outbox_message
             WHERE published_at IS NULL AND parked_at IS NULL AND id >= 0
               AND key <> ALL('{}'::text[])
               AND (pg_catalog.hashtext(key) & 2147483647) % 1 = 0
             ORDER BY id LIMIT 5000
               FOR UPDATE SKIP LOCKED) AS claim;
        EXIT WHEN tids IS NULL;
        UPDATE outbox.outbox_message SET published_at = pg_catalog.statement_timestamp()
         WHERE ctid = ANY(tids);
        COMMIT;
    END LOOP;
END $$;
"""


def db_ceiling_once(pg, n):
    """The relay's claim and mark SQL alone (no Kafka), in a database the
    relay does not serve, batches of 5000, a commit per batch."""
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
    # The relay's part alone: commit -> acknowledged, marked and committed.
    marked = dict(pg.sql(f"SELECT message_id::text, extract(epoch FROM {MARKED_AT})::float8 "
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



# ---- a long snapshot ---------------------------------------------------------

ONE_WRITE = (f"SELECT outbox.write('{TOPIC}', 'key-' || (random() * {KEYS})::int, "
             f"jsonb_build_object('id', 1, 'pad', repeat('x', {PAD})));\n")


def relay_cpu_s(pid):
    """utime + stime of a process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def relays_cpu_s(pids):
    """The CPU seconds of several relay workers together."""
    return sum(relay_cpu_s(p) for p in pids)


def snapshot_run(pg, before_s, held_s, after_s, rate):
    """Writers at `rate` msg/s; after before_s a REPEATABLE READ transaction
    takes a snapshot and holds it for held_s (as a pg_dump or a report would).
    Per 10 s window: p99 of commit -> published (published_at - created_at:
    each write is its own transaction), and the relay's CPU per message."""
    pg.sql("TRUNCATE outbox.outbox_message")
    pg.sql("VACUUM outbox.outbox_message")
    if os.environ.get("NOAV"):
        pg.sql("ALTER TABLE outbox.outbox_message SET (autovacuum_enabled = false)")
    path = os.path.join(pg.dir, "one-write.sql")
    with open(path, "w") as f:
        f.write(ONE_WRITE)
    os.chmod(path, 0o644)
    total = before_s + held_s + after_s
    cmd = [os.path.join(PG_BIN, "pgbench"), "-n", "-h", pg.dir, "-p", str(pg.port), "-U",
           "postgres", "-c", "4", "-j", "2", "-R", str(rate), "-T", str(total), "-f", path,
           "postgres"]
    pid = relay_pid(pg)
    t0 = pg.scalar("SELECT extract(epoch FROM clock_timestamp())::float8")
    p = subprocess.Popen(as_postgres(cmd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cpu = []  # (seconds since t0, relay cpu seconds)
    holder = None
    held_at = released_at = None
    while p.poll() is None:
        now = time.time() - t0
        cpu.append((now, relay_cpu_s(pid)))
        if holder is None and now >= before_s:
            holder = pg.connect()
            holder.autocommit = False
            with holder.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                cur.execute("SELECT count(*) FROM outbox.outbox_message")
            held_at = now
        if holder is not None and released_at is None and now >= before_s + held_s:
            dead = pg.scalar("SELECT n_dead_tup FROM pg_stat_user_tables "
                             "WHERE relid = 'outbox.outbox_message'::regclass")
            holder.commit()
            holder.close()
            released_at = now
        time.sleep(1)
    wait_until(lambda: pending(pg) == 0, 120, what="the snapshot run to drain")
    rows = pg.sql("""SELECT floor((extract(epoch FROM created_at) - %s) / 10)::int AS w, count(*),
                            percentile_disc(0.99) WITHIN GROUP
                                (ORDER BY extract(epoch FROM published_at - created_at) * 1000),
                            percentile_disc(0.5) WITHIN GROUP
                                (ORDER BY extract(epoch FROM published_at - created_at) * 1000)
                       FROM outbox.outbox_message GROUP BY 1 ORDER BY 1""", (t0,))
    windows = []
    for w, n, p99, p50 in rows:
        lo, hi = w * 10, w * 10 + 10
        c = [c for t, c in cpu if lo <= t < hi + 1]
        us = (c[-1] - c[0]) / n * 1e6 if len(c) > 1 and n else None
        state = ("held" if held_at is not None and lo >= held_at and hi <= released_at
                 else "before" if hi <= before_s else "after" if lo >= before_s + held_s else "edge")
        windows.append({"from_s": lo, "n": n, "p50": float(p50), "p99": float(p99),
                        "cpu_us_per_msg": us, "state": state})
    pg.sql("TRUNCATE outbox.outbox_message")
    return {"windows": windows, "dead_tuples_at_release": dead}


# ---- writers at full speed ---------------------------------------------------

def writers_run(pg, clients, seconds, runs):
    """tx/s of 4 writers at full speed with the relay idle (outbox.brokers
    empty) and publishing everything, in pairs run back to back (order
    alternating)."""
    idle, publishing = [], []
    for r in range(runs):
        order = [("idle", idle), ("publishing", publishing)]
        if r % 2:
            order.reverse()
        for mode, into in order:
            pg.sql("TRUNCATE outbox.outbox_message, orders")
            if mode == "idle":
                pg.sql("ALTER SYSTEM SET outbox.brokers = ''")
            else:
                pg.sql("ALTER SYSTEM RESET outbox.brokers")
            pg.reload()
            time.sleep(1.5)
            into.append(pgbench_tps(pg, WITH_OUTBOX, clients, seconds))
            if mode == "publishing":
                wait_until(lambda: pending(pg) == 0, 120, what="the writers' messages published")
    pg.sql("ALTER SYSTEM RESET outbox.brokers")
    pg.reload()
    pg.sql("TRUNCATE outbox.outbox_message, orders")
    return idle, publishing


# ---- a distant broker --------------------------------------------------------

def delay_run(pg, broker, n, runs, rtt_ms):
    """Drains of n with no added broker latency and with rtt_ms on every
    response, in pairs (order alternating)."""
    near, far = [], []
    for r in range(runs):
        order = [(0, near), (rtt_ms, far)]
        if r % 2:
            order.reverse()
        for rtt, into in order:
            broker.ctl("rtt", rtt)
            time.sleep(0.5)
            into.append(drain_once(pg, n)[0])
    broker.ctl("rtt", 0)
    return near, far


def server_settings(pairs):
    """--set NAME=VALUE options as postgresql.conf lines (values quoted)."""
    out = {}
    for p in pairs:
        name, sep, value = p.partition("=")
        if not sep or not name.strip():
            raise SystemExit(f"bench: --set wants NAME=VALUE, not {p!r}")
        out[name.strip()] = "'" + value.strip().replace("'", "''") + "'"
    return out


# ---- a large backlog ---------------------------------------------------------

def backlog_run(pg, n, chunk=1000000):
    """A backlog of n messages committed at once (written in chunks of one
    transaction each, with the relay stopped), drained: the rate, the
    relay's memory (the largest of the relay workers'), WAL per message and
    the relay workers' CPU per message (microseconds)."""
    pg.sql("TRUNCATE outbox.outbox_message")
    pg.sql("ALTER SYSTEM SET outbox.brokers = ''")
    pg.reload()
    time.sleep(1)
    left = n
    while left > 0:
        pg.sql(BACKLOG_SQL, (min(chunk, left),))
        left -= chunk
    pg.sql("VACUUM ANALYZE outbox.outbox_message")
    pg.sql("CHECKPOINT")
    relay_pid(pg)
    pids = pg.relay_pids("postgres")
    before = max(rss_kb(p) for p in pids)
    peak = before
    wal0 = pg.scalar("SELECT wal_bytes FROM pg_stat_wal")
    cpu0 = relays_cpu_s(pids)
    pg.sql("ALTER SYSTEM RESET outbox.brokers")
    t0 = time.time()
    pg.reload()
    watch = DrainWatch(pg)
    while not watch.drained():
        peak = max([peak] + [rss_kb(p) for p in pids])
        time.sleep(0.5)
    watch.close()
    cpu = relays_cpu_s(pids) - cpu0
    wal = float(pg.scalar("SELECT wal_bytes FROM pg_stat_wal") - wal0)
    last = pg.scalar(f"SELECT extract(epoch FROM max({MARKED_AT})) FROM outbox.outbox_message")
    rate = n / (float(last) - t0)
    pg.sql("TRUNCATE outbox.outbox_message")
    return rate, before, peak, wal / n, cpu / n * 1e6


def backlog_line(pg, results, name, drain_n, big, label):
    """The backlog scenario: one drain of big, bracketed by three drains of
    drain_n just before and three just after; the comparison is with the
    median of those six, so that the VM's drift during the big drain (it
    takes minutes) hits both sides alike.  Between them, two "cold" drains
    of drain_n before and two after, each built as the big backlog is
    (written with the relay away, vacuumed, checkpointed): a real backlog
    is cold, and a cold start costs by itself (each page's first change
    after a checkpoint goes to WAL whole, and clears its all-visible bit),
    so their median tells what size costs apart from what a cold start
    does.  The relay's CPU per message of each kind is printed too: it is
    what a drain is bound by.  Its line of the table."""
    pids = pg.relay_pids("postgres")
    hot, cold, hot_cpu, cold_cpu = [], [], [], []

    def small(cold_start):
        rates, cpus = (cold, cold_cpu) if cold_start else (hot, hot_cpu)
        c0 = relays_cpu_s(pids)
        rates.append((backlog_run if cold_start else drain_once)(pg, drain_n)[0])
        cpus.append((relays_cpu_s(pids) - c0) / drain_n * 1e6)

    for cold_start in (False, True, False, True, False):
        small(cold_start)
    rate, before, peak, wal_per_msg, cpu = backlog_run(pg, big)
    for cold_start in (False, True, False, True, False):
        small(cold_start)
    results[name] = {"n": big, "rate": rate, "small_rates": hot, "cold_small_rates": cold,
                     "rss_kb": [before, peak], "wal_bytes_per_message": wal_per_msg,
                     "relay_cpu_us_per_message": {"big": cpu, "small": hot_cpu,
                                                  "cold_small": cold_cpu}}
    return (f"| backlog of {big:,}{label}: drain rate (vs six drains of {drain_n:,} around it; "
            f"vs four cold-started ones) | {rate:,.0f} msg/s (vs {fmt_range(hot)}; "
            f"vs {fmt_range(cold)}) | {rate / med(hot):.0%}; target >= 90%; vs cold "
            f"{rate / med(cold):.0%}; relay CPU {cpu:.1f} us/msg (vs {med(hot_cpu):.1f}; cold "
            f"{med(cold_cpu):.1f}); relay RSS {before / 1024:.1f} -> {peak / 1024:.1f} MB; "
            f"WAL {wal_per_msg:,.0f} B/msg |")


# ---- inbox: set-based handlers, a slow topic beside a fast one ---------------

SET_HANDLER = """
CREATE OR REPLACE FUNCTION bench_batch_handler(msgs outbox.inbox_message[]) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO inbox_handled SELECT m.event_id, m.key, (m.payload->>'id')::numeric
      FROM unnest(msgs) AS m;
$$;
"""

SLOW_TOPIC = "bench.slow"
FAST_TOPIC = "bench.fast"
SLOW_HANDLERS = """
CREATE TABLE IF NOT EXISTS slow_handled (event_id uuid PRIMARY KEY);
CREATE OR REPLACE FUNCTION bench_slow(msg outbox.inbox_message) RETURNS void LANGUAGE sql AS $$
    SELECT pg_sleep(0.05); INSERT INTO slow_handled VALUES (msg.event_id);
$$;
CREATE TABLE IF NOT EXISTS fast_handled (event_id uuid PRIMARY KEY);
CREATE OR REPLACE FUNCTION bench_fast(msg outbox.inbox_message) RETURNS void LANGUAGE sql AS $$
    INSERT INTO fast_handled VALUES (msg.event_id);
$$;
"""


def inbox_handler_rate(pg, broker, n, handler):
    """Stores a burst of n records unsubscribed, then times `handler`
    (regprocedure text) working them off."""
    pg.sql(INBOX_SCHEMA + SET_HANDLER)
    pg.sql("TRUNCATE outbox.inbox_message, inbox_handled")
    pg.sql("SELECT outbox.inbox_unsubscribe(%s)", (INBOX_TOPIC,))
    subprocess.run([os.path.join(BUILD, "produce_ceiling"), broker.bootstrap, INBOX_TOPIC,
                    str(n), str(KEYS), "200", "0"], check=True, capture_output=True)
    wait_until(lambda: pg.scalar("SELECT count(*) FROM outbox.inbox_message") >= n, 300,
               interval=0.05, what="the burst stored")
    t1 = time.time()
    pg.sql("SELECT outbox.inbox_subscribe(%s, %s)", (INBOX_TOPIC, handler))
    wait_until(lambda: pg.scalar("SELECT count(*) FROM inbox_handled") >= n, 600,
               interval=0.05, what="the burst handled")
    rate = n / (time.time() - t1)
    pg.sql("SELECT outbox.inbox_unsubscribe(%s)", (INBOX_TOPIC,))
    return rate


def slow_fast_run(pg, broker, slow_n, fast_rate, seconds):
    """A slow handler (50 ms a record) works through a backlog of slow_n
    records on one topic while another topic gets fast_rate records/s: the
    fast topic's store -> handled p50 / p99."""
    pg.sql(SLOW_HANDLERS)
    pg.sql("TRUNCATE outbox.inbox_message, slow_handled, fast_handled")
    for topic, fn in ((SLOW_TOPIC, "bench_slow"), (FAST_TOPIC, "bench_fast")):
        pg.sql("SELECT outbox.inbox_subscribe(%s, %s)", (topic, f"{fn}(outbox.inbox_message)"))
    subprocess.run([os.path.join(BUILD, "produce_ceiling"), broker.bootstrap, SLOW_TOPIC,
                    str(slow_n), str(KEYS), "200", "0"], check=True, capture_output=True)
    from confluent_kafka import Producer
    prod = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "log_level": 2})
    end = time.time() + seconds
    i = 0
    while time.time() < end:
        prod.produce(FAST_TOPIC, key=f"k{i % 100}", value=b'{"id": 1}',
                     headers=[("event_id", str(uuid.uuid4()))])
        prod.poll(0)
        i += 1
        time.sleep(1 / fast_rate)
    prod.flush(30)
    wait_until(lambda: pg.scalar("SELECT count(*) FROM fast_handled") >= i, 120,
               what="the fast topic handled")
    slow_left = pg.scalar("SELECT count(*) FROM outbox.inbox_message "
                          "WHERE topic = %s AND NOT processed", (SLOW_TOPIC,))
    p50, p99 = pg.sql("""SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY d),
                                percentile_disc(0.99) WITHIN GROUP (ORDER BY d)
                           FROM (SELECT extract(epoch FROM processed_at - received_at) * 1000 AS d
                                   FROM outbox.inbox_message WHERE topic = %s) s""",
                      (FAST_TOPIC,))[0]
    for topic in (SLOW_TOPIC, FAST_TOPIC):
        pg.sql("SELECT outbox.inbox_unsubscribe(%s)", (topic,))
    return {"fast_n": i, "p50": float(p50), "p99": float(p99), "slow_still_waiting": slow_left}

# ---- main --------------------------------------------------------------------

SCENARIOS = ("drain", "latency", "write", "memory", "inbox", "retention", "snapshot", "writers",
             "delay", "backlog", "backlog_two_relays", "inbox_scale")


class _Echo(list):
    """A list of report lines that also prints each one as it comes, so a
    scenario that fails late does not take the earlier figures with it."""

    def append(self, item):
        print(item, flush=True)
        super().append(item)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="fewer, shorter runs (smoke test)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a server setting for the benchmark's cluster (repeatable), e.g. "
                         "--set shared_buffers=6GB")
    ap.add_argument("--fillfactor", type=int, default=None,
                    help="outbox_message's fillfactor instead of the schema's (50)")
    ap.add_argument("--only", default=",".join(SCENARIOS),
                    help="comma-separated scenarios: " + ", ".join(SCENARIOS))
    args = ap.parse_args()
    only = set(args.only.split(","))
    unknown = only - set(SCENARIOS)
    if unknown:
        ap.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    runs = 2 if args.quick else args.runs
    drain_n = 20000 if args.quick else 100000
    rss_n = 100000 if args.quick else 1000000
    lat_seconds = 5 if args.quick else 20
    write_seconds = 3 if args.quick else 4

    broker = TestBroker(topics=(f"{TOPIC}:{PARTITIONS}", f"{INBOX_TOPIC}:{PARTITIONS}",
                                f"{SLOW_TOPIC}:{PARTITIONS}", f"{FAST_TOPIC}:{PARTITIONS}"))
    pg = PgCluster({**COMMIT_TS, "outbox.brokers": f"'{broker.bootstrap}'",
                    "fsync": "on", "synchronous_commit": "on", "autovacuum_naptime": "'10s'",
                    "outbox.inbox": "on",
                    "outbox.inbox_topics": f"'{INBOX_TOPIC}, {SLOW_TOPIC}, {FAST_TOPIC}'",
                    "shared_buffers": "'512MB'", "max_wal_size": "'8GB'",
                    "checkpoint_timeout": "'30min'",
                    **server_settings(args.set)}, name="outbox-bench")
    results = {}
    lines = _Echo(["| measure | median (min-max) | ratio |", "|---|---|---|"])
    extra_tables = _Echo()
    try:
        pg.start()
        pg.sql("CREATE EXTENSION outbox")
        if args.fillfactor:
            pg.sql(f"ALTER TABLE outbox.outbox_message SET (fillfactor = {args.fillfactor:d})")
        pg.sql(WRITE_SCHEMA)
        pg.sql("CREATE DATABASE ceiling")
        pg.sql("CREATE EXTENSION outbox", dbname="ceiling")
        if args.fillfactor:
            pg.sql(f"ALTER TABLE outbox.outbox_message SET (fillfactor = {args.fillfactor:d})",
                   dbname="ceiling")
        pg.sql("SELECT 1 FROM outbox.write('warmup', 'k', '{}')")  # producer connected
        wait_until(lambda: pending(pg) == 0, 30, what="warm-up")

        if "drain" in only:
            # Drain and both ceilings run in turn, so that the machine's drift
            # (a shared VM here) hits them alike; ratios are taken per round.
            print(f"drain and ceilings: {runs} rounds of {drain_n:,} messages ...", flush=True)
            drains, kafka, db, ratios = [], [], [], []
            for _ in range(runs):
                drains.append(drain_once(pg, drain_n)[0])
                kafka.append(kafka_ceiling_once(broker, drain_n))
                db.append(db_ceiling_once(pg, drain_n))
                ratios.append(drains[-1] / min(kafka[-1], db[-1]))
            results.update(drain=drains, kafka_ceiling=kafka, db_ceiling=db)
            lines.append(f"| drain, {drain_n:,} x 200 B, {KEYS:,} keys | {fmt_range(drains, ' msg/s')} "
                         f"| {med(ratios):.0%} of the lower ceiling (per-round ratios "
                         f"{min(ratios):.0%}-{max(ratios):.0%}) |")
            lines.append(f"| ceiling: test broker, plain librdkafka producer, batches of 1,000 | "
                         f"{fmt_range(kafka, ' msg/s')} | drain = {med(drains) / med(kafka):.0%} |")
            lines.append(f"| ceiling: database, the relay's claim + mark SQL alone | "
                         f"{fmt_range(db, ' msg/s')} | drain = {med(drains) / med(db):.0%} |")

        if "latency" in only:
            print(f"latency: {min(runs, 3)} runs of {lat_seconds} s at 1,000 msg/s, twice ...",
                  flush=True)
            pg.sql("TRUNCATE outbox.outbox_message")
            lats = [latency_once(pg, broker, 1000, lat_seconds) for _ in range(min(runs, 3))]
            pg.sql("ALTER SYSTEM SET outbox.synchronous_commit = off")
            pg.reload()
            time.sleep(1)
            lats_async = [latency_once(pg, broker, 1000, lat_seconds) for _ in range(min(runs, 3))]
            pg.sql("ALTER SYSTEM RESET outbox.synchronous_commit")
            pg.reload()
            results.update(latency=lats, latency_async=lats_async)
            lines.append(f"| latency commit->consumer at 1,000 msg/s, p50 / p99 / max | "
                         f"{fmt_range([r['p50'] for r in lats], ' ms', 1)} / "
                         f"{fmt_range([r['p99'] for r in lats], ' ms', 1)} / "
                         f"{fmt_range([r['max'] for r in lats], ' ms', 1)} | |")
            lines.append(f"| relay part: commit -> acknowledged and marked, p50 / p99 | "
                         f"{fmt_range([r['relay_p50'] for r in lats], ' ms', 1)} / "
                         f"{fmt_range([r['relay_p99'] for r in lats], ' ms', 1)} | |")
            lines.append(f"| latency p50 / p99 with outbox.synchronous_commit = off | "
                         f"{fmt_range([r['p50'] for r in lats_async], ' ms', 1)} / "
                         f"{fmt_range([r['p99'] for r in lats_async], ' ms', 1)} "
                         f"(relay part {fmt_range([r['relay_p50'] for r in lats_async], ' ms', 1)}"
                         f" / {fmt_range([r['relay_p99'] for r in lats_async], ' ms', 1)}) | |")
            lines.append(f"| latency runs: lost / duplicates | {sum(r['lost'] for r in lats)} / "
                         f"{sum(r['dups'] for r in lats)} of {sum(r['n'] for r in lats):,} | |")

        if "write" in only:
            print(f"write cost: pgbench {write_seconds} s per run ...", flush=True)
            pg.sql("TRUNCATE outbox.outbox_message")
            wc = {}
            for relay in ("idle", "publishing"):
                if relay == "idle":
                    pg.sql("ALTER SYSTEM SET outbox.brokers = ''")
                else:
                    pg.sql("ALTER SYSTEM RESET outbox.brokers")
                pg.reload()
                time.sleep(1)
                for clients in (1, 8):
                    wc[(relay, clients)] = write_cost(pg, clients, write_seconds, runs)
            results["write_cost"] = {f"{k[0]}/{k[1]}": v for k, v in wc.items()}
            for (relay, clients), (ob, pl) in wc.items():
                extra = extra_costs(ob, pl)
                lines.append(f"| write, {clients} client{'s' if clients > 1 else ''}, relay {relay}: "
                             f"outbox.write() / plain INSERT | "
                             f"{fmt_range(ob, ' tx/s')} / {fmt_range(pl, ' tx/s')} | "
                             f"outbox.write() costs {med(extra):+.1%} (pairs {min(extra):+.0%} to "
                             f"{max(extra):+.0%}) |")

        if "writers" in only:
            w_seconds = 5 if args.quick else 10
            print(f"writers at full speed: 4 clients, {runs} pairs of {w_seconds} s, relay idle / "
                  "publishing ...", flush=True)
            idle, publishing = writers_run(pg, 4, w_seconds, runs)
            kept = [p / i for i, p in zip(idle, publishing)]
            results["writers"] = {"idle": idle, "publishing": publishing}
            lines.append(f"| 4 writers at full speed, relay idle / publishing everything | "
                         f"{fmt_range(idle, ' tx/s')} / {fmt_range(publishing, ' tx/s')} | "
                         f"kept {med(kept):.1%} of the idle rate (pairs {min(kept):.0%}-"
                         f"{max(kept):.0%}); target >= 95% |")

        if "delay" in only:
            print(f"distant broker: {runs} pairs of {drain_n:,}-message drains, 0 / 5 ms ...",
                  flush=True)
            near, far = delay_run(pg, broker, drain_n, runs, 5)
            kept = [f / n for n, f in zip(near, far)]
            results["delay"] = {"near": near, "far": far}
            lines.append(f"| drain with 0 / 5 ms added to every broker response | "
                         f"{fmt_range(near, ' msg/s')} / {fmt_range(far, ' msg/s')} | "
                         f"kept {med(kept):.0%} (pairs {min(kept):.0%}-{max(kept):.0%}); "
                         f"target >= 80% |")

        if "memory" in only:
            print(f"memory: draining {drain_n:,} and then {rss_n:,} messages ...", flush=True)
            pg.sql("TRUNCATE outbox.outbox_message, plain_outbox, orders")
            _, before_small, peak_small = drain_once(pg, drain_n, sample_rss=True)
            _, before_big, peak_big = drain_once(pg, rss_n, sample_rss=True)
            results["rss_kb"] = {"small": [before_small, peak_small], "big": [before_big, peak_big]}
            lines.append(f"| relay private RSS (RssAnon) draining {drain_n:,} / {rss_n:,} "
                         f"(before -> peak) | {before_small / 1024:.1f} -> {peak_small / 1024:.1f} / "
                         f"{before_big / 1024:.1f} -> {peak_big / 1024:.1f} MB | |")

        big = 1000000 if args.quick else 10000000
        if "backlog" in only:
            print(f"backlog: one drain of {big:,} messages between five of {drain_n:,} before "
                  f"and five after (three hot, two cold-started) ...", flush=True)
            lines.append(backlog_line(pg, results, "backlog", drain_n, big, ""))

        if "backlog_two_relays" in only:
            # The same comparison with a relay worker per core (outbox.workers
            # needs a restart), then back to the default.
            print(f"backlog, outbox.workers = 2: one drain of {big:,} between five of "
                  f"{drain_n:,} before and five after ...", flush=True)
            pg.sql("ALTER SYSTEM SET outbox.workers = 2")
            pg.restart()
            wait_until(lambda: len(pg.relay_pids("postgres")) == 2, 30, what="two relay workers")
            lines.append(backlog_line(pg, results, "backlog_two_relays", drain_n, big,
                                      ", outbox.workers = 2"))
            pg.sql("ALTER SYSTEM RESET outbox.workers")
            pg.restart()
            wait_until(lambda: len(pg.relay_pids("postgres")) == 1, 30, what="one relay worker")

        if "inbox" in only:
            print(f"inbox: {runs} bursts of {drain_n:,} records ...", flush=True)
            inbox = [inbox_run(pg, broker, drain_n) for _ in range(runs)]
            results["inbox"] = inbox
            lines.append(f"| inbox burst of {drain_n:,}: consumer stores | "
                         f"{fmt_range([i[0] for i in inbox], ' records/s')} | |")

        if "inbox_scale" in only:
            print(f"inbox handlers: {runs} bursts of {drain_n:,}, per record / set-based ...",
                  flush=True)
            per, batch = [], []
            for r in range(runs):
                order = [("bench_handler(outbox.inbox_message)", per),
                         ("bench_batch_handler(outbox.inbox_message[])", batch)]
                if r % 2:
                    order.reverse()
                for handler, into in order:
                    into.append(inbox_handler_rate(pg, broker, drain_n, handler))
            results["inbox_handlers"] = {"per_record": per, "set_based": batch}
            lines.append(f"| inbox handler works off {drain_n:,}: per record / set-based | "
                         f"{fmt_range(per, ' records/s')} / {fmt_range(batch, ' records/s')} | "
                         f"set-based target >= 25,000 |")
            sf_seconds = 10 if args.quick else 30
            print(f"inbox: a slow topic (50 ms a record) beside a fast one, {sf_seconds} s ...",
                  flush=True)
            sf = slow_fast_run(pg, broker, 2000, 100, sf_seconds)
            results["slow_fast"] = sf
            lines.append(f"| fast topic (100 records/s) beside a slow handler's backlog: "
                         f"stored -> handled p50 / p99 | {sf['p50']:.0f} / {sf['p99']:.0f} ms | "
                         f"target p99 <= 1 s; {sf['slow_still_waiting']:,} slow records still "
                         f"waiting |")

        if "retention" in only:
            ret_seconds = 60 if args.quick else 240
            print(f"retention: {ret_seconds} s of writes at 1,000 msg/s, outbox.retention = 20s ...",
                  flush=True)
            pg.sql("TRUNCATE outbox.outbox_message, plain_outbox, orders")
            ret = retention_run(pg, ret_seconds, 1000, 20)
            results["retention"] = ret
            t = ["Retention (outbox.retention = 20s, writes at 1,000 msg/s, autovacuum naptime "
                 "10s): the table stays bounded", "", "| after | rows | heap | indexes |",
                 "|---|---|---|---|"]
            for at, heap, idx, rows in ret:
                t.append(f"| {at} s | {rows:,} | {heap / 1048576:.1f} MB | {idx / 1048576:.1f} MB |")
            extra_tables.append("\n".join(t))

        if "snapshot" in only:
            before_s, held_s, after_s = (30, 120, 20) if args.quick else (30, 600, 30)
            print(f"long snapshot: 2,000 msg/s, a snapshot held {held_s} s ...", flush=True)
            snap = snapshot_run(pg, before_s, held_s, after_s, 2000)
            results["snapshot"] = snap
            t = [f"A REPEATABLE READ snapshot held {held_s} s while writers go at 2,000 msg/s "
                 f"({snap['dead_tuples_at_release']:,} dead tuples when it ended): commit -> "
                 "published per 10 s window", "",
                 "| window | snapshot | messages | p50 | p99 | relay CPU per message |",
                 "|---|---|---|---|---|---|"]
            for w in snap["windows"]:
                cpu = f"{w['cpu_us_per_msg']:.0f} us" if w["cpu_us_per_msg"] else "-"
                t.append(f"| {w['from_s']}-{w['from_s'] + 10} s | {w['state']} | {w['n']:,} | "
                         f"{w['p50']:.1f} ms | {w['p99']:.1f} ms | {cpu} |")
            held = [w["p99"] for w in snap["windows"] if w["state"] == "held"]
            before = [w["p99"] for w in snap["windows"] if w["state"] == "before"]
            if held and before:
                lines.append(f"| snapshot held {held_s} s: worst 10 s window p99 (before it) | "
                             f"{max(held):.1f} ms ({max(before):.1f} ms) | target <= 25 ms or 3x "
                             f"before |")
            extra_tables.append("\n".join(t))

        report = "\n\n".join(["\n".join(lines)] + extra_tables)
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
