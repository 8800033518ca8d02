"""End to end: services write with outbox.write(), the relay worker inside
Postgres publishes, a real consumer checks what Kafka holds."""

import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (ClusterPerTest, Collector, PgCluster, TestBroker,  # noqa: E402
                     check_places, committed_messages, verify, wait_until)

ORDERS = """
CREATE EXTENSION outbox;
CREATE TABLE orders (id bigserial PRIMARY KEY, customer int NOT NULL, seq int NOT NULL,
                     amount numeric NOT NULL, status text NOT NULL DEFAULT 'pending');
"""

# An order service's CreateOrder: the order and its event in one transaction.  Each
# pgbench client writes its own keys (an aggregate's events are serialised
# by the service), so id order is the order the events happened in.
CREATE_ORDER = r"""
\set k random(1, 25)
\set amount random(1, 1000)
BEGIN;
INSERT INTO orders (customer, seq, amount) VALUES (:client_id, :k, :amount) RETURNING id AS order_id \gset
SELECT outbox.write('order.events', 'customer-' || :client_id || '-' || :k,
                    jsonb_build_object('order_id', :order_id, 'customer', :client_id,
                                       'amount', :amount),
                    jsonb_build_object('event_type', 'OrderCreated'));
END;
"""

# Same flow, rolled back on purpose: nothing of it may reach Kafka.
ROLLED_BACK = r"""
BEGIN;
INSERT INTO orders (customer, seq, amount) VALUES (:client_id, 0, 0) RETURNING id AS order_id \gset
SELECT outbox.write('order.events', 'rolled-back-' || :client_id,
                    jsonb_build_object('order_id', :order_id, 'rolled_back', true));
ROLLBACK;
"""


class RelayEndToEnd(unittest.TestCase):
    """One broker and one cluster for the class; each test cleans up."""

    @classmethod
    def setUpClass(cls):
        cls.broker = TestBroker()
        cls.pg = PgCluster({"outbox.brokers": f"'{cls.broker.bootstrap}'",
                            "outbox.poll_interval": "'1h'",
                            "outbox.batch_timeout": "'1s'"})
        cls.pg.start()
        conn = cls.pg.connect()
        with conn.cursor() as cur:
            cur.execute(ORDERS)
        conn.close()

    @classmethod
    def tearDownClass(cls):
        cls.pg.destroy()
        cls.broker.stop()

    def pending(self):
        return self.pg.scalar(
            "SELECT count(*) FROM outbox.outbox_message WHERE published_at IS NULL")

    def test_concurrent_writers_every_committed_message_arrives_in_key_order(self):
        collector = Collector(self.broker.bootstrap)
        try:
            writers = self.pg.pgbench(CREATE_ORDER, clients=8, transactions=1250)
            rollbacks = self.pg.pgbench(ROLLED_BACK, clients=2, transactions=500)
            for p in (writers, rollbacks):
                out, err = p.communicate(timeout=600)
                self.assertEqual(p.returncode, 0, err)

            # This test's messages only (its keys), whatever ran before it.
            mine = ("customer-", "rolled-back-")
            committed = {k: v for k, v in committed_messages(self.pg).items()
                         if v[1].startswith(mine)}
            self.assertEqual(len(committed), 10000, "pgbench committed 8 x 1250 messages")
            self.assertEqual(self.pg.scalar("SELECT count(*) FROM orders WHERE seq > 0"), 10000)
            self.assertEqual(self.pg.scalar("SELECT count(*) FROM orders WHERE seq = 0"), 0,
                             "rolled-back orders are gone")

            wait_until(lambda: set(committed) <= collector.event_ids(), 120,
                       what="every committed message at the consumer")
            time.sleep(1)  # a late duplicate or rolled-back record would show up here
            records = [r for r in collector.snapshot() if r["key"].startswith(mine)]
            result = verify(records, committed)
            print(f"\n  concurrent writers: {result}")
            self.assertEqual(result["lost"], 0)
            self.assertEqual(result["unknown"], 0, "no record of a rolled-back transaction")
            self.assertEqual(result["mismatched"], 0, "key, value and headers as written")
            self.assertEqual(result["order_violations"], 0)
            self.assertEqual(result["duplicates"], 0, "no crash, so no duplicate")
            self.assertEqual(collector.errors, [])

            # Every record carries its event_id header = message_id, and the
            # caller's own headers.
            for r in records:
                self.assertIn(r["headers"]["event_id"], committed)
                self.assertEqual(r["headers"]["event_type"], "OrderCreated")

            # Exactly the acknowledged rows are marked, and all were.
            wait_until(lambda: self.pending() == 0, 30, what="all rows marked published")
            self.assertEqual(self.pg.scalar(
                "SELECT count(*) FROM outbox.outbox_message "
                "WHERE published_at < created_at OR attempts > 0"), 0)
            # Each marked row names the partition and offset where the
            # consumer found its record.
            places = check_places(self.pg, collector.snapshot())
            print(f"  places: {places}")
            self.assertGreaterEqual(places["published"], 10000)  # the class shares the cluster
            self.assertEqual(places["without_place"], 0, places["examples"])
            self.assertEqual(places["misplaced"], 0, places["examples"])
        finally:
            collector.close()

    def test_commit_wakes_the_relay_without_a_poll_tick(self):
        # poll_interval is 1h: only the commit's wake-up can deliver this.
        collector = Collector(self.broker.bootstrap)
        try:
            mid = self.pg.scalar("SELECT outbox.write('order.events', 'wake-1', '{\"n\": 1}')")
            wait_until(lambda: mid in collector.event_ids(), 30,
                       what="the record of a single commit")
            # A rolled-back write wakes nobody and publishes nothing.
            conn = self.pg.connect()
            conn.autocommit = False
            with conn.cursor() as cur:
                cur.execute("SELECT outbox.write('order.events', 'wake-2', '{}')")
                rolled = cur.fetchone()[0]
            conn.rollback()
            conn.close()
            mid2 = self.pg.scalar("SELECT outbox.write('order.events', 'wake-3', '{}')")
            wait_until(lambda: mid2 in collector.event_ids(), 30, what="the next commit")
            self.assertNotIn(rolled, collector.event_ids())
        finally:
            collector.close()

    def test_broker_down_keeps_rows_pending_until_it_returns(self):
        collector = Collector(self.broker.bootstrap)
        up = False
        try:
            self.broker.ctl("down")
            ids = [r[0] for r in self.pg.sql(
                "SELECT outbox.write('order.events', 'outage-' || (i % 3), "
                "jsonb_build_object('i', i))::text FROM generate_series(1, 300) i")]
            time.sleep(3)
            # Nothing is marked published without an acknowledgement...
            self.assertEqual(self.pg.scalar(
                "SELECT count(*) FROM outbox.outbox_message "
                "WHERE key LIKE 'outage-%%' AND published_at IS NOT NULL"), 0)
            # ...and the relay holds no transaction open while it waits.
            self.assertEqual(self.pg.scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg outbox relay' "
                "AND xact_start < now() - interval '2 seconds'"), 0)
            self.broker.ctl("up")
            up = True
            wait_until(lambda: set(ids) <= collector.event_ids(), 60,
                       what="the backlog after the outage")
            wait_until(lambda: self.pending() == 0, 30, what="the backlog marked published")
            result = verify([r for r in collector.snapshot() if r["key"].startswith("outage-")],
                            {k: v for k, v in committed_messages(self.pg).items() if k in ids})
            self.assertEqual(result["lost"], 0)
            self.assertEqual(result["order_violations"], 0)
            # The outage is logged once when it starts, once when it ends.
            log = self.pg.log()
            self.assertEqual(log.count("cannot reach Kafka"), 1, log[-3000:])
            self.assertEqual(log.count("Kafka is reachable again"), 1, log[-3000:])
        finally:
            if not up:  # the class's other tests share the broker
                self.broker.ctl("up")
            collector.close()

    def claim_scans(self):
        """Scans of outbox_message since the server started: each claim makes at least one;
        a write makes none (an insert is no scan)."""
        return self.pg.scalar("SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) "
                              "FROM pg_stat_user_tables WHERE relid = 'outbox.outbox_message'::regclass")

    def test_broker_down_relay_rests(self):
        """While Kafka is down, the relay does not claim in a loop: a backlog whose every key
        has a record waiting in the producer is not claimed again and again (before the fix:
        a claim every few milliseconds, a whole core, more the bigger the backlog), neither
        between commits nor at each commit that wakes it."""
        up = False
        try:
            self.broker.ctl("down")
            self.pg.sql("SELECT outbox.write('order.events', 'rest-' || (i % 3), "
                        "jsonb_build_object('i', i)) FROM generate_series(1, 300) i")
            time.sleep(4)  # the first claim, its wait for acknowledgements, the first backoff
            conn = self.pg.connect()
            quiet_from = self.claim_scans()
            time.sleep(3)
            time.sleep(1.5)  # a backend's counts reach the view within a second
            quiet = self.claim_scans() - quiet_from
            busy_from = self.claim_scans()
            with conn.cursor() as cur:  # a commit every 50 ms wakes the relay each time
                for i in range(60):
                    cur.execute("SELECT outbox.write('order.events', 'rest-' || %s, '{}')",
                                (i % 3,))
                    time.sleep(0.05)
            time.sleep(1.5)
            busy = self.claim_scans() - busy_from
            conn.close()
            print(f"\n[relay] Kafka down, 300+ rows of 3 keys pending: {quiet} scans of the "
                  f"outbox in 3 s without commits, {busy} in 3 s of 60 commits",
                  file=sys.stderr, flush=True)
            # Backing off from 250 ms to 30 s: a few claims in 3 s, each a few scans.
            self.assertLess(quiet, 40, "the relay claims in a loop while Kafka is down")
            self.assertLess(busy, 60, "every commit makes the relay claim while Kafka is down")
            self.broker.ctl("up")
            up = True
            wait_until(lambda: self.pg.scalar(
                "SELECT count(*) FROM outbox.outbox_message WHERE key LIKE 'rest-%%' "
                "AND published_at IS NULL") == 0, 60, what="the backlog after the outage")
        finally:
            if not up:  # the class's other tests share the broker
                self.broker.ctl("up")

    def test_reload_applies_new_brokers(self):
        # An empty outbox.brokers parks the relay; setting it and reloading
        # starts publishing, with no restart and nothing lost.
        self.pg.sql("ALTER SYSTEM SET outbox.brokers = ''")
        self.pg.reload()
        wait_until(lambda: "outbox.brokers is empty" in self.pg.log(), 30,
                   what="the relay to notice the empty broker list")
        mid = self.pg.scalar("SELECT outbox.write('order.events', 'reload', '{}')::text")
        time.sleep(1)
        self.assertEqual(self.pg.scalar(
            "SELECT published_at IS NULL FROM outbox.outbox_message WHERE message_id = %s",
            (mid,)), True)
        collector = Collector(self.broker.bootstrap)
        try:
            self.pg.sql(f"ALTER SYSTEM SET outbox.brokers = '{self.broker.bootstrap}'")
            self.pg.reload()
            wait_until(lambda: mid in collector.event_ids(), 60,
                       what="the pending message after the reload")
        finally:
            collector.close()
            self.pg.sql("ALTER SYSTEM RESET outbox.brokers")
            self.pg.reload()

    def test_sigterm_stops_the_relay_cleanly_and_restart_resumes(self):
        collector = Collector(self.broker.bootstrap)
        try:
            self.pg.sql("SELECT outbox.write('order.events', 'stop-' || (i % 5), '{}') "
                        "FROM generate_series(1, 2000) i")
            self.pg.stop("fast")
            self.assertIn("pg outbox relay 1 [postgres] stopped", self.pg.log())
            self.pg.start()
            wait_until(lambda: self.pending() == 0, 60, what="the rest after a restart")
            committed = committed_messages(self.pg)
            stop_ids = {k for k, v in committed.items() if v[1].startswith("stop-")}
            wait_until(lambda: stop_ids <= collector.event_ids(), 60, what="every stop- record")
        finally:
            collector.close()


class Stragglers(unittest.TestCase):
    """Rows the relay's low-water mark passed before they committed, by a path
    that announces nothing to the relay: a direct INSERT and COMMIT PREPARED
    (docs/architecture.md, "The low-water mark").  The relay polls too, but
    from its mark, so only the maintenance worker's straggler scan can find
    them; the scan runs at most every outbox.poll_interval, which this class
    keeps at its default so the test waits seconds, not an hour."""

    @classmethod
    def setUpClass(cls):
        cls.broker = TestBroker()
        cls.pg = PgCluster({"outbox.brokers": f"'{cls.broker.bootstrap}'",
                            "outbox.poll_interval": "'1s'",
                            "outbox.batch_timeout": "'1s'",
                            "max_prepared_transactions": 2})
        cls.pg.start()
        cls.pg.sql("CREATE EXTENSION outbox")

    @classmethod
    def tearDownClass(cls):
        cls.pg.destroy()
        cls.broker.stop()

    def published(self, message_id):
        return self.pg.scalar("SELECT coalesce((SELECT published_at IS NOT NULL "
                              "FROM outbox.outbox_message WHERE message_id = %s), false)",
                              (message_id,))

    def test_rows_committed_below_a_settled_mark_are_published(self):
        collector = Collector(self.broker.bootstrap)
        inserter = self.pg.connect()
        inserter.autocommit = False
        prepared = self.pg.connect()
        prepared.autocommit = False
        try:
            first = self.pg.scalar("SELECT outbox.write('order.events', 'settle', '{}')::text")
            wait_until(lambda: self.published(first), 30, what="the first message published")
            # Two transactions take their ids and stay open: a superuser's
            # direct INSERT, and a service's write() that will be prepared.
            with inserter.cursor() as cur:
                cur.execute("INSERT INTO outbox.outbox_message (message_id, topic, key, payload) "
                            "VALUES (gen_random_uuid(), 'order.events', 'direct', '{\"n\": 1}') "
                            "RETURNING id, message_id::text")
                direct_id, direct = cur.fetchone()
            with prepared.cursor() as cur:
                cur.execute("SELECT outbox.write('order.events', 'two-phase', '{\"n\": 2}')::text")
                two_phase = cur.fetchone()[0]
                cur.execute("SELECT id FROM outbox.outbox_message WHERE message_id = %s",
                            (two_phase,))
                two_phase_id = cur.fetchone()[0]
                cur.execute("PREPARE TRANSACTION 'outbox-straggler'")
            prepared.commit()  # the client's side of the transaction is over (no-op on the server)
            # A later write commits first: its turn moves the mark past both ids.
            later = self.pg.scalar("SELECT outbox.write('order.events', 'later', '{}')::text")
            wait_until(lambda: self.published(later), 30, what="the later message published")
            later_id = self.pg.scalar("SELECT id FROM outbox.outbox_message WHERE message_id = %s",
                                      (later,))
            self.assertLess(max(direct_id, two_phase_id), later_id)
            self.assertFalse(self.published(direct))
            self.assertFalse(self.published(two_phase))
            # Now they commit, waking nobody.
            inserter.commit()
            self.pg.sql("COMMIT PREPARED 'outbox-straggler'")
            wait_until(lambda: self.published(direct) and self.published(two_phase), 30,
                       what="both stragglers published")
            wait_until(lambda: {direct, two_phase} <= collector.event_ids(), 30,
                       what="both stragglers in Kafka")
        finally:
            inserter.close()
            prepared.close()
            collector.close()


class RelayBadRows(ClusterPerTest, unittest.TestCase):
    """Rows the relay cannot send, whatever put them there, cost only
    themselves."""
    cluster_name = "outbox-relay-bad-rows"

    def test_a_row_that_cannot_be_rendered_is_parked_and_the_rest_go_on(self):
        self.start()
        self.pg.sql("CREATE EXTENSION outbox")
        # 180 MB of control characters print as more than 1 GB of JSON text:
        # outbox.write() refuses such a payload or such headers, but a row can
        # get in another way.
        for payload, headers in (("jsonb_build_object('x', repeat(chr(1), 180000000))", "'{}'"),
                                 ("'{}'", "jsonb_build_object('h', repeat(chr(1), 180000000))")):
            self.pg.sql("INSERT INTO outbox.outbox_message (message_id, topic, key, payload, headers) "
                        f"VALUES (gen_random_uuid(), 'order.events', 'poison', {payload}, {headers})")
        self.pg.sql("SELECT outbox._wake_relay_at_commit()")
        self.pg.sql("SELECT count(outbox.write('order.events', 'after-' || i, '{}')) "
                    "FROM generate_series(1, 100) i")
        wait_until(lambda: self.scalar("SELECT count(*) FROM outbox.outbox_message "
                                       "WHERE published_at IS NOT NULL") == 100, 120,
                   what="the messages after the poison published")
        wait_until(lambda: self.scalar("SELECT count(*) FROM outbox.parked_messages") == 2, 60,
                   what="both poison rows parked")
        errors = [r[0] for r in self.pg.sql("SELECT last_error FROM outbox.parked_messages "
                                            "ORDER BY id")]
        self.assertIn("the payload", errors[0])
        self.assertIn("the headers", errors[1])
        for e in errors:
            self.assertIn("cannot be rendered", e)


if __name__ == "__main__":
    unittest.main(verbosity=2)
