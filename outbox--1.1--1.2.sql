-- pg outbox 1.1 -> 1.2: Kafka-native messages, a safe inbox, backups that
-- restore.  sql/outbox--1.2.sql is the same schema written out whole; the
-- upgrade test checks that both give the same objects.

\echo Use "ALTER EXTENSION outbox UPDATE TO '1.2'" to load this file. \quit

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

-- ---- backups -----------------------------------------------------------------
-- pg_dump keeps the sequences' positions too: a restored database goes on
-- with the next id instead of failing on the primary key.
SELECT pg_catalog.pg_extension_config_dump('outbox.outbox_message_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.inbox_message_seq_seq', '');

-- ---- Kafka-native messages -----------------------------------------------------
-- A message of outbox.write_bytes() is the Kafka record's bytes: key_bytes
-- (NULL: no key) and value (NULL: a tombstone); its payload is JSON null.
-- kafka_partition: the partition the caller asked for (NULL: by key).
ALTER TABLE outbox.outbox_message
    ADD COLUMN is_binary boolean NOT NULL DEFAULT false,
    ADD COLUMN key_bytes bytea,
    ADD COLUMN value bytea,
    ADD COLUMN kafka_partition integer;

-- Room on each page for its rows' marks (outbox--1.2.sql says why); pages
-- written from now on.
ALTER TABLE outbox.outbox_message SET (fillfactor = 50);
-- And in the two btree indexes a mark adds an entry to, for its own entries.
ALTER INDEX outbox.outbox_message_pkey SET (fillfactor = 50);
ALTER INDEX outbox.outbox_message_message_id_key SET (fillfactor = 50);

-- outbox.replay() finds a window of created_at through this (a few pages
-- for millions of rows; rows are written in time order).
CREATE INDEX ix_outbox_message_created ON outbox.outbox_message USING brin (created_at);

CREATE OR REPLACE VIEW outbox.parked_messages AS
    SELECT id, message_id, topic, key, created_at, parked_at, attempts, last_error,
           CASE WHEN is_binary THEN coalesce(pg_catalog.octet_length(value), 0)
                ELSE pg_catalog.octet_length(payload::text) END AS payload_bytes
      FROM outbox.outbox_message
     WHERE parked_at IS NOT NULL AND published_at IS NULL;

-- outbox.write() gains `partition`.  Its grants are kept across the change
-- of signature.
DO $$
BEGIN
    PERFORM pg_catalog.set_config('pg_outbox_upgrade.write_grantees', coalesce((
        SELECT pg_catalog.string_agg(CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                          ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) END, ',')
          FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
         WHERE p.oid OPERATOR(pg_catalog.=) 'outbox.write(text, text, jsonb, jsonb)'::pg_catalog.regprocedure
           AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
           AND a.grantee OPERATOR(pg_catalog.<>) p.proowner), ''), true);
END
$$;
DROP FUNCTION outbox.write(text, text, jsonb, jsonb);

CREATE FUNCTION outbox.write(topic text, key text, payload jsonb,
                             headers jsonb DEFAULT '{}', "partition" integer DEFAULT NULL)
RETURNS uuid
AS 'MODULE_PATHNAME', 'outbox_write'
LANGUAGE C VOLATILE CALLED ON NULL INPUT SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION outbox.write(text, text, jsonb, jsonb, integer) FROM PUBLIC;

DO $$
DECLARE
    g text;
BEGIN
    FOREACH g IN ARRAY pg_catalog.string_to_array(
            pg_catalog.current_setting('pg_outbox_upgrade.write_grantees'), ',') LOOP
        EXECUTE pg_catalog.format(
            'GRANT EXECUTE ON FUNCTION outbox.write(text, text, jsonb, jsonb, integer) TO %s', g);
    END LOOP;
END
$$;

CREATE FUNCTION outbox.write_bytes(topic text, key bytea, value bytea,
                                   headers jsonb DEFAULT '{}', "partition" integer DEFAULT NULL)
RETURNS uuid
AS 'MODULE_PATHNAME', 'outbox_write_bytes'
LANGUAGE C VOLATILE CALLED ON NULL INPUT SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION outbox.write_bytes(text, bytea, bytea, jsonb, integer) FROM PUBLIC;

CREATE FUNCTION outbox.confluent_frame(schema_id integer, body bytea)
RETURNS bytea
AS 'MODULE_PATHNAME', 'outbox_confluent_frame'
LANGUAGE C IMMUTABLE CALLED ON NULL INPUT PARALLEL SAFE;

-- ---- the inbox -------------------------------------------------------------------
-- A record's exact bytes beside what handlers read: value (NULL: a
-- tombstone) and key_bytes (NULL: no key); and its time in Kafka.
ALTER TABLE outbox.inbox_message
    ADD COLUMN value bytea,
    ADD COLUMN key_bytes bytea,
    ADD COLUMN kafka_timestamp timestamptz;  -- the record's time in Kafka

-- Each topic's waiting records in arrival order: a topic's handler claims
-- without walking the other topics' backlog.
CREATE INDEX ix_inbox_message_unprocessed_topic ON outbox.inbox_message (topic, received_at, seq)
    WHERE NOT processed;

-- A subscription records who subscribed; its handler runs as the
-- function's owner (see outbox.inbox_subscribe).
ALTER TABLE outbox.inbox_subscription RENAME COLUMN run_as TO owner;
-- PostgreSQL 18 keeps each NOT NULL as a constraint named after its column
-- when it was made: give it the name a fresh 1.2 has (earlier versions keep
-- no such constraint).
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_constraint
                WHERE conrelid OPERATOR(pg_catalog.=) 'outbox.inbox_subscription'::pg_catalog.regclass
                  AND conname OPERATOR(pg_catalog.=) 'inbox_subscription_run_as_not_null') THEN
        ALTER TABLE outbox.inbox_subscription
            RENAME CONSTRAINT inbox_subscription_run_as_not_null TO inbox_subscription_owner_not_null;
    END IF;
END $$;
REVOKE ALL ON outbox.inbox_subscription FROM PUBLIC;
-- 1.1 let whoever could write the table subscribe, and said so: take back
-- every such grant, or a role could still write a row naming any owner.
DO $$
DECLARE
    grantee name;
BEGIN
    FOR grantee IN
        SELECT DISTINCT r.rolname
          FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) AS a
          JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
         WHERE c.oid OPERATOR(pg_catalog.=) 'outbox.inbox_subscription'::pg_catalog.regclass
           AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON outbox.inbox_subscription FROM %I', grantee);
        RAISE WARNING 'outbox 1.2: revoked role %''s privileges on outbox.inbox_subscription; '
                      'subscriptions are made with outbox.inbox_subscribe() now', grantee;
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION outbox.inbox_subscribe(topic text, handler regprocedure)
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_inbox_subscribe'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp;

CREATE OR REPLACE FUNCTION outbox.inbox_unsubscribe(topic text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'outbox_inbox_unsubscribe'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp;

-- outbox.inbox_write: now keeps the value's bytes too (the payload's text).
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
    INSERT INTO outbox.inbox_message (event_id, topic, payload, value, headers)
    VALUES (inbox_write.event_id, inbox_write.topic, inbox_write.payload,
            convert_to(inbox_write.payload::text, 'UTF8'), coalesce(inbox_write.headers, '{}'))
    ON CONFLICT ON CONSTRAINT inbox_message_pkey DO NOTHING;
    IF FOUND THEN
        PERFORM outbox._wake_inbox_at_commit();
    END IF;
    RETURN FOUND;
END
$$;

-- Per subscribed topic: what waits, how fast it is handled, what is parked.
-- (handled_per_second counts the last 10 seconds.)
CREATE VIEW outbox.inbox_stats AS
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
               / 10 AS handled_per_second
      FROM outbox.inbox_subscription s;
GRANT SELECT ON outbox.inbox_stats TO pg_monitor;

-- ---- restores into a server that does not serve this database ----------------------
CREATE FUNCTION outbox._warn_unless_served()
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_warn_unless_served'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION outbox._warn_unless_served() FROM PUBLIC;
SELECT outbox._warn_unless_served();
