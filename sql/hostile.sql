-- Hostile roles, on the SQL side (the workers' side is in
-- test/e2e/test_hostile.py).  Each block is an attack a role could try.
CREATE EXTENSION outbox;
CREATE ROLE regress_attacker;
CREATE ROLE regress_victim;
CREATE ROLE regress_monitor IN ROLE pg_monitor;
GRANT USAGE ON SCHEMA outbox TO regress_attacker, regress_victim;
GRANT EXECUTE ON FUNCTION outbox.write, outbox.inbox_subscribe, outbox.inbox_unsubscribe
   TO regress_attacker, regress_victim;
GRANT CREATE ON SCHEMA public TO regress_attacker, regress_victim;
CREATE SCHEMA evil AUTHORIZATION regress_attacker;

-- A writer with EXECUTE only, and an evil search_path: write() resolves
-- nothing through it (its statements run with search_path pinned).
SET ROLE regress_attacker;
CREATE FUNCTION evil.texteq(text, text) RETURNS boolean LANGUAGE sql
    AS $$ SELECT pg_catalog.texteq($1, $2) $$;
CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.texteq);
SET search_path = evil, pg_catalog, public;
SELECT outbox.write('order.events', 'k', '{"a": 1}') IS NOT NULL AS wrote;
SHOW search_path;  -- the caller's own setting is untouched
RESET search_path;

-- A message larger than outbox.max_message_bytes is refused at write
-- time, naming the size; the limit is not the writer's to raise.
SELECT outbox.write('order.events', 'big', jsonb_build_object('x', repeat('x', 1100000)));
SELECT outbox.write_bytes('order.events', 'big', decode(repeat('00', 1100000), 'hex'));
SET outbox.max_message_bytes = '10MB';
-- Control characters print six times longer as JSON text: measured as sent.
SELECT outbox.write('order.events', 'ctl', jsonb_build_object('x', repeat(chr(1), 200000)));
-- So are a key and headers over the limit: headers of control characters
-- as they print, and headers far over it without printing them at all
-- (the relay could not print 180 MB of them: more than 1 GB of text).
SELECT outbox.write('order.events', repeat('k', 1100000), '{}');
SELECT outbox.write('order.events', 'k', '{}', jsonb_build_object('h', repeat(chr(1), 200000)));
SELECT outbox.write('order.events', 'k', '{}', jsonb_build_object('h', repeat(chr(1), 5000000)));
-- A message on outbox.progress_topic, keyed like a relay's transactional id,
-- would become that id's last progress record (another share's transaction
-- carries it) and stop that relay at its next recovery: refused, whatever
-- the delivery mode, naming the setting.
SELECT outbox.write('pg_outbox_progress', 'pg_outbox-1-regression-2of2', '{"x": 1}');
-- Nor on Kafka's own topics ("__" first): a record on __consumer_offsets
-- aborted every exactly-once transaction it was in, and could break the
-- cluster's consumer groups.
SELECT outbox.write('__consumer_offsets', 'k', '{"x": 1}');
SELECT outbox.write('__transaction_state', 'k', '{"x": 1}');
RESET ROLE;
-- Nor may the owner put one there with write_bytes().
SELECT outbox.write_bytes('pg_outbox_progress', 'k'::bytea, NULL);
SELECT outbox.write_bytes('__consumer_offsets', 'k'::bytea, NULL);
SELECT count(*) AS on_progress_topic FROM outbox.outbox_message WHERE topic = 'pg_outbox_progress';
SELECT count(*) AS on_internal_topics FROM outbox.outbox_message WHERE topic LIKE '\_\_%';
-- A record without a key stores key NULL, which equals no other key: it
-- holds back, and is held back by, nothing (a '' key once made every
-- keyless record of every role wait behind one refused keyless record).
SELECT outbox.write_bytes('order.events', NULL, '\x01') IS NOT NULL AS wrote,
       outbox.write_bytes('order.events', '', '\x02') IS NOT NULL AS wrote_empty_key;
SELECT key IS NULL AS key_is_null, key_bytes FROM outbox.outbox_message
 WHERE is_binary AND value IN ('\x01', '\x02') ORDER BY id;
-- write_bytes()'s key too (as a superuser: the attacker may not call it).
SELECT outbox.write_bytes('order.events', decode(repeat('00', 1100000), 'hex'), NULL);
SET outbox.max_message_bytes = '10MB';  -- a superuser may
SELECT outbox.write('order.events', 'ctl', jsonb_build_object('x', repeat(chr(1), 200000))) IS NOT NULL AS wrote;
RESET outbox.max_message_bytes;

-- Subscriptions: a role may subscribe only a function it owns, may not
-- take over another role's topic, and may not write the table.
SET ROLE regress_victim;
CREATE FUNCTION public.victim_handler(m outbox.inbox_message) RETURNS void LANGUAGE sql AS $$ SELECT $$;
SELECT outbox.inbox_subscribe('payments', 'public.victim_handler(outbox.inbox_message)');
SET ROLE regress_attacker;
CREATE FUNCTION public.attacker_handler(m outbox.inbox_message) RETURNS void LANGUAGE sql AS $$ SELECT $$;
SELECT outbox.inbox_subscribe('orders', 'public.victim_handler(outbox.inbox_message)');
SELECT outbox.inbox_subscribe('payments', 'public.attacker_handler(outbox.inbox_message)');
SELECT outbox.inbox_unsubscribe('payments');
INSERT INTO outbox.inbox_subscription (topic, handler, owner)
    VALUES ('orders', 'public.attacker_handler(outbox.inbox_message)', 'postgres');
UPDATE outbox.inbox_subscription SET owner = 'postgres';
SELECT outbox.inbox_subscribe('orders', 'public.attacker_handler(outbox.inbox_message)');
RESET ROLE;
SELECT topic, handler, owner FROM outbox.inbox_subscription ORDER BY topic;
-- A superuser may subscribe any role's function: it runs as that role.
SELECT outbox.inbox_subscribe('payments', 'public.attacker_handler(outbox.inbox_message)');
SELECT topic, owner, (SELECT proowner::regrole FROM pg_proc WHERE oid = to_regprocedure(handler)) AS runs_as
  FROM outbox.inbox_subscription ORDER BY topic;
-- A handler is found by its signature (schema 1.6: pg_upgrade keeps no
-- function oid).  When a subscribed function is gone, a role that may
-- create in its schema can put its own function under that signature: the
-- workers find it but do not run it, as it belongs to another role than the
-- one that owned the handler when it was subscribed (the workers' own
-- statement, verbatim: its last column but one says whether they may run it).
SELECT outbox.inbox_subscribe('refunds', 'public.victim_handler(outbox.inbox_message)');
SET ROLE regress_victim;
DROP FUNCTION public.victim_handler(outbox.inbox_message);
SET ROLE regress_attacker;
CREATE FUNCTION public.victim_handler(m outbox.inbox_message) RETURNS void LANGUAGE sql AS $$ SELECT $$;
RESET ROLE;
SELECT topic, proowner::regrole AS found_owner, allowed FROM (SELECT s.topic, p.oid, p.proowner, p.proargtypes[0] OPERATOR(pg_catalog.<>) 'outbox.inbox_message'::pg_catalog.regtype, ((SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.oid = s.owner) OR pg_catalog.pg_has_role(s.owner, p.proowner, 'USAGE')) AND (s.handler_owner IS NULL OR s.handler_owner OPERATOR(pg_catalog.=) p.proowner), s.handler::pg_catalog.text, s.owner::pg_catalog.oid, EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.oid = s.owner) FROM outbox.inbox_subscription s LEFT JOIN pg_catalog.pg_proc p ON p.oid = pg_catalog.to_regprocedure(s.handler::pg_catalog.text) ORDER BY s.topic) AS s(topic, fn, proowner, batch, allowed, handler, subscriber, subscriber_exists)
 WHERE topic = 'refunds';

-- Secrets: outbox.kafka_config refuses them, and no error repeats a value
-- (not even of a misspelt property, nor a value without a name).
ALTER SYSTEM SET outbox.kafka_config = 'sasl.password=hunter2secret';
ALTER SYSTEM SET outbox.kafka_config = 'security.protocol=SASL_SSL;ssl.key.password=hunter2secret';
ALTER SYSTEM SET outbox.kafka_config = 'sasl.pasword=hunter2secret';
ALTER SYSTEM SET outbox.kafka_config = 'linger.ms=5;hunter2secret';
ALTER SYSTEM SET outbox.kafka_config = 'security.protocol=hunter2secret';
-- A pg_monitor member reads settings, but no secret is in any of them; the
-- file that holds them is named, its content is read by the workers only.
SET ROLE regress_monitor;
SELECT name FROM pg_settings WHERE name LIKE 'outbox.kafka%' ORDER BY name;
SHOW outbox.kafka_config_file;
SELECT count(*) FROM pg_file_settings;
RESET ROLE;

DROP OWNED BY regress_attacker, regress_victim;
DROP EXTENSION outbox;
DROP ROLE regress_attacker, regress_victim, regress_monitor;
