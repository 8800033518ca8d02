"""Hostile roles against the workers, which run as the bootstrap superuser:
a database owner, a subscriber, a pg_monitor member, a writer with EXECUTE
only, a Kafka producer on an inbox topic.  Each test is one attack; each
failed on the code before this suite (see docs/security.md, the threat model)."""

import json
import os
import sys
import tempfile
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (AS_ROOT, INBOX_KAFKA, INBOX_TOPIC, ClusterPerTest,  # noqa: E402
                     wait_until)

SECRET = "hunter2secret"
TOPIC = INBOX_TOPIC
KAFKA = INBOX_KAFKA


class Hostile(ClusterPerTest, unittest.TestCase):
    cluster_name = "outbox-hostile"

    # ---- a database owner --------------------------------------------------

    def test_database_owner_gets_no_superuser_through_the_handler_worker(self):
        self.start({"outbox.database": "'app'"})
        self.pg.sql("CREATE ROLE dbowner LOGIN; CREATE ROLE payments_owner")
        self.pg.sql("CREATE DATABASE app OWNER dbowner")
        self.pg.sql("CREATE EXTENSION outbox", dbname="app")
        # The database owner owns schema public (PG 15): it plants operators
        # that the worker's own statements could pick, and a database-wide
        # search_path that puts its schema first.  Each records whether it
        # ran as a superuser, and makes its owner one if so.
        attack = """
        CREATE TABLE public.pwned (who text);
        GRANT INSERT ON public.pwned TO PUBLIC;
        CREATE FUNCTION public.escalate() RETURNS void LANGUAGE plpgsql AS $$
        BEGIN
            IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
                INSERT INTO public.pwned VALUES (current_user);
                ALTER ROLE dbowner SUPERUSER;
            END IF;
        END $$;
        CREATE FUNCTION public.evil_mul(numeric, double precision) RETURNS double precision
            LANGUAGE plpgsql AS $$ BEGIN PERFORM public.escalate(); RETURN $1::float8 * $2; END $$;
        CREATE OPERATOR public.* (LEFTARG = numeric, RIGHTARG = double precision,
                                  FUNCTION = public.evil_mul);
        CREATE SCHEMA evil;
        GRANT USAGE ON SCHEMA evil TO PUBLIC;
        CREATE FUNCTION evil.evil_eq(uuid, uuid) RETURNS boolean
            LANGUAGE plpgsql AS $$ BEGIN PERFORM public.escalate(); RETURN pg_catalog.uuid_eq($1, $2); END $$;
        CREATE OPERATOR evil.= (LEFTARG = uuid, RIGHTARG = uuid, FUNCTION = evil.evil_eq);
        CREATE FUNCTION evil.evil_teq(text, text) RETURNS boolean
            LANGUAGE plpgsql AS $$ BEGIN PERFORM public.escalate(); RETURN pg_catalog.texteq($1, $2); END $$;
        CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.evil_teq);
        ALTER DATABASE app SET search_path = evil, pg_catalog, public;
        """
        conn = self.pg.connect("app")
        with conn.cursor() as cur:
            cur.execute("SET ROLE dbowner")
            cur.execute(attack)
        conn.close()
        # A subscribed handler that fails (its failures run the worker's
        # retry bookkeeping), and one that works.
        self.pg.sql("""
            CREATE FUNCTION public.handle(m outbox.inbox_message) RETURNS void LANGUAGE plpgsql
                SET search_path = pg_catalog AS $$
            BEGIN
                IF (m.payload->>'fail')::boolean THEN RAISE EXCEPTION 'refused'; END IF;
            END $$;
            ALTER FUNCTION public.handle(outbox.inbox_message) OWNER TO payments_owner;
            SELECT outbox.inbox_subscribe('payments.events', 'public.handle(outbox.inbox_message)');
        """, dbname="app")
        self.produce(TOPIC, [{"fail": True}, {"fail": False}, {"fail": True}])
        wait_until(lambda: self.scalar("SELECT count(*) FROM outbox.inbox_parked", db="app") == 2, 60,
                   what="the failing records parked")
        self.assertEqual(self.scalar("SELECT count(*) FROM outbox.inbox_message WHERE processed",
                                     db="app"), 1)
        # The relay and the maintenance worker ran there too.
        self.pg.sql("SELECT outbox.write('order.events', 'k', '{}')", dbname="app")
        wait_until(lambda: self.scalar("SELECT count(*) FROM outbox.outbox_message "
                                       "WHERE published_at IS NULL", db="app") == 0, 30,
                   what="the relay publishing in the database")
        self.assertEqual(self.scalar("SELECT count(*) FROM public.pwned", db="app"), 0,
                         "a worker ran the database owner's operator as a superuser")
        self.assertFalse(self.scalar("SELECT rolsuper FROM pg_roles WHERE rolname = 'dbowner'"))

    # ---- subscribers ---------------------------------------------------------

    def subscriber_setup(self):
        self.start()
        self.pg.sql("""
            CREATE EXTENSION outbox;
            CREATE ROLE attacker;
            GRANT USAGE ON SCHEMA outbox TO attacker;
            GRANT CREATE ON SCHEMA public TO attacker;
            CREATE TABLE ran_as (who text, note text);
            GRANT INSERT ON ran_as TO PUBLIC;
            CREATE FUNCTION public.attacker_handler(m outbox.inbox_message) RETURNS void
                LANGUAGE sql AS $$ INSERT INTO public.ran_as VALUES (current_user, 'first') $$;
            ALTER FUNCTION public.attacker_handler(outbox.inbox_message) OWNER TO attacker;
        """)

    def test_a_row_in_the_subscription_table_runs_nothing_as_superuser(self):
        self.subscriber_setup()
        # Someone may write the table (granted by mistake): the row names a
        # superuser.  The handler still runs as the function's owner.
        self.pg.sql("GRANT INSERT ON outbox.inbox_subscription TO attacker")
        conn = self.pg.connect()
        with conn.cursor() as cur:
            cur.execute("SET ROLE attacker")
            cur.execute("INSERT INTO outbox.inbox_subscription (topic, handler, owner) VALUES "
                        "('payments.events', 'public.attacker_handler(outbox.inbox_message)', 'postgres')")
        conn.close()
        self.pg.sql("SELECT outbox._wake_inbox_at_commit()")
        self.produce(TOPIC, [{"n": 1}])
        wait_until(lambda: self.scalar("SELECT count(*) FROM ran_as"), 60, what="the handler")
        self.assertEqual(self.pg.sql("SELECT DISTINCT who FROM ran_as"), [("attacker",)])

    def test_a_handler_owner_cannot_replace_its_function_to_gain_superuser(self):
        self.subscriber_setup()
        # A superuser subscribes a function another role owns: the normal flow.
        self.pg.sql("SELECT outbox.inbox_subscribe('payments.events', "
                    "'public.attacker_handler(outbox.inbox_message)')")
        self.produce(TOPIC, [{"n": 1}])
        wait_until(lambda: self.scalar("SELECT count(*) FROM ran_as"), 60, what="the handler")
        # Its owner replaces the body with one that would make it a superuser.
        conn = self.pg.connect()
        with conn.cursor() as cur:
            cur.execute("SET ROLE attacker")
            cur.execute("""CREATE OR REPLACE FUNCTION public.attacker_handler(m outbox.inbox_message)
                           RETURNS void LANGUAGE plpgsql AS $$
                           BEGIN
                               INSERT INTO public.ran_as VALUES (current_user, 'replaced');
                               ALTER ROLE attacker SUPERUSER;
                           END $$""")
        conn.close()
        self.produce(TOPIC, [{"n": 2}])
        wait_until(lambda: self.scalar("SELECT count(*) FROM outbox.inbox_message "
                                       "WHERE attempts > 0"), 60, what="the replaced handler tried")
        self.assertFalse(self.scalar("SELECT rolsuper FROM pg_roles WHERE rolname = 'attacker'"))
        # Refused as a privilege error (worded "must be superuser ..." on 15,
        # "permission denied to alter role" from 16 on).
        self.assertRegex(self.scalar("SELECT last_error FROM outbox.inbox_message WHERE attempts > 0"),
                         "must be superuser|permission denied to alter role")
        self.assertEqual(self.pg.sql("SELECT DISTINCT who FROM ran_as"), [("attacker",)])

    def test_a_handler_that_never_returns_is_parked_and_other_topics_go_on(self):
        # A subscriber's handler sleeps for ever.  Its call is cancelled after
        # outbox.inbox_handler_timeout, counted, retried and parked; another
        # subscriber's topic, served by the same handler worker, goes on.
        self.start({"outbox.inbox_topics": "'payments.events, orders.events'",
                    "outbox.inbox_handler_timeout": "'1s'"},
                   topics=(f"{TOPIC}:1", "orders.events:1"))
        self.pg.sql("""
            CREATE EXTENSION outbox;
            CREATE TABLE handled (event_id uuid PRIMARY KEY);
            CREATE FUNCTION stuck(m outbox.inbox_message) RETURNS void LANGUAGE sql
                AS $$ SELECT pg_sleep('infinity') $$;
            CREATE FUNCTION fine(m outbox.inbox_message) RETURNS void LANGUAGE sql
                AS $$ INSERT INTO handled VALUES (m.event_id) $$;
            SELECT outbox.inbox_subscribe('payments.events', 'stuck(outbox.inbox_message)');
            SELECT outbox.inbox_subscribe('orders.events', 'fine(outbox.inbox_message)');
        """)
        stuck = self.produce(TOPIC, [{"n": 1}])
        wait_until(lambda: self.scalar("SELECT count(*) FROM outbox.inbox_message "
                                       "WHERE attempts > 0"), 60, what="the stuck call cancelled")
        fine = self.produce("orders.events", [{"n": n} for n in range(5)])
        wait_until(lambda: self.scalar("SELECT count(*) FROM handled") == 5, 30,
                   what="the other topic handled")
        wait_until(lambda: self.scalar("SELECT count(*) FROM outbox.inbox_parked "
                                       "WHERE event_id = %s", stuck[0]), 60,
                   what="the stuck record parked")
        self.assertIn("statement timeout", self.scalar(
            "SELECT last_error FROM outbox.inbox_message WHERE event_id = %s", stuck[0]))
        self.assertEqual({r[0] for r in self.pg.sql("SELECT event_id::text FROM handled")},
                         set(fine))

    def test_nothing_a_handler_sets_or_creates_outlives_its_record(self):
        self.start({"outbox.inbox_topics": "'payments.events, orders.events'"},
                   topics=(f"{TOPIC}:1", "orders.events:1"))
        self.pg.sql("""
            CREATE EXTENSION outbox;
            CREATE ROLE handlers;
            CREATE TABLE handled (topic text, n int);
            GRANT INSERT ON handled TO handlers;
            -- Sets what would jam the worker for every topic after it.
            CREATE FUNCTION public.jam(m outbox.inbox_message) RETURNS void LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM set_config('default_transaction_read_only', 'on', false);
                PERFORM set_config('statement_timeout', '1', false);
                PERFORM set_config('search_path', 'nowhere', false);
                INSERT INTO public.handled VALUES (m.topic, (m.payload->>'n')::int);
            END $$;
            -- Creates a temporary table that would shadow the next handler's.
            CREATE FUNCTION public.shadow(m outbox.inbox_message) RETURNS void LANGUAGE plpgsql AS $$
            BEGIN
                IF (m.payload->>'n')::int = 0 THEN
                    CREATE TEMP TABLE handled (topic text, n int);
                END IF;
                INSERT INTO handled VALUES (m.topic, (m.payload->>'n')::int);
            END $$;
            ALTER FUNCTION public.jam(outbox.inbox_message) OWNER TO handlers;
            ALTER FUNCTION public.shadow(outbox.inbox_message) OWNER TO handlers;
            SELECT outbox.inbox_subscribe('payments.events', 'public.jam(outbox.inbox_message)');
            SELECT outbox.inbox_subscribe('orders.events', 'public.shadow(outbox.inbox_message)');
        """)
        for n in range(10):
            self.produce(TOPIC, [{"n": n}])
            self.produce("orders.events", [{"n": n}])
        wait_until(lambda: self.scalar("SELECT count(*) FILTER (WHERE processed OR parked_at IS NOT NULL) "
                                       "FROM outbox.inbox_message") == 20, 90,
                   what="every record handled or parked")
        # Every record of both topics is in public.handled (none in a
        # temporary table, none refused by a read-only or timed-out worker),
        # but the one that tried to create a temporary table: parked.
        self.assertEqual(self.scalar("SELECT count(*) FROM handled WHERE topic = 'payments.events'"), 10)
        self.assertEqual(self.scalar("SELECT count(*) FROM handled WHERE topic = 'orders.events'"), 9)
        self.assertIn("cannot create temporary table within security-restricted operation",
                      self.scalar("SELECT last_error FROM outbox.inbox_parked"))

    # ---- a pg_monitor member ---------------------------------------------------

    def test_no_role_but_a_superuser_reads_the_kafka_password(self):
        secrets = tempfile.NamedTemporaryFile("w", delete=False, prefix="outbox-secrets-")
        # The secret, and a property that shows the file is applied: records
        # over 3000 bytes are refused (parked).
        secrets.write(f"# credentials\nssl.key.password = {SECRET}\nmessage.max.bytes = 3000\n")
        secrets.close()
        if AS_ROOT:
            os.chown(secrets.name, *_postgres_ids())
        os.chmod(secrets.name, 0o600)
        self.addCleanup(os.unlink, secrets.name)
        # A misspelt secret property in postgresql.conf: refused at start,
        # and its value is not repeated in the log.
        self.start({"outbox.kafka_config_file": f"'{secrets.name}'",
                    "outbox.kafka_config": f"'{KAFKA};sasl.pasword=other{SECRET}'"})
        self.pg.sql("CREATE EXTENSION outbox; CREATE ROLE monitor LOGIN IN ROLE pg_monitor")
        # (outbox.kafka_config, where a password used to go, refuses one:
        # sql/hostile.sql.  Not tried here: Postgres itself logs the text
        # of a statement that fails.)
        self.pg.sql("SELECT outbox.write('order.events', 'small', '{}')")
        self.pg.sql("SELECT outbox.write('order.events', 'large', jsonb_build_object('x', repeat('x', 4000)))")
        wait_until(lambda: self.scalar("SELECT count(*) FROM outbox.outbox_message "
                                       "WHERE published_at IS NULL AND parked_at IS NULL") == 0, 60,
                   what="the small one published, the large one parked by the file's limit")
        self.assertEqual(self.scalar("SELECT key FROM outbox.parked_messages"), "large")
        seen = []
        conn = self.pg.connect()
        with conn.cursor() as cur:
            cur.execute("SET ROLE monitor")
            cur.execute("SHOW ALL")
            seen += [str(r) for r in cur.fetchall()]
            cur.execute("SELECT * FROM pg_settings WHERE name LIKE 'outbox.%'")
            seen += [str(r) for r in cur.fetchall()]
            for name in ("outbox.kafka_config", "outbox.kafka_config_file"):
                cur.execute("SELECT current_setting(%s)", (name,))
                seen.append(str(cur.fetchone()))
            cur.execute("SELECT * FROM outbox.stats")
            seen += [str(r) for r in cur.fetchall()]
            cur.execute("SELECT * FROM outbox.worker_stats")
            seen += [str(r) for r in cur.fetchall()]
            with self.assertRaisesRegex(Exception, "permission denied"):
                cur.execute("SELECT * FROM pg_file_settings")
        conn.close()
        for text in seen + [self.pg.log()]:
            self.assertNotIn(SECRET, text)
        self.assertIn("sasl.pasword", self.pg.log(), "the refused property is named")

    def test_a_pg_monitor_member_reads_no_record_data_in_the_workers_errors(self):
        # A handler fails on a record and its error quotes the record, as
        # constraint violations and RAISE ... % do.  worker_stats (pg_monitor,
        # all databases) says which handler failed, how, on which topic and
        # where the text is; the text itself stays in the inbox table, which
        # only the record's readers may select.
        self.start()
        self.pg.sql("""
            CREATE EXTENSION outbox;
            CREATE ROLE monitor LOGIN IN ROLE pg_monitor;
            CREATE FUNCTION picky(m outbox.inbox_message) RETURNS void LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION 'card % refused', m.payload->>'card' USING ERRCODE = '22023';
            END $$;
            SELECT outbox.inbox_subscribe('payments.events', 'picky(outbox.inbox_message)');
        """)
        card = "4111-1111-1111-1111"
        eid = self.produce(TOPIC, [{"card": card}])[0]
        wait_until(lambda: self.scalar("SELECT count(*) FROM outbox.inbox_parked "
                                       "WHERE event_id = %s", eid), 60, what="the record parked")
        self.assertIn(card, self.scalar("SELECT last_error FROM outbox.inbox_message "
                                        "WHERE event_id = %s", eid), "the table keeps the text")
        conn = self.pg.connect()
        with conn.cursor() as cur:
            cur.execute("SET ROLE monitor")
            cur.execute("SELECT last_error FROM outbox.worker_stats WHERE role = 'inbox handler'")
            seen = cur.fetchone()[0]
            cur.execute("SELECT last_error FROM outbox.stats")
            seen_stats = cur.fetchone()[0]
        conn.close()
        for text in (seen, seen_stats):
            self.assertNotIn(card, text)
            self.assertIn("picky", text)
            self.assertIn("22023", text)
            self.assertIn(TOPIC, text)

    def test_a_secrets_file_others_can_read_is_refused(self):
        secrets = tempfile.NamedTemporaryFile("w", delete=False, prefix="outbox-secrets-")
        secrets.write(f"sasl.password={SECRET}\n")
        secrets.close()
        os.chmod(secrets.name, 0o644)
        self.addCleanup(os.unlink, secrets.name)
        self.start({"outbox.kafka_config_file": f"'{secrets.name}'"})
        self.pg.sql("CREATE EXTENSION outbox")
        self.pg.sql("SELECT outbox.write('order.events', 'k', '{}')")
        wait_until(lambda: "group or world access" in self.pg.log(), 30, what="the refusal logged")
        time.sleep(2)
        self.assertEqual(self.scalar("SELECT count(*) FROM outbox.outbox_message "
                                     "WHERE published_at IS NULL"), 1, "nothing published with it")
        self.assertNotIn(SECRET, self.pg.log())

    # ---- a database owner: the extension's schema ------------------------------

    OWNER_ESCALATES = """
        CREATE TABLE public.pwned (who text);
        GRANT INSERT ON public.pwned TO PUBLIC;
        CREATE FUNCTION public.escalate() RETURNS boolean LANGUAGE plpgsql AS $$
        BEGIN
            IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
                INSERT INTO public.pwned VALUES (current_user);
                ALTER ROLE dbowner SUPERUSER;
            END IF;
            RETURN true;
        END $$;
    """

    def owner_database(self, settings=None):
        self.start(dict({"outbox.database": "'app'"}, **(settings or {})))
        self.pg.sql("CREATE ROLE dbowner LOGIN")
        self.pg.sql("CREATE DATABASE app OWNER dbowner")

    def as_owner(self, sql, db="app"):
        conn = self.pg.connect(db)
        with conn.cursor() as cur:
            cur.execute("SET ROLE dbowner")
            cur.execute(sql)
        conn.close()

    def assert_owner_not_superuser(self):
        self.assertFalse(self.scalar("SELECT rolsuper FROM pg_roles WHERE rolname = 'dbowner'"),
                         "the database owner became a superuser")

    def test_create_extension_refuses_a_schema_the_database_owner_made(self):
        self.owner_database()
        # The owner makes the schema first, with an operator that a view of
        # the extension would bind (float8 / int4 has no exact match in
        # pg_catalog): whoever reads the view would run it.
        self.as_owner(self.OWNER_ESCALATES + """
            CREATE SCHEMA outbox;
            CREATE FUNCTION outbox.div(double precision, integer) RETURNS double precision
                LANGUAGE plpgsql AS $$ BEGIN PERFORM public.escalate(); RETURN $1 / $2::float8; END $$;
            CREATE OPERATOR outbox./ (LEFTARG = double precision, RIGHTARG = integer,
                                      FUNCTION = outbox.div);
        """)
        refused = None
        try:
            self.pg.sql("CREATE EXTENSION outbox", dbname="app")
            # Installed: a DBA looks at the inbox, as superuser.
            self.pg.sql("SELECT * FROM outbox.inbox_stats", dbname="app")
        except Exception as e:  # noqa: BLE001 - the refusal is what we want
            refused = str(e)
        self.assert_owner_not_superuser()
        self.assertIsNotNone(refused, "CREATE EXTENSION installed into the owner's schema")
        self.assertIn('schema "outbox"', refused)
        self.assertIn("dbowner", refused)
        self.assertIsNone(self.scalar("SELECT extname FROM pg_extension WHERE extname = 'outbox'",
                                      db="app"))

    def test_alter_extension_update_refuses_a_schema_a_non_superuser_owns(self):
        self.owner_database()
        # An install whose schema the owner holds (made before CREATE
        # EXTENSION refused that).  The owner plants an operator that the
        # upgrade's statements would bind: oid = integer.
        self.pg.sql("CREATE EXTENSION outbox VERSION '1.0'", dbname="app")
        self.pg.sql("ALTER SCHEMA outbox OWNER TO dbowner", dbname="app")
        self.as_owner(self.OWNER_ESCALATES + """
            CREATE FUNCTION outbox.oideq(oid, integer) RETURNS boolean
                LANGUAGE plpgsql AS $$ BEGIN PERFORM public.escalate(); RETURN $1 = $2::oid; END $$;
            CREATE OPERATOR outbox.= (LEFTARG = oid, RIGHTARG = integer, FUNCTION = outbox.oideq);
        """)
        refused = None
        try:
            self.pg.sql("ALTER EXTENSION outbox UPDATE", dbname="app")
        except Exception as e:  # noqa: BLE001
            refused = str(e)
        self.assert_owner_not_superuser()
        self.assertIsNotNone(refused, "the upgrade ran in the owner's schema")
        self.assertIn('schema "outbox"', refused)
        self.assertEqual(self.scalar("SELECT extversion FROM pg_extension", db="app"), "1.0")

    def test_workers_refuse_a_schema_a_non_superuser_owns_or_that_is_not_the_extensions(self):
        self.owner_database({"outbox.retention": "'1s'"})
        self.pg.sql("CREATE EXTENSION outbox", dbname="app")
        self.pg.sql("ALTER SCHEMA outbox OWNER TO dbowner", dbname="app")
        # The owner moves the extension's schema away and puts look-alike
        # tables in a new "outbox", with a trigger on each statement.
        self.as_owner(self.OWNER_ESCALATES + """
            ALTER SCHEMA outbox RENAME TO outbox_real;
            CREATE SCHEMA outbox;
            CREATE FUNCTION public.trg() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN PERFORM public.escalate(); RETURN NULL; END $$;
            CREATE TABLE outbox.outbox_message (id bigint, message_id uuid, topic text, key text,
                payload jsonb, headers jsonb, created_at timestamptz, published_at timestamptz,
                attempts int, last_error text, parked_at timestamptz, is_binary boolean,
                key_bytes bytea, value bytea, kafka_partition int);
            CREATE TABLE outbox.processed_event (event_id text, topic text,
                processed_at timestamptz, expires_at timestamptz);
            CREATE TABLE outbox.inbox_message (event_id uuid, processed boolean,
                processed_at timestamptz);
            CREATE TRIGGER t1 BEFORE DELETE ON outbox.outbox_message
                FOR EACH STATEMENT EXECUTE FUNCTION public.trg();
            CREATE TRIGGER t2 BEFORE DELETE ON outbox.processed_event
                FOR EACH STATEMENT EXECUTE FUNCTION public.trg();
            CREATE TRIGGER t3 BEFORE DELETE ON outbox.inbox_message
                FOR EACH STATEMENT EXECUTE FUNCTION public.trg();
            CREATE TRIGGER t4 BEFORE UPDATE ON outbox.outbox_message
                FOR EACH STATEMENT EXECUTE FUNCTION public.trg();
        """)
        self.pg.sql("SELECT pg_reload_conf()")  # the next retention pass starts at once
        wait_until(lambda: "schema \"outbox\"" in self.pg.log() or self.scalar(
            "SELECT count(*) FROM public.pwned", db="app"), 60, what="the workers' verdict")
        time.sleep(3)  # a few more turns
        self.assertEqual(self.scalar("SELECT count(*) FROM public.pwned", db="app"), 0,
                         "a worker ran the owner's trigger as a superuser")
        self.assert_owner_not_superuser()
        self.assertIn("not a superuser", self.pg.log())

    # ---- a writer with EXECUTE only ----------------------------------------------

    def writer_setup(self):
        self.pg.sql("""
            CREATE EXTENSION outbox;
            CREATE ROLE writer LOGIN;
            GRANT USAGE ON SCHEMA outbox TO writer;
            GRANT EXECUTE ON FUNCTION outbox.write TO writer;
        """)

    def as_writer(self, sql, params=None):
        conn = self.pg.connect()
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SET ROLE writer")
            cur.execute(sql, params)
            row = cur.fetchone() if cur.description else None
        conn.close()
        return row

    def test_a_writer_of_refused_messages_holds_back_no_other_writer(self):
        self.start({"outbox.max_attempts": 10}, topics=("order.events:2",))
        self.writer_setup()
        # 20,000 messages to a partition the topic does not have, in one
        # statement: Kafka (librdkafka) refuses every one for good.
        self.as_writer("SELECT count(outbox.write('order.events', 'bad-' || g, '{}', partition => 99))"
                       " FROM generate_series(1, 20000) g")
        # Another writer's message, right after, and one of a refused key.
        innocent = self.pg.scalar("SELECT outbox.write('order.events', 'innocent', '{}')::text")
        wait_until(lambda: self.scalar("SELECT published_at IS NOT NULL FROM outbox.outbox_message "
                                       "WHERE message_id = %s", innocent), 60,
                   what="the innocent message published")
        # It did not wait for the refused ones to be parked.
        self.assertLess(self.scalar("SELECT count(*) FROM outbox.outbox_message "
                                    "WHERE parked_at IS NOT NULL"), 20000)
        self.assertGreater(self.scalar("SELECT count(*) FROM outbox.outbox_message "
                                       "WHERE attempts > 0"), 0)
        self.assertIn("Unknown partition", self.scalar(
            "SELECT last_error FROM outbox.outbox_message WHERE attempts > 0 LIMIT 1"))

    def test_a_refused_message_keeps_its_key_in_order_until_it_is_parked(self):
        self.start({"outbox.max_attempts": 3}, topics=("order.events:2",))
        self.writer_setup()
        bad = self.pg.scalar("SELECT outbox.write('order.events', 'k', '{\"n\":1}', partition => 99)::text")
        good = self.pg.scalar("SELECT outbox.write('order.events', 'k', '{\"n\":2}')::text")
        other = self.pg.scalar("SELECT outbox.write('order.events', 'other', '{}')::text")
        wait_until(lambda: self.scalar("SELECT published_at IS NOT NULL FROM outbox.outbox_message "
                                       "WHERE message_id = %s", other), 30, what="another key published")
        wait_until(lambda: self.scalar("SELECT published_at IS NOT NULL FROM outbox.outbox_message "
                                       "WHERE message_id = %s", good), 60,
                   what="the refused message's key going on after it is parked")
        parked_at, published_at = self.pg.sql(
            "SELECT (SELECT parked_at FROM outbox.outbox_message WHERE message_id = %s),"
            " (SELECT published_at FROM outbox.outbox_message WHERE message_id = %s)", (bad, good))[0]
        self.assertIsNotNone(parked_at)
        self.assertLessEqual(parked_at, published_at, "a later message of the key overtook it")

    def victim_waits(self, write_one, n=6, gap=0.5, what="the other role's messages"):
        """Another role writes n messages with `write_one(i)` (returns a message_id), one every
        `gap` s, while the attack runs; each must be published within 2 s of its write (the
        issue's p99 over so few is their maximum). Returns their waits, in seconds, and the
        places Kafka gave them, in write order."""
        ids = []
        for i in range(n):
            ids.append(write_one(i))
            time.sleep(gap)
        wait_until(lambda: self.scalar("SELECT count(*) FROM outbox.outbox_message WHERE message_id::text"
                                       " = ANY(%s) AND published_at IS NOT NULL", ids) == n, 60,
                   what=f"{what} published")
        rows = self.pg.sql("SELECT extract(epoch FROM published_at - created_at)::float8,"
                           " published_partition, published_offset FROM outbox.outbox_message"
                           " WHERE message_id::text = ANY(%s) ORDER BY id", (ids,))
        waits = [r[0] for r in rows]
        print(f"\n[hostile] {what}: waits {[round(w, 3) for w in waits]} s", file=sys.stderr, flush=True)
        self.assertLessEqual(max(waits), 2.0, f"{what} waited for another role's refused records")
        return waits, [(r[1], r[2]) for r in rows]

    def test_a_writers_refused_key_holds_no_other_topics_message_of_that_key(self):
        """Issue 39: order is per (topic, key). A writer puts 1,000 messages on its own topic
        with another role's key and a partition the topic lacks; the other role's messages of
        that key on its own topic go on (before: still unpublished after 91 s)."""
        self.start({"outbox.max_attempts": 10}, topics=("order.events:2", "payments:2"))
        self.writer_setup()
        self.as_writer("SELECT count(outbox.write('order.events', 'customer-42', jsonb_build_object('g', g),"
                       " partition => 99)) FROM generate_series(1, 1000) g")
        wait_until(lambda: self.scalar("SELECT count(*) FROM outbox.outbox_message WHERE attempts > 0") > 0,
                   30, what="the writer's rows refused")
        _, places = self.victim_waits(lambda i: self.pg.scalar(
            "SELECT outbox.write('payments', 'customer-42', jsonb_build_object('i', %s::int))::text", (i,)),
            what="payments' messages of key customer-42")
        # One key: one partition, offsets in write order.
        self.assertEqual(len({p for p, _ in places}), 1)
        self.assertEqual([o for _, o in places], sorted(o for _, o in places))
        self.assertEqual(self.scalar("SELECT count(*) FROM outbox.outbox_message WHERE topic = 'order.events'"
                                     " AND published_at IS NOT NULL"), 0)

    def test_a_refused_keyless_record_holds_no_other_keyless_record(self):
        """Issue 39: a record without a key orders nothing. write_bytes() stored its key as '',
        so one role's refused keyless records held every other role's keyless ones."""
        self.start({"outbox.max_attempts": 10}, topics=("order.events:2", "payments:2"))
        self.pg.sql("CREATE EXTENSION outbox")
        self.pg.sql("SELECT count(outbox.write_bytes('order.events', NULL, '\\x01'::bytea, partition => 99))"
                    " FROM generate_series(1, 200)")
        wait_until(lambda: self.scalar("SELECT count(*) FROM outbox.outbox_message WHERE attempts > 0") > 0,
                   30, what="the refused keyless rows tried")
        # A refused record's wait doubles with each attempt, up to minutes: stand in for a late
        # one (before, a keyless record waited behind it, 1.5-2 s each at the first retries).
        self.pg.sql("UPDATE outbox.outbox_message SET next_attempt_at = now() + interval '1 hour'"
                    " WHERE attempts > 0")
        self.victim_waits(lambda i: self.pg.scalar(
            "SELECT outbox.write_bytes('payments', NULL, convert_to(%s, 'UTF8'))::text", (f"v{i}",)),
            what="another role's keyless records")

    def test_a_message_with_thousands_of_headers_is_refused_at_write_time(self):
        self.start()
        self.writer_setup()
        # Tens of thousands of tiny headers, well inside the byte limit.
        many = json.dumps({f"{i:x}": "" for i in range(60000)})
        self.assertLess(len(many), 1024 * 1024)
        with self.assertRaises(Exception) as e:
            self.as_writer("SELECT outbox.write('order.events', 'k', '{}', %s::jsonb)", (many,))
        self.assertIn("headers", str(e.exception))
        self.assertIn("60000", str(e.exception))
        self.assertEqual(self.scalar("SELECT count(*) FROM outbox.outbox_message"), 0)

    def test_a_forgotten_transaction_that_wrote_does_not_slow_every_claim(self):
        # Commits wake the relay; the hour-long poll keeps the maintenance
        # worker's straggler scan (which walks below the mark on purpose, a
        # bounded share of its time) out of the count.
        self.start({"outbox.poll_interval": "'1h'"})
        self.writer_setup()
        forgotten = self.pg.connect()
        forgotten.autocommit = False
        with forgotten.cursor() as cur:  # BEGIN, write, and never commit (for now)
            cur.execute("SELECT outbox.write('order.events', 'forgotten', '{}')::text")
            held = cur.fetchone()[0]

        def index_reads():
            return self.scalar("SELECT idx_tup_read FROM pg_stat_all_indexes "
                               "WHERE indexrelname = 'ix_outbox_message_unpublished'") or 0

        def flushed_reads():
            # The relay flushes its statistics at most once a second.
            for _ in range(2):
                time.sleep(1.2)
                mid = self.pg.scalar("SELECT outbox.write('order.events', 'tick', '{}')::text")
                wait_until(lambda: self.scalar("SELECT published_at IS NOT NULL FROM "
                                               "outbox.outbox_message WHERE message_id = %s", mid),
                           30, what="a tick published")
            return index_reads()

        before = flushed_reads()
        for i in range(300):  # one message a transaction, each claimed on its own
            mid = self.pg.scalar("SELECT outbox.write('order.events', %s, '{}')::text", (f"k{i}",))
            wait_until(lambda: self.scalar("SELECT published_at IS NOT NULL FROM outbox.outbox_message "
                                           "WHERE message_id = %s", mid), 30, interval=0.01,
                       what="a message published")
        read = flushed_reads() - before
        # Each claim walked from the forgotten message (every dead entry
        # since) on the old code: some 45,000 entries for 300 messages.
        self.assertLess(read, 20 * 300, f"the claims read {read} index entries for 300 messages")
        forgotten.commit()
        forgotten.close()
        wait_until(lambda: self.scalar("SELECT published_at IS NOT NULL FROM outbox.outbox_message "
                                       "WHERE message_id = %s", held), 30,
                   what="the forgotten message published once committed")

    # ---- a database owner: settings ----------------------------------------------

    def test_default_headers_cannot_set_event_id_nor_break_every_write(self):
        self.start()
        self.pg.sql("CREATE EXTENSION outbox")
        self.pg.sql("CREATE ROLE dbowner LOGIN; ALTER DATABASE postgres OWNER TO dbowner")
        for value, why in (('{"event_id": "00000000-0000-0000-0000-000000000000"}', "event_id"),
                           ('{"trace": "a\\u0000b"}', "\\u0000")):
            with self.assertRaises(Exception) as e:
                self.as_owner(f"ALTER DATABASE postgres SET outbox.default_headers = '{value}'",
                              db="postgres")
            self.assertIn(why, str(e.exception))
            with self.assertRaises(Exception) as e:
                self.pg.sql(f"SET outbox.default_headers = '{value}'")
            self.assertIn("outbox.default_headers", str(e.exception))
        # What a session still may set works, and each message keeps its own id.
        conn = self.pg.connect()
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("""SET outbox.default_headers = '{"traceparent": "00-ab-cd-01"}'""")
            cur.execute("SELECT outbox.write('order.events', 'k', '{}')::text")
            mid = cur.fetchone()[0]
        conn.close()
        self.assertEqual(self.scalar("SELECT headers->>'traceparent' FROM outbox.outbox_message "
                                     "WHERE message_id = %s", mid), "00-ab-cd-01")

    def test_exit_on_error_set_by_the_database_owner_crash_loops_no_worker(self):
        self.start()
        self.pg.sql("CREATE EXTENSION outbox")
        self.pg.sql("CREATE ROLE dbowner LOGIN; ALTER DATABASE postgres OWNER TO dbowner")
        self.as_owner("ALTER DATABASE postgres SET exit_on_error = on", db="postgres")
        self.pg.restart()
        pid = wait_until(lambda: self.scalar("SELECT pid FROM pg_stat_activity "
                                             "WHERE backend_type = 'pg outbox inbox consumer'"),
                         30, what="the consumer")
        # A record whose value jsonb refuses: the consumer catches that
        # error and keeps the record as raw text.  exit_on_error must not
        # turn the error into a FATAL.
        eid = str(uuid.uuid4())
        self.producer.produce(TOPIC, key="k", value=b'{"a": "\\u0000"}', headers=[("event_id", eid)])
        self.producer.flush(30)
        ok = self.produce(TOPIC, [{"n": 1}])
        wait_until(lambda: self.scalar("SELECT count(*) FROM outbox.inbox_message") == 2, 60,
                   what="both records stored")
        self.assertEqual(self.scalar("SELECT pid FROM pg_stat_activity "
                                     "WHERE backend_type = 'pg outbox inbox consumer'"), pid,
                         "the consumer restarted")
        self.assertTrue(self.scalar("SELECT payload ? 'raw_text' FROM outbox.inbox_message "
                                    "WHERE event_id = %s", eid))
        self.assertEqual(self.scalar("SELECT count(*) FROM outbox.inbox_message WHERE event_id = %s",
                                     ok[0]), 1)

    # ---- a subscriber: its handler ---------------------------------------------

    def handler_setup(self, body, settings=None, batch=False):
        conf = {"outbox.inbox_topics": "'payments.events, orders.events'",
                "outbox.inbox_handler_timeout": "'1s'"}
        conf.update(settings or {})
        self.start(conf, topics=(f"{TOPIC}:1", "orders.events:1"))
        argtype = "outbox.inbox_message[]" if batch else "outbox.inbox_message"
        self.pg.sql(f"""
            CREATE EXTENSION outbox;
            CREATE ROLE subscriber;
            CREATE TABLE handled (event_id uuid PRIMARY KEY);
            GRANT INSERT ON handled TO subscriber;
            CREATE FUNCTION public.hostile(m {argtype}) RETURNS void LANGUAGE plpgsql AS $$ {body} $$;
            ALTER FUNCTION public.hostile({argtype}) OWNER TO subscriber;
            CREATE FUNCTION public.fine(m outbox.inbox_message) RETURNS void LANGUAGE sql
                AS $$ INSERT INTO public.handled VALUES (m.event_id) $$;
            SELECT outbox.inbox_subscribe('payments.events', 'public.hostile({argtype})');
            SELECT outbox.inbox_subscribe('orders.events', 'public.fine(outbox.inbox_message)');
        """)

    def assert_hostile_parked_and_others_handled(self, what):
        hostile = self.produce(TOPIC, [{"n": 1}])
        fine = self.produce("orders.events", [{"n": n} for n in range(5)])
        wait_until(lambda: self.scalar("SELECT count(*) FROM handled") == 5, 90,
                   what="the other topic handled")
        wait_until(lambda: self.scalar("SELECT count(*) FROM outbox.inbox_parked WHERE event_id = %s",
                                       hostile[0]), 90, what="the hostile record parked")
        self.assertEqual(self.scalar("SELECT attempts FROM outbox.inbox_message WHERE event_id = %s",
                                     hostile[0]), 2)
        self.assertIn(what, self.scalar("SELECT last_error FROM outbox.inbox_message "
                                        "WHERE event_id = %s", hostile[0]))
        self.assertEqual({r[0] for r in self.pg.sql("SELECT event_id::text FROM handled")}, set(fine))

    def test_a_handler_that_swallows_its_cancellation_is_ended_and_parked(self):
        self.handler_setup("""
            BEGIN
                LOOP
                    BEGIN
                        PERFORM pg_sleep(3600);
                    EXCEPTION WHEN query_canceled THEN NULL;  -- and on
                    END;
                END LOOP;
            END""")
        self.assert_hostile_parked_and_others_handled("outbox.inbox_handler_timeout")

    def test_a_handler_that_sets_exit_on_error_is_parked_not_restarted_forever(self):
        self.handler_setup("""
            BEGIN
                PERFORM set_config('exit_on_error', 'on', true);
                RAISE EXCEPTION 'refused';
            END""")
        self.assert_hostile_parked_and_others_handled("refused")

    def test_a_handler_runs_with_its_owners_role_settings(self):
        self.handler_setup("""
            BEGIN
                INSERT INTO public.seen VALUES (whoami(), current_setting('app.tenant', true));
            END""")
        self.pg.sql("""
            CREATE ROLE dbowner LOGIN; ALTER DATABASE postgres OWNER TO dbowner;
            CREATE TABLE public.seen (path text, tenant text);
            GRANT INSERT ON public.seen TO subscriber;
            CREATE SCHEMA mine AUTHORIZATION subscriber;
            CREATE FUNCTION mine.whoami() RETURNS text LANGUAGE sql AS $$ SELECT 'mine' $$;
            ALTER ROLE subscriber SET search_path = mine, pg_catalog;
            ALTER ROLE subscriber SET app.tenant = 'blue';
        """)
        self.as_owner("""
            CREATE SCHEMA evil;
            GRANT USAGE ON SCHEMA evil TO PUBLIC;
            CREATE FUNCTION evil.whoami() RETURNS text LANGUAGE sql AS $$ SELECT 'evil' $$;
            ALTER DATABASE postgres SET search_path = evil, public;
        """, db="postgres")
        self.pg.restart()
        self.produce(TOPIC, [{"n": 1}])
        wait_until(lambda: self.scalar("SELECT count(*) FROM public.seen"), 60, what="the handler")
        self.assertEqual(self.pg.sql("SELECT path, tenant FROM public.seen"), [("mine", "blue")])

    def test_a_handler_gets_no_more_record_bytes_than_a_budget_at_once(self):
        self.handler_setup("""
            BEGIN
                INSERT INTO public.calls VALUES (cardinality(m),
                    (SELECT sum(octet_length(x.payload::text)) FROM unnest(m) x));
            END""", batch=True)
        self.pg.sql("""
            CREATE TABLE public.calls (records int, bytes bigint);
            GRANT INSERT ON public.calls TO subscriber;
            -- 1 MB of random hex each: nothing TOAST could compress.
            CREATE TEMP TABLE blob AS
                SELECT string_agg(md5(random()::text), '') AS b FROM generate_series(1, 32768);
            SELECT count(outbox.inbox_write(gen_random_uuid(), 'payments.events',
                                            jsonb_build_object('blob', blob.b)))
              FROM generate_series(1, 100), blob;
        """)
        wait_until(lambda: self.scalar("SELECT sum(records) FROM public.calls") == 100, 120,
                   what="every record handled")
        biggest = self.scalar("SELECT max(bytes) FROM public.calls")
        self.assertLess(biggest, 40 * 1024 * 1024, f"one call got {biggest} bytes of records")


def _postgres_ids():
    import pwd
    p = pwd.getpwnam("postgres")
    return p.pw_uid, p.pw_gid


if __name__ == "__main__":
    unittest.main(verbosity=2)
