"""What the inbox consumer keeps, and what one topic's producer cannot do to
another's: ids unique per (event_id, topic), headers kept as the bytes Kafka
carried, batches bounded by bytes, the consumer's insert errors kept out of
what pg_monitor reads, and odd event_id headers stored with a stated reason."""

import os
import sys
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import TestBroker, inbox_cluster, wait_until  # noqa: E402
from confluent_kafka import Producer  # noqa: E402

A = "team-a.events"
B = "team-b.events"
BIG = "big.events"
BIG_PARTITIONS = 8

SCHEMA = """
CREATE EXTENSION outbox;
CREATE TABLE handled (topic text NOT NULL, event_id uuid NOT NULL, payload jsonb);
CREATE FUNCTION record_it(msg outbox.inbox_message) RETURNS void LANGUAGE sql AS $$
    INSERT INTO handled VALUES (msg.topic, msg.event_id, msg.payload);
$$;
SELECT outbox.inbox_subscribe('team-a.events', 'record_it(outbox.inbox_message)');
SELECT outbox.inbox_subscribe('team-b.events', 'record_it(outbox.inbox_message)');
"""


class InboxIntake(unittest.TestCase):

    def setUp(self):
        self.broker = TestBroker(topics=(f"{A}:1", f"{B}:1", f"{BIG}:{BIG_PARTITIONS}"))
        self.pg = inbox_cluster(self.broker, (A, B, BIG), "outbox-intake")
        self.pg.start()
        self.pg.sql(SCHEMA)
        self.producer = Producer({"bootstrap.servers": self.broker.bootstrap, "linger.ms": 5,
                                  "message.max.bytes": 8 * 1024 * 1024, "log_level": 2})

    def tearDown(self):
        self.pg.destroy()
        self.broker.stop()

    def produce(self, topic, value, headers=(), key=b"k"):
        self.producer.produce(topic, key=key, value=value, headers=list(headers))
        self.producer.flush(30)

    def scalar(self, q, *args):
        return self.pg.scalar(q, args or None)

    def test_the_same_event_id_on_two_topics_is_two_records_each_handled_once(self):
        # Team A's producer sends an id first; team B's record with the same
        # id must still be stored and handled, and a repeat on A is still a
        # duplicate.
        eid = str(uuid.uuid4())
        self.produce(A, b'{"n": 1}', [("event_id", eid)])
        wait_until(lambda: self.scalar("SELECT count(*) FROM handled") == 1, 60,
                   what="A's record handled")
        self.produce(B, b'{"n": 2}', [("event_id", eid)])
        self.produce(A, b'{"n": 3}', [("event_id", eid)])  # a redelivery on A
        marker = str(uuid.uuid4())
        self.produce(A, b'{"n": 4}', [("event_id", marker)])
        wait_until(lambda: self.scalar("SELECT count(*) FROM handled WHERE event_id = %s",
                                       marker) == 1, 60, what="the marker after the repeat")
        wait_until(lambda: self.scalar("SELECT count(*) FROM handled WHERE topic = %s", B) == 1,
                   30, what="B's record with A's id handled")
        rows = self.pg.sql("SELECT topic, payload->>'n' FROM handled WHERE event_id = %s "
                           "ORDER BY topic", (eid,))
        self.assertEqual(rows, [(A, "1"), (B, "2")], "each topic's record handled once")
        self.assertEqual(self.scalar("SELECT count(*) FROM outbox.inbox_message "
                                     "WHERE event_id = %s", eid), 2)

    def test_header_values_round_trip_byte_for_byte(self):
        self.pg.sql("""
            CREATE TABLE got (event_id uuid, header_values bytea[]);
            CREATE FUNCTION keep_headers(msg outbox.inbox_message) RETURNS void LANGUAGE sql AS $$
                INSERT INTO handled VALUES (msg.topic, msg.event_id, msg.payload);
                INSERT INTO got VALUES (msg.event_id, msg.header_values);
            $$;
            SELECT outbox.inbox_subscribe('team-a.events', 'keep_headers(outbox.inbox_message)');
        """)
        eid = str(uuid.uuid4())
        headers = [("event_id", eid.encode()), ("bin", b"\x00\xff"), ("latin1", b"caf\xe9"),
                   ("bin", b"\xc3\x28"), ("none", None), ("empty", b""),
                   ("cl\u00e9", b"\\xff"), ("looks-escaped", b"\xff")]
        self.produce(A, b'{"n": 1}', headers)
        wait_until(lambda: self.scalar("SELECT count(*) FROM handled") == 1, 60,
                   what="the record handled")
        names, values = self.pg.sql("SELECT header_names, header_values FROM outbox.inbox_message "
                                    "WHERE event_id = %s", (eid,))[0]
        self.assertEqual([bytes(n) for n in names], [h[0].encode() for h in headers],
                         "names in order, repeats kept")
        self.assertEqual([None if v is None else bytes(v) for v in values],
                         [h[1] for h in headers], "values as Kafka carried them")
        # The handler got the same bytes.
        got = self.scalar("SELECT header_values FROM got WHERE event_id = %s", eid)
        self.assertEqual([None if v is None else bytes(v) for v in got], [h[1] for h in headers])
        # The readable form is still there for handlers that use it.
        readable = self.scalar("SELECT headers FROM outbox.inbox_message WHERE event_id = %s", eid)
        self.assertEqual(readable["empty"], "")
        self.assertEqual(readable["latin1"], "caf\\xe9")

    def test_a_batch_is_bounded_by_bytes(self):
        # outbox.inbox_batch_bytes is 16 MB by default.  The consumer is held
        # inside its insert (a lock) while 200 records of 128 kB (25 MB, over
        # 8 partitions: the test broker keeps about 5 MB a partition) arrive:
        # librdkafka has them all when it is let go.  Each batch (one
        # transaction: one received_at) stops at the record that crosses
        # 16 MB.
        self.produce(BIG, b"0", [("event_id", str(uuid.uuid4()))])
        wait_until(lambda: self.scalar("SELECT count(*) FROM outbox.inbox_message "
                                       "WHERE topic = %s", BIG) == 1, 60, what="the consumer up")
        lock = self.pg.connect()
        lock.autocommit = False
        with lock.cursor() as cur:
            cur.execute("LOCK TABLE outbox.inbox_message IN EXCLUSIVE MODE")
        self.produce(BIG, b"1", [("event_id", str(uuid.uuid4()))])  # the consumer waits on it
        size, n = 128 * 1024, 200
        for i in range(n):
            self.producer.produce(BIG, key=b"k%d" % i, value=bytes([65 + i % 26]) * size,
                                  headers=[("event_id", str(uuid.uuid4()))])
            self.producer.poll(0)
        self.producer.flush(60)
        time.sleep(5)  # librdkafka fetches them meanwhile
        lock.rollback()
        lock.close()
        wait_until(lambda: self.scalar("SELECT count(*) FROM outbox.inbox_message "
                                       "WHERE topic = %s", BIG) == n + 2, 120, what="all stored")
        batches = self.pg.sql("SELECT count(*), sum(octet_length(value)), max(octet_length(value)) "
                              "FROM outbox.inbox_message WHERE topic = %s GROUP BY received_at "
                              "ORDER BY min(received_at)", (BIG,))
        print(f"\n  batches (records, bytes): {[(c, int(t)) for c, t, _ in batches]}")
        for count, total, largest in batches:
            self.assertLess(total - largest, 16 * 1024 * 1024,
                            "a batch goes past 16 MB only by its last record")

    def test_a_pg_monitor_member_reads_no_record_data_after_an_insert_error(self):
        # A trigger (a superuser's) refuses a record and quotes it, as a
        # constraint's "Key (...)=(...)" or a RAISE ... % does.  The consumer
        # does not skip it: it comes again until it can be stored.  What
        # pg_monitor reads (worker_stats, stats, across databases) and the
        # log name the topic and the SQLSTATE, never the text.
        card = "4111-1111-1111-1111"
        self.pg.sql("""
            CREATE ROLE monitor LOGIN IN ROLE pg_monitor;
            CREATE FUNCTION refuse_cards() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.payload ? 'card' THEN
                    RAISE EXCEPTION 'card % refused', NEW.payload->>'card' USING ERRCODE = '23514';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER refuse_cards BEFORE INSERT ON outbox.inbox_message
                FOR EACH ROW EXECUTE FUNCTION refuse_cards();
        """)
        before = str(uuid.uuid4())
        refused = str(uuid.uuid4())
        after = str(uuid.uuid4())
        self.produce(A, b'{"n": 1}', [("event_id", before)])
        self.produce(A, ('{"card": "%s"}' % card).encode(), [("event_id", refused)])
        self.produce(A, b'{"n": 3}', [("event_id", after)])

        def consumer_error():
            return self.scalar("SELECT last_error FROM outbox.worker_stats "
                               "WHERE role = 'inbox consumer'") or ""
        wait_until(lambda: "23514" in consumer_error(), 60,
                   what="the consumer's insert error in worker_stats")
        conn = self.pg.connect()
        with conn.cursor() as cur:
            cur.execute("SET ROLE monitor")
            cur.execute("SELECT last_error FROM outbox.worker_stats WHERE role = 'inbox consumer'")
            seen = cur.fetchone()[0]
            cur.execute("SELECT last_error FROM outbox.stats")
            seen_stats = cur.fetchone()[0] or ""
        conn.close()
        self.assertIn(A, seen)
        self.assertIn("23514", seen)
        for text in (seen, seen_stats, self.pg.log()):
            self.assertNotIn(card, text)
        self.assertEqual(self.scalar("SELECT count(*) FROM outbox.inbox_message "
                                     "WHERE event_id = %s", after), 0,
                         "nothing after the refused record is committed past it")
        # Fixed, the refused record is stored, and so is the rest: none skipped.
        self.pg.sql("DROP TRIGGER refuse_cards ON outbox.inbox_message")
        wait_until(lambda: self.scalar("SELECT count(*) FROM handled WHERE topic = %s", A) == 3,
                   90, what="every record stored and handled")
        self.assertEqual(self.scalar("SELECT count(*) FROM handled WHERE event_id = %s", refused), 1)

    def test_odd_event_id_headers_and_huge_headers_are_stored_with_a_reason(self):
        eids = [str(uuid.uuid4()) for _ in range(4)]
        self.produce(B, b'{"n": 1}', [])                                  # no event_id
        self.produce(B, b'{"n": 2}', [("event_id", b"")])                 # empty
        self.produce(B, b'{"n": 3}', [("event_id", b"\xff\xfe\x00bad")])  # not UTF-8
        self.produce(B, b'{"n": 4}', [("event_id", b"7" * 10240)])        # 10 kB
        big = bytes(range(256)) * 4096                                    # 1 MB header value
        self.produce(B, b'{"n": 5}', [("event_id", eids[0]), ("blob", big)])
        many = [("event_id", eids[1])] + [(f"h{i}", b"v%d" % i) for i in range(10000)]
        self.produce(B, b'{"n": 6}', many)                                # 10,000 headers
        self.produce(B, b'{"n": 7}', [("event_id", eids[2])])
        wait_until(lambda: self.scalar("SELECT count(*) FROM handled WHERE topic = %s", B) == 7,
                   90, what="every record stored and handled")
        self.assertEqual(self.scalar("SELECT count(*) FROM outbox.inbox_message"), 7)
        derived, note = self.pg.sql("SELECT derived_event_ids, last_intake_note "
                                    "FROM outbox.inbox_stats WHERE topic = %s", (B,))[0]
        self.assertEqual(derived, 3, "empty, not UTF-8, 10 kB: their ids derived, and counted")
        self.assertIn("10240 bytes", note)
        self.assertNotIn("7777", note, "the note never quotes the header")
        blob = self.scalar("SELECT header_values[2] FROM outbox.inbox_message WHERE event_id = %s",
                           eids[0])
        self.assertEqual(bytes(blob), big)
        self.assertEqual(self.scalar("SELECT cardinality(header_names) FROM outbox.inbox_message "
                                     "WHERE event_id = %s", eids[1]), 10001)
        self.assertEqual(self.scalar("SELECT count(*) FROM jsonb_object_keys((SELECT headers "
                                     "FROM outbox.inbox_message WHERE event_id = %s))", eids[1]),
                         10001)


if __name__ == "__main__":
    unittest.main(verbosity=2)
