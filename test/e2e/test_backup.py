"""Backups, restores and moves: pg_dump (custom and plain), pg_restore and
pg_dumpall give a database where the outbox works at once; pending messages
are published by the restored server, published ones are not sent again,
parked ones stay parked, processed events and inbox records keep
deduplicating, subscriptions keep their owners."""

import os
import shutil
import subprocess
import tempfile
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import PG_BIN, Collector, PgCluster, TestBroker, as_postgres, wait_until  # noqa: E402

SETUP = """
CREATE EXTENSION outbox;
CREATE ROLE regress_payments_owner;
CREATE TABLE handled (event_id uuid PRIMARY KEY);
CREATE FUNCTION handle(msg outbox.inbox_message) RETURNS void LANGUAGE sql
    AS $$ INSERT INTO public.handled VALUES (msg.event_id) $$;
ALTER FUNCTION handle(outbox.inbox_message) OWNER TO regress_payments_owner;
SELECT outbox.inbox_subscribe('payments', 'handle(outbox.inbox_message)');
"""


class Backups(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.broker = TestBroker(topics=("order.events:2",))
        cls.collector = Collector(cls.broker.bootstrap, partitions=2)

    @classmethod
    def tearDownClass(cls):
        cls.collector.close()
        cls.broker.stop()

    def run_as_postgres(self, cluster, tool, *args, stdin=None):
        cmd = as_postgres([os.path.join(PG_BIN, tool), "-h", cluster.dir, "-p", str(cluster.port),
                           "-U", "postgres"] + list(args))
        out = subprocess.run(cmd, capture_output=True, text=True, input=stdin)
        self.assertEqual(out.returncode, 0, f"{tool} {args}: {out.stderr}")
        return out

    def source(self, with_version=None):
        """A database "app" with published, parked and pending messages,
        processed events, inbox records and a subscription."""
        pg = PgCluster({"outbox.brokers": f"'{self.broker.bootstrap}'", "outbox.database": "'app'",
                        "outbox.max_attempts": 1, "outbox.max_message_bytes": "'4MB'"},
                       name="outbox-source")
        pg.start()
        pg.sql("CREATE DATABASE app")
        if with_version:
            pg.sql(f"CREATE EXTENSION outbox VERSION '{with_version}'", dbname="app")
            pg.sql("SELECT count(outbox.write('order.events', 'old-' || i, jsonb_build_object('i', i))) "
                   "FROM generate_series(1, 10) i", dbname="app")
            wait_until(lambda: pg.scalar("SELECT count(*) FROM outbox.outbox_message "
                                         "WHERE published_at IS NULL", dbname="app") == 0, 30,
                       what="the old messages published")
            return pg
        pg.sql(SETUP, dbname="app")
        pg.sql("SELECT count(outbox.write('order.events', 'published-' || i, jsonb_build_object('i', i))) "
               "FROM generate_series(1, 60) i", dbname="app")
        # 1.02 MB: past librdkafka's message.max.bytes (1,000,000), so parked.
        pg.sql("SELECT outbox.write('order.events', 'parked', "
               "jsonb_build_object('blob', repeat('x', 1020000)))", dbname="app")
        wait_until(lambda: pg.scalar("SELECT count(*) FROM outbox.outbox_message "
                                     "WHERE published_at IS NULL AND parked_at IS NULL",
                                     dbname="app") == 0, 60, what="published and parked")
        # The relay stops publishing; these stay pending in the dump.
        pg.append_conf({"outbox.brokers": "''"})
        pg.reload()
        time.sleep(1)
        pg.sql("SELECT count(outbox.write('order.events', 'pending-' || i, jsonb_build_object('i', i))) "
               "FROM generate_series(1, 30) i", dbname="app")
        pg.sql("SELECT outbox.mark_processed('evt-' || i, 'payments') FROM generate_series(1, 5) i",
               dbname="app")
        pg.sql("SELECT outbox.inbox_write(('00000000-0000-7000-8000-' || lpad(i::text, 12, '0'))::uuid, "
               "'payments', jsonb_build_object('i', i)) FROM generate_series(1, 3) i", dbname="app")
        return pg

    def ids(self, pg, db, where):
        return {r[0] for r in pg.sql(f"SELECT message_id::text FROM outbox.outbox_message WHERE {where}",
                                     dbname=db)}

    def test_dump_and_restore_both_formats_then_write_publish_deduplicate(self):
        src = self.source()
        try:
            published = self.ids(src, "app", "published_at IS NOT NULL")
            pending = self.ids(src, "app", "published_at IS NULL AND parked_at IS NULL")
            parked = self.ids(src, "app", "parked_at IS NOT NULL")
            self.assertEqual((len(published), len(pending), len(parked)), (60, 30, 1))
            keep = tempfile.mkdtemp(prefix="outbox-dump-")
            os.chmod(keep, 0o777)
            self.addCleanup(shutil.rmtree, keep, True)
            custom = os.path.join(keep, "app.dump")
            self.run_as_postgres(src, "pg_dump", "-Fc", "-f", custom, "app")
            plain = self.run_as_postgres(src, "pg_dump", "app").stdout
            roles = self.run_as_postgres(src, "pg_dumpall", "--roles-only").stdout
        finally:
            src.destroy()

        # A new server; "unlisted" is not in its outbox.database.
        dst = PgCluster({"outbox.brokers": f"'{self.broker.bootstrap}'",
                         "outbox.database": "'restored_custom, restored_plain'"},
                        name="outbox-restored")
        dst.start()
        try:
            self.run_as_postgres(dst, "psql", "-X", "-q", "-d", "postgres", stdin=roles)
            for db in ("restored_custom", "restored_plain", "unlisted"):
                dst.sql(f"CREATE DATABASE {db}")
            self.run_as_postgres(dst, "pg_restore", "-d", "restored_custom", custom)
            self.run_as_postgres(dst, "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d",
                                 "restored_plain", stdin=plain)
            self.run_as_postgres(dst, "pg_restore", "-d", "unlisted", custom)

            for db in ("restored_custom", "restored_plain"):
                # outbox.write works at once (the id sequence came along).
                new = dst.scalar("SELECT outbox.write('order.events', 'after-restore', '{}')::text",
                                 dbname=db)
                wait_until(lambda: dst.scalar("SELECT count(*) FROM outbox.outbox_message "
                                              "WHERE published_at IS NULL AND parked_at IS NULL",
                                              dbname=db) == 0, 60, what=f"{db} publishing")
                self.assertEqual(self.ids(dst, db, "parked_at IS NOT NULL"), parked,
                                 "parked stays parked")
                self.assertEqual(dst.scalar("SELECT count(*) FROM outbox.parked_messages", dbname=db), 1)
                # Processed events and inbox records keep deduplicating.
                self.assertFalse(dst.scalar("SELECT outbox.mark_processed('evt-3', 'payments')", dbname=db))
                self.assertTrue(dst.scalar("SELECT outbox.mark_processed('evt-new', 'payments')", dbname=db))
                self.assertFalse(dst.scalar("SELECT outbox.inbox_write('00000000-0000-7000-8000-000000000002', "
                                            "'payments', '{}')", dbname=db))
                # The subscription keeps its owner and its handler's owner.
                self.assertEqual(dst.sql("SELECT owner::text, (SELECT proowner::regrole::text FROM pg_proc "
                                         "WHERE oid = to_regprocedure(handler)) FROM outbox.inbox_subscription",
                                         dbname=db), [("postgres", "regress_payments_owner")])
                self.assertIn(new, self.ids(dst, db, "published_at IS NOT NULL"))

            # What Kafka got: each pending message once per restored database,
            # no published one again, never the parked one.
            def counts_now():
                c = {}
                for r in self.collector.snapshot():
                    eid = r["headers"].get("event_id")
                    c[eid] = c.get(eid, 0) + 1
                return c
            wait_until(lambda: all(counts_now().get(e, 0) >= 2 for e in pending), 30,
                       what="the pending messages of both restored databases in Kafka")
            time.sleep(2)  # a late duplicate would show here
            counts = counts_now()
            resent_published = sum(counts.get(e, 0) for e in published) - len(published)
            self.assertEqual(resent_published, 0, "a published message went out again")
            self.assertEqual({counts.get(e, 0) for e in pending}, {2},
                             "each pending message once per restored database")
            self.assertEqual(sum(counts.get(e, 0) for e in parked), 0)
            print(f"\n  restore: {len(pending)} pending re-sent once per restored database, "
                  f"{len(published)} published not re-sent, {len(parked)} parked kept")

            # The unlisted database keeps its messages, and the log says why, once.
            time.sleep(2)
            self.assertEqual(dst.scalar("SELECT count(*) FROM outbox.outbox_message "
                                        "WHERE published_at IS NULL AND parked_at IS NULL",
                                        dbname="unlisted"), 30)
            self.assertEqual(dst.log().count('database "unlisted" is not in outbox.database'), 1)
        finally:
            dst.destroy()

    def test_dumpall_restores_roles_databases_and_owners(self):
        src = self.source()
        try:
            dump = self.run_as_postgres(src, "pg_dumpall").stdout
            max_id = src.scalar("SELECT max(id) FROM outbox.outbox_message", dbname="app")
        finally:
            src.destroy()
        dst = PgCluster({"outbox.brokers": "''", "outbox.database": "'app'"}, name="outbox-dumpall")
        dst.start()
        try:
            self.run_as_postgres(dst, "psql", "-X", "-q", "-d", "postgres", stdin=dump)
            mid = dst.scalar("SELECT outbox.write('order.events', 'after', '{}')", dbname="app")
            new_id = dst.scalar("SELECT id FROM outbox.outbox_message WHERE message_id = %s",
                                (mid,), dbname="app")
            self.assertGreater(new_id, max_id)
            self.assertEqual(dst.scalar("SELECT count(*) FROM outbox.outbox_message "
                                        "WHERE published_at IS NOT NULL", dbname="app"), 60)
            self.assertEqual(dst.scalar("SELECT (SELECT proowner::regrole::text FROM pg_proc "
                                        "WHERE oid = to_regprocedure(handler)) FROM outbox.inbox_subscription",
                                        dbname="app"), "regress_payments_owner")
        finally:
            dst.destroy()

    def test_a_dump_made_before_1_2_restores_and_writes_at_once(self):
        # A 1.0 database's dump has no position for the id sequence; the
        # first write of each backend moves the sequence past the table.
        src = self.source(with_version="1.0")
        try:
            max_id = src.scalar("SELECT max(id) FROM outbox.outbox_message", dbname="app")
            dump = self.run_as_postgres(src, "pg_dump", "app").stdout
            self.assertNotIn("outbox_message_id_seq', ", dump, "1.0 did not register the sequence")
        finally:
            src.destroy()
        dst = PgCluster({"outbox.brokers": "''", "outbox.database": "'app'"}, name="outbox-old-dump")
        dst.start()
        try:
            dst.sql("CREATE DATABASE app")
            self.run_as_postgres(dst, "psql", "-X", "-q", "-d", "app", stdin=dump)
            dst.sql("ALTER EXTENSION outbox UPDATE", dbname="app")
            mid = dst.scalar("SELECT outbox.write('order.events', 'after', '{}')", dbname="app")
            new_id = dst.scalar("SELECT id FROM outbox.outbox_message WHERE message_id = %s",
                                (mid,), dbname="app")
            self.assertGreater(new_id, max_id)
            self.assertIn("the message id sequence was behind the table", dst.log())
            # Two more backends write; no id is handed out twice.
            for _ in range(2):
                dst.sql("SELECT outbox.write('order.events', 'again', '{}')", dbname="app")
            self.assertEqual(dst.scalar("SELECT count(*) - count(DISTINCT id) FROM outbox.outbox_message",
                                        dbname="app"), 0)
        finally:
            dst.destroy()

    def test_updating_a_1_0_database_registers_its_sequences_for_dump(self):
        src = self.source(with_version="1.0")
        try:
            src.sql("ALTER EXTENSION outbox UPDATE", dbname="app")
            dump = self.run_as_postgres(src, "pg_dump", "app").stdout
            self.assertIn("SELECT pg_catalog.setval('outbox.outbox_message_id_seq', 10, true);", dump)
        finally:
            src.destroy()


if __name__ == "__main__":
    unittest.main(verbosity=2)
