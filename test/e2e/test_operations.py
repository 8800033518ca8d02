"""Operating it, end to end: stats after known traffic, retention, replay,
several databases, reload of the batch size, DROP EXTENSION under a
running relay, and no payload in the server log."""

import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (Collector, PgCluster, TestBroker, committed_messages,  # noqa: E402
                     wait_until)

SECRET = "payload-marker-7f3a9c"  # must never reach the server log


class Operations(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.broker = TestBroker(topics=("order.events:4", "app2.events:4"))
        cls.pg = PgCluster({"outbox.brokers": f"'{cls.broker.bootstrap}'",
                            "outbox.database": "'postgres, app2'",
                            "outbox.poll_interval": "'1h'",
                            "outbox.batch_timeout": "'1s'",
                            "outbox.max_attempts": 3,
                            # A message over Kafka's limit must reach the
                            # relay here (to be parked).
                            "outbox.max_message_bytes": "'64MB'"})
        cls.pg.start()
        cls.pg.sql("CREATE EXTENSION outbox")
        cls.pg.sql("CREATE DATABASE app2")
        cls.pg.sql("CREATE EXTENSION outbox", dbname="app2")
        # app2's workers failed to start before the database existed; the
        # postmaster restarts them after bgw_restart_time.
        wait_until(lambda: cls.pg.relay_pids("app2"), 60, what="the relay of app2")

    @classmethod
    def tearDownClass(cls):
        cls.pg.destroy()
        cls.broker.stop()

    def pending(self, db="postgres"):
        return self.pg.scalar("SELECT count(*) FROM outbox.outbox_message "
                              "WHERE published_at IS NULL AND parked_at IS NULL", dbname=db)

    def worker(self, role, db="postgres"):
        rows = self.pg.sql("SELECT processed, batches, failed, parked, broker_state FROM "
                           "outbox.worker_stats WHERE role = %s AND database = %s", (role, db))
        self.assertEqual(len(rows), 1, f"one {role} in {db}")
        return dict(zip(["processed", "batches", "failed", "parked", "broker_state"], rows[0]))

    def test_stats_follow_known_traffic(self):
        before = self.pg.stats()
        self.pg.sql("SELECT outbox.write('order.events', 'stats-' || (i % 7), "
                    "jsonb_build_object('i', i)) FROM generate_series(1, 500) i")
        wait_until(lambda: self.pending() == 0, 30, what="500 messages published")
        after = self.pg.stats()
        self.assertEqual(after["published_since_start"] - before["published_since_start"], 500)
        self.assertGreaterEqual(after["published_last_minute"], 500)
        self.assertEqual(after["pending"], 0)
        self.assertEqual(after["lag_seconds"], 0)
        self.assertEqual(after["broker_state"], "up")
        self.assertEqual(after["relay_workers"], 1)
        roles = {(r[0], r[1]) for r in self.pg.sql("SELECT role, database FROM outbox.worker_stats")}
        self.assertEqual(roles, {("relay", "postgres"), ("maintenance", "postgres"),
                                 ("relay", "app2"), ("maintenance", "app2")})

        # A message Kafka refuses for good: retries, then parked, with the
        # error in the stats; its payload never in the log.
        self.pg.sql("SELECT outbox.write('order.events', 'too-big', "
                    "jsonb_build_object('marker', %s, 'blob', repeat('x', 1200000)))", (SECRET,))
        wait_until(lambda: self.pg.stats()["parked"] == 1, 60, what="the message parked")
        s = self.pg.stats()
        self.assertEqual(s["retries"] - after["retries"], 3)
        self.assertEqual(s["parked_since_start"] - after["parked_since_start"], 1)
        self.assertIn("too large", s["last_error"])
        self.assertIsNotNone(s["last_error_at"])
        self.assertNotIn(SECRET, self.pg.log())
        self.pg.sql("DELETE FROM outbox.outbox_message WHERE key = 'too-big'")

        # Broker down: the state says so, the backlog and its age grow.
        self.broker.ctl("down")
        try:
            self.pg.sql("SELECT outbox.write('order.events', 'down', '{}')")
            wait_until(lambda: self.pg.stats()["broker_state"] == "down", 60,
                       what="broker_state down")
            time.sleep(1.5)
            s = self.pg.stats()
            self.assertEqual(s["pending"], 1)
            self.assertGreater(s["lag_seconds"], 1.0)
        finally:
            self.broker.ctl("up")
        wait_until(lambda: self.pending() == 0, 60, what="the backlog after the outage")
        wait_until(lambda: self.pg.stats()["broker_state"] == "up", 30, what="broker_state up")

    def test_retention_deletes_exactly_the_old_published_rows(self):
        self.pg.sql("SELECT outbox.write('order.events', 'old-' || i, '{}') "
                    "FROM generate_series(1, 100) i")
        wait_until(lambda: self.pending() == 0, 30, what="old messages published")
        # One old message that is not published (parked): never deleted.
        self.pg.sql("SELECT outbox.write('order.events', 'old-parked', '{}')")
        wait_until(lambda: self.pending() == 0, 30, what="published")
        self.pg.sql("UPDATE outbox.outbox_message SET published_at = NULL, parked_at = now(), "
                    "created_at = now() - interval '1 day' WHERE key = 'old-parked'")
        self.pg.sql("SELECT outbox.mark_processed('evt-short', 'x', '1 second')")
        self.pg.sql("SELECT outbox.mark_processed('evt-long', 'x', '1 day')")
        deleted_before = self.pg.stats()["retention_deleted_since_start"]
        time.sleep(3)  # the 101 published rows are now older than 2 s
        self.pg.sql("SELECT outbox.write('order.events', 'recent', '{}')")
        wait_until(lambda: self.pending() == 0, 30, what="recent published")
        self.pg.sql("ALTER SYSTEM SET outbox.retention = '2s'")
        self.pg.reload()
        try:
            wait_until(lambda: self.pg.scalar(
                "SELECT count(*) FROM outbox.outbox_message WHERE key LIKE 'old-%%'") == 1, 30,
                what="retention to delete the old published rows")
            keys = {r[0] for r in self.pg.sql("SELECT key FROM outbox.outbox_message")}
            self.assertIn("old-parked", keys, "an unpublished row is never deleted")
            self.assertIn("recent", keys, "a row published under 2 s ago stays")
            wait_until(lambda: self.pg.scalar("SELECT count(*) FROM outbox.processed_event "
                                              "WHERE event_id = 'evt-short'") == 0, 30,
                       what="the expired processed event deleted")
            self.assertTrue(self.pg.scalar("SELECT outbox.is_processed('evt-long')"))
            s = self.pg.stats()
            self.assertGreaterEqual(s["retention_deleted_since_start"] - deleted_before, 101)
            self.assertIsNotNone(s["retention_last_pass_at"])
        finally:
            self.pg.sql("ALTER SYSTEM RESET outbox.retention")
            self.pg.reload()
            self.pg.sql("DELETE FROM outbox.outbox_message WHERE key = 'old-parked'")

    def test_replay_republishes_with_the_same_event_id(self):
        collector = Collector(self.broker.bootstrap)
        try:
            t0 = self.pg.scalar("SELECT now()")
            self.pg.sql("SELECT outbox.write('order.events', 'replay-' || (i % 3), "
                        "jsonb_build_object('i', i)) FROM generate_series(1, 50) i")
            wait_until(lambda: self.pending() == 0, 30, what="published once")
            ids = {k for k, v in committed_messages(self.pg).items() if v[1].startswith("replay-")}
            self.assertEqual(len(ids), 50)
            wait_until(lambda: ids <= collector.event_ids(), 30, what="first delivery")
            n = self.pg.scalar("SELECT outbox.replay(%s, now(), 'order.events')", (t0,))
            self.assertEqual(n, 50)

            def twice():
                seen = [r["headers"]["event_id"] for r in collector.snapshot()]
                return all(seen.count(i) == 2 for i in ids)

            wait_until(twice, 30, what="every replayed message delivered a second time")
        finally:
            collector.close()

    def test_several_databases_each_deliver_their_own(self):
        c1 = Collector(self.broker.bootstrap, topic="order.events")
        c2 = Collector(self.broker.bootstrap, topic="app2.events")
        try:
            before2 = self.pg.stats("app2")["published_since_start"]
            self.pg.sql("SELECT outbox.write('order.events', 'db1-' || i, '{}') "
                        "FROM generate_series(1, 200) i")
            self.pg.sql("SELECT outbox.write('app2.events', 'db2-' || i, '{}') "
                        "FROM generate_series(1, 300) i", dbname="app2")
            ids1 = {k for k, v in committed_messages(self.pg).items() if v[1].startswith("db1-")}
            ids2 = {k for k, v in committed_messages(self.pg, "app2").items()
                    if v[1].startswith("db2-")}
            wait_until(lambda: ids1 <= c1.event_ids(), 30, what="database 1's messages")
            wait_until(lambda: ids2 <= c2.event_ids(), 30, what="database 2's messages")
            wait_until(lambda: self.pending("app2") == 0, 30, what="app2 marked")
            self.assertEqual(self.pg.stats("app2")["published_since_start"] - before2, 300)
        finally:
            c1.close()
            c2.close()

    def test_reload_applies_a_new_batch_size(self):
        before = self.worker("relay")
        self.pg.sql("ALTER SYSTEM SET outbox.batch_size = 7")
        self.pg.reload()
        time.sleep(1)
        try:
            self.pg.sql("SELECT outbox.write('order.events', 'batch-' || i, '{}') "
                        "FROM generate_series(1, 100) i")
            wait_until(lambda: self.pending() == 0, 30, what="published")
            after = self.worker("relay")
            self.assertEqual(after["processed"] - before["processed"], 100)
            self.assertGreaterEqual(after["batches"] - before["batches"], 15, "100 / 7 -> 15")
        finally:
            self.pg.sql("ALTER SYSTEM RESET outbox.batch_size")
            self.pg.reload()

    def test_drop_extension_leaves_the_relay_idle_not_crashing(self):
        pid = self.pg.relay_pids("app2")[0]
        self.pg.sql("DROP EXTENSION outbox", dbname="app2")
        time.sleep(2)
        self.pg.sql("SELECT 1", dbname="app2")  # nudge nothing; the relay polls
        self.assertEqual(self.pg.relay_pids("app2"), [pid], "the same relay, still running")
        self.assertNotIn("terminated by signal", self.pg.log())
        self.pg.sql("CREATE EXTENSION outbox", dbname="app2")
        collector = Collector(self.broker.bootstrap, topic="app2.events")
        try:
            mid = self.pg.scalar("SELECT outbox.write('app2.events', 'after-recreate', '{}')::text",
                                 dbname="app2")
            wait_until(lambda: mid in collector.event_ids(), 30,
                       what="the recreated extension's message")
            self.assertEqual(self.pg.relay_pids("app2"), [pid])
        finally:
            collector.close()

    def test_the_exporters_queries_run_as_a_pg_monitor_member(self):
        # contrib/postgres_exporter/queries.yaml is what dashboards and
        # alerts read: each query runs as a member of pg_monitor (and
        # nothing more), and returns every column its metrics name.
        import yaml
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "contrib",
                            "postgres_exporter", "queries.yaml")
        with open(path) as f:
            queries = yaml.safe_load(f)
        self.pg.sql("DROP ROLE IF EXISTS regress_exporter")
        self.pg.sql("CREATE ROLE regress_exporter LOGIN IN ROLE pg_monitor")
        self.pg.sql("SELECT outbox.write('order.events', 'exporter', '{}')")
        wait_until(lambda: self.pending() == 0, 30, what="the message published")
        self.assertEqual(set(queries), {"pg_outbox", "pg_outbox_worker"})
        for name, q in queries.items():
            with self.subTest(query=name):
                conn = self.pg.connect()
                try:
                    cur = conn.cursor()
                    cur.execute("SET ROLE regress_exporter")
                    cur.execute(q["query"])
                    columns = [d[0] for d in cur.description]
                    rows = cur.fetchall()
                finally:
                    conn.close()
                self.assertTrue(rows, f"{name} returned no row")
                wanted = [next(iter(m)) for m in q["metrics"]]
                self.assertEqual([c for c in wanted if c not in columns], [],
                                 f"{name}: metrics without a column")
                row = dict(zip(columns, rows[0]))
                if name == "pg_outbox":
                    self.assertEqual(row["broker_up"], 1)
                    self.assertEqual(row["waiting_for_standbys"], 0)
                    self.assertEqual(row["relay_workers"], 1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
