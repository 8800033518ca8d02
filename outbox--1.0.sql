-- pg outbox 1.0: tables and SQL API.  The schema "outbox" is created by
-- CREATE EXTENSION (outbox.control: schema = outbox).

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
--   GRANT EXECUTE ON FUNCTION outbox.write(text, text, jsonb, jsonb) TO svc;
-- and never needs (nor gets) direct access to the tables.
REVOKE ALL ON SCHEMA outbox FROM PUBLIC;

-- Messages written by services, published by the relay worker.  Rows stay
-- after publication (audit, replay); only the retention pass deletes them.
CREATE TABLE outbox.outbox_message (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id    uuid        NOT NULL UNIQUE,
    topic         text        NOT NULL,
    key           text        NOT NULL,
    payload       jsonb       NOT NULL,
    headers       jsonb       NOT NULL DEFAULT '{}',
    created_at    timestamptz NOT NULL DEFAULT now(),
    published_at  timestamptz,
    -- bookkeeping of the relay: deliveries Kafka refused, the last error
    -- text librdkafka gave, and when the relay gave up on the message
    -- (after outbox.max_attempts refusals; outbox.retry() puts it back).
    attempts      integer     NOT NULL DEFAULT 0,
    last_error    text,
    parked_at     timestamptz
);

-- The relay scans only this index: it holds the pending rows, in id order.
CREATE INDEX ix_outbox_message_unpublished ON outbox.outbox_message (id)
    WHERE published_at IS NULL;

-- Consumer-side deduplication (outbox.mark_processed).
CREATE TABLE outbox.processed_event (
    event_id      text        PRIMARY KEY,
    topic         text,
    processed_at  timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL
);

-- The inbox: Kafka records stored before they are handled.
CREATE TABLE outbox.inbox_message (
    event_id         uuid        PRIMARY KEY,
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
    last_error       text
);

CREATE INDEX ix_inbox_message_unprocessed ON outbox.inbox_message (received_at)
    WHERE NOT processed;

-- pg_dump keeps the rows of these tables: they are user data, not part of
-- the extension's definition.
SELECT pg_catalog.pg_extension_config_dump('outbox.outbox_message', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.processed_event', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.inbox_message', '');

-- outbox.write: insert one message in the caller's transaction.  Commit
-- publishes it, rollback discards it.  Returns the message_id, which Kafka
-- consumers see as the "event_id" header unless the caller set one.
CREATE FUNCTION outbox.write(topic text, key text, payload jsonb,
                             headers jsonb DEFAULT '{}')
RETURNS uuid
AS 'MODULE_PATHNAME', 'outbox_write'
LANGUAGE C VOLATILE CALLED ON NULL INPUT SECURITY DEFINER PARALLEL UNSAFE;

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
-- authorised).  They block nothing; outbox.retry() puts one back.
CREATE VIEW outbox.parked_messages AS
    SELECT id, message_id, topic, key, created_at, parked_at, attempts, last_error,
           pg_catalog.octet_length(payload::text) AS payload_bytes
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
    UPDATE outbox.outbox_message m SET parked_at = NULL, attempts = 0
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
    UPDATE outbox.outbox_message m SET parked_at = NULL, attempts = 0
     WHERE m.parked_at IS NOT NULL AND m.published_at IS NULL
       AND (retry_parked.topic IS NULL OR m.topic = retry_parked.topic);
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        PERFORM outbox._wake_relay_at_commit();
    END IF;
    RETURN n;
END
$$;

REVOKE ALL ON FUNCTION outbox.write(text, text, jsonb, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox._wake_relay_at_commit() FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.retry(uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.retry_parked(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.mark_processed(text, text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.is_processed(text) FROM PUBLIC;
