"""Test harness for the end-to-end and fault tests.

Starts the project's test broker (build/outbox_test_broker) and a throwaway
PostgreSQL cluster with the extension preloaded, consumes with a real
librdkafka consumer (confluent_kafka) while messages are produced, and
checks what arrived against what the database committed.

Runs as root (Postgres then runs as the `postgres` user, via runuser) or as
an ordinary user who can run initdb/pg_ctl.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid

import psycopg2
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("OUTBOX_BUILD_DIR", os.path.join(ROOT, "build"))
BROKER_BIN = os.path.join(BUILD, "outbox_test_broker")


def pg_bindir():
    out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


PG_BIN = os.environ.get("OUTBOX_PG_BIN", pg_bindir())
AS_ROOT = os.geteuid() == 0


def as_postgres(cmd):
    """The command, run as the postgres user when we are root."""
    return (["runuser", "-u", "postgres", "--"] + cmd) if AS_ROOT else cmd


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tier_may_skip(cls):
    """A test class a CI tier may leave out: named module.Class in OUTBOX_E2E_SKIP (test/pgtree.sh
    leaves out on 17 what runs on 15 and 18), it is skipped, and says why."""
    import unittest
    name = f"{cls.__module__}.{cls.__name__}"
    if name in os.environ.get("OUTBOX_E2E_SKIP", "").split():
        return unittest.skip(f"{name} is left out of this tier (OUTBOX_E2E_SKIP): another tier "
                             "runs it (test/README.md)")(cls)
    return cls


def wait_until(predicate, timeout, interval=0.1, what="condition"):
    """Polls predicate() until it is truthy; raises AssertionError on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class TestBroker:
    """The project's mock-cluster broker, with its fault controls."""

    def __init__(self, topics=("order.events:4",), brokers=1):
        self.dir = tempfile.mkdtemp(prefix="outbox-broker-")
        self.control = os.path.join(self.dir, "control.sock")
        bootstrap_file = os.path.join(self.dir, "bootstrap")
        args = [BROKER_BIN, "--brokers", str(brokers), "--bootstrap-file", bootstrap_file,
                "--control", self.control]
        for t in topics:
            args += ["--topic", t]
        with open(os.path.join(self.dir, "broker.log"), "w") as log:
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
        wait_until(lambda: os.path.exists(bootstrap_file) and os.path.exists(self.control),
                   10, what="test broker start")
        with open(bootstrap_file) as f:
            self.bootstrap = f.read().strip()

    def ctl(self, *command):
        out = subprocess.run([BROKER_BIN, "ctl", self.control] + [str(c) for c in command],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"broker ctl {command}: {out.stdout}{out.stderr}")
        return out.stdout.strip()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class PgCluster:
    """A throwaway cluster with shared_preload_libraries = 'outbox'."""

    def __init__(self, settings=None, name="outbox-e2e"):
        self.dir = tempfile.mkdtemp(prefix=name + "-")
        os.chmod(self.dir, 0o755)
        if AS_ROOT:
            shutil.chown(self.dir, "postgres", "postgres")
        self.data = os.path.join(self.dir, "data")
        self.logfile = os.path.join(self.dir, "postgres.log")
        self.port = free_port()
        subprocess.run(as_postgres([os.path.join(PG_BIN, "initdb"), "-D", self.data, "-A", "trust",
                                    "-U", "postgres", "--no-sync"]),
                       check=True, stdout=subprocess.DEVNULL)
        conf = {
            "port": self.port,
            "listen_addresses": "''",
            "unix_socket_directories": f"'{self.dir}'",
            "shared_preload_libraries": "'outbox'",
            "fsync": "off",
            "log_line_prefix": "'%m [%p] %b '",
            "max_connections": 50,
        }
        conf.update(settings or {})
        self.append_conf(conf)

    def append_conf(self, settings):
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            for k, v in settings.items():
                f.write(f"{k} = {v}\n")

    def pg_ctl(self, *args, check=True):
        # OUTBOX_PG_ENV: NAME=VALUE pairs for the server alone (test/sanitize.sh preloads the
        # sanitizer's runtime with it).
        env = os.environ.get("OUTBOX_PG_ENV", "").split()
        return subprocess.run(as_postgres((["env"] + env if env else [])
                                          + [os.path.join(PG_BIN, "pg_ctl"), "-D", self.data,
                                             "-l", self.logfile] + list(args)),
                              check=check, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def start(self):
        self.pg_ctl("-w", "-t", "60", "start")

    def stop(self, mode="fast"):
        self.pg_ctl("-w", "-t", "120", "-m", mode, "stop", check=False)

    def restart(self):
        self.stop()
        self.start()

    def reload(self):
        self.pg_ctl("reload")

    def connect(self, dbname="postgres"):
        conn = psycopg2.connect(host=self.dir, port=self.port, user="postgres", dbname=dbname)
        conn.autocommit = True
        return conn

    def sql(self, query, params=None, dbname="postgres"):
        """Runs one statement in its own connection; returns all rows (or [])."""
        conn = self.connect(dbname)
        try:
            with conn.cursor() as cur:
                cur.execute(query, params)
                return cur.fetchall() if cur.description else []
        finally:
            conn.close()

    def scalar(self, query, params=None, dbname="postgres"):
        return self.sql(query, params, dbname)[0][0]

    def pgbench(self, script, clients, transactions, dbname="postgres", extra=()):
        """Runs a pgbench script file; returns the process (call .wait())."""
        path = os.path.join(self.dir, f"bench-{time.monotonic_ns()}.sql")
        with open(path, "w") as f:
            f.write(script)
        os.chmod(path, 0o644)
        cmd = [os.path.join(PG_BIN, "pgbench"), "-n", "-h", self.dir, "-p", str(self.port),
               "-U", "postgres", "-c", str(clients), "-j", str(min(clients, 4)),
               "-t", str(transactions), "-f", path] + list(extra) + [dbname]
        return subprocess.Popen(as_postgres(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    def relay_pids(self, dbname=None):
        q = "SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg outbox relay'"
        if dbname:
            return [r[0] for r in self.sql(q + " AND datname = %s", (dbname,))]
        return [r[0] for r in self.sql(q)]

    def stats(self, dbname="postgres"):
        """outbox.stats of a database, as a dict."""
        conn = self.connect(dbname)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT * FROM outbox.stats")
                names = [d[0] for d in cur.description]
                return dict(zip(names, cur.fetchone()))
        finally:
            conn.close()

    def log(self):
        try:
            with open(self.logfile, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def destroy(self):
        self.stop("immediate")
        if os.environ.get("OUTBOX_KEEP_TEST_DIRS"):
            print(f"kept {self.dir}")
            return
        shutil.rmtree(self.dir, ignore_errors=True)


class Collector:
    """A real consumer reading topics from the beginning in a thread."""

    def __init__(self, bootstrap, topic="order.events", partitions=4, label=0):
        self.label = label  # orders records of several clusters: lower label first
        self.records = []
        self.raw = []  # the consumer's messages themselves: bytes as Kafka has them
        self.errors = []
        self.lock = threading.Lock()
        self.stop_flag = threading.Event()
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap,
            "group.id": "outbox-e2e-verifier",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "fetch.wait.max.ms": 10,
            # Outage tests take the broker down on purpose: keep the
            # consumer's connection errors out of the test output.
            "log_level": 2,
        })
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING)
                              for p in range(partitions)])
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop_flag.is_set():
            msgs = self.consumer.consume(num_messages=1000, timeout=0.1)
            batch = []
            raw = []
            for m in msgs:
                if m.error():
                    if m.error().code() != KafkaError._PARTITION_EOF:
                        self.errors.append(str(m.error()))
                    continue
                raw.append(m)
                batch.append({
                    "cluster": self.label,
                    "topic": m.topic(),
                    "partition": m.partition(),
                    "offset": m.offset(),
                    "key": m.key().decode(errors="replace") if m.key() is not None else None,
                    "value": m.value().decode(errors="replace") if m.value() is not None else None,
                    "headers": {k: (v.decode(errors="replace") if v is not None else None)
                                for k, v in (m.headers() or [])},
                    "received": time.time(),
                })
            if batch:
                with self.lock:
                    self.records.extend(batch)
                    self.raw.extend(raw)

    def snapshot(self):
        with self.lock:
            return list(self.records)

    def consumer_raw(self):
        with self.lock:
            return list(self.raw)

    def event_ids(self):
        return {r["headers"].get("event_id") for r in self.snapshot()}

    def close(self):
        self.stop_flag.set()
        self.thread.join(10)
        self.consumer.close()


ORDERS_SCHEMA = """
CREATE EXTENSION IF NOT EXISTS outbox;
CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, customer int NOT NULL,
                                   seq int NOT NULL, amount numeric NOT NULL,
                                   status text NOT NULL DEFAULT 'pending');
"""

# An order service's CreateOrder in one statement (one round trip, one transaction):
# the order row and its event commit together.
CREATE_ORDER_SQL = """
WITH o AS (INSERT INTO orders (customer, seq, amount) VALUES (%(c)s, %(n)s, %(amount)s)
           RETURNING id)
SELECT outbox.write(%(topic)s, %(key)s,
                    jsonb_build_object('order_id', o.id, 'client', %(c)s, 'n', %(n)s,
                                       'note', %(note)s),
                    %(headers)s)
  FROM o
"""


class Writers:
    """Concurrent service clients running CreateOrder, some rolled back.

    Each client owns its keys (an aggregate's events are serialised by its
    service), so id order is the order its events happened in.  A client
    that loses its connection (server crash, restart) reconnects and goes
    on; the outcome of the transaction in flight is whatever the database
    says, which is what the checks read.
    """

    def __init__(self, cluster, clients=8, per_client=2500, rollback_every=10, keys=25,
                 dbname="postgres", topic="order.events", special=None):
        self.cluster = cluster
        self.clients = clients
        self.per_client = per_client
        self.rollback_every = rollback_every
        self.keys = keys
        self.dbname = dbname
        self.topic = topic
        self.special = special or {}  # (client, n) -> note text (e.g. a huge payload)
        self.done = 0
        self.errors = 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(c,), daemon=True)
                        for c in range(clients)]

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def join(self, timeout=600):
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0, deadline - time.monotonic()))
        if any(t.is_alive() for t in self.threads):
            raise AssertionError("writers did not finish")

    def progress(self):
        with self.lock:
            return self.done

    def _connect(self):
        deadline = time.monotonic() + 180
        while True:
            try:
                conn = self.cluster.connect(self.dbname)
                conn.autocommit = False
                return conn
            except psycopg2.Error:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _run(self, c):
        conn = self._connect()
        for n in range(1, self.per_client + 1):
            rollback = self.rollback_every and n % self.rollback_every == 0
            params = {"c": c, "n": n, "amount": n % 1000, "topic": self.topic,
                      "key": f"rolled-back-{c}" if rollback else f"c{c}-{n % self.keys}",
                      "note": self.special.get((c, n), "rolled_back" if rollback else "ok"),
                      "headers": '{"event_type": "OrderCreated"}'}
            try:
                with conn.cursor() as cur:
                    cur.execute(CREATE_ORDER_SQL, params)
                if rollback:
                    conn.rollback()
                else:
                    conn.commit()
                    with self.lock:
                        self.done += 1
            except psycopg2.Error:
                with self.lock:
                    self.errors += 1
                try:
                    conn.close()
                except psycopg2.Error:
                    pass
                conn = self._connect()
        conn.close()


INBOX_TOPIC = "payments.events"
# The mock's group coordinator admits a new member only once the previous
# member's session has expired: keep sessions short.
INBOX_KAFKA = "session.timeout.ms=6000;heartbeat.interval.ms=500"


def inbox_cluster(broker, topics, name, **settings):
    """A cluster (not started) whose inbox consumer reads `topics` from
    `broker`; `settings` adds to or overrides the outbox.* settings."""
    conf = {"outbox.brokers": f"'{broker.bootstrap}'", "outbox.inbox": "on",
            "outbox.inbox_topics": "'" + ",".join(topics) + "'",
            "outbox.kafka_config": f"'{INBOX_KAFKA}'"}
    conf.update(settings)
    return PgCluster(conf, name=name)


class ClusterPerTest:
    """For a unittest.TestCase whose tests each need a cluster of their own
    with settings of their own: start() makes a test broker and a cluster with
    the inbox on for INBOX_TOPIC, both removed after the test."""

    cluster_name = "outbox-e2e"

    def start(self, settings=None, topics=(f"{INBOX_TOPIC}:2", "order.events:2")):
        from confluent_kafka import Producer
        self.broker = TestBroker(topics=topics)
        conf = {"outbox.brokers": f"'{self.broker.bootstrap}'",
                "outbox.inbox": "on", "outbox.inbox_topics": f"'{INBOX_TOPIC}'",
                "outbox.kafka_config": f"'{INBOX_KAFKA}'", "outbox.max_attempts": 2,
                "outbox.batch_timeout": "'2s'"}
        conf.update(settings or {})
        self.pg = PgCluster(conf, name=self.cluster_name)
        self.pg.start()
        self.addCleanup(self.broker.stop)
        self.addCleanup(self.pg.destroy)
        self.producer = Producer({"bootstrap.servers": self.broker.bootstrap, "log_level": 2})

    def produce(self, topic, payloads, key="k"):
        ids = []
        for p in payloads:
            eid = str(uuid.uuid4())
            ids.append(eid)
            self.producer.produce(topic, key=key, value=json.dumps(p).encode(),
                                  headers=[("event_id", eid)])
        self.producer.flush(30)
        return ids

    def scalar(self, q, *args, db="postgres"):
        """The query's one value, or None when it fails (a worker's table
        may not be there yet)."""
        try:
            return self.pg.scalar(q, args or None, dbname=db)
        except Exception:
            return None


def committed_messages(cluster, dbname="postgres"):
    """message_id text -> (id, key, payload, headers) for every committed row."""
    rows = cluster.sql("SELECT message_id::text, id, key, payload::text, headers::text "
                       "FROM outbox.outbox_message", dbname=dbname)
    return {r[0]: (r[1], r[2], json.loads(r[3]), json.loads(r[4])) for r in rows}


def event_id_of(record):
    """The event_id header of a record from the Collector (text) or the Java dump (bytes)."""
    h = record["headers"]
    v = h.get("event_id") if isinstance(h, dict) else dict(h).get("event_id")
    return v.decode(errors="replace") if isinstance(v, (bytes, bytearray)) else v


def check_places(cluster, records, dbname="postgres", topic=None):
    """A published row keeps where Kafka wrote its record (schema 1.6): counts the published
    rows (of `topic`, or all), those without a partition and offset, and those whose place
    holds no record or another row's record, among `records` (all of the topic's records as
    read back; each a dict with topic, partition, offset and headers).  Returns a dict, with
    up to 5 examples of each fault."""
    at = {}
    for r in records:
        at[(r.get("topic", topic), r["partition"], r["offset"])] = event_id_of(r)
    rows = cluster.sql("SELECT message_id::text, topic, published_partition, published_offset "
                       "FROM outbox.outbox_message WHERE published_at IS NOT NULL"
                       + (" AND topic = %s" if topic else ""), (topic,) if topic else None,
                       dbname=dbname)
    without = [r[0] for r in rows if r[2] is None or r[3] is None]
    misplaced = [(r[0], r[2], r[3], at.get((r[1], r[2], r[3]))) for r in rows
                 if r[2] is not None and r[3] is not None and at.get((r[1], r[2], r[3])) != r[0]]
    return {"published": len(rows), "without_place": len(without), "misplaced": len(misplaced),
            "examples": without[:5] + misplaced[:5]}


def verify(records, committed):
    """What a user depends on, counted.

    Records are taken in the order Kafka holds them: by partition and offset
    (a key always lands on one partition), and, when they come from several
    clusters (a broker switch), cluster by cluster in switch order.

    lost: committed messages never received.  duplicates: records received
    more than once.  order_violations: a key's message received for the
    first time after a later message (higher id) of the same key.  unknown:
    records that match no committed message (rolled back, or wrong
    event_id).  mismatched: key, value or headers differ from the row.
    """
    seen = {}
    duplicates = unknown = mismatched = order_violations = 0
    highest_by_key = {}
    for r in sorted(records, key=lambda r: (r.get("cluster", 0), r["partition"], r["offset"])):
        eid = r["headers"].get("event_id")
        row = committed.get(eid)
        if row is None:
            unknown += 1
            continue
        row_id, key, payload, headers = row
        if eid in seen:
            duplicates += 1
            continue
        seen[eid] = r
        expected_headers = dict(headers)
        expected_headers.setdefault("event_id", eid)
        if r["key"] != key or json.loads(r["value"]) != payload or r["headers"] != expected_headers:
            mismatched += 1
        if highest_by_key.get(key, 0) > row_id:
            order_violations += 1
        highest_by_key[key] = max(highest_by_key.get(key, 0), row_id)
    lost = len(set(committed) - set(seen))
    return {"written": len(committed), "delivered": len(seen), "lost": lost,
            "duplicates": duplicates, "order_violations": order_violations,
            "unknown": unknown, "mismatched": mismatched}
