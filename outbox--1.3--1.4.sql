-- pg outbox 1.3 -> 1.4.  outbox--1.4.sql is the same schema written out
-- whole; the upgrade test checks that both give the same objects.  Each
-- change is a block of its own, between its ==== begin / end lines.

\echo Use "ALTER EXTENSION outbox UPDATE TO '1.4'" to load this file. \quit

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

-- ==== issue 30, the inbox keeps what it received, exactly: begin ====
-- An inbox record is unique per (event_id, topic), no longer per event_id:
-- the same id on two topics is two records, each handled once (a producer
-- of one topic can no longer make the inbox drop another topic's record).
-- Rows stored before hold each id once per database: nothing to split.
-- The key leads with event_id, so a look-up by event_id alone still uses it.
ALTER TABLE outbox.inbox_message DROP CONSTRAINT inbox_message_pkey;
ALTER TABLE outbox.inbox_message ADD CONSTRAINT inbox_message_pkey PRIMARY KEY (event_id, topic);

-- The record's headers as Kafka carried them, in order, repeats included:
-- names and values as bytes (a NULL value: a header without one), beside
-- the readable `headers` object.  NULL for rows stored before 1.4.
ALTER TABLE outbox.inbox_message ADD COLUMN header_names bytea[], ADD COLUMN header_values bytea[];

-- Records whose event_id header the consumer could not use as their id
-- (empty, not UTF-8, not a UUID), per topic: they are stored with an id
-- derived from their place in Kafka, and outbox.inbox_stats says so.  The
-- notes are the consumer's own words: never a header's or a record's data.
CREATE TABLE outbox.inbox_intake (
    topic              text        PRIMARY KEY,
    derived_event_ids  bigint      NOT NULL DEFAULT 0,
    last_note          text,
    last_note_at       timestamptz
);
REVOKE ALL ON outbox.inbox_intake FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('outbox.inbox_intake', '');

-- outbox.inbox_write: for services that consume Kafka in their own code.
-- Stores a received record in the inbox in the caller's transaction; true
-- when it is new, false for a duplicate (the event_id is known already for
-- this topic).  The headers' bytes are their UTF-8.
CREATE OR REPLACE FUNCTION outbox.inbox_write(event_id uuid, topic text, payload jsonb,
                                              headers jsonb DEFAULT '{}')
RETURNS boolean
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    why text;
    bad text;
BEGIN
    IF inbox_write.event_id IS NULL THEN
        RAISE EXCEPTION 'outbox.inbox_write: event_id must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF inbox_write.topic IS NULL THEN
        RAISE EXCEPTION 'outbox.inbox_write: topic must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF inbox_write.payload IS NULL THEN
        RAISE EXCEPTION 'outbox.inbox_write: payload must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    why := outbox._topic_error(inbox_write.topic);
    IF why IS NOT NULL THEN
        RAISE EXCEPTION 'outbox.inbox_write: invalid topic "%"', inbox_write.topic
            USING ERRCODE = 'invalid_parameter_value', DETAIL = why || '.';
    END IF;
    IF inbox_write.headers IS NOT NULL THEN
        IF jsonb_typeof(inbox_write.headers) <> 'object' THEN
            RAISE EXCEPTION 'outbox.inbox_write: headers must be a JSON object of strings'
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = 'The headers are a JSON ' || jsonb_typeof(inbox_write.headers) || '.';
        END IF;
        SELECT h.key INTO bad FROM jsonb_each(inbox_write.headers) AS h
         WHERE jsonb_typeof(h.value) <> 'string' LIMIT 1;
        IF bad IS NOT NULL THEN
            RAISE EXCEPTION 'outbox.inbox_write: headers must be a JSON object of strings'
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = 'Header "' || bad || '" is not a string.';
        END IF;
    END IF;
    INSERT INTO outbox.inbox_message (event_id, topic, payload, value, headers, header_names,
                                      header_values)
    SELECT inbox_write.event_id, inbox_write.topic, inbox_write.payload,
           convert_to(inbox_write.payload::text, 'UTF8'), coalesce(inbox_write.headers, '{}'),
           coalesce(array_agg(convert_to(h.key, 'UTF8') ORDER BY h.key), '{}'),
           coalesce(array_agg(convert_to(h.value, 'UTF8') ORDER BY h.key), '{}')
      FROM jsonb_each_text(coalesce(inbox_write.headers, '{}')) AS h
    ON CONFLICT ON CONSTRAINT inbox_message_pkey DO NOTHING;
    IF FOUND THEN
        PERFORM outbox._wake_inbox_at_commit();
    END IF;
    RETURN FOUND;
END
$$;

-- outbox.inbox_retry(event_id, topic): puts the parked record of `topic`
-- with that id back in line (inbox_retry(event_id) puts back every parked
-- record with that id, of any topic).
CREATE FUNCTION outbox.inbox_retry(event_id uuid, topic text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF inbox_retry.event_id IS NULL OR inbox_retry.topic IS NULL THEN
        RAISE EXCEPTION 'outbox.inbox_retry: event_id and topic must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    UPDATE outbox.inbox_message m SET parked_at = NULL, attempts = 0, next_attempt_at = NULL
     WHERE m.event_id = inbox_retry.event_id AND m.topic = inbox_retry.topic
       AND m.parked_at IS NOT NULL AND NOT m.processed;
    IF FOUND THEN
        PERFORM outbox._wake_inbox_at_commit();
        RETURN true;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM outbox.inbox_message m
                    WHERE m.event_id = inbox_retry.event_id AND m.topic = inbox_retry.topic) THEN
        RAISE EXCEPTION 'outbox.inbox_retry: no inbox message with event_id % in topic "%"',
                        inbox_retry.event_id, inbox_retry.topic
            USING ERRCODE = 'no_data_found';
    END IF;
    RETURN false;
END
$$;
REVOKE ALL ON FUNCTION outbox.inbox_retry(uuid, text) FROM PUBLIC;

-- Per subscribed topic: what waits, how fast it is handled, what is parked,
-- and how many records came with an event_id header that could not be their
-- id (the consumer's note says why, in its own words).
-- (handled_per_second counts the last 10 seconds.)
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
-- ==== issue 30: end ====
