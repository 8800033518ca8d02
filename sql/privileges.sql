-- The privilege model: nothing for PUBLIC; a service role with USAGE on the
-- schema and EXECUTE on outbox.write() writes messages and can do nothing
-- else with the tables.
CREATE EXTENSION outbox;
CREATE ROLE regress_outbox_service;
CREATE ROLE regress_outbox_consumer;
CREATE ROLE regress_outbox_nobody;

GRANT USAGE ON SCHEMA outbox TO regress_outbox_service, regress_outbox_consumer;
GRANT EXECUTE ON FUNCTION outbox.write TO regress_outbox_service;
GRANT EXECUTE ON FUNCTION outbox.mark_processed(text, text, interval),
                          outbox.is_processed(text) TO regress_outbox_consumer;

-- A role with no grants cannot even see the schema.
SET ROLE regress_outbox_nobody;
SELECT outbox.write('t', 'k', '{}');
RESET ROLE;

-- Nor can a role with USAGE but no EXECUTE: PUBLIC has none.
SET ROLE regress_outbox_consumer;
SELECT outbox.write('t', 'k', '{}');
RESET ROLE;

-- The service writes...
SET ROLE regress_outbox_service;
SELECT outbox.write('order.events', 'from-service', '{"ok": true}') IS NOT NULL AS wrote;
-- ...but cannot read, change, delete or forge rows directly,
SELECT count(*) FROM outbox.outbox_message;
UPDATE outbox.outbox_message SET published_at = now();
DELETE FROM outbox.outbox_message;
INSERT INTO outbox.outbox_message (message_id, topic, key, payload)
    VALUES (gen_random_uuid(), 't', 'k', '{}');
-- nor touch the consumer side.
SELECT outbox.mark_processed('evt-1');
SELECT count(*) FROM outbox.processed_event;
RESET ROLE;

SELECT key, payload FROM outbox.outbox_message WHERE key = 'from-service';

-- The consumer role deduplicates without table access.
SET ROLE regress_outbox_consumer;
SELECT outbox.mark_processed('evt-1', 'payments') AS first;
SELECT outbox.mark_processed('evt-1', 'payments') AS again;
SELECT outbox.is_processed('evt-1') AS seen;
SELECT count(*) FROM outbox.processed_event;
DELETE FROM outbox.processed_event;
RESET ROLE;

SELECT event_id, topic FROM outbox.processed_event;

-- outbox.kafka_config may hold secrets: only superusers see it.
-- (The error's wording changed in 16: its SQLSTATE, 42501, is what holds.)
SET ROLE regress_outbox_service;
\set VERBOSITY sqlstate
SHOW outbox.kafka_config;
\set VERBOSITY default
SELECT count(*) AS visible FROM pg_settings WHERE name = 'outbox.kafka_config';
SHOW outbox.brokers;
RESET ROLE;

DROP OWNED BY regress_outbox_service, regress_outbox_consumer, regress_outbox_nobody;
DROP ROLE regress_outbox_service, regress_outbox_consumer, regress_outbox_nobody;

DROP EXTENSION outbox;
