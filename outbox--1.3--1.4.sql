-- pg outbox 1.3 -> 1.4: the relay can wait for standbys (waiting_for in
-- outbox.worker_stats and outbox.stats), and the inbox keeps what it
-- received exactly (ids per topic, headers as bytes).  outbox--1.4.sql is
-- the same schema written out whole; the upgrade test checks that both give
-- the same objects.  Each change is a block of its own, between its ==== begin
-- / end lines.

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

-- ==== wait for standbys (waiting_for): begin ====
-- The function's result type changes, so it and the views on it are made
-- again (a view of the user's own on outbox.stats or outbox.worker_stats
-- must be dropped before the update and made again after it).
DROP VIEW outbox.stats;
DROP VIEW outbox.worker_stats;
DROP FUNCTION outbox._worker_stats();

-- Counters of every worker, from shared memory (no table is read).
CREATE FUNCTION outbox._worker_stats(
    OUT role text, OUT worker integer, OUT database text, OUT pid integer,
    OUT started_at timestamptz, OUT last_activity_at timestamptz,
    OUT processed bigint, OUT processed_last_minute bigint, OUT failed bigint,
    OUT parked bigint, OUT batches bigint, OUT in_flight bigint,
    OUT broker_state text, OUT last_error text, OUT last_error_at timestamptz,
    OUT waiting_for text)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'outbox_worker_stats'
LANGUAGE C VOLATILE STRICT PARALLEL RESTRICTED;

-- One row per worker of every database.  processed: messages published
-- (relay), rows deleted (maintenance), records stored (inbox consumer),
-- messages handled (inbox handler); since the worker started.  waiting_for:
-- what the worker's work waits for, when it waits (a relay holding batches
-- until the standbys outbox.wait_for_standbys names have their WAL).
CREATE VIEW outbox.worker_stats AS
    SELECT * FROM outbox._worker_stats() ORDER BY database, role, worker;

-- One row for this database: the queue as the table has it, and the
-- workers' counters summed.  The counts read only pending (unpublished)
-- rows through the partial indexes: the cost follows the backlog, never
-- the size of the table.
CREATE VIEW outbox.stats AS
WITH w AS (
    SELECT * FROM outbox._worker_stats() WHERE database = pg_catalog.current_database()
), relay AS (
    SELECT count(*) AS workers,
           CASE WHEN bool_or(broker_state = 'down') THEN 'down'
                WHEN bool_and(broker_state = 'up') THEN 'up'
                ELSE 'unknown' END AS broker_state,
           coalesce(sum(in_flight), 0)::bigint AS in_flight,
           coalesce(sum(processed_last_minute), 0)::bigint AS published_last_minute,
           coalesce(sum(processed), 0)::bigint AS published_since_start,
           coalesce(sum(failed), 0)::bigint AS retries,
           coalesce(sum(parked), 0)::bigint AS parked_since_start,
           max(last_activity_at) AS last_batch_at
      FROM w WHERE role = 'relay'
), waiting AS (
    SELECT pg_catalog.string_agg(DISTINCT waiting_for, '; ') AS waiting_for
      FROM w WHERE role = 'relay'
), last_error AS (
    SELECT last_error, last_error_at FROM w
     WHERE last_error IS NOT NULL ORDER BY last_error_at DESC LIMIT 1
), maintenance AS (
    SELECT coalesce(sum(processed), 0)::bigint AS deleted, max(last_activity_at) AS last_pass_at
      FROM w WHERE role = 'maintenance'
), queue AS (
    SELECT count(*) FILTER (WHERE parked_at IS NULL) AS pending,
           count(*) FILTER (WHERE parked_at IS NOT NULL) AS parked,
           min(created_at) FILTER (WHERE parked_at IS NULL) AS oldest_pending_at
      FROM outbox.outbox_message WHERE published_at IS NULL
), inbox AS (
    SELECT count(*) FILTER (WHERE parked_at IS NULL) AS pending,
           count(*) FILTER (WHERE parked_at IS NOT NULL) AS parked
      FROM outbox.inbox_message WHERE NOT processed
)
SELECT queue.pending,
       coalesce(extract(epoch FROM pg_catalog.clock_timestamp() - queue.oldest_pending_at), 0)
           ::double precision AS lag_seconds,
       queue.parked,
       relay.published_last_minute,
       relay.published_since_start,
       relay.retries,
       relay.parked_since_start,
       relay.in_flight,
       relay.workers AS relay_workers,
       CASE WHEN relay.workers = 0 THEN 'no relay' ELSE relay.broker_state END AS broker_state,
       relay.last_batch_at,
       last_error.last_error,
       last_error.last_error_at,
       inbox.pending AS inbox_pending,
       inbox.parked AS inbox_parked,
       maintenance.deleted AS retention_deleted_since_start,
       maintenance.last_pass_at AS retention_last_pass_at,
       waiting.waiting_for
  FROM queue, inbox, relay, maintenance, waiting
  LEFT JOIN last_error ON true;

-- Monitoring roles (postgres_exporter connects as one) may read the stats,
-- and nothing else.
REVOKE ALL ON FUNCTION outbox._worker_stats() FROM PUBLIC;
GRANT USAGE ON SCHEMA outbox TO pg_monitor;
GRANT EXECUTE ON FUNCTION outbox._worker_stats() TO pg_monitor;
GRANT SELECT ON outbox.worker_stats, outbox.stats TO pg_monitor;
-- ==== wait for standbys: end ====

-- ==== the inbox keeps what it received, exactly: begin ====
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
-- ==== the inbox keeps what it received: end ====
