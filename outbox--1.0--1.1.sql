-- pg outbox 1.0 -> 1.1: operating it.  Stats views, retention support,
-- replay.  (CREATE EXTENSION outbox installs 1.0 and runs this script.)

\echo Use "ALTER EXTENSION outbox UPDATE TO '1.1'" to load this file. \quit

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

-- ---- retention ---------------------------------------------------------------
-- The maintenance worker deletes expired processed events and processed
-- inbox rows oldest first; these indexes find them without a scan.
CREATE INDEX ix_processed_event_expires ON outbox.processed_event (expires_at);
ALTER TABLE outbox.inbox_message ADD COLUMN parked_at timestamptz;
CREATE INDEX ix_inbox_message_processed ON outbox.inbox_message (processed_at)
    WHERE processed;

-- A queue table churns: every row is inserted, updated once and later
-- deleted.  Vacuum it after 1% of changes instead of 20%, so that the
-- index of pending rows stays small.
ALTER TABLE outbox.outbox_message SET (autovacuum_vacuum_scale_factor = 0.01,
                                       autovacuum_vacuum_insert_scale_factor = 0.01,
                                       autovacuum_analyze_scale_factor = 0.02);

-- ---- stats -------------------------------------------------------------------
-- Counters of every worker, from shared memory (no table is read).
CREATE FUNCTION outbox._worker_stats(
    OUT role text, OUT worker integer, OUT database text, OUT pid integer,
    OUT started_at timestamptz, OUT last_activity_at timestamptz,
    OUT processed bigint, OUT processed_last_minute bigint, OUT failed bigint,
    OUT parked bigint, OUT batches bigint, OUT in_flight bigint,
    OUT broker_state text, OUT last_error text, OUT last_error_at timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'outbox_worker_stats'
LANGUAGE C VOLATILE STRICT PARALLEL RESTRICTED;

-- One row per worker of every database.  processed: messages published
-- (relay), rows deleted (maintenance), records stored (inbox consumer),
-- messages handled (inbox handler); since the worker started.
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
       maintenance.last_pass_at AS retention_last_pass_at
  FROM queue, inbox, relay, maintenance
  LEFT JOIN last_error ON true;

-- Monitoring roles (postgres_exporter connects as one) may read the stats,
-- and nothing else.
REVOKE ALL ON FUNCTION outbox._worker_stats() FROM PUBLIC;
GRANT USAGE ON SCHEMA outbox TO pg_monitor;
GRANT EXECUTE ON FUNCTION outbox._worker_stats() TO pg_monitor;
GRANT SELECT ON outbox.worker_stats, outbox.stats TO pg_monitor;

-- ---- replay ------------------------------------------------------------------
-- outbox.replay: publishes again the messages written in [since, until)
-- (of one topic, or all) that were published already: a rebuild of
-- a read projection.  They go out as new deliveries with their own
-- message_id, so the event_id header is the same and idempotent consumers
-- drop what they have seen.  Pending and parked messages are left alone;
-- rows deleted by retention cannot be replayed.  published_at then tells
-- when the replay was published.  Returns the number of messages queued.
CREATE FUNCTION outbox.replay(since timestamptz, until timestamptz DEFAULT now(),
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
       SET published_at = NULL, attempts = 0, last_error = NULL
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

REVOKE ALL ON FUNCTION outbox.replay(timestamptz, timestamptz, text) FROM PUBLIC;

-- ---- inbox -------------------------------------------------------------------
-- The inbox: the consumer worker stores every record of
-- outbox.inbox_topics here before anything handles it; the handler worker
-- runs the subscribed handler of each, in arrival order, exactly once.
ALTER TABLE outbox.inbox_message
    ADD COLUMN seq bigint GENERATED ALWAYS AS IDENTITY,   -- arrival order within received_at
    ADD COLUMN next_attempt_at timestamptz;               -- a failed handler call is retried then

-- The few messages being retried (their keys wait behind them).
CREATE INDEX ix_inbox_message_retrying ON outbox.inbox_message (next_attempt_at)
    WHERE NOT processed AND next_attempt_at IS NOT NULL;

-- Which function handles each topic, and as whom it runs.
CREATE TABLE outbox.inbox_subscription (
    topic       text         PRIMARY KEY,
    handler     regprocedure NOT NULL,
    run_as      regrole      NOT NULL,
    created_at  timestamptz  NOT NULL DEFAULT now()
);
SELECT pg_catalog.pg_extension_config_dump('outbox.inbox_subscription', '');

-- NULL when Kafka accepts the topic name, else the reason (the rules of
-- outbox.write()).
CREATE FUNCTION outbox._topic_error(topic text)
RETURNS text
AS 'MODULE_PATHNAME', 'outbox_topic_error'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

-- Wakes the inbox handler when the calling transaction commits.
CREATE FUNCTION outbox._wake_inbox_at_commit()
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_wake_inbox_at_commit'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;

-- outbox.inbox_subscribe: `handler(msg outbox.inbox_message) RETURNS void`
-- handles the records of `topic` (replacing an earlier subscription).  It
-- runs as the role that subscribes, which must be allowed to execute it;
-- its writes and the message's processed flag commit together.  Whoever
-- may write outbox.inbox_subscription may subscribe (by default: the
-- extension's owner only).
CREATE FUNCTION outbox.inbox_subscribe(topic text, handler regprocedure)
RETURNS void
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    why text;
    p pg_proc;
BEGIN
    IF inbox_subscribe.topic IS NULL THEN
        RAISE EXCEPTION 'outbox.inbox_subscribe: topic must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF inbox_subscribe.handler IS NULL THEN
        RAISE EXCEPTION 'outbox.inbox_subscribe: handler must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    why := outbox._topic_error(inbox_subscribe.topic);
    IF why IS NOT NULL THEN
        RAISE EXCEPTION 'outbox.inbox_subscribe: invalid topic "%"', inbox_subscribe.topic
            USING ERRCODE = 'invalid_parameter_value', DETAIL = why || '.';
    END IF;
    SELECT * INTO p FROM pg_proc WHERE oid = inbox_subscribe.handler;
    IF p.pronargs <> 1 OR p.proargtypes[0] <> 'outbox.inbox_message'::regtype
       OR p.prorettype <> 'void'::regtype OR p.proretset OR p.prokind <> 'f' THEN
        RAISE EXCEPTION 'outbox.inbox_subscribe: handler % must take (outbox.inbox_message) and return void',
                        inbox_subscribe.handler
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT has_function_privilege(current_user, inbox_subscribe.handler, 'EXECUTE') THEN
        RAISE EXCEPTION 'outbox.inbox_subscribe: role % may not execute %', current_user,
                        inbox_subscribe.handler
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    INSERT INTO outbox.inbox_subscription AS s (topic, handler, run_as)
    VALUES (inbox_subscribe.topic, inbox_subscribe.handler, current_user::regrole)
    ON CONFLICT ON CONSTRAINT inbox_subscription_pkey
    DO UPDATE SET handler = excluded.handler, run_as = excluded.run_as, created_at = now();
    PERFORM outbox._wake_inbox_at_commit();
END
$$;

-- outbox.inbox_unsubscribe: stops handling `topic` (its records stay and
-- wait).  True when there was a subscription.
CREATE FUNCTION outbox.inbox_unsubscribe(topic text)
RETURNS boolean
LANGUAGE sql VOLATILE STRICT PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH d AS (DELETE FROM outbox.inbox_subscription s WHERE s.topic = $1 RETURNING 1)
    SELECT count(*) > 0 FROM d
$$;

-- outbox.inbox_write: for services that consume Kafka in their own code.
-- Stores a received record in the inbox in the caller's transaction; true
-- when it is new, false for a duplicate (the event_id is known already).
CREATE FUNCTION outbox.inbox_write(event_id uuid, topic text, payload jsonb,
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
    INSERT INTO outbox.inbox_message (event_id, topic, payload, headers)
    VALUES (inbox_write.event_id, inbox_write.topic, inbox_write.payload,
            coalesce(inbox_write.headers, '{}'))
    ON CONFLICT ON CONSTRAINT inbox_message_pkey DO NOTHING;
    IF FOUND THEN
        PERFORM outbox._wake_inbox_at_commit();
    END IF;
    RETURN FOUND;
END
$$;

-- Inbox records whose handler failed outbox.max_attempts times, with the
-- payload (a handler usually fails on what is in it).
CREATE VIEW outbox.inbox_parked AS
    SELECT event_id, topic, key, received_at, parked_at, attempts, last_error, payload
      FROM outbox.inbox_message
     WHERE parked_at IS NOT NULL AND NOT processed;

-- outbox.inbox_retry: puts a parked inbox record back in line.
CREATE FUNCTION outbox.inbox_retry(event_id uuid)
RETURNS boolean
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF inbox_retry.event_id IS NULL THEN
        RAISE EXCEPTION 'outbox.inbox_retry: event_id must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    UPDATE outbox.inbox_message m SET parked_at = NULL, attempts = 0, next_attempt_at = NULL
     WHERE m.event_id = inbox_retry.event_id AND m.parked_at IS NOT NULL AND NOT m.processed;
    IF FOUND THEN
        PERFORM outbox._wake_inbox_at_commit();
        RETURN true;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM outbox.inbox_message m WHERE m.event_id = inbox_retry.event_id) THEN
        RAISE EXCEPTION 'outbox.inbox_retry: no inbox message with event_id %', inbox_retry.event_id
            USING ERRCODE = 'no_data_found';
    END IF;
    RETURN false;
END
$$;

-- outbox._topic_error and outbox._wake_inbox_at_commit stay executable (by
-- roles with USAGE on the schema): inbox_subscribe runs as its caller and
-- uses them; neither reads nor changes data.
REVOKE ALL ON FUNCTION outbox.inbox_subscribe(text, regprocedure) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.inbox_unsubscribe(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.inbox_write(uuid, text, jsonb, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.inbox_retry(uuid) FROM PUBLIC;
