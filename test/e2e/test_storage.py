"""The outbox table's storage, end to end: a mark keeps its row on its page,
does not split the indexes, and its full-page images are compressed as
outbox.wal_compression says (docs/architecture.md, "What a mark costs the
server")."""

import os
import subprocess
import sys
import time
import unittest
from contextlib import contextmanager

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import PG_BIN, PgCluster, TestBroker, as_postgres, wait_until  # noqa: E402


class Storage(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.broker = TestBroker(topics=("order.events:4",))
        cls.pg = PgCluster({"outbox.brokers": f"'{cls.broker.bootstrap}'",
                            "outbox.poll_interval": "'1h'",
                            "outbox.batch_timeout": "'1s'"})
        cls.pg.start()
        cls.pg.sql("CREATE EXTENSION outbox")

    @classmethod
    def tearDownClass(cls):
        cls.pg.destroy()
        cls.broker.stop()

    def pending(self, db="postgres"):
        return self.pg.scalar("SELECT count(*) FROM outbox.outbox_message "
                              "WHERE published_at IS NULL AND parked_at IS NULL", dbname=db)

    @contextmanager
    def relay_idle(self):
        """The relay publishes nothing inside (no brokers), all of it after."""
        self.pg.sql("ALTER SYSTEM SET outbox.brokers = ''")
        self.pg.reload()
        time.sleep(1)
        try:
            yield
        finally:
            self.pg.sql("ALTER SYSTEM RESET outbox.brokers")
            self.pg.reload()

    def marks_full_page_images(self, setting):
        """Writes 2,000 messages with the relay idle, checkpoints, lets the
        relay mark them under outbox.wal_compression = setting, and returns
        the full-page images of the marks' heap records, as pg_waldump
        prints them."""
        self.pg.sql(f"ALTER SYSTEM SET outbox.wal_compression = '{setting}'")
        with self.relay_idle():
            self.pg.sql("SELECT outbox.write('order.events', 'fpi-' || i, "
                        "jsonb_build_object('i', i, 'pad', repeat('x', 200))) "
                        "FROM generate_series(1, 2000) i")
            self.pg.sql("CHECKPOINT")  # so that each mark is its page's first change since
            start = self.pg.scalar("SELECT pg_current_wal_insert_lsn()::text")
        wait_until(lambda: self.pending() == 0, 30, what="2,000 messages published")
        self.pg.sql("ALTER SYSTEM RESET outbox.wal_compression")
        self.pg.reload()
        end = self.pg.scalar("SELECT pg_current_wal_insert_lsn()::text")
        self.pg.sql("SELECT pg_switch_wal()")
        out = subprocess.run(as_postgres([os.path.join(PG_BIN, "pg_waldump"), "-p",
                                          os.path.join(self.pg.data, "pg_wal"), "-s", start, "-e",
                                          end, "-r", "Heap", "--bkp-details"]),
                             capture_output=True, text=True)
        self.assertIn("UPDATE", out.stdout, out.stderr)
        return [line for line in out.stdout.splitlines() if "FPW" in line]

    def test_the_relays_full_page_images_are_compressed_as_set(self):
        # The server's wal_compression is off here: "server" writes them
        # whole, the default (lz4) compresses them.
        self.assertEqual(self.pg.scalar("SHOW wal_compression"), "off")
        whole = self.marks_full_page_images("server")
        self.assertTrue(whole, "marks after a checkpoint write full-page images")
        self.assertFalse([f for f in whole if "method:" in f], whole[:3])
        lz4 = self.marks_full_page_images("lz4")
        self.assertTrue(lz4)
        self.assertTrue(all("method: lz4" in f for f in lz4), lz4[:3])

    def test_a_mark_keeps_its_row_on_its_page(self):
        # The table keeps room on each page for its rows' marks, so that a
        # mark logs only what changed and never extends the table.
        with self.relay_idle():
            ids = [r[0] for r in self.pg.sql(
                "SELECT outbox.write('order.events', 'page-' || i, "
                "jsonb_build_object('i', i, 'pad', repeat('y', 200)))::text "
                "FROM generate_series(1, 3000) i")]
            before = dict(self.pg.sql("SELECT message_id::text, (ctid::text::point)[0] "
                                      "FROM outbox.outbox_message WHERE message_id::text = ANY(%s)",
                                      (ids,)))
        wait_until(lambda: self.pending() == 0, 30, what="3,000 messages published")
        after = dict(self.pg.sql("SELECT message_id::text, (ctid::text::point)[0] "
                                 "FROM outbox.outbox_message WHERE message_id::text = ANY(%s)",
                                 (ids,)))
        self.assertEqual(len(after), 3000)
        moved = sum(1 for k in ids if after[k] != before[k])
        self.assertLess(moved, 3000 * 0.1, f"{moved} of 3,000 marks moved their row to another page")

    def test_marks_do_not_split_the_indexes(self):
        # A mark adds an entry for the row's new version to the primary key
        # and to the message_id index.  Their pages keep room for it, so
        # marking a backlog does not split them: the indexes stay the size
        # the writes made them.
        indexes = ("outbox.outbox_message_pkey", "outbox.outbox_message_message_id_key")

        def pages():
            return [self.pg.scalar("SELECT pg_relation_size(%s::regclass) / 8192", (ix,))
                    for ix in indexes]

        with self.relay_idle():
            empty = pages()
            self.pg.sql("SELECT outbox.write('order.events', 'split-' || i, '{}') "
                        "FROM generate_series(1, 5000) i")
            written = pages()
        wait_until(lambda: self.pending() == 0, 30, what="5,000 messages published")
        published = pages()
        for ix, e, w, p in zip(indexes, empty, written, published):
            self.assertGreater(w - e, 5, f"{ix}: the writes took pages")
            self.assertLess(p - w, (w - e) * 0.25,
                            f"{ix}: {w - e} pages for 5,000 writes, {p - w} more for their marks")


if __name__ == "__main__":
    unittest.main(verbosity=2)
