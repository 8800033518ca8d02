"""What a database owner (owns the database, ALTER DATABASE ... SET, no
superuser) could do to the inbox consumer and the relay through
database-level settings, were the workers not to pin them
(src/worker_common.cpp kPinned).  Each test failed on 1.4's first cut.

docs/security.md promises: a database owner cannot make a worker run its
code, and "nothing a database owner configures may redirect a name, make a
claim fail or wait" (src/worker_common.cpp kPinned); a Kafka producer
cannot make the inbox "lose a record of its topic ... (every record is
stored, losslessly)"; header_values keeps "a NULL value: a header without
one" (outbox--1.3--1.4.sql).

Run one:  cd test/e2e; python3 -m unittest -v test_hostile_settings.DatabaseOwnerSettings.test_x
"""

import json
import os
import sys
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import TestBroker, inbox_cluster, wait_until  # noqa: E402
from confluent_kafka import Consumer, Producer  # noqa: E402

INBOX = "team-a.events"
OTHER = "team-b.events"
RELAYED = "order.events"

SCHEMA = """
CREATE EXTENSION outbox;
CREATE TABLE handled (topic text NOT NULL, event_id uuid NOT NULL, header_values bytea[]);
CREATE FUNCTION record_it(msg outbox.inbox_message) RETURNS void LANGUAGE sql AS $$
    INSERT INTO handled VALUES (msg.topic, msg.event_id, msg.header_values);
$$;
SELECT outbox.inbox_subscribe('team-a.events', 'record_it(outbox.inbox_message)');
SELECT outbox.inbox_subscribe('team-b.events', 'record_it(outbox.inbox_message)');
CREATE ROLE dbowner LOGIN;
ALTER DATABASE postgres OWNER TO dbowner;
CREATE ROLE writer LOGIN;
GRANT USAGE ON SCHEMA outbox TO writer;
GRANT EXECUTE ON FUNCTION outbox.write(text, text, jsonb, jsonb, integer) TO writer;
"""


class DatabaseOwnerSettings(unittest.TestCase):

    def setUp(self):
        self.broker = TestBroker(topics=(f"{INBOX}:1", f"{OTHER}:1", f"{RELAYED}:1"))
        self.pg = inbox_cluster(self.broker, (INBOX, OTHER), "outbox-hostile-settings")
        self.pg.start()
        self.pg.sql(SCHEMA)
        self.producer = Producer({"bootstrap.servers": self.broker.bootstrap, "linger.ms": 5,
                                  "log_level": 2})

    def tearDown(self):
        self.pg.destroy()
        self.broker.stop()

    def scalar(self, q, *args):
        # As the superuser itself: RESET SESSION AUTHORIZATION and SET ROLE
        # NONE undo a database's `session_authorization` and `role`.
        conn = self.pg.connect("postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("RESET SESSION AUTHORIZATION")
            cur.execute("SET ROLE NONE")
            cur.execute(q, args or None)
            rows = cur.fetchall()
        conn.close()
        return rows[0][0] if rows else None

    def as_owner(self, sql):
        conn = self.pg.connect("postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SET ROLE dbowner")
            cur.execute(sql)
        conn.close()

    def produce(self, topic, value, headers=()):
        self.producer.produce(topic, key=b"k", value=value, headers=list(headers))
        self.producer.flush(30)

    def worker_pid(self, kind):
        return self.scalar("SELECT pid FROM pg_stat_activity WHERE backend_type = %s",
                           f"pg outbox {kind}")

    def owner_sets(self, setting, worker="inbox consumer"):
        # The database owner's setting reaches the workers when they connect.
        self.as_owner(f"ALTER DATABASE postgres SET {setting}")
        self.pg.restart()
        wait_until(lambda: self.worker_pid(worker), 30, what=f"the {worker}")

    def wait_or_show_errors(self, predicate, what):
        try:
            wait_until(predicate, 60, what=what)
        except AssertionError:
            stats = self.scalar("SELECT string_agg(role || ': ' || last_error, ' | ') "
                                "FROM outbox.worker_stats WHERE last_error IS NOT NULL")
            self.fail(f"never {what}; worker_stats: {stats}")

    # ---- array_nulls ----------------------------------------------------------

    def test_database_owner_array_nulls_off_keeps_a_header_without_value_null(self):
        # The user depends on: header_values holds NULL for a header that
        # came without a value (outbox--1.4.sql), and "every record is
        # stored, losslessly" (docs/security.md).  The consumer passes the
        # headers as a bytea[] *literal* with a bare NULL: were array_nulls
        # not pinned, a database owner's ALTER DATABASE ... SET
        # array_nulls = off would make it the 4 bytes "NULL".
        self.owner_sets("array_nulls = off")
        eid = str(uuid.uuid4())
        self.produce(INBOX, b'{"n": 1}', [("event_id", eid.encode()), ("none", None),
                                          ("some", b"v")])
        wait_until(lambda: self.scalar("SELECT count(*) FROM outbox.inbox_message "
                                       "WHERE event_id = %s", eid), 60, what="the record stored")
        values = self.scalar("SELECT header_values FROM outbox.inbox_message WHERE event_id = %s",
                             eid)
        got = [None if v is None else bytes(v) for v in values]
        self.assertEqual(got, [eid.encode(), None, b"v"],
                         "a header without a value must be stored as NULL, not as other bytes")

    # ---- role -----------------------------------------------------------------

    def test_database_owner_set_role_does_not_stop_the_inbox_consumer(self):
        # The user depends on: a database owner cannot stop the inbox for
        # the database's subscribers, nor make a worker run as another role
        # (docs/security.md, kPinned: "nothing a database owner configures
        # may ... make a claim fail").  `role` is a USERSET setting a database
        # owner may set for its database (to a role it is a member of); the
        # workers connect as the bootstrap superuser, which is a member of
        # every role, so Postgres applies it at their connection and every
        # statement of theirs would run as dbowner, were `role` not pinned.
        self.owner_sets("role = dbowner")
        eid = str(uuid.uuid4())
        self.produce(OTHER, b'{"n": 1}', [("event_id", eid.encode())])
        self.wait_or_show_errors(
            lambda: self.scalar("SELECT count(*) FROM handled WHERE event_id = %s", eid),
            "the record stored and handled")

    def test_database_owner_set_role_does_not_stop_the_relay(self):
        # The user depends on: a writer's committed outbox.write() is
        # published; the database owner cannot stop the relay for every
        # writer of the database (docs/security.md, kPinned).
        self.relay_publishes_after("role = dbowner")

    def test_database_owner_session_authorization_does_not_stop_the_relay(self):
        # session_authorization is a USERSET setting too, and a database
        # owner may set it for its database: a superuser's connection (a
        # worker's) then becomes the owner's session, which `SET ROLE NONE`
        # does not undo.
        self.relay_publishes_after("session_authorization = dbowner")

    def relay_publishes_after(self, setting):
        self.owner_sets(setting, worker="relay")
        conn = self.pg.connect("postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("RESET SESSION AUTHORIZATION")
            cur.execute("SET ROLE writer")
            cur.execute("SELECT outbox.write(%s, 'k', '{\"n\": 1}')", (RELAYED,))
        conn.close()
        self.wait_or_show_errors(
            lambda: self.scalar("SELECT count(*) FROM outbox.outbox_message "
                                "WHERE published_at IS NOT NULL") == 1,
            "the writer's message published")


if __name__ == "__main__":
    unittest.main(verbosity=2)
