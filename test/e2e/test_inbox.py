"""The inbox end to end: the consumer worker stores Kafka records, the
handler worker runs a SQL handler exactly once per event, through crashes."""

import json
import os
import signal
import sys
import threading
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import INBOX_TOPIC, ClusterPerTest, PgCluster, TestBroker, wait_until  # noqa: E402
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

TOPIC = "payments.events"
PARTITIONS = 4
GROUP = "outbox-postgres"

SCHEMA = """
CREATE EXTENSION outbox;
CREATE TABLE payments (event_id uuid PRIMARY KEY, account text NOT NULL, amount numeric NOT NULL);
CREATE TABLE handled (n bigserial PRIMARY KEY, account text NOT NULL, seq int NOT NULL);
CREATE FUNCTION handle_payment(msg outbox.inbox_message) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF (msg.payload->>'fail')::boolean THEN
        RAISE EXCEPTION 'payment % refused by the handler', msg.payload->>'seq';
    END IF;
    INSERT INTO payments VALUES (msg.event_id, msg.key, (msg.payload->>'amount')::numeric);
    INSERT INTO handled (account, seq) VALUES (msg.key, (msg.payload->>'seq')::int);
END $$;
SELECT outbox.inbox_subscribe('payments.events', 'handle_payment(outbox.inbox_message)');
"""


class Inbox(unittest.TestCase):

    def setUp(self):
        self.broker = TestBroker(topics=(f"{TOPIC}:{PARTITIONS}",))
        self.pg = PgCluster({"outbox.brokers": f"'{self.broker.bootstrap}'",
                             "outbox.inbox": "on",
                             "outbox.inbox_topics": f"'{TOPIC}'",
                             "outbox.max_attempts": 3,
                             # The mock coordinator admits a restarted consumer
                             # only when the dead one's session expires.
                             "outbox.kafka_config": "'session.timeout.ms=6000;heartbeat.interval.ms=500'",
                             "outbox.batch_size": 500}, name="outbox-inbox")
        self.pg.start()
        self.pg.sql(SCHEMA)
        self.producer = Producer({"bootstrap.servers": self.broker.bootstrap, "linger.ms": 5,
                                  "log_level": 2})
        self.placed = {}

    def tearDown(self):
        self.pg.destroy()
        self.broker.stop()

    def produce(self, records):
        """records: (event_id or None, key, value bytes) in order.  Where
        each one lands is kept in self.placed: (partition, offset) -> id."""
        def placed(err, msg, eid):
            if not err:
                self.placed[(msg.partition(), msg.offset())] = eid

        for eid, key, value in records:
            headers = [("event_id", eid)] if eid else []
            self.producer.produce(TOPIC, key=key, value=value, headers=headers,
                                  on_delivery=lambda err, msg, eid=eid: placed(err, msg, eid))
            self.producer.poll(0)
        self.producer.flush(30)

    def scalar(self, q, *args):
        try:
            return self.pg.scalar(q, args or None)
        except Exception:
            return None  # the server is restarting

    def worker_pid(self, kind):
        try:
            rows = self.pg.sql("SELECT pid FROM pg_stat_activity WHERE backend_type = %s",
                               (f"pg outbox inbox {kind}",))
        except Exception:
            return None  # the server is restarting
        return rows[0][0] if rows else None

    def test_every_event_stored_and_handled_exactly_once_through_crashes(self):
        n = 10000
        events = [(str(uuid.uuid4()), i) for i in range(n)]
        stream = []
        for eid, i in events:
            stream.append((eid, f"account-{i % 100}",
                           json.dumps({"amount": i, "seq": i}).encode()))
            if i % 10 == 0:  # 10% sent twice, a little later
                stream.append((eid, f"account-{i % 100}",
                               json.dumps({"amount": i, "seq": i}).encode()))

        # Offsets must never run ahead of the table: every offset below the
        # committed one must hold an event that is stored.  (A redelivered
        # event keeps the row of its first offset.)  Sampled all along.
        samples, violations = [], []
        stop = threading.Event()

        def watch_offsets():
            c = Consumer({"bootstrap.servers": self.broker.bootstrap, "group.id": GROUP,
                          "enable.auto.commit": False, "log_level": 2})
            parts = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
            verified = {p: 0 for p in range(PARTITIONS)}
            while not stop.is_set():
                try:
                    committed = c.committed(parts, timeout=5)
                    for tp in committed:
                        if tp.offset < 0:
                            continue
                        samples.append(tp.offset)
                        ids = []
                        for o in range(verified[tp.partition], tp.offset):
                            eid = self.placed.get((tp.partition, o))
                            if eid is None:
                                break  # not reported to the producer yet: later
                            ids.append(eid)
                        if not ids:
                            continue
                        stored = self.pg.scalar("SELECT count(*) FROM outbox.inbox_message "
                                                "WHERE event_id::text = ANY(%s)",
                                                (list(set(ids)),))
                        if stored < len(set(ids)):
                            violations.append((tp.partition, tp.offset, len(set(ids)) - stored))
                        verified[tp.partition] += len(ids)
                except Exception:
                    pass  # the server is restarting
                time.sleep(0.2)
            c.close()

        watcher = threading.Thread(target=watch_offsets, daemon=True)
        watcher.start()
        third = len(stream) // 3
        try:
            self.produce(stream[:third])
            wait_until(lambda: (self.scalar("SELECT count(*) FROM outbox.inbox_message") or 0)
                       >= 1000, 60, what="the consumer storing records")
            # kill -9 the consumer: the postmaster restarts the server.
            pid = wait_until(lambda: self.worker_pid("consumer"), 30, what="the consumer's pid")
            os.kill(pid, signal.SIGKILL)
            self.produce(stream[third:2 * third])
            wait_until(lambda: self.worker_pid("consumer") is not None, 120,
                       what="the server back after the crash")
            wait_until(lambda: (self.scalar("SELECT count(*) FROM payments") or 0) >= 3000, 120,
                       what="handling to resume")
            self.pg.stop("fast")
            self.pg.start()
            self.produce(stream[2 * third:])
            wait_until(lambda: self.scalar("SELECT count(*) FROM payments") == n, 240,
                       interval=0.5, what="every event handled")
            time.sleep(2)  # a late duplicate would show here
        finally:
            stop.set()
            watcher.join(10)

        self.assertEqual(self.scalar("SELECT count(*) FROM outbox.inbox_message"), n,
                         "every distinct event stored once")
        self.assertEqual(self.scalar("SELECT count(DISTINCT event_id) FROM outbox.inbox_message"), n)
        self.assertEqual(self.scalar("SELECT count(*) FROM outbox.inbox_message WHERE NOT processed"), 0)
        self.assertEqual(self.scalar("SELECT count(*) FROM payments"), n)
        self.assertEqual(self.scalar("SELECT count(*) FROM handled"), n, "each handler ran once")
        ids = {r[0] for r in self.pg.sql("SELECT event_id::text FROM payments")}
        self.assertEqual(ids, {e for e, _ in events})
        # A key's events were handled in their order.
        out_of_order = self.scalar("""
            SELECT count(*) FROM (SELECT seq < lag(seq) OVER (PARTITION BY account ORDER BY n) AS back
                                    FROM handled) s WHERE back""")
        self.assertEqual(out_of_order, 0)
        self.assertGreater(len(samples), 10, "the offset watcher saw the run")
        self.assertEqual(violations, [], "committed offsets ran ahead of the table")
        print(f"\n  inbox: {n} events, {len(stream)} records, offsets sampled {len(samples)} times, "
              f"0 ahead of the table")

    def test_failing_handler_parks_its_messages_and_the_rest_go_on(self):
        stream = []
        for i in range(200):
            fail = i in (10, 50, 51, 120)
            stream.append((str(uuid.uuid4()), f"account-{i % 7}",
                           json.dumps({"amount": i, "seq": i, "fail": fail}).encode()))
        self.produce(stream)
        wait_until(lambda: self.scalar("SELECT count(*) FROM outbox.inbox_parked") == 4, 120,
                   interval=0.5, what="the failing messages parked")
        wait_until(lambda: self.scalar("SELECT count(*) FROM payments") == 196, 60,
                   what="every other message handled")
        rows = self.pg.sql("SELECT payload->>'seq', attempts, last_error FROM outbox.inbox_parked "
                           "ORDER BY (payload->>'seq')::int")
        self.assertEqual([int(r[0]) for r in rows], [10, 50, 51, 120])
        for seq, attempts, error in rows:
            self.assertEqual(attempts, 3)
            self.assertIn(f"payment {seq} refused by the handler", error)
        # Later messages of a parked message's key were handled, in order.
        self.assertEqual(self.scalar("SELECT count(*) FROM handled WHERE account = 'account-3' "
                                     "AND seq > 10"), len([i for i in range(11, 200) if i % 7 == 3
                                                           and i not in (50, 51, 120)]))
        s = self.pg.stats()
        self.assertEqual(s["inbox_parked"], 4)
        self.assertEqual(s["inbox_pending"], 0)
        log = self.pg.log()
        self.assertIn("parked inbox message", log)

        # Retried after a fix, a parked message is handled.
        self.pg.sql("""CREATE OR REPLACE FUNCTION handle_payment(msg outbox.inbox_message)
                       RETURNS void LANGUAGE sql AS $$
                       INSERT INTO payments VALUES (msg.event_id, msg.key,
                                                    (msg.payload->>'amount')::numeric) $$""")
        eid = self.scalar("SELECT event_id FROM outbox.inbox_parked WHERE payload->>'seq' = '10'")
        self.assertTrue(self.scalar("SELECT outbox.inbox_retry(%s)", eid))
        wait_until(lambda: self.scalar("SELECT count(*) FROM payments") == 197, 30,
                   what="the retried message handled")

    def test_records_without_event_id_or_json_are_kept(self):
        self.pg.sql("SELECT outbox.inbox_unsubscribe('payments.events')")
        self.produce([(None, "k", b'{"a": 1}'),
                      ("not-a-uuid", "k", b'{"a": 2}'),
                      (str(uuid.uuid4()), "k", b"\xff\x00binary"),
                      (str(uuid.uuid4()), None, b'"no key"')])
        wait_until(lambda: self.scalar("SELECT count(*) FROM outbox.inbox_message") == 4, 60,
                   what="four records stored")
        rows = self.pg.sql("SELECT event_id::text, key, payload, headers, kafka_partition, "
                           "kafka_offset FROM outbox.inbox_message")
        # The records may sit on different partitions: find each by content.
        by_payload = {json.dumps(r[2], sort_keys=True): r for r in rows}
        # Derived ids: md5 of topic/partition/offset/timestamp: a redelivery
        # matches, a topic created again (offsets from 0) does not.
        for payload in ({"a": 1}, {"a": 2}):
            eid, key, _, headers, part, off = by_payload[json.dumps(payload, sort_keys=True)]
            stored = self.scalar("SELECT (extract(epoch FROM kafka_timestamp) * 1000)::bigint "
                                 "FROM outbox.inbox_message WHERE event_id = %s", eid)
            self.assertLess(abs(stored / 1000 - time.time()), 600, "the record's time is kept")
            expected = self.scalar("SELECT md5(%s || '/' || %s || '/' || %s || '/' || %s)::uuid::text",
                                   TOPIC, part, off, stored)
            self.assertEqual(eid, expected)
        self.assertEqual(by_payload[json.dumps({"a": 2})][3], {"event_id": "not-a-uuid"})
        self.assertIn(json.dumps({"raw_base64": "/wBiaW5hcnk="}), by_payload)
        no_key = by_payload[json.dumps("no key")]
        self.assertIsNone(no_key[1])


class InboxConsumerDurability(ClusterPerTest, unittest.TestCase):
    """What the inbox consumer stores survives a crash, a record Postgres
    cannot fully hold stops nothing, and each database consumes as its own
    group; each test with a cluster of its own settings."""
    cluster_name = "outbox-inbox-consumer"

    def test_stored_records_survive_a_crash_whatever_synchronous_commit_says(self):
        # The database owner turns synchronous_commit off; the WAL writer
        # flushes only every 10 s.  Records whose offsets Kafka has must
        # still be there after an immediate shutdown.
        self.start({"outbox.database": "'app'", "wal_writer_delay": "'10s'"})
        self.pg.sql("CREATE DATABASE app")
        self.pg.sql("CREATE EXTENSION outbox", dbname="app")
        self.pg.sql("ALTER DATABASE app SET synchronous_commit = off")
        self.pg.restart()
        ids = self.produce(INBOX_TOPIC, [{"n": n} for n in range(20)])
        c = Consumer({"bootstrap.servers": self.broker.bootstrap, "group.id": "outbox-app",
                      "log_level": 2})
        parts = [TopicPartition(INBOX_TOPIC, p) for p in range(2)]

        def committed():
            return sum(max(tp.offset, 0) for tp in c.committed(parts, timeout=5))
        wait_until(lambda: committed() == 20, 60, interval=0.05, what="the offsets committed")
        c.close()
        self.pg.stop("immediate")
        self.pg.start()
        stored = {r[0] for r in self.pg.sql("SELECT event_id::text FROM outbox.inbox_message",
                                            dbname="app")}
        self.assertEqual(stored, set(ids), "records whose offsets were committed were lost")

    def test_a_record_timestamp_postgres_cannot_hold_stops_nothing(self):
        # A producer sets the record's CreateTime; INT64_MAX ms is past what
        # a timestamptz holds.  The record is stored (without a time) and the
        # records after it too, by the same consumer process.
        self.start()
        self.pg.sql("CREATE EXTENSION outbox")
        pid = wait_until(lambda: self.scalar("SELECT pid FROM pg_stat_activity "
                                             "WHERE backend_type = 'pg outbox inbox consumer'"),
                         30, what="the inbox consumer")
        ids = []
        for ts in (2 ** 63 - 1, int(time.time() * 1000)):
            eid = str(uuid.uuid4())
            ids.append(eid)
            self.producer.produce(INBOX_TOPIC, key="k", value=b"{}", headers=[("event_id", eid)],
                                  timestamp=ts)
        self.producer.flush(30)
        wait_until(lambda: self.scalar("SELECT count(*) FROM outbox.inbox_message") == 2, 60,
                   what="both records stored")
        rows = dict(self.pg.sql("SELECT event_id::text, kafka_timestamp IS NOT NULL "
                                "FROM outbox.inbox_message"))
        self.assertEqual(rows, {ids[0]: False, ids[1]: True})
        self.assertEqual(self.scalar("SELECT pid FROM pg_stat_activity "
                                     "WHERE backend_type = 'pg outbox inbox consumer'"), pid,
                         "the consumer restarted")

    def test_each_database_has_its_own_consumer_group(self):
        self.start({"outbox.database": "'app1, app2'", "outbox.inbox_group": "'shared'",
                    "max_worker_processes": 16})
        for db in ("app1", "app2"):
            self.pg.sql(f"CREATE DATABASE {db}")
            self.pg.sql("CREATE EXTENSION outbox", dbname=db)
        ids = []
        for k in range(10):
            ids += self.produce(INBOX_TOPIC, [{"n": k}], key=f"key-{k}")
        for db in ("app1", "app2"):
            wait_until(lambda: self.scalar("SELECT count(*) FROM outbox.inbox_message", db=db) == 10,
                       60, what=f"every record stored in {db}")


if __name__ == "__main__":
    unittest.main(verbosity=2)
