-- pg outbox 1.5: the whole schema, as CREATE EXTENSION outbox installs it.
-- The schema "outbox" is created by CREATE EXTENSION (outbox.control:
-- schema = outbox); one that exists already is refused unless no role but
-- a superuser controls it (below).  Databases on an earlier version move
-- here with ALTER EXTENSION outbox UPDATE (outbox--1.0--1.1.sql,
-- outbox--1.1--1.2.sql, outbox--1.2--1.3.sql, outbox--1.3--1.4.sql,
-- outbox--1.4--1.5.sql); the
-- upgrade test checks that both ways give the same objects.

\echo Use "CREATE EXTENSION outbox" to load this file. \quit

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

-- Nothing in this schema is granted to PUBLIC.  A service role gets
--   GRANT USAGE ON SCHEMA outbox TO svc;
--   GRANT EXECUTE ON FUNCTION outbox.write TO svc;
-- and never needs (nor gets) direct access to the tables.
REVOKE ALL ON SCHEMA outbox FROM PUBLIC;

-- ==== tables =====================================================================

-- Messages written by services, published by the relay workers.  Rows stay
-- after publication (audit, replay); only the retention pass deletes them.
CREATE TABLE outbox.outbox_message (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY WITH (fillfactor = 50),
    message_id    uuid        NOT NULL UNIQUE WITH (fillfactor = 50),
    topic         text        NOT NULL,
    -- What orders the message among its topic's messages of the same key
    -- (NULL: a write_bytes() record without a key, ordered by nothing).
    key           text,
    payload       jsonb       NOT NULL,
    headers       jsonb       NOT NULL DEFAULT '{}',
    created_at    timestamptz NOT NULL DEFAULT now(),
    published_at  timestamptz,
    -- bookkeeping of the relay: deliveries Kafka refused, the last error
    -- text librdkafka gave, and when the relay gave up on the message
    -- (after outbox.max_attempts refusals; outbox.retry() puts it back).
    attempts      integer     NOT NULL DEFAULT 0,
    last_error    text,
    parked_at     timestamptz,
    -- A message of outbox.write_bytes() is the Kafka record's bytes:
    -- key_bytes (NULL: no key) and value (NULL: a tombstone); its payload
    -- is JSON null.  kafka_partition: the partition the caller asked for
    -- (NULL: by key).
    is_binary     boolean     NOT NULL DEFAULT false,
    key_bytes     bytea,
    value         bytea,
    kafka_partition integer,
    -- A message Kafka refused for good waits until then for its next
    -- attempt; the later messages of its key wait behind it, every other
    -- message goes on (NULL: not waiting).
    next_attempt_at timestamptz,
    -- Where Kafka wrote the published message's record: the partition and
    -- offset of its acknowledgement (schema 1.6; NULL while pending, for
    -- rows published before 1.6, and for rows exactly-once recovery marked
    -- from the progress topic).  A success without an offset is no success.
    published_partition integer,
    published_offset    bigint
);

-- The relay scans only this index: it holds the pending rows, in id order.
CREATE INDEX ix_outbox_message_unpublished ON outbox.outbox_message (id)
    WHERE published_at IS NULL;

-- The few messages waiting for a retry after Kafka refused them: the
-- relay finds the (key, topic) pairs they hold back, and when the next one
-- is due, without walking the pending rows.  The topic is in the index: a
-- role's waiting rows of a key on its topic cost nothing to another topic's
-- rows of that key.
CREATE INDEX ix_outbox_message_waiting ON outbox.outbox_message (key, topic, id)
    WHERE published_at IS NULL AND next_attempt_at IS NOT NULL;
CREATE INDEX ix_outbox_message_retry_at ON outbox.outbox_message (next_attempt_at)
    WHERE published_at IS NULL AND next_attempt_at IS NOT NULL;

-- outbox.replay() finds a window of created_at through this (a few pages
-- for millions of rows; rows are written in time order).
CREATE INDEX ix_outbox_message_created ON outbox.outbox_message USING brin (created_at);

-- A queue table churns: every row is inserted, updated once and later
-- deleted.  Vacuum it after 1% of changes instead of 20%, so that the
-- index of pending rows stays small.
ALTER TABLE outbox.outbox_message SET (autovacuum_vacuum_scale_factor = 0.01,
                                       autovacuum_vacuum_insert_scale_factor = 0.01,
                                       autovacuum_analyze_scale_factor = 0.02);

-- Each row is updated once, by its mark (published_at).  The partial index
-- on published_at makes that update non-HOT, but with half of each page
-- kept free the new version stays on its page: the mark's WAL record then
-- holds only the bytes that changed (86 bytes against 375 for the
-- benchmark's rows), needs no lock record before it, and the mark never
-- extends the table.
ALTER TABLE outbox.outbox_message SET (fillfactor = 50);
--
-- A non-HOT update also adds an entry to each btree index for the row's new
-- version: the primary key and message_id (both fillfactor = 50, above).
-- Their leaf pages fill at the right edge as messages are written; kept half
-- full there, each page has room for the marks' entries of its own rows, so
-- a mark does not split it (at 90%, every leaf page split once: a new page
-- and its WAL for every few hundred marks).  Writers split twice as
-- often, at the right edge, where a split is cheap.

-- Consumer-side deduplication (outbox.mark_processed).
CREATE TABLE outbox.processed_event (
    event_id      text        PRIMARY KEY,
    topic         text,
    processed_at  timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL
);

-- The maintenance worker deletes expired processed events and processed
-- inbox rows oldest first; these indexes find them without a scan.
CREATE INDEX ix_processed_event_expires ON outbox.processed_event (expires_at);

-- The inbox: Kafka records stored before they are handled.  The consumer
-- worker stores every record of outbox.inbox_topics here; the handler
-- workers run the subscribed handler of each, in arrival order, exactly once.
CREATE TABLE outbox.inbox_message (
    event_id         uuid        NOT NULL,
    received_at      timestamptz NOT NULL DEFAULT now(),
    topic            text        NOT NULL,
    key              text,
    payload          jsonb       NOT NULL,
    headers          jsonb       NOT NULL DEFAULT '{}',
    kafka_partition  integer,
    kafka_offset     bigint,
    processed        boolean     NOT NULL DEFAULT false,
    processed_at     timestamptz,
    attempts         integer     NOT NULL DEFAULT 0,
    last_error       text,
    parked_at        timestamptz,
    seq              bigint      GENERATED ALWAYS AS IDENTITY,  -- arrival order within received_at
    next_attempt_at  timestamptz,                               -- a failed handler call is retried then
    -- The record's exact bytes beside what handlers read: value (NULL: a
    -- tombstone) and key_bytes (NULL: no key); and its time in Kafka.
    value            bytea,
    key_bytes        bytea,
    kafka_timestamp  timestamptz,                               -- the record's time in Kafka
    -- ==== issue 30, the inbox keeps what it received, exactly: begin ====
    -- The record's headers as Kafka carried them, in order, repeats
    -- included: names and values as bytes (a NULL value: a header without
    -- one), beside the readable `headers` object.  NULL for rows stored
    -- before 1.4.
    header_names     bytea[],
    header_values    bytea[],
    -- A record is unique per (event_id, topic): the same id on two topics
    -- is two records, each handled once.  The key leads with event_id, so a
    -- look-up by event_id alone still uses it.
    CONSTRAINT inbox_message_pkey PRIMARY KEY (event_id, topic)
    -- ==== issue 30: end ====
);

CREATE INDEX ix_inbox_message_unprocessed ON outbox.inbox_message (received_at)
    WHERE NOT processed;
CREATE INDEX ix_inbox_message_processed ON outbox.inbox_message (processed_at)
    WHERE processed;
-- The few messages being retried (their keys wait behind them).
CREATE INDEX ix_inbox_message_retrying ON outbox.inbox_message (next_attempt_at)
    WHERE NOT processed AND next_attempt_at IS NOT NULL;
-- Each topic's waiting records in arrival order: a topic's handler claims
-- without walking the other topics' backlog.
CREATE INDEX ix_inbox_message_unprocessed_topic ON outbox.inbox_message (topic, received_at, seq)
    WHERE NOT processed;

-- Which function handles each topic, and who subscribed it (its owner).
-- A handler runs as the role that owns the function; only
-- outbox.inbox_subscribe() writes here (see it for who may).  handler is
-- the function's signature as text, schema-qualified
-- ('public.handle(outbox.inbox_message)'), resolved by name each time the
-- workers read the subscriptions: function oids do not survive pg_upgrade,
-- and pg_upgrade refuses a table that stores a regprocedure (schema 1.6;
-- before, the column was one).  A handler dropped or renamed since is
-- reported by name, and its records wait.
CREATE TABLE outbox.inbox_subscription (
    topic       text         PRIMARY KEY,
    handler     text         NOT NULL,
    owner       regrole      NOT NULL,
    created_at  timestamptz  NOT NULL DEFAULT now(),
    -- The role that owned the handler when it was subscribed: a function
    -- found later under the same signature but owned by another role (the
    -- handler was dropped, and someone who may create in its schema made
    -- one) is not run (schema 1.6; NULL for a subscription whose function
    -- was already gone when the schema was updated).
    handler_owner regrole
);
REVOKE ALL ON outbox.inbox_subscription FROM PUBLIC;

-- pg_dump keeps the rows of these tables (user data, not part of the
-- extension's definition) and the sequences' positions, so that a restored
-- database goes on with the next id instead of failing on the primary key.
SELECT pg_catalog.pg_extension_config_dump('outbox.outbox_message', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.processed_event', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.inbox_message', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.inbox_subscription', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.outbox_message_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.inbox_message_seq_seq', '');

-- ==== the outbox =================================================================

-- outbox.write: insert one message in the caller's transaction.  Commit
-- publishes it, rollback discards it.  Returns the message_id, which Kafka
-- consumers see as the "event_id" header unless the caller set one.
CREATE FUNCTION outbox.write(topic text, key text, payload jsonb,
                             headers jsonb DEFAULT '{}', "partition" integer DEFAULT NULL)
RETURNS uuid
AS 'MODULE_PATHNAME', 'outbox_write'
LANGUAGE C VOLATILE CALLED ON NULL INPUT SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp;

-- outbox.write_bytes: a message that is a Kafka record's bytes (Avro,
-- Protobuf, a tombstone).  outbox.confluent_frame: the schema registry's
-- framing of an encoded body.
CREATE FUNCTION outbox.write_bytes(topic text, key bytea, value bytea,
                                   headers jsonb DEFAULT '{}', "partition" integer DEFAULT NULL)
RETURNS uuid
AS 'MODULE_PATHNAME', 'outbox_write_bytes'
LANGUAGE C VOLATILE CALLED ON NULL INPUT SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION outbox.confluent_frame(schema_id integer, body bytea)
RETURNS bytea
AS 'MODULE_PATHNAME', 'outbox_confluent_frame'
LANGUAGE C IMMUTABLE CALLED ON NULL INPUT PARALLEL SAFE;

-- outbox.mark_processed: the idempotent-consumer check.  True the first time
-- an event id is seen within its ttl (the caller goes on processing in the
-- same transaction), false for a duplicate.  Two transactions racing on one
-- id never both get true once both commit: the second waits for the first
-- on the primary key and then sees its row.  An entry whose ttl has passed
-- counts as forgotten, whether or not retention has deleted it yet.
CREATE FUNCTION outbox.mark_processed(event_id text, topic text DEFAULT NULL,
                                      ttl interval DEFAULT '72 hours')
RETURNS boolean
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF mark_processed.event_id IS NULL THEN
        RAISE EXCEPTION 'outbox.mark_processed: event_id must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF mark_processed.event_id = '' THEN
        RAISE EXCEPTION 'outbox.mark_processed: event_id must not be empty'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF ttl IS NULL OR ttl <= interval '0' THEN
        RAISE EXCEPTION 'outbox.mark_processed: ttl must be a positive interval, got %',
                        coalesce(ttl::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    INSERT INTO outbox.processed_event AS p (event_id, topic, processed_at, expires_at)
    VALUES (mark_processed.event_id, mark_processed.topic, now(), now() + ttl)
    ON CONFLICT ON CONSTRAINT processed_event_pkey DO UPDATE
        SET topic = excluded.topic,
            processed_at = excluded.processed_at,
            expires_at = excluded.expires_at
        WHERE p.expires_at <= now();
    RETURN FOUND;
END
$$;

-- outbox.is_processed: has this event id been marked, and not yet expired?
CREATE FUNCTION outbox.is_processed(event_id text)
RETURNS boolean
LANGUAGE sql STABLE STRICT SECURITY DEFINER PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT EXISTS (SELECT 1 FROM outbox.processed_event p
                    WHERE p.event_id = $1 AND p.expires_at > now())
$$;

-- Messages the relay gave up on: Kafka refused them outbox.max_attempts
-- times for a reason that does not pass (too large, unknown topic, not
-- authorised), or the relay could not render them.  They block nothing;
-- outbox.retry() puts one back.
CREATE VIEW outbox.parked_messages AS
    SELECT id, message_id, topic, key, created_at, parked_at, attempts, last_error,
           CASE WHEN is_binary THEN coalesce(pg_catalog.octet_length(value), 0)
                ELSE pg_catalog.octet_length(payload::text) END AS payload_bytes
      FROM outbox.outbox_message
     WHERE parked_at IS NOT NULL AND published_at IS NULL;

-- Wakes the relay when the calling transaction commits (as outbox.write()
-- does).  Internal: used by the retry functions.
CREATE FUNCTION outbox._wake_relay_at_commit()
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_wake_relay_at_commit'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;

-- outbox.retry: puts one parked message back in line, with its attempts
-- reset.  True when it was parked; false when it is pending or published
-- already (nothing to do).  Unknown id: an error.
CREATE FUNCTION outbox.retry(message_id uuid)
RETURNS boolean
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF retry.message_id IS NULL THEN
        RAISE EXCEPTION 'outbox.retry: message_id must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    UPDATE outbox.outbox_message m SET parked_at = NULL, attempts = 0, next_attempt_at = NULL
     WHERE m.message_id = retry.message_id
       AND m.parked_at IS NOT NULL AND m.published_at IS NULL;
    IF FOUND THEN
        PERFORM outbox._wake_relay_at_commit();
        RETURN true;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM outbox.outbox_message m WHERE m.message_id = retry.message_id) THEN
        RAISE EXCEPTION 'outbox.retry: no message with message_id %', retry.message_id
            USING ERRCODE = 'no_data_found';
    END IF;
    RETURN false;
END
$$;

-- outbox.retry_parked: puts every parked message (of one topic, or all)
-- back in line; returns how many.
CREATE FUNCTION outbox.retry_parked(topic text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n bigint;
BEGIN
    UPDATE outbox.outbox_message m SET parked_at = NULL, attempts = 0, next_attempt_at = NULL
     WHERE m.parked_at IS NOT NULL AND m.published_at IS NULL
       AND (retry_parked.topic IS NULL OR m.topic = retry_parked.topic);
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        PERFORM outbox._wake_relay_at_commit();
    END IF;
    RETURN n;
END
$$;

REVOKE ALL ON FUNCTION outbox.write(text, text, jsonb, jsonb, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.write_bytes(text, bytea, bytea, jsonb, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox._wake_relay_at_commit() FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.retry(uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.retry_parked(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.mark_processed(text, text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.is_processed(text) FROM PUBLIC;

-- ==== operating it ===============================================================

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

REVOKE ALL ON FUNCTION outbox.replay(timestamptz, timestamptz, text) FROM PUBLIC;

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

-- ==== the inbox ==================================================================

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

-- outbox.inbox_subscribe(topic, handler): `handler(msg outbox.inbox_message)`
-- or `handler(msgs outbox.inbox_message[])`, returning void, handles the
-- records of `topic` (replacing an earlier subscription).  It runs as the
-- role that owns it; only that role, a member of it, or a superuser may
-- subscribe it, and only whoever may act for the subscription's owner (or
-- the handler's) may replace or remove a subscription.
-- outbox.inbox_unsubscribe(topic): stops handling `topic` (its records stay
-- and wait); true when there was a subscription.
CREATE FUNCTION outbox.inbox_subscribe(topic text, handler regprocedure)
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_inbox_subscribe'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION outbox.inbox_unsubscribe(topic text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'outbox_inbox_unsubscribe'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp;

-- (outbox.inbox_write: below, with the rest of issue 30's block.)

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

-- ==== issue 30, the inbox keeps what it received, exactly: begin ====
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
GRANT SELECT ON outbox.inbox_stats TO pg_monitor;

-- outbox._topic_error and outbox._wake_inbox_at_commit stay executable (by
-- roles with USAGE on the schema); neither reads nor changes data.
REVOKE ALL ON FUNCTION outbox.inbox_subscribe(text, regprocedure) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.inbox_unsubscribe(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.inbox_write(uuid, text, jsonb, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.inbox_retry(uuid) FROM PUBLIC;

-- ==== a database the workers do not serve ==========================================

CREATE FUNCTION outbox._warn_unless_served()
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_warn_unless_served'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION outbox._warn_unless_served() FROM PUBLIC;
SELECT outbox._warn_unless_served();

-- ==== exactly-once delivery (1.5) ================================================

-- One row per Kafka transactional id a relay of this database has used with
-- outbox.delivery = exactly_once (pg_outbox-<system id>-<database>-<share>of<shares>):
-- seq is the last Kafka transaction whose messages this database marked
-- published (in the same transaction as the marks); clean says the relay
-- that used the id stopped cleanly (nothing of it open in Kafka).  Recovery
-- compares seq with the progress topic (docs/exactly-once.md).  Not dumped:
-- a restored database is another server, with other ids.
CREATE TABLE outbox.relay_transaction (
    transactional_id text        PRIMARY KEY,
    seq              bigint      NOT NULL DEFAULT 0,
    clean            boolean     NOT NULL DEFAULT true,
    updated_at       timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON outbox.relay_transaction FROM PUBLIC;
GRANT SELECT ON outbox.relay_transaction TO pg_monitor;
