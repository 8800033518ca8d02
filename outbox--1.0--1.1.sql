-- pg outbox 1.0 -> 1.1: operating it.  Stats views, retention support,
-- replay.  (CREATE EXTENSION outbox installs 1.0 and runs this script.)

\echo Use "ALTER EXTENSION outbox UPDATE TO '1.1'" to load this file. \quit

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
-- (of one topic, or all) that were published already: the seed's rebuild of
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
