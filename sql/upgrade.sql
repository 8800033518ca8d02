-- ALTER EXTENSION outbox UPDATE from 1.0: data kept, new objects there.
CREATE EXTENSION outbox VERSION '1.0';
SELECT extversion FROM pg_extension WHERE extname = 'outbox';
SELECT outbox.write('order.events', 'before-upgrade', '{"n": 1}') IS NOT NULL AS wrote;
SELECT outbox.mark_processed('evt-before-upgrade') AS marked;

ALTER EXTENSION outbox UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'outbox';

-- The rows written under 1.0 are all there, and 1.1's objects work.
SELECT key, payload FROM outbox.outbox_message;
SELECT outbox.mark_processed('evt-before-upgrade') AS marked_again;
SELECT pending FROM outbox.stats;
SELECT outbox.replay('2000-01-01') AS replayed;
SELECT outbox.write('order.events', 'after-upgrade', '{"n": 2}') IS NOT NULL AS wrote;
SELECT count(*) FROM outbox.outbox_message;

-- Every object of the extension, as the update leaves it.
SELECT pg_describe_object(classid, objid, 0) AS object
  FROM pg_depend
 WHERE refclassid = 'pg_extension'::regclass
   AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'outbox')
   AND deptype = 'e'
 ORDER BY 1;

DROP EXTENSION outbox;
