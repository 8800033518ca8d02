-- pg outbox 1.4 -> 1.5: exactly-once delivery (outbox.delivery): the table
-- where the relay records its Kafka transactions.  outbox--1.5.sql is the
-- same schema written out whole; the upgrade test checks that both give
-- the same objects.

\echo Use "ALTER EXTENSION outbox UPDATE TO '1.5'" to load this file. \quit

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

-- ==== exactly-once delivery: begin ====

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
-- ==== exactly-once delivery: end ====
