-- Operating it: the stats views, replay, and who may use them.  (The relay
-- does not serve this database: the workers' counters are tested end to
-- end in test/e2e/test_operations.py.)
CREATE EXTENSION outbox;
SELECT extversion FROM pg_extension WHERE extname = 'outbox';

-- With nothing written: an empty queue, no relay for this database.
SELECT pending, lag_seconds, parked, published_since_start, relay_workers, broker_state,
       inbox_pending, inbox_parked
  FROM outbox.stats;

-- Pending messages count, and their age is the lag.
SELECT outbox.write('order.events', 'k' || i, jsonb_build_object('i', i)) IS NOT NULL AS wrote
  FROM generate_series(1, 3) AS i;
UPDATE outbox.outbox_message SET created_at = now() - interval '90 seconds' WHERE key = 'k1';
SELECT pending, lag_seconds >= 90 AS lag_from_oldest, parked FROM outbox.stats;
UPDATE outbox.outbox_message SET parked_at = now() WHERE key = 'k1';
SELECT pending, lag_seconds < 90 AS parked_not_in_lag, parked FROM outbox.stats;

-- The counts go through the partial index of unpublished rows.
SET enable_seqscan = off;
EXPLAIN (COSTS OFF)
SELECT count(*) FILTER (WHERE parked_at IS NULL) FROM outbox.outbox_message
 WHERE published_at IS NULL;
RESET enable_seqscan;

-- Replay: published messages of a window go out again, same message_id.
TRUNCATE outbox.outbox_message;
INSERT INTO outbox.outbox_message (message_id, topic, key, payload, created_at, published_at)
SELECT ('00000000-0000-7000-8000-' || lpad(i::text, 12, '0'))::uuid,
       CASE WHEN i % 2 = 0 THEN 'order.events' ELSE 'audit.events' END,
       'k' || i, jsonb_build_object('i', i),
       '2026-01-01 00:00:00+00'::timestamptz + i * interval '1 hour',
       '2026-01-01 00:00:00+00'::timestamptz + i * interval '1 hour' + interval '1 second'
  FROM generate_series(1, 10) AS i;
UPDATE outbox.outbox_message SET published_at = NULL WHERE key = 'k4';          -- pending
UPDATE outbox.outbox_message SET published_at = NULL, parked_at = now() WHERE key = 'k6';  -- parked
SELECT outbox.replay('2026-01-01 02:00+00', '2026-01-01 08:00+00', 'order.events') AS replayed;
SELECT key, published_at IS NULL AS pending_again, parked_at IS NOT NULL AS parked
  FROM outbox.outbox_message WHERE published_at IS NULL ORDER BY id;
SELECT outbox.replay('2026-01-01 00:00+00', '2026-01-01 04:00+00') AS all_topics;
SELECT outbox.replay('2030-01-01 00:00+00', '2031-01-01 00:00+00') AS nothing_then;
SELECT count(*) AS messages, count(DISTINCT message_id) AS ids FROM outbox.outbox_message;

-- Bad input: clear errors.
SELECT outbox.replay(NULL);
SELECT outbox.replay('2026-01-02', '2026-01-01');
SELECT outbox.replay('2026-01-01', NULL);

-- A monitoring role reads the stats and nothing else.
CREATE ROLE regress_outbox_monitor IN ROLE pg_monitor;
SET ROLE regress_outbox_monitor;
SELECT pending >= 0 AS can_read_stats FROM outbox.stats;
SELECT count(*) >= 0 AS can_read_worker_stats FROM outbox.worker_stats;
SELECT count(*) FROM outbox.outbox_message;
SELECT outbox.replay('2026-01-01');
SELECT outbox.write('t', 'k', '{}');
RESET ROLE;
-- ...and a service role that may write cannot replay or read the stats.
CREATE ROLE regress_outbox_writer;
GRANT USAGE ON SCHEMA outbox TO regress_outbox_writer;
GRANT EXECUTE ON FUNCTION outbox.write TO regress_outbox_writer;
SET ROLE regress_outbox_writer;
SELECT outbox.replay('2026-01-01');
SELECT * FROM outbox.stats;
RESET ROLE;
DROP OWNED BY regress_outbox_monitor, regress_outbox_writer;
DROP ROLE regress_outbox_monitor, regress_outbox_writer;

-- Settings a DBA sets: every outbox.* GUC, its default, unit and context.
SELECT name, setting, unit, context FROM pg_settings WHERE name LIKE 'outbox.%' ORDER BY name;

DROP EXTENSION outbox;
