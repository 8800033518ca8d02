-- pg outbox 1.5 -> 1.6: a published message keeps where Kafka wrote its
-- record (published_partition, published_offset: the relay marks a row only
-- with the offset of its acknowledgement), and outbox.message_status()
-- answers "where is my message?"; a subscription keeps its handler as text,
-- so that pg_upgrade passes.  outbox--1.6.sql is the same schema
-- written out whole; the upgrade test checks that both give the same
-- objects.  Every existing row is kept; rows published before keep NULL
-- places.

\echo Use "ALTER EXTENSION outbox UPDATE TO '1.6'" to load this file. \quit

-- The extension's schema must be one that no other role controls
-- (CVE-2022-2625, CVE-2023-39417): a superuser owns it, no other role may
-- create in it, and nothing in it belongs to a role that is not a
-- superuser.  Otherwise nothing is installed or changed: every name below
-- would resolve into it.  Every operator here is pg_catalog's, by name.
DO $guard$
DECLARE
    why text;
BEGIN
    SELECT CASE
             WHEN NOT o.rolsuper THEN
                 pg_catalog.format('it is owned by role %I, which is not a superuser', o.rolname)
             WHEN EXISTS (SELECT FROM pg_catalog.aclexplode(n.nspacl) a
                            LEFT JOIN pg_catalog.pg_roles g ON g.oid OPERATOR(pg_catalog.=) a.grantee
                           WHERE a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'
                             AND NOT coalesce(g.rolsuper, false)) THEN
                 'a role that is not a superuser may create objects in it'
             WHEN EXISTS (SELECT FROM pg_catalog.pg_depend d
                            JOIN pg_catalog.pg_shdepend s
                              ON s.classid OPERATOR(pg_catalog.=) d.classid
                             AND s.objid OPERATOR(pg_catalog.=) d.objid
                             AND s.deptype OPERATOR(pg_catalog.=) 'o'
                             AND s.dbid OPERATOR(pg_catalog.=)
                                 (SELECT b.oid FROM pg_catalog.pg_database b
                                   WHERE b.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
                            JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) s.refobjid
                           WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_namespace'::pg_catalog.regclass
                             AND d.refobjid OPERATOR(pg_catalog.=) n.oid
                             AND NOT r.rolsuper) THEN
                 'it holds objects of a role that is not a superuser'
           END
      INTO why
      FROM pg_catalog.pg_namespace n
      JOIN pg_catalog.pg_roles o ON o.oid OPERATOR(pg_catalog.=) n.nspowner
     WHERE n.nspname OPERATOR(pg_catalog.=) 'outbox';
    IF why IS NOT NULL THEN
        RAISE EXCEPTION 'pg outbox: schema "outbox" is not the extension''s own: %', why
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Drop that schema, or have a superuser own it after checking what it '
                         'holds, and run the command again (see the README, Security).';
    END IF;
END
$guard$;

ALTER TABLE outbox.outbox_message
    ADD COLUMN published_partition integer,
    ADD COLUMN published_offset    bigint;

-- pg_upgrade refuses a table with a regprocedure column, and function oids
-- would not survive it anyway: a subscription keeps its handler's
-- signature as schema-qualified text instead, resolved by name when the
-- workers read it, and the role that owned the function then
-- (handler_owner): a function of another owner found later under the same
-- signature is not run.  A subscription whose function no longer exists
-- keeps a name that resolves to nothing and says so.  The view that shows the
-- column is made again around the change.
CREATE FUNCTION outbox._handler_signature(h regprocedure) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog AS $$
    SELECT CASE WHEN EXISTS (SELECT FROM pg_catalog.pg_proc p WHERE p.oid OPERATOR(pg_catalog.=) h)
                THEN h::pg_catalog.text
                ELSE pg_catalog.format('outbox.%I()', 'dropped handler ' OPERATOR(pg_catalog.||) h::pg_catalog.oid::pg_catalog.text)
           END
$$;
DROP VIEW outbox.inbox_stats;
ALTER TABLE outbox.inbox_subscription ADD COLUMN handler_owner regrole;
UPDATE outbox.inbox_subscription s
   SET handler_owner = (SELECT p.proowner FROM pg_catalog.pg_proc p
                         WHERE p.oid OPERATOR(pg_catalog.=) s.handler);
ALTER TABLE outbox.inbox_subscription
    ALTER COLUMN handler TYPE text USING outbox._handler_signature(handler);
DROP FUNCTION outbox._handler_signature(regprocedure);
CREATE OR REPLACE VIEW outbox.inbox_stats AS
    SELECT s.topic, s.handler, s.owner,
           (SELECT count(*) FROM outbox.inbox_message m
             WHERE NOT m.processed AND m.topic = s.topic AND m.parked_at IS NULL) AS waiting,
           (SELECT extract(epoch FROM pg_catalog.clock_timestamp() - min(m.received_at))
              FROM outbox.inbox_message m
             WHERE NOT m.processed AND m.topic = s.topic AND m.parked_at IS NULL)::double precision
               AS oldest_waiting_seconds,
           (SELECT count(*) FROM outbox.inbox_message m
             WHERE NOT m.processed AND m.topic = s.topic AND m.parked_at IS NOT NULL) AS parked,
           (SELECT count(*) FROM outbox.inbox_message m
             WHERE m.processed AND m.topic = s.topic
               AND m.processed_at > pg_catalog.clock_timestamp() - interval '10 seconds')::double precision
               / 10 AS handled_per_second,
           coalesce((SELECT i.derived_event_ids FROM outbox.inbox_intake i WHERE i.topic = s.topic),
                    0) AS derived_event_ids,
           (SELECT i.last_note FROM outbox.inbox_intake i WHERE i.topic = s.topic)
               AS last_intake_note,
           (SELECT i.last_note_at FROM outbox.inbox_intake i WHERE i.topic = s.topic)
               AS last_intake_note_at
      FROM outbox.inbox_subscription s;
GRANT SELECT ON outbox.inbox_stats TO pg_monitor;

-- A replayed message forgets where its last copy went.
CREATE OR REPLACE FUNCTION outbox.replay(since timestamptz, until timestamptz DEFAULT now(),
                              topic text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n bigint;
BEGIN
    IF replay.since IS NULL THEN
        RAISE EXCEPTION 'outbox.replay: since must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF replay.until IS NULL THEN
        RAISE EXCEPTION 'outbox.replay: until must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF replay.until < replay.since THEN
        RAISE EXCEPTION 'outbox.replay: until (%) is before since (%)', replay.until, replay.since
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE outbox.outbox_message m
       SET published_at = NULL, published_partition = NULL, published_offset = NULL,
           attempts = 0, last_error = NULL, next_attempt_at = NULL,
           -- a keyless record of before 1.6 kept key '': none orders it now
           key = CASE WHEN m.is_binary AND m.key_bytes IS NULL THEN NULL ELSE m.key END
     WHERE m.published_at IS NOT NULL
       AND m.created_at >= replay.since AND m.created_at < replay.until
       AND (replay.topic IS NULL OR m.topic = replay.topic);
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        PERFORM outbox._wake_relay_at_commit();
    END IF;
    RETURN n;
END
$$;


-- Where a message is: pending, waiting for a retry, parked or published,
-- and for a published one the partition and offset Kafka gave its record.
-- Plain SQL with the caller's rights: whoever may read the table may ask.
CREATE FUNCTION outbox.message_status(message_id uuid)
RETURNS TABLE (message_id uuid, topic text, state text, attempts integer, last_error text,
               created_at timestamptz, published_at timestamptz, next_attempt_at timestamptz,
               kafka_partition integer, kafka_offset bigint)
LANGUAGE sql STABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT m.message_id, m.topic,
           CASE WHEN m.published_at IS NOT NULL THEN 'published'
                WHEN m.parked_at IS NOT NULL THEN 'parked'
                WHEN m.next_attempt_at IS NOT NULL THEN 'waiting'
                ELSE 'pending' END,
           m.attempts, m.last_error, m.created_at, m.published_at, m.next_attempt_at,
           m.published_partition, m.published_offset
      FROM outbox.outbox_message m
     WHERE m.message_id OPERATOR(pg_catalog.=) message_status.message_id
$$;

-- A key's order is per (topic, key), and a record without a key orders
-- nothing: outbox.write_bytes() without a key stores key NULL (before, '',
-- which held back and was held back by every other keyless record, and by
-- outbox.write() messages whose key is ''). The pending and parked keyless
-- rows move to NULL; published ones keep '' (nothing orders them anymore).
ALTER TABLE outbox.outbox_message ALTER COLUMN key DROP NOT NULL;
UPDATE outbox.outbox_message SET key = NULL
 WHERE published_at IS NULL AND is_binary AND key_bytes IS NULL AND key = '';
-- The waiting rows hold back their key on their topic only: the index that
-- finds them has the topic too (a small index: only rows that wait).
DROP INDEX outbox.ix_outbox_message_waiting;
CREATE INDEX ix_outbox_message_waiting ON outbox.outbox_message (key, topic, id)
    WHERE published_at IS NULL AND next_attempt_at IS NOT NULL;
