"""Kafka gets UTF-8 whatever the database's encoding, and the inbox stores
records in it: LATIN1 and WIN1251 databases next to a UTF-8 one."""

import json
import os
import sys
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Collector, PgCluster, TestBroker, wait_until  # noqa: E402
from confluent_kafka import Producer  # noqa: E402

DATABASES = {"utf8db": "UTF8", "latin1db": "LATIN1", "win1251db": "WIN1251"}
# What each database's encoding can hold, written from a UTF-8 client.
TEXT = {"utf8db": ("clé", "José", "Zoë"),
        "latin1db": ("clé", "José", "Zoë"),
        "win1251db": ("ключ", "Иван", "Жанна")}
INBOX = "payments.events"

HANDLER = """
CREATE TABLE handled (event_id uuid PRIMARY KEY, who text);
CREATE FUNCTION handle(msg outbox.inbox_message) RETURNS void LANGUAGE sql AS $$
    INSERT INTO handled VALUES (msg.event_id, msg.payload->>'who') $$;
SELECT outbox.inbox_subscribe('payments.events', 'handle(outbox.inbox_message)');
"""


class Encodings(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.broker = TestBroker(topics=("order.events:4", f"{INBOX}:2"))
        cls.pg = PgCluster({"outbox.brokers": f"'{cls.broker.bootstrap}'",
                            "outbox.database": "'" + ", ".join(DATABASES) + "'",
                            "outbox.inbox": "on", "outbox.inbox_topics": f"'{INBOX}'",
                            "max_worker_processes": 20,
                            "outbox.kafka_config": "'session.timeout.ms=6000;heartbeat.interval.ms=500'"},
                           name="outbox-encoding")
        cls.pg.start()
        for db, enc in DATABASES.items():
            cls.pg.sql(f"CREATE DATABASE {db} ENCODING '{enc}' LC_COLLATE 'C' LC_CTYPE 'C' "
                       "TEMPLATE template0")
            cls.pg.sql("CREATE EXTENSION outbox", dbname=db)
            cls.pg.sql(HANDLER, dbname=db)
        cls.collector = Collector(cls.broker.bootstrap, partitions=4)

    @classmethod
    def tearDownClass(cls):
        cls.collector.close()
        cls.pg.destroy()
        cls.broker.stop()

    def utf8(self, db):
        conn = self.pg.connect(db)
        conn.set_client_encoding("UTF8")
        return conn

    def query(self, db, sql, params=None):
        conn = self.utf8(db)
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params)
                return cur.fetchall() if cur.description else []
        finally:
            conn.close()

    def record(self, event_id):
        # (A list: a Message of an empty value is falsy.)
        def find():
            return [r for r in self.collector.consumer_raw()
                    if dict(r.headers() or []).get("event_id", b"").decode() == event_id]
        return wait_until(find, 30, what=f"record {event_id} in Kafka")[0]

    def test_kafka_gets_utf8_keys_values_and_headers(self):
        written = {}
        for db in DATABASES:
            key, name, who = TEXT[db]
            mid = self.query(db, "SELECT outbox.write('order.events', %s, %s, %s)::text",
                             (key, json.dumps({"name": name}, ensure_ascii=False),
                              json.dumps({"who": who}, ensure_ascii=False)))[0][0]
            written[db] = mid
        partitions = {}
        for db, mid in written.items():
            key, name, who = TEXT[db]
            r = self.record(mid)
            # The bytes a Kafka client reads are the UTF-8 of what was written.
            self.assertEqual(r.key(), key.encode("utf-8"), db)
            value = r.value().decode("utf-8")  # raises if it is not UTF-8
            self.assertEqual(json.loads(value), {"name": name}, db)
            self.assertIn(name.encode("utf-8"), r.value())
            self.assertEqual(dict(r.headers())["who"], who.encode("utf-8"), db)
            partitions[db] = r.partition()
        # The same key from a UTF-8 database lands on the same partition.
        self.assertEqual(partitions["latin1db"], partitions["utf8db"])
        print(f"\n  encodings: keys, values and headers arrive as UTF-8 from "
              f"{', '.join(DATABASES)}; 'clé' on partition {partitions['utf8db']} from both")

    def test_a_character_utf8_lacks_is_parked_and_the_rest_go_on(self):
        # 0x98 is a byte of WIN1251 that maps to no Unicode character: a key,
        # a payload or a header value holding it cannot be sent as UTF-8.
        db = "win1251db"
        self.assertEqual(self.query(db, "SELECT length(chr(152))")[0][0], 1)
        with self.assertRaises(Exception):
            self.query(db, "SELECT convert_to(chr(152), 'UTF8')")
        poison = []
        for key, payload, headers in (("chr(152)", "'{}'", "'{}'"),
                                      ("'k'", "jsonb_build_object('x', chr(152))", "'{}'"),
                                      ("'k'", "'{}'", "jsonb_build_object('h', chr(152))")):
            poison.append(self.query(db, f"SELECT outbox.write('order.events', {key}, {payload}, "
                                         f"{headers})::text")[0][0])
        after = self.query(db, "SELECT outbox.write('order.events', 'after', '{}')::text")[0][0]
        self.record(after)  # published: nothing held it up
        parked = wait_until(lambda: (r := self.query(
            db, "SELECT message_id::text, last_error FROM outbox.parked_messages "
                "WHERE message_id = ANY(%s::uuid[])", (poison,))) and len(r) == 3 and r, 60,
            what="the three rows parked")
        for _, error in parked:
            self.assertIn("no equivalent in UTF-8", error)
        print("\n  encodings: key, payload and header with WIN1251's 0x98 parked, the next published")

    def test_inbox_stores_in_the_database_encoding_and_keeps_what_it_cannot(self):
        producer = Producer({"bootstrap.servers": self.broker.bootstrap, "log_level": 2})
        accents, foreign = str(uuid.uuid4()), str(uuid.uuid4())
        # A record every database can hold in part, and one with characters
        # neither LATIN1 nor WIN1251 has (漢, €).
        producer.produce(INBOX, key="clé".encode(), value=json.dumps({"who": "José"}, ensure_ascii=False).encode(),
                         headers=[("event_id", accents), ("h", "Zoë".encode())])
        producer.produce(INBOX, key="漢€".encode(), value=json.dumps({"who": "漢字 €"}, ensure_ascii=False).encode(),
                         headers=[("event_id", foreign), ("h", "漢".encode())])
        producer.flush(30)
        for db in DATABASES:
            wait_until(lambda: self.query(db, "SELECT count(*) FROM handled")[0][0] == 2, 60,
                       what=f"both records handled in {db}")
            rows = {r[0]: r[1:] for r in self.query(
                db, "SELECT event_id::text, key, key_bytes, payload, value, headers FROM outbox.inbox_message")}
            key, key_bytes, payload, value, headers = rows[foreign]
            # The exact bytes are always there.
            self.assertEqual(bytes(key_bytes), "漢€".encode(), db)
            self.assertEqual(bytes(value), json.dumps({"who": "漢字 €"}, ensure_ascii=False).encode(), db)
            if db == "utf8db":
                self.assertEqual(key, "漢€")
                self.assertEqual(payload, {"who": "漢字 €"})
                self.assertEqual(headers, {"event_id": foreign, "h": "漢"})
            else:
                # What the encoding lacks: the key's and headers' characters
                # as \xNN escapes of their UTF-8, the value as raw bytes.
                self.assertTrue(key.startswith("\\xe6\\xbc\\xa2"), (db, key))
                self.assertEqual(set(payload), {"raw_base64"}, db)
                self.assertEqual(headers["h"], "\\xe6\\xbc\\xa2", db)
            key, key_bytes, payload, value, headers = rows[accents]
            if db == "win1251db":
                self.assertEqual(set(payload), {"raw_base64"})  # é is not in WIN1251
            else:
                self.assertEqual(key, "clé", db)
                self.assertEqual(payload, {"who": "José"}, db)
                self.assertEqual(headers["h"], "Zoë", db)
            self.assertEqual(self.query(db, "SELECT count(*) FROM outbox.inbox_message "
                                            "WHERE NOT processed")[0][0], 0, db)

    def test_processed_ids_compare_as_the_same_text_whatever_the_client_encoding(self):
        self.assertTrue(self.query("latin1db", "SELECT outbox.mark_processed('évt-1')")[0][0])
        conn = self.pg.connect("latin1db")
        conn.set_client_encoding("LATIN1")
        with conn.cursor() as cur:
            cur.execute("SELECT outbox.mark_processed('évt-1')")
            self.assertFalse(cur.fetchone()[0], "the same id from a LATIN1 client is a duplicate")
        conn.close()
        # An id the database's encoding cannot hold is refused with a clear error.
        with self.assertRaisesRegex(Exception, "has no equivalent in encoding"):
            self.query("latin1db", "SELECT outbox.mark_processed('漢')")


if __name__ == "__main__":
    unittest.main(verbosity=2)
