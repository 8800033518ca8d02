-- pg outbox 1.3 -> 1.4: outbox.worker_stats and outbox.stats say what a
-- relay waits for (waiting_for: the standbys outbox.wait_for_standbys names,
-- while they lack a batch's WAL).  outbox--1.4.sql is the same schema written
-- out whole; the upgrade test checks that both give the same objects.

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

-- ---- the stats views gain waiting_for ------------------------------------------
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
