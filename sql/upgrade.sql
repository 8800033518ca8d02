-- ALTER EXTENSION outbox UPDATE from 1.0: data kept, new objects there, and
-- the same schema as a fresh CREATE EXTENSION (outbox--1.2.sql).

-- Every object of the extension, described so that two installs compare.
CREATE FUNCTION pg_temp.outbox_schema() RETURNS SETOF text LANGUAGE sql AS $$
    SELECT 'column ' || c.relname || '.' || a.attname || ' #' || a.attnum || ' '
           || pg_catalog.format_type(a.atttypid, a.atttypmod)
           || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
           || coalesce(' default ' || pg_catalog.pg_get_expr(d.adbin, d.adrelid), '')
           || CASE WHEN a.attidentity <> '' THEN ' identity ' || a.attidentity::text ELSE '' END
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
      JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
      LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
     WHERE n.nspname = 'outbox' AND c.relkind IN ('r', 'v')
    UNION ALL
    SELECT 'relation ' || c.relname || ' ' || c.relkind::text || ' options ' || coalesce(c.reloptions::text, '')
           || ' acl ' || coalesce(c.relacl::text, '')
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = 'outbox' AND c.relkind IN ('r', 'v', 'S')
    UNION ALL
    SELECT 'index ' || pg_catalog.pg_get_indexdef(i.indexrelid)
      FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = 'outbox'
    UNION ALL
    SELECT 'constraint ' || r.conname || ' ' || pg_catalog.pg_get_constraintdef(r.oid)
      FROM pg_constraint r JOIN pg_namespace n ON n.oid = r.connamespace WHERE n.nspname = 'outbox'
    UNION ALL
    SELECT 'view ' || c.relname || ' ' || pg_catalog.pg_get_viewdef(c.oid)
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = 'outbox' AND c.relkind = 'v'
    UNION ALL
    SELECT 'function ' || pg_catalog.pg_get_functiondef(p.oid) || ' acl ' || coalesce(p.proacl::text, '')
      FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'outbox'
    UNION ALL
    SELECT 'dumped ' || t::regclass::text
      FROM pg_extension e, unnest(e.extconfig) AS t WHERE e.extname = 'outbox'
    UNION ALL
    SELECT 'schema acl ' || coalesce(nspacl::text, '') FROM pg_namespace WHERE nspname = 'outbox'
$$;

CREATE EXTENSION outbox;
CREATE TEMP TABLE fresh AS SELECT * FROM pg_temp.outbox_schema() AS d;
DROP EXTENSION outbox;

CREATE EXTENSION outbox VERSION '1.0';
SELECT extversion FROM pg_extension WHERE extname = 'outbox';
SELECT outbox.write('order.events', 'before-upgrade', '{"n": 1}') IS NOT NULL AS wrote;
SELECT outbox.mark_processed('evt-before-upgrade') AS marked;
-- A grant made under 1.0 survives the change of write()'s signature.
CREATE ROLE regress_outbox_old_writer;
GRANT USAGE ON SCHEMA outbox TO regress_outbox_old_writer;
GRANT EXECUTE ON FUNCTION outbox.write(text, text, jsonb, jsonb) TO regress_outbox_old_writer;

-- 1.1 said whoever may write the subscription table may subscribe: such a
-- grant must not survive into 1.2, where only inbox_subscribe() may.
ALTER EXTENSION outbox UPDATE TO '1.1';
CREATE ROLE regress_outbox_old_subscriber;
GRANT INSERT, UPDATE, DELETE ON outbox.inbox_subscription TO regress_outbox_old_subscriber;
-- Inbox records stored before 1.4, when an id was unique per database:
-- the update keeps every one, processed or not.
INSERT INTO outbox.inbox_message (event_id, topic, payload, headers, processed)
VALUES ('00000000-0000-7000-8000-0000000000a1', 'payments.events', '{"n": 1}', '{"trace": "t1"}', true),
       ('00000000-0000-7000-8000-0000000000a2', 'payments.events', '{"n": 2}', '{}', false),
       ('00000000-0000-7000-8000-0000000000a3', 'orders.events', '{"n": 3}', '{}', false);

-- Subscriptions of 1.5, whose handler was a regprocedure (which pg_upgrade
-- refuses): 1.6 keeps each as its qualified signature, and one whose
-- function was dropped as a name that resolves to nothing.
ALTER EXTENSION outbox UPDATE TO '1.5';
CREATE FUNCTION public.regress_keep(m outbox.inbox_message) RETURNS void LANGUAGE sql AS $$ SELECT $$;
CREATE FUNCTION public.regress_gone(m outbox.inbox_message) RETURNS void LANGUAGE sql AS $$ SELECT $$;
SELECT outbox.inbox_subscribe('kept.events', 'public.regress_keep(outbox.inbox_message)');
SELECT outbox.inbox_subscribe('gone.events', 'public.regress_gone(outbox.inbox_message)');
DROP FUNCTION public.regress_gone(outbox.inbox_message);
-- A record without a key under 1.5 stored key '' (which held every keyless
-- record back behind each other): pending, it is NULL after the update.
SELECT outbox.write_bytes('order.events', NULL, '\x0a') IS NOT NULL AS keyless_under_15;
SELECT outbox.write_bytes('order.events', NULL, '\x0b') IS NOT NULL AS keyless_published_under_15;
UPDATE outbox.outbox_message SET published_at = now() WHERE value = '\x0b';
SELECT key = '' AS empty_key FROM outbox.outbox_message WHERE value = '\x0a';

ALTER EXTENSION outbox UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'outbox';
SELECT key IS NULL AS keyless_now_null FROM outbox.outbox_message WHERE value = '\x0a';
-- A published one keeps '' (the update touches no published row) until a
-- replay sends it again: then it is keyless, key NULL, as a new one.
SELECT key = '' AS published_keeps_empty FROM outbox.outbox_message WHERE value = '\x0b';
SELECT outbox.replay(now() - interval '1 hour', now() + interval '1 hour', 'order.events') > 0 AS replayed;
SELECT key IS NULL AS replayed_keyless_null FROM outbox.outbox_message WHERE value = '\x0b';
SELECT topic, CASE WHEN handler LIKE 'outbox."dropped handler %"()' THEN 'outbox."dropped handler <oid>"()'
                   ELSE handler END AS handler,
       to_regprocedure(handler) IS NOT NULL AS resolves, pg_typeof(handler) AS stored_as
  FROM outbox.inbox_subscription ORDER BY topic;
SELECT outbox.inbox_subscribe('gone.events', 'public.regress_keep(outbox.inbox_message)');
SELECT topic, handler FROM outbox.inbox_subscription ORDER BY topic;
SELECT pg_catalog.has_table_privilege('regress_outbox_old_subscriber', 'outbox.inbox_subscription',
                                      'INSERT, UPDATE, DELETE') AS old_subscriber_may_write;

-- The rows written under 1.0 are all there, and 1.2's objects work.
SELECT key, payload, is_binary FROM outbox.outbox_message;
SELECT outbox.mark_processed('evt-before-upgrade') AS marked_again;
SELECT pending FROM outbox.stats;
SELECT outbox.replay('2000-01-01') AS replayed;
-- The inbox records are all there, as they were (their headers' bytes were
-- not kept before 1.4: NULL).  An id is unique per topic now: the same id
-- on another topic is another record, on the same topic a duplicate.
SELECT event_id, topic, payload, headers, processed, header_names IS NULL AS no_header_bytes
  FROM outbox.inbox_message ORDER BY event_id, topic;
SELECT outbox.inbox_write('00000000-0000-7000-8000-0000000000a3', 'payments.events', '{"n": 4}',
                          '{"trace": "t4"}') AS same_id_other_topic;
SELECT outbox.inbox_write('00000000-0000-7000-8000-0000000000a3', 'orders.events', '{"n": 5}')
       AS same_id_same_topic;
SELECT topic, payload, header_names, header_values FROM outbox.inbox_message
 WHERE event_id = '00000000-0000-7000-8000-0000000000a3' ORDER BY topic;
SELECT outbox.write('order.events', 'after-upgrade', '{"n": 2}', partition => 1) IS NOT NULL AS wrote;
SELECT outbox.write_bytes('order.events', 'k'::bytea, NULL) IS NOT NULL AS tombstone;
SELECT count(*) FROM outbox.outbox_message;
SET ROLE regress_outbox_old_writer;
SELECT outbox.write('order.events', 'by-old-grant', '{}') IS NOT NULL AS still_may_write;
RESET ROLE;

-- The upgraded schema is the fresh one, object for object (no rows: none
-- differs), once the test's own grants are gone.
REVOKE ALL ON FUNCTION outbox.write(text, text, jsonb, jsonb, integer) FROM regress_outbox_old_writer;
REVOKE ALL ON SCHEMA outbox FROM regress_outbox_old_writer;
CREATE TEMP TABLE upgraded AS SELECT * FROM pg_temp.outbox_schema() AS d;
(SELECT 'only fresh' AS side, d FROM fresh EXCEPT SELECT 'only fresh', d FROM upgraded)
UNION ALL
(SELECT 'only upgraded', d FROM upgraded EXCEPT SELECT 'only upgraded', d FROM fresh)
ORDER BY 1, 2;
SELECT count(*) > 50 AS compared_many_objects FROM fresh;

-- Every object of the extension, as the update leaves it.  (From 17 on, the
-- row types of its tables and views, and their array types, are members
-- too; they come and go with their relations and are left out here.)
SELECT pg_describe_object(classid, objid, 0) AS object
  FROM pg_depend
 WHERE refclassid = 'pg_extension'::regclass
   AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'outbox')
   AND deptype = 'e'
   AND NOT (classid = 'pg_type'::regclass AND EXISTS (
         SELECT FROM pg_type t LEFT JOIN pg_type e ON e.oid = t.typelem
          WHERE t.oid = objid AND (t.typrelid <> 0 OR e.typrelid <> 0)))
 ORDER BY 1;

DROP FUNCTION public.regress_keep(outbox.inbox_message);
DROP EXTENSION outbox;
DROP OWNED BY regress_outbox_old_writer;
DROP ROLE regress_outbox_old_writer;
DROP OWNED BY regress_outbox_old_subscriber;
DROP ROLE regress_outbox_old_subscriber;
