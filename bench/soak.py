"""The soak: hours of steady writes against the real three-node Kafka cluster, with faults
in the middle, sampled every minute.

    bench/run.sh --soak [--rate 500] [--minutes 120] [--retention 5min] [--no-faults]

What runs (all on this machine):
  - a three-node Apache Kafka cluster (test/kafka/cluster.py: replication factor 3,
    min.insync.replicas=2), topic soak.events of 8 partitions;
  - one PostgreSQL cluster (fsync and synchronous_commit on, autovacuum as shipped) with the
    extension, outbox.retention = --retention, so that the maintenance worker deletes all
    the time;
  - writers (pgbench -R, 2 clients) calling outbox.write() at --rate messages a second, each
    payload 200 bytes carrying a sequence number and the write's clock time;
  - the relay publishing them to the cluster (at-least-once);
  - the inbox consuming the same topic back (outbox.inbox_topics), its handler calling
    outbox.mark_processed() with a ttl of the retention: the outbox, the inbox and
    processed_event all fill and empty at once;
  - a consumer here (confluent_kafka) reading the topic: write -> consumer latency, and
    every sequence number seen (a loss is a number never seen).

Faults (unless --no-faults), at fixed fractions of the run: a broker stopped cleanly and
started again (20%), pg_terminate_backend() of the relay (30%), every broker down for
--outage minutes (40%), a transaction held open for --hold minutes (65%).

Every minute: written, write -> consumer p50/p99/max, pending and parked rows, WAL bytes
per message, each worker's CPU per message and private memory (RssAnon), heap and index
size, dead tuples and autovacuum runs of outbox_message, inbox_message and processed_event.
At the end, each series with a verdict: "flat" or its slope per hour, fitted on the minutes
outside the faults (a fault's minutes and the 5 after it are left out); the series in
bench/results/soak-*.json and drawn in one PNG (matplotlib, faults shaded).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "test", "e2e"))
sys.path.insert(0, os.path.join(ROOT, "test", "kafka"))
from harness import PG_BIN, PgCluster, as_postgres, wait_until  # noqa: E402
from cluster import KafkaCluster  # noqa: E402

TOPIC = "soak.events"
PARTITIONS = 8
KEYS = 1000
TABLES = ("outbox.outbox_message", "outbox.inbox_message", "outbox.processed_event")
# {"n": 1234567, "t": 1765000000.123456, "pad": "xx.."}: about 200 bytes as jsonb prints it.
PAD = 200 - len('{"n": 1234567, "t": 1765000000.123456, "pad": ""}')
WRITE = (f"SELECT outbox.write('{TOPIC}', 'key-' || (random() * {KEYS})::int, "
         f"jsonb_build_object('n', nextval('soak_n'), 't', "
         f"extract(epoch FROM clock_timestamp()), 'pad', repeat('x', {PAD})));\n")


def interval_seconds(text):
    units = {"s": 1, "min": 60, "h": 3600, "d": 86400}
    for u in sorted(units, key=len, reverse=True):
        if text.endswith(u):
            return float(text[:-len(u)]) * units[u]
    return float(text)


def cpu_s(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return None


def rss_anon_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class Reader(threading.Thread):
    """Reads the topic from its end: latency per minute, every sequence number seen."""

    def __init__(self, bootstrap, capacity):
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.seen = bytearray(capacity + 1)
        self.lock = threading.Lock()
        self.window = []
        self.total = self.duplicates = 0
        self.ready = threading.Event()
        self.stopping = threading.Event()

    def run(self):
        from confluent_kafka import OFFSET_END, Consumer, TopicPartition
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "soak-reader",
                      "enable.auto.commit": False, "fetch.wait.max.ms": 5, "log_level": 2})
        c.assign([TopicPartition(TOPIC, p, OFFSET_END) for p in range(PARTITIONS)])
        end = time.time() + 5
        while time.time() < end:
            c.poll(0.1)
        self.ready.set()
        while not self.stopping.is_set():
            for m in c.consume(500, 0.1):
                if m.error():
                    continue
                now = time.time()
                v = json.loads(m.value())
                n = v["n"]
                with self.lock:
                    self.total += 1
                    if n < len(self.seen):
                        if self.seen[n]:
                            self.duplicates += 1
                            continue
                        self.seen[n] = 1
                    self.window.append((now - v["t"]) * 1000)
        c.close()

    def take(self):
        with self.lock:
            w, self.window = self.window, []
        return w


def pct(xs, q):
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


class Sampler:
    """One sample a minute of what the module's docstring lists."""

    def __init__(self, pg):
        self.pg = pg
        self.cpu = {}           # pid -> cpu seconds at the last sample
        self.last = None

    def raw(self):
        q = ["(SELECT last_value FROM soak_n)",
             "pg_current_wal_lsn()",
             "(SELECT count(*) FROM outbox.outbox_message WHERE published_at IS NULL "
             "AND parked_at IS NULL)",
             "(SELECT count(*) FROM outbox.outbox_message WHERE parked_at IS NOT NULL)",
             "(SELECT count(*) FROM outbox.inbox_message WHERE NOT processed)"]
        for t in TABLES:
            q += [f"pg_relation_size('{t}')", f"pg_indexes_size('{t}')",
                  f"(SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = '{t}'::regclass)",
                  f"(SELECT autovacuum_count FROM pg_stat_user_tables "
                  f"WHERE relid = '{t}'::regclass)"]
        row = self.pg.sql("SELECT " + ", ".join(q))[0]
        workers = self.pg.sql("SELECT pid, backend_type FROM pg_stat_activity "
                              "WHERE backend_type LIKE 'pg outbox%'")
        return row, workers

    def sample(self, minute, latencies, phase):
        row, workers = self.raw()
        written, lsn, pending, parked, inbox_waiting = row[:5]
        rest = row[5:]
        out = {"minute": minute, "phase": phase, "pending": pending, "parked": parked,
               "inbox_unhandled": inbox_waiting}
        lat = sorted(latencies)
        out.update({"consumed": len(lat), "p50_ms": pct(lat, 0.5), "p99_ms": pct(lat, 0.99),
                    "max_ms": lat[-1] if lat else None})
        for i, t in enumerate(TABLES):
            name = t.split(".")[1]
            heap, idx, dead, av = rest[4 * i:4 * i + 4]
            out[f"{name}_heap_mb"] = heap / 2**20
            out[f"{name}_index_mb"] = idx / 2**20
            out[f"{name}_dead"] = dead
            out[f"{name}_autovacuum_total"] = av
        lsn_bytes = int(self.pg.scalar("SELECT %s::pg_lsn - '0/0'::pg_lsn", (lsn,)))
        cpu_by_type, rss_by_type = {}, {}
        seen = {}
        for pid, btype in workers:
            kind = btype.replace("pg outbox ", "")
            c = cpu_s(pid)
            if c is not None:
                cpu_by_type[kind] = cpu_by_type.get(kind, 0.0) + c - self.cpu.get(pid, 0.0)
                seen[pid] = c
            r = rss_anon_kb(pid)
            if r is not None:
                rss_by_type[kind] = max(rss_by_type.get(kind, 0), r)
        self.cpu = seen
        if self.last is not None:
            n = (written or 0) - (self.last[0] or 0)
            out["written"] = n
            out["wal_bytes_per_msg"] = (lsn_bytes - self.last[1]) / n if n > 0 else None
            for kind, c in cpu_by_type.items():
                out[f"cpu_us_per_msg_{kind}"] = c / n * 1e6 if n > 0 else None
        for kind, r in rss_by_type.items():
            out[f"rss_anon_mb_{kind}"] = r / 1024
        self.last = (written, lsn_bytes)
        return out


def slope_per_hour(points):
    """Least-squares slope of (minute, value) points, per hour."""
    if len(points) < 5:
        return None
    xs = [p[0] / 60.0 for p in points]
    ys = [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else None


def verdicts(samples, faults, hours, warm_min=0.0):
    """series -> (median, slope per hour, verdict) over the minutes outside faults, after a
    warm-up (the first tenth of the run, and at least warm_min: the tables fill for one
    retention period before retention deletes as much as is written)."""
    def quiet(m):
        return all(not (f["start_min"] <= m <= f["end_min"] + 5) for f in faults)
    keys = sorted({k for s in samples for k, v in s.items()
                   if isinstance(v, (int, float)) and k not in ("minute",)})
    out = {}
    warm = max(2.0, 0.1 * (samples[-1]["minute"] if samples else 0), warm_min)
    for k in keys:
        pts = [(s["minute"], s[k]) for s in samples
               if s["minute"] >= warm and quiet(s["minute"]) and isinstance(s.get(k), (int, float))]
        if k.endswith("_total"):
            # a count that only grows: its rate per hour is the figure
            sl = slope_per_hour(pts)
            out[k] = (pts[-1][1] if pts else None, sl, f"{sl:.1f} runs/h" if sl is not None
                      else "too few points")
            continue
        sl = slope_per_hour(pts)
        med = statistics.median(v for _, v in pts) if pts else None
        if sl is None or med is None:
            out[k] = (med, sl, "too few points")
            continue
        change = abs(sl) * max(hours, 1.0)
        flat = change <= max(0.1 * abs(med), 1e-9) or (k in ("pending", "parked") and change < 50)
        out[k] = (med, sl, "flat" if flat else f"{'grows' if sl > 0 else 'shrinks'} "
                                               f"{sl:+.3g}/h")
    return out


def plot(samples, faults, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[soak] no matplotlib (apt-get install python3-matplotlib): no PNG", flush=True)
        return None
    groups = [
        ("write -> consumer (ms)", ["p50_ms", "p99_ms"]),
        ("rows waiting", ["pending", "parked", "inbox_unhandled"]),
        ("WAL bytes per message", ["wal_bytes_per_msg"]),
        ("CPU us per message", [k for k in samples[-1] if k.startswith("cpu_us_per_msg_")]),
        ("heap + index (MB)", [f"{t.split('.')[1]}_{w}_mb" for t in TABLES
                               for w in ("heap", "index")]),
        ("dead tuples", [f"{t.split('.')[1]}_dead" for t in TABLES]),
        ("private memory (MB, RssAnon)", [k for k in samples[-1] if k.startswith("rss_anon_mb_")]),
        ("written per minute", ["written"]),
    ]
    fig, axes = plt.subplots(len(groups), 1, figsize=(11, 2.4 * len(groups)), sharex=True)
    for ax, (title, keys) in zip(axes, groups):
        for k in keys:
            xs = [s["minute"] for s in samples if s.get(k) is not None]
            ys = [s[k] for s in samples if s.get(k) is not None]
            ax.plot(xs, ys, label=k, linewidth=1)
        for f in faults:
            ax.axvspan(f["start_min"], f["end_min"], color="0.85")
        if title.startswith(("write", "rows")):
            ax.set_yscale("symlog", linthresh=10)  # an outage's backlog beside quiet minutes
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=6, loc="upper left")
        ax.tick_params(labelsize=7)
    axes[-1].set_xlabel("minute (faults shaded)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=int, default=500, help="messages a second (default 500)")
    ap.add_argument("--minutes", type=int, default=120, help="length of the run (default 120)")
    ap.add_argument("--retention", default="5min", help="outbox.retention (default 5min)")
    ap.add_argument("--outage", type=float, default=5, help="minutes of the Kafka outage")
    ap.add_argument("--hold", type=float, default=10, help="minutes the transaction is held")
    ap.add_argument("--no-faults", action="store_true")
    args = ap.parse_args()
    retention_s = interval_seconds(args.retention)

    t0 = time.monotonic()
    kafka = KafkaCluster(nodes=3).start()
    print(f"[soak] 3 nodes ready in {time.monotonic() - t0:.0f}s", flush=True)
    kafka.create_topic(TOPIC, partitions=PARTITIONS)
    pg = PgCluster({"outbox.brokers": f"'{kafka.bootstrap}'", "fsync": "on",
                    "synchronous_commit": "on", "shared_buffers": "'256MB'",
                    "max_wal_size": "'4GB'", "outbox.retention": f"'{int(retention_s)}s'",
                    "outbox.inbox": "on", "outbox.inbox_topics": f"'{TOPIC}'"},
                   name="outbox-soak")
    writers = reader = finished = None
    samples, faults = [], []
    lock = threading.Lock()
    phase = ["steady"]
    try:
        pg.start()
        pg.sql("CREATE EXTENSION outbox")
        pg.sql("CREATE SEQUENCE soak_n")
        pg.sql(f"""CREATE FUNCTION soak_handler(msg outbox.inbox_message) RETURNS void
                   LANGUAGE sql AS $$
                   SELECT outbox.mark_processed(msg.event_id::text, 'soak',
                                                interval '{int(retention_s)} seconds') $$""")
        pg.sql(f"SELECT outbox.inbox_subscribe('{TOPIC}', 'soak_handler(outbox.inbox_message)')")
        reader = Reader(kafka.bootstrap, int(args.rate * args.minutes * 60 * 1.2) + 100000)
        reader.start()
        reader.ready.wait(60)
        script = os.path.join(pg.dir, "soak-write.sql")
        with open(script, "w") as f:
            f.write(WRITE)
        os.chmod(script, 0o644)
        seconds = args.minutes * 60
        writers = subprocess.Popen(as_postgres(
            [os.path.join(PG_BIN, "pgbench"), "-n", "-h", pg.dir, "-p", str(pg.port), "-U",
             "postgres", "-c", "2", "-j", "2", "-R", str(args.rate), "-T", str(seconds),
             "-f", script, "postgres"]), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)
        start = time.monotonic()

        def minute_now():
            return (time.monotonic() - start) / 60.0

        def fault(name, action):
            f = {"name": name, "start_min": round(minute_now(), 2)}
            with lock:
                phase[0] = name
            print(f"[soak] minute {f['start_min']:.1f}: {name}", flush=True)
            try:
                action()
            except Exception as e:  # the soak goes on; the fault says what failed
                f["error"] = repr(e)
            f["end_min"] = round(minute_now(), 2)
            with lock:
                phase[0] = "steady"
                faults.append(f)
            print(f"[soak] minute {f['end_min']:.1f}: {name} over", flush=True)

        def restart_broker():
            kafka.stop_node(kafka.ids[0])
            time.sleep(30)
            kafka.start_node(kafka.ids[0])
            kafka.wait_ready()

        def terminate_relay():
            pg.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                   "WHERE backend_type = 'pg outbox relay'")
            time.sleep(5)

        def outage():
            # All at once: one by one, the last ones wait for a quorum that is gone.
            stoppers = [threading.Thread(target=kafka.stop_node, args=(i, 30)) for i in kafka.ids]
            for t in stoppers:
                t.start()
            for t in stoppers:
                t.join()
            time.sleep(args.outage * 60)
            for i in kafka.ids:
                kafka.start_node(i)
            kafka.wait_ready()

        def hold():
            conn = pg.connect()
            conn.autocommit = False
            with conn.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                cur.execute("SELECT txid_current(), count(*) FROM outbox.outbox_message")
            time.sleep(args.hold * 60)
            conn.commit()
            conn.close()

        plan = [] if args.no_faults else [
            (0.20, "broker restart", restart_broker),
            (0.30, "relay terminated", terminate_relay),
            (0.40, f"Kafka down {args.outage:g} min", outage),
            (0.65, f"transaction held {args.hold:g} min", hold)]

        def run_plan():
            for frac, name, action in plan:
                while minute_now() < frac * args.minutes:
                    if writers.poll() is not None:
                        break
                    time.sleep(1)
                else:
                    fault(name, action)
                    continue
                break
            # Brokers started here die with this thread (cluster.py's PR_SET_PDEATHSIG names
            # the thread that started them): it lives until the run ends.
            finished.wait()

        finished = threading.Event()
        planner = threading.Thread(target=run_plan, daemon=True)
        planner.start()
        sampler = Sampler(pg)
        sampler.sample(0, [], "steady")
        minute = 0
        print("[soak] min  written  p50ms  p99ms pending parked wal/msg relay_us "
              "outbox_MB inbox_MB processed_MB phase", flush=True)
        while writers.poll() is None:
            minute += 1
            while minute_now() < minute and writers.poll() is None:
                time.sleep(0.5)
            with lock:
                ph = phase[0]
            try:
                s = sampler.sample(round(minute_now(), 2), reader.take(), ph)
            except Exception as e:  # e.g. the server restarting: skip the minute
                print(f"[soak] minute {minute}: no sample ({e!r})", flush=True)
                continue
            samples.append(s)

            def f(k, fmt="{:.0f}"):
                return fmt.format(s[k]) if s.get(k) is not None else "-"
            print(f"[soak] {minute:3d} {f('written'):>8} {f('p50_ms'):>6} {f('p99_ms'):>6} "
                  f"{s['pending']:7d} {s['parked']:6d} {f('wal_bytes_per_msg'):>7} "
                  f"{f('cpu_us_per_msg_relay'):>8} "
                  f"{s['outbox_message_heap_mb'] + s['outbox_message_index_mb']:9.1f} "
                  f"{s['inbox_message_heap_mb'] + s['inbox_message_index_mb']:8.1f} "
                  f"{s['processed_event_heap_mb'] + s['processed_event_index_mb']:12.1f} {ph}",
                  flush=True)
        out = writers.communicate()[0]
        while phase[0] != "steady":  # a fault still under way ends first
            time.sleep(1)
        print("[soak] writers: " + " ".join(line for line in out.splitlines()
                                           if "tps" in line or "processed" in line), flush=True)
        wait_until(lambda: pg.scalar("SELECT count(*) FROM outbox.outbox_message "
                                     "WHERE published_at IS NULL") == 0, 1200, interval=1,
                   what="the backlog drained")
        written = pg.scalar("SELECT last_value FROM soak_n")
        # Until the reader has seen every number, or saw nothing new for a minute.
        last, still = -1, time.monotonic()
        while time.monotonic() - still < 60:
            with reader.lock:
                got = sum(reader.seen[1:written + 1])
            if got >= written:
                break
            if got != last:
                last, still = got, time.monotonic()
            time.sleep(2)
        time.sleep(5)
        reader.stopping.set()
        reader.join(30)
        lost = [n for n in range(1, written + 1) if not reader.seen[n]]
        hours = args.minutes / 60.0
        v = verdicts(samples, faults, hours, warm_min=retention_s / 60.0 + 2)
        print(f"\n[soak] {written} messages written at {args.rate}/s for {args.minutes} min, "
              f"retention {args.retention}; lost {len(lost)}, duplicates {reader.duplicates}, "
              f"parked {pg.scalar('SELECT count(*) FROM outbox.outbox_message WHERE parked_at IS NOT NULL')}",
              flush=True)
        if lost:
            print(f"[soak] LOST sequence numbers (first 20): {lost[:20]}", flush=True)
        for f_ in faults:
            print(f"[soak] fault {f_['name']}: minutes {f_['start_min']}-{f_['end_min']}"
                  + (f" ({f_['error']})" if f_.get("error") else ""), flush=True)
        print(f"\n{'series':44} {'median':>12} {'slope/h':>12}  verdict")
        for k, (med, sl, verdict) in v.items():
            ms = f"{med:.3g}" if isinstance(med, (int, float)) else "-"
            ss = f"{sl:+.3g}" if isinstance(sl, (int, float)) else "-"
            print(f"{k:44} {ms:>12} {ss:>12}  {verdict}")
        os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M")
        base = os.path.join(HERE, "results", f"soak-{stamp}")
        with open(base + ".json", "w") as fh:
            json.dump({"args": vars(args), "written": written, "lost": len(lost),
                       "duplicates": reader.duplicates, "faults": faults, "samples": samples,
                       "verdicts": {k: list(x) for k, x in v.items()}}, fh, indent=1)
        png = plot(samples, faults, base + ".png")
        print(f"\n[soak] saved {base}.json" + (f" and {png}" if png else ""), flush=True)
        return 1 if lost else 0
    finally:
        if reader:
            reader.stopping.set()
        if finished is not None:
            finished.set()
        if writers and writers.poll() is None:
            writers.kill()
        pg.destroy()
        kafka.stop()


if __name__ == "__main__":
    sys.exit(main())
