"""Failover without phantom events: outbox.wait_for_standbys.

A primary and an asynchronous streaming standby on this machine
(pg_basebackup, replication over the clusters' Unix sockets), both with
the extension and the same test broker.  The standby's WAL receiver is
stopped (its primary_conninfo emptied), messages are committed on the
primary, the primary is killed (-m immediate) and the standby promoted:

- setting on: the primary's relay holds those messages (waiting_for says
  why), so Kafka holds no message the promoted server lacks, and the
  promoted server's relay publishes every message it has, once;
- setting off: the same steps put the messages into Kafka and the promoted
  server lacks them: the phantom events the setting exists to prevent
  (this test documents the hazard);
- a standby that comes back releases what waited, at once.
"""

import collections
import os
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (PG_BIN, Collector, PgCluster, TestBroker, as_postgres,  # noqa: E402
                     wait_until)

STANDBY = "standby1"


class Pair:
    """A primary with the extension and one streaming standby named STANDBY."""

    def __init__(self, wait_for_standbys):
        self.broker = TestBroker()
        self.collector = Collector(self.broker.bootstrap)
        self.primary = PgCluster({
            "outbox.brokers": f"'{self.broker.bootstrap}'",
            "outbox.wait_for_standbys": f"'{wait_for_standbys}'",
            "outbox.batch_timeout": 1000,
            "wal_level": "replica",
            "max_wal_senders": 4,
        }, name="outbox-primary")
        self.standby = None
        self.conninfo = None
        try:
            self.primary.start()
            self.primary.sql("CREATE EXTENSION outbox")
            with open(os.path.join(self.primary.data, "pg_hba.conf"), "a") as f:
                f.write("local replication all trust\n")
            self.primary.reload()
            self.standby = PgCluster({}, name="outbox-standby")
            subprocess.run(as_postgres(["rm", "-rf", self.standby.data]), check=True)
            subprocess.run(as_postgres([os.path.join(PG_BIN, "pg_basebackup"), "-h",
                                        self.primary.dir, "-p", str(self.primary.port), "-U",
                                        "postgres", "-D", self.standby.data, "-R", "-X",
                                        "stream"]), check=True)
            # The walreceiver's application_name is the standby's cluster_name.
            self.standby.append_conf({"port": self.standby.port,
                                      "unix_socket_directories": f"'{self.standby.dir}'",
                                      "cluster_name": f"'{STANDBY}'",
                                      "outbox.wait_for_standbys": "''"})
            self.standby.start()
            self.conninfo = self.standby.scalar("SHOW primary_conninfo")
            self.wait_streaming(True)
        except Exception:
            self.close()
            raise

    def streaming(self):
        return self.primary.scalar(
            "SELECT count(*) FROM pg_stat_replication WHERE application_name = %s", (STANDBY,)) > 0

    def wait_streaming(self, on):
        wait_until(lambda: self.streaming() == on, 60,
                   what=f"the standby to {'stream' if on else 'stop streaming'}")

    def cut(self):
        """Stops the standby's WAL receiver: it streams nothing more."""
        self.standby.sql("ALTER SYSTEM SET primary_conninfo = ''")
        self.standby.sql("SELECT pg_reload_conf()")
        self.wait_streaming(False)

    def reconnect(self):
        self.standby.sql("ALTER SYSTEM SET primary_conninfo = %s", (self.conninfo,))
        self.standby.sql("SELECT pg_reload_conf()")

    def caught_up(self):
        """Waits until the primary has marked everything published and the
        standby has replayed it all."""
        wait_until(lambda: self.primary.scalar(
            "SELECT count(*) = 0 FROM outbox.outbox_message WHERE published_at IS NULL"), 60,
            what="the primary to mark its messages published")
        lsn = self.primary.scalar("SELECT pg_current_wal_lsn()::text")
        wait_until(lambda: self.standby.scalar("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn",
                                               (lsn,)), 60, what="the standby to replay")

    def write(self, server, tag, n):
        return [str(r[0]) for r in server.sql(
            "SELECT outbox.write('order.events', 'k' || i, jsonb_build_object('tag', %s, 'i', i))"
            "  FROM generate_series(1, %s) AS i", (tag, n))]

    def kafka_ids(self):
        return collections.Counter(r["headers"].get("event_id") for r in self.collector.snapshot())

    def wait_published(self, ids):
        wait_until(lambda: set(ids) <= set(self.kafka_ids()), 60,
                   what=f"{len(ids)} messages to reach Kafka")

    def fail_over(self):
        """Kills the primary and promotes the standby."""
        self.primary.stop("immediate")
        self.standby.sql("SELECT pg_promote()")
        wait_until(lambda: not self.standby.scalar("SELECT pg_is_in_recovery()"), 60,
                   what="the promotion")

    def close(self):
        self.collector.close()
        if self.standby:
            self.standby.destroy()
        self.primary.destroy()
        self.broker.stop()


class Failover(unittest.TestCase):

    def test_no_phantom_event_after_a_failover_when_the_relay_waits_for_the_standby(self):
        pair = Pair(STANDBY)
        try:
            # A healthy standby: messages go out as usual.
            before = pair.write(pair.primary, "before", 20)
            pair.wait_published(before)
            pair.caught_up()  # the standby has the marks too
            pair.cut()
            lost_with_primary = pair.write(pair.primary, "not on the standby", 20)
            wait_until(lambda: pair.primary.scalar(
                "SELECT waiting_for FROM outbox.stats") is not None, 30,
                what="outbox.stats to say that publishing waits")
            time.sleep(1.5)  # more than a batch_timeout: nothing goes out meanwhile
            self.assertEqual(set(lost_with_primary) & set(pair.kafka_ids()), set(),
                             "a message the standby lacks went to Kafka")
            self.assertEqual(pair.primary.scalar("SELECT waiting_for FROM outbox.stats"),
                             f'standby "{STANDBY}" is not connected')
            self.assertEqual(pair.primary.scalar(
                "SELECT waiting_for FROM outbox.worker_stats WHERE role = 'relay'"),
                f'standby "{STANDBY}" is not connected')
            self.assertEqual(pair.primary.scalar(
                "SELECT count(*) FROM outbox.outbox_message WHERE published_at IS NULL"), 20,
                "the held messages stay pending, none parked")
            self.assertIn("publishing waits for the standbys", pair.primary.log())

            pair.fail_over()
            after = pair.write(pair.standby, "after the failover", 10)
            pair.wait_published(after)
            time.sleep(1)  # room for a duplicate to show
            on_promoted = {str(r[0]) for r in pair.standby.sql(
                "SELECT message_id FROM outbox.outbox_message")}
            kafka = pair.kafka_ids()
            self.assertEqual(set(kafka) - on_promoted, set(),
                             "Kafka holds messages the promoted server lacks (phantoms)")
            self.assertEqual(set(kafka), set(before) | set(after))
            self.assertEqual({i: c for i, c in kafka.items() if c > 1}, {},
                             "a message reached Kafka twice")
            self.assertEqual(pair.standby.scalar(
                "SELECT count(*) FROM outbox.outbox_message WHERE published_at IS NULL"), 0)
        except Exception:
            print(pair.primary.log()[-3000:])
            raise
        finally:
            pair.close()

    def test_without_the_setting_a_failover_leaves_phantom_events_in_kafka(self):
        # The hazard itself, as every relay without the setting has it.
        pair = Pair("")
        try:
            before = pair.write(pair.primary, "before", 20)
            pair.wait_published(before)
            pair.caught_up()
            pair.cut()
            lost_with_primary = pair.write(pair.primary, "not on the standby", 20)
            pair.wait_published(lost_with_primary)
            self.assertIsNone(pair.primary.scalar("SELECT waiting_for FROM outbox.stats"))
            pair.fail_over()
            on_promoted = {str(r[0]) for r in pair.standby.sql(
                "SELECT message_id FROM outbox.outbox_message")}
            phantoms = set(pair.kafka_ids()) - on_promoted
            self.assertEqual(phantoms, set(lost_with_primary),
                             "without the setting, Kafka holds what no server has")
        finally:
            pair.close()

    def test_a_standby_that_comes_back_releases_what_waited(self):
        pair = Pair(STANDBY)
        try:
            pair.cut()
            held = pair.write(pair.primary, "held", 10)
            wait_until(lambda: pair.primary.scalar(
                "SELECT waiting_for FROM outbox.stats") is not None, 30,
                what="outbox.stats to say that publishing waits")
            self.assertEqual(set(held) & set(pair.kafka_ids()), set())
            pair.reconnect()
            pair.wait_published(held)
            wait_until(lambda: pair.primary.scalar(
                "SELECT waiting_for FROM outbox.stats") is None, 30,
                what="waiting_for to clear")
            self.assertIn("publishing again", pair.primary.log())

            # Emptying the setting releases a wait too (a DBA's way out).
            pair.cut()
            held = pair.write(pair.primary, "held again", 10)
            wait_until(lambda: pair.primary.scalar(
                "SELECT waiting_for FROM outbox.stats") is not None, 30,
                what="outbox.stats to say that publishing waits")
            pair.primary.sql("ALTER SYSTEM SET outbox.wait_for_standbys = ''")
            pair.primary.reload()
            pair.wait_published(held)

            # "*": any one standby will do; a list may not mix it with names.
            pair.primary.sql("ALTER SYSTEM SET outbox.wait_for_standbys = '*'")
            pair.primary.reload()
            pair.reconnect()
            pair.wait_streaming(True)
            anyone = pair.write(pair.primary, "any standby", 10)
            pair.wait_published(anyone)
            with self.assertRaisesRegex(Exception, r'"\*" \(any standby\) cannot be listed'):
                pair.primary.sql("ALTER SYSTEM SET outbox.wait_for_standbys = 'a, *'")
        finally:
            pair.close()

    def test_following_synchronous_standby_names_holds_what_a_local_commit_let_through(self):
        # Synchronous replication keeps a commit invisible until the
        # synchronous standby has it, except for a transaction that asks
        # for less (synchronous_commit = local; any role may): such a
        # commit is visible, and published, while the standby lacks it.
        pair = Pair("synchronous_standby_names")
        # Names in synchronous_standby_names compare without regard to case.
        pair.primary.sql(f"ALTER SYSTEM SET synchronous_standby_names = 'FIRST 1 ({STANDBY.upper()})'")
        pair.primary.reload()

        def write_local(tag):
            return [str(r[0]) for r in pair.primary.sql(
                "SET synchronous_commit = local; "
                "SELECT outbox.write('order.events', 'k' || i, jsonb_build_object('tag', %s))"
                "  FROM generate_series(1, 10) AS i", (tag,))]
        try:
            wait_until(lambda: pair.primary.scalar(
                "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s",
                (STANDBY,)) == "sync", 30, what="the standby to be synchronous")
            healthy = pair.write(pair.primary, "healthy", 10)
            pair.wait_published(healthy)

            pair.cut()
            held = write_local("local commit, standby cut")
            wait_until(lambda: pair.primary.scalar(
                "SELECT waiting_for FROM outbox.stats") is not None, 30,
                what="outbox.stats to say that publishing waits")
            self.assertEqual(pair.primary.scalar("SELECT waiting_for FROM outbox.stats"),
                             "synchronous_standby_names wants 1 standby; 0 of its standbys are "
                             "connected")
            time.sleep(1.5)  # more than a batch_timeout
            self.assertEqual(set(held) & set(pair.kafka_ids()), set(),
                             "a local commit the synchronous standby lacks went to Kafka")
            pair.reconnect()
            pair.wait_published(held)

            # Without the setting, the same local commit goes to Kafka while
            # the synchronous standby lacks it.
            pair.primary.sql("ALTER SYSTEM SET outbox.wait_for_standbys = ''")
            pair.primary.reload()
            pair.cut()
            through = write_local("local commit, no wait")
            pair.wait_published(through)
            self.assertFalse(pair.streaming())
        finally:
            pair.close()


if __name__ == "__main__":
    unittest.main()
