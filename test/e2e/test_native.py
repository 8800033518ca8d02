"""Kafka-native messages: bytes exactly as written, tombstones, records
without a key, explicit partitions, session-wide default headers, the
schema registry's framing; and the inbox keeping a record's bytes."""

import json
import os
import sys
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Collector, PgCluster, TestBroker, wait_until  # noqa: E402
from confluent_kafka import Producer  # noqa: E402
import psycopg2  # noqa: E402

TOPIC = "order.events"
INBOX = "payments.events"


class Native(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.broker = TestBroker(topics=(f"{TOPIC}:4", f"{INBOX}:2"))
        cls.pg = PgCluster({"outbox.brokers": f"'{cls.broker.bootstrap}'",
                            "outbox.max_attempts": 2,
                            "outbox.inbox": "on", "outbox.inbox_topics": f"'{INBOX}'",
                            "outbox.kafka_config": "'session.timeout.ms=6000;heartbeat.interval.ms=500'"},
                           name="outbox-native")
        cls.pg.start()
        cls.pg.sql("CREATE EXTENSION outbox")
        cls.collector = Collector(cls.broker.bootstrap, partitions=4)

    @classmethod
    def tearDownClass(cls):
        cls.collector.close()
        cls.pg.destroy()
        cls.broker.stop()

    def record(self, message_id):
        # (A list: a Message of an empty value, a tombstone, is falsy.)
        def find():
            return [r for r in self.collector.consumer_raw()
                    if dict(r.headers() or []).get("event_id", b"").decode() == message_id]
        return wait_until(find, 30, what=f"record {message_id} in Kafka")[0]

    def test_bytes_arrive_exactly_as_written(self):
        key = b"\x00\xffk\x80"
        value = b"\x00\x01\xfe\xff not UTF-8 \xc3\x28"
        mid = self.pg.scalar("SELECT outbox.write_bytes('order.events', %s, %s, "
                             "'{\"content-type\": \"application/octet-stream\"}')::text",
                             (psycopg2.Binary(key), psycopg2.Binary(value)))
        r = self.record(mid)
        self.assertEqual(r.key(), key)
        self.assertEqual(r.value(), value)
        self.assertEqual(dict(r.headers())["content-type"], b"application/octet-stream")
        # The row keeps them, its payload is JSON null.
        row = self.pg.sql("SELECT is_binary, key_bytes, value, payload FROM outbox.outbox_message "
                          "WHERE message_id = %s", (mid,))[0]
        self.assertEqual((row[0], bytes(row[1]), bytes(row[2]), row[3]), (True, key, value, None))

    def test_a_tombstone_follows_its_keys_json_events(self):
        ids = [self.pg.scalar("SELECT outbox.write('order.events', 'order-42', %s)::text",
                              (json.dumps({"n": n}),)) for n in range(3)]
        gone = self.pg.scalar("SELECT outbox.write_bytes('order.events', "
                              "convert_to('order-42', 'UTF8'), NULL)::text")
        records = [self.record(m) for m in ids + [gone]]
        self.assertIsNone(records[-1].value(), "a null value: a tombstone")
        self.assertEqual(records[-1].key(), b"order-42")
        self.assertEqual({r.partition() for r in records}, {records[0].partition()},
                         "the tombstone lands on its key's partition")
        self.assertEqual([r.offset() for r in records], sorted(r.offset() for r in records),
                         "and after the key's events")

    def test_records_without_a_key_and_explicit_partitions(self):
        keyless = self.pg.scalar("SELECT outbox.write_bytes('order.events', NULL, 'v'::bytea)::text")
        self.assertIsNone(self.record(keyless).key())
        p2 = self.pg.scalar("SELECT outbox.write('order.events', 'k', '{}', partition => 2)::text")
        p3 = self.pg.scalar("SELECT outbox.write_bytes('order.events', 'k', 'v', "
                            "\"partition\" => 3)::text")
        self.assertEqual(self.record(p2).partition(), 2)
        self.assertEqual(self.record(p3).partition(), 3)
        with self.assertRaisesRegex(psycopg2.Error, "partition must be NULL or at least 0, got -1"):
            self.pg.sql("SELECT outbox.write('order.events', 'k', '{}', partition => -1)")

    def test_a_partition_the_topic_lacks_is_parked_and_nothing_else_waits(self):
        bad = self.pg.scalar("SELECT outbox.write('order.events', 'lost', '{}', partition => 99)::text")
        after = self.pg.scalar("SELECT outbox.write('order.events', 'other', '{}')::text")
        self.record(after)
        wait_until(lambda: self.pg.scalar("SELECT count(*) FROM outbox.parked_messages "
                                          "WHERE message_id = %s", (bad,)) == 1, 60,
                   what="the message for partition 99 parked")
        self.assertIn("partition", self.pg.scalar("SELECT last_error FROM outbox.parked_messages "
                                                  "WHERE message_id = %s", (bad,)).lower())

    def test_default_headers_for_a_transaction(self):
        conn = self.pg.connect()
        conn.autocommit = False
        with conn.cursor() as cur:
            cur.execute("SET LOCAL outbox.default_headers = "
                        "'{\"traceparent\": \"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\", "
                        "\"h\": \"default\"}'")
            cur.execute("SELECT outbox.write('order.events', 'k', '{}', '{\"h\": \"own\"}')::text")
            traced = cur.fetchone()[0]
            cur.execute("SELECT outbox.write_bytes('order.events', 'k', 'v')::text")
            traced_bytes = cur.fetchone()[0]
        conn.commit()
        with conn.cursor() as cur:
            cur.execute("SELECT outbox.write('order.events', 'k', '{}')::text")
            plain = cur.fetchone()[0]
        conn.commit()
        h = dict(self.record(traced).headers())
        self.assertEqual(h["traceparent"], b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        self.assertEqual(h["h"], b"own", "the message's own header wins")
        self.assertIn("traceparent", dict(self.record(traced_bytes).headers()))
        self.assertNotIn("traceparent", dict(self.record(plain).headers()), "SET LOCAL ended")
        with conn.cursor() as cur:
            with self.assertRaisesRegex(psycopg2.Error, 'header "retries" is a number'):
                cur.execute("SET outbox.default_headers = '{\"retries\": 3}'")
        conn.close()

    def test_confluent_framing(self):
        framed = bytes(self.pg.scalar("SELECT outbox.confluent_frame(42, '\\x0a0b'::bytea)"))
        self.assertEqual(framed, b"\x00\x00\x00\x00\x2a\x0a\x0b")
        mid = self.pg.scalar("SELECT outbox.write_bytes('order.events', 'k', "
                             "outbox.confluent_frame(7, '\\x0a0b'::bytea))::text")
        self.assertEqual(self.record(mid).value(), b"\x00\x00\x00\x00\x07\x0a\x0b")
        with self.assertRaisesRegex(psycopg2.Error, "body must not be NULL"):
            self.pg.sql("SELECT outbox.confluent_frame(7, NULL)")

    def test_the_inbox_keeps_a_records_bytes(self):
        self.pg.sql("""
            CREATE TABLE IF NOT EXISTS seen (event_id uuid PRIMARY KEY, tombstone boolean,
                                             value bytea, key bytea);
            CREATE OR REPLACE FUNCTION keep(m outbox.inbox_message) RETURNS void LANGUAGE sql AS $$
                INSERT INTO seen VALUES (m.event_id, m.value IS NULL, m.value, m.key_bytes) $$;
            SELECT outbox.inbox_subscribe('payments.events', 'keep(outbox.inbox_message)');
        """)
        producer = Producer({"bootstrap.servers": self.broker.bootstrap, "log_level": 2})
        binary, tomb, js = (str(uuid.uuid4()) for _ in range(3))
        producer.produce(INBOX, key=b"\x00\xfekey", value=b"\x00\xff\x10",
                         headers=[("event_id", binary)])
        producer.produce(INBOX, key=b"gone", value=None, headers=[("event_id", tomb)])
        producer.produce(INBOX, key=b"k", value=b'{"a":  1}', headers=[("event_id", js)])
        producer.flush(30)
        wait_until(lambda: self.pg.scalar("SELECT count(*) FROM seen") == 3, 60,
                   what="three records handled")
        rows = {r[0]: r[1:] for r in self.pg.sql(
            "SELECT event_id::text, tombstone, value, key, (SELECT payload FROM outbox.inbox_message i "
            "WHERE i.event_id = seen.event_id) FROM seen")}
        self.assertEqual((rows[binary][0], bytes(rows[binary][1]), bytes(rows[binary][2])),
                         (False, b"\x00\xff\x10", b"\x00\xfekey"))
        self.assertEqual(set(rows[binary][3]), {"raw_base64"})
        self.assertEqual((rows[tomb][0], rows[tomb][1], rows[tomb][3]), (True, None, None))
        self.assertEqual(bytes(rows[js][1]), b'{"a":  1}', "the value's exact bytes")
        self.assertEqual(rows[js][3], {"a": 1}, "and its JSON")


if __name__ == "__main__":
    unittest.main(verbosity=2)
