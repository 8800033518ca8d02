-- The plans the workers' statements get.  The workers prepare each one once
-- as a generic plan, with sequential and bitmap scans off: each must walk
-- only what it needs (the claim from its low-water mark, a mark by ctid as a
-- TID scan), never a whole index that a long snapshot fills with dead
-- entries.  The texts are the workers' own, verbatim (test/unit/spec_sync_test.cpp).
CREATE EXTENSION outbox;
SET plan_cache_mode = force_generic_plan;
SET enable_seqscan = off;
SET enable_bitmapscan = off;
SET search_path = pg_catalog, pg_temp;
-- For the statements whose EXPLAIN text differs between versions (15
-- prints "NOT (SubPlan 1)", 17 "NOT EXISTS(SubPlan 1)"; 19 names an IN
-- (subquery) "unnamed_subquery" where 15-18 say "ANY_subquery", makes it
-- unique by a sort where 15-18 hash it, may hash-join the arrays of a mark
-- and writes a TID condition the other way round): the scans each plan
-- makes, with their index and index condition, the subquery's name written
-- "subquery".
CREATE FUNCTION pg_temp.scans(stmt text)
    RETURNS TABLE (node text, alias text, index text, index_cond text)
    LANGUAGE plpgsql AS $$
DECLARE
    plan jsonb;
BEGIN
    EXECUTE 'EXPLAIN (COSTS OFF, FORMAT JSON) ' || stmt INTO plan;
    RETURN QUERY
    SELECT s->>'Node Type',
           regexp_replace(s->>'Alias', '^(ANY_subquery|unnamed_subquery)$', 'subquery'),
           s->>'Index Name',
           regexp_replace(s->>'Index Cond', '"ANY_subquery"|unnamed_subquery', 'subquery', 'g')
      FROM jsonb_path_query(plan, 'strict $.**') AS s
     WHERE jsonb_typeof(s) = 'object' AND s->>'Node Type' LIKE '%Scan'
     ORDER BY 1, 2, 3;
END $$;
PREPARE claim(int, text[], int, int, bigint, boolean) AS SELECT id, message_id, topic, key, payload, headers, ctid AS claimed_ctid, is_binary, key_bytes, value, kafka_partition FROM outbox.outbox_message m WHERE published_at IS NULL AND parked_at IS NULL AND id >= $5 AND (key IS NULL OR (topic || ' ' || key) NOT IN (SELECT pg_catalog.unnest($2))) AND (COALESCE(pg_catalog.hashtext(key) & 2147483647, id)) % $3 = $4 AND ($6 OR (m.next_attempt_at IS NULL OR m.next_attempt_at <= pg_catalog.now()) AND NOT EXISTS (SELECT FROM outbox.outbox_message w WHERE w.key = m.key AND w.topic = m.topic AND w.id < m.id AND w.published_at IS NULL AND w.next_attempt_at > pg_catalog.now())) ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED;
-- One generic plan, whatever $6 says: while a message waits for a retry,
-- each row also probes the few that wait (w).
SELECT * FROM pg_temp.scans($$EXECUTE claim(1000, '{}', 1, 0, 0, true)$$);
PREPARE first_pending(bigint, boolean) AS SELECT id FROM outbox.outbox_message m WHERE published_at IS NULL AND parked_at IS NULL AND id >= $1 AND ($2 OR (m.next_attempt_at IS NULL OR m.next_attempt_at <= pg_catalog.now()) AND NOT EXISTS (SELECT FROM outbox.outbox_message w WHERE w.key = m.key AND w.topic = m.topic AND w.id < m.id AND w.published_at IS NULL AND w.next_attempt_at > pg_catalog.now())) ORDER BY id LIMIT 1;
SELECT * FROM pg_temp.scans($$EXECUTE first_pending(0, true)$$);
PREPARE mark_claimed(tid[]) AS UPDATE outbox.outbox_message SET published_at = pg_catalog.statement_timestamp() WHERE ctid = ANY($1);
EXPLAIN (COSTS OFF) EXECUTE mark_claimed('{"(0,1)"}');
PREPARE mark(bigint[]) AS UPDATE outbox.outbox_message SET published_at = pg_catalog.statement_timestamp() WHERE id = ANY($1) AND published_at IS NULL;
EXPLAIN (COSTS OFF) EXECUTE mark('{1}');
-- From schema 1.6 the marks carry each record's partition and offset: the
-- arrays joined to the table, each row found by its ctid (a TID scan) or
-- by the pending index, never a scan of the table.
PREPARE mark_claimed_at(tid[], int4[], int8[]) AS UPDATE outbox.outbox_message m SET published_at = pg_catalog.statement_timestamp(), published_partition = a.p, published_offset = a.o FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.tid[]), pg_catalog.unnest($2::pg_catalog.int4[]), pg_catalog.unnest($3::pg_catalog.int8[])) AS a(t, p, o) WHERE m.ctid = a.t;
SELECT * FROM pg_temp.scans($$EXECUTE mark_claimed_at('{"(0,1)"}', '{0}', '{5}')$$);
PREPARE mark_at(bigint[], int4[], int8[]) AS UPDATE outbox.outbox_message m SET published_at = pg_catalog.statement_timestamp(), published_partition = a.p, published_offset = a.o FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.int8[]), pg_catalog.unnest($2::pg_catalog.int4[]), pg_catalog.unnest($3::pg_catalog.int8[])) AS a(i, p, o) WHERE m.id = ANY($1) AND m.id = a.i AND m.published_at IS NULL;
SELECT * FROM pg_temp.scans($$EXECUTE mark_at('{1}', '{0}', '{5}')$$);
PREPARE fail(bigint[], text, boolean, int, boolean, float8, float8) AS UPDATE outbox.outbox_message m SET attempts = m.attempts + 1, last_error = $2, parked_at = CASE WHEN $5 OR ($3 AND m.attempts + 1 >= $4) THEN pg_catalog.statement_timestamp() ELSE m.parked_at END, next_attempt_at = CASE WHEN $3 AND NOT $5 AND m.attempts + 1 < $4 THEN pg_catalog.statement_timestamp() + pg_catalog.make_interval(secs => LEAST($7::float8, $6::float8 * pg_catalog.power(2::float8, m.attempts::float8))) END WHERE m.id = ANY($1) AND m.published_at IS NULL RETURNING m.message_id::text, m.topic, m.attempts, m.parked_at IS NOT NULL AS parked_now, m.last_error, m.id, m.next_attempt_at - pg_catalog.statement_timestamp() AS waits;
EXPLAIN (COSTS OFF) EXECUTE fail('{1}', 'x', true, 10, false, 1, 60);
PREPARE retention_published(timestamptz, int, bigint, bigint) AS DELETE FROM outbox.outbox_message WHERE id IN (SELECT id FROM outbox.outbox_message WHERE id >= $3 AND id < $4 AND published_at < $1 ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED) AND published_at < $1 RETURNING id;
SELECT * FROM pg_temp.scans($$EXECUTE retention_published(now(), 1000, 0, 100)$$);
PREPARE first_id_since(uuid) AS SELECT id, message_id FROM outbox.outbox_message WHERE message_id >= $1 ORDER BY message_id LIMIT 1;
EXPLAIN (COSTS OFF) EXECUTE first_id_since('00000000-0000-7000-8000-000000000000');
PREPARE retention_processed(timestamptz, int, timestamptz) AS DELETE FROM outbox.processed_event WHERE event_id IN (SELECT event_id FROM outbox.processed_event WHERE expires_at >= $3 AND expires_at < $1 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED) AND expires_at < $1 RETURNING expires_at;
SELECT * FROM pg_temp.scans($$EXECUTE retention_processed(now(), 1000, '-infinity')$$);
PREPARE retention_inbox(timestamptz, int, timestamptz) AS DELETE FROM outbox.inbox_message WHERE (event_id, topic) IN (SELECT event_id, topic FROM outbox.inbox_message WHERE processed AND processed_at >= $3 AND processed_at < $1 ORDER BY processed_at LIMIT $2 FOR UPDATE SKIP LOCKED) AND processed AND processed_at < $1 RETURNING processed_at;
SELECT * FROM pg_temp.scans($$EXECUTE retention_inbox(now(), 1000, '-infinity')$$);
PREPARE straggler(bigint, boolean) AS SELECT id FROM outbox.outbox_message m WHERE published_at IS NULL AND parked_at IS NULL AND id < $1 AND ($2 OR (m.next_attempt_at IS NULL OR m.next_attempt_at <= pg_catalog.now()) AND NOT EXISTS (SELECT FROM outbox.outbox_message w WHERE w.key = m.key AND w.topic = m.topic AND w.id < m.id AND w.published_at IS NULL AND w.next_attempt_at > pg_catalog.now())) ORDER BY id LIMIT 1;
SELECT * FROM pg_temp.scans($$EXECUTE straggler(100, true)$$);
-- The relay's look at the messages that wait for a retry, on a table with a
-- backlog (10,000 pending, 10 waiting, analysed): each reads one of the
-- small indexes of waiting messages, never the backlog's.
INSERT INTO outbox.outbox_message (message_id, topic, key, payload, attempts, next_attempt_at)
SELECT gen_random_uuid(), 'order.events', 'k' || i, '{}',
       CASE WHEN i % 1000 = 0 THEN 1 ELSE 0 END,
       CASE WHEN i % 1000 = 0 THEN now() + interval '1 minute' END
  FROM generate_series(1, 10000) AS i;
ANALYZE outbox.outbox_message;
PREPARE next_retry AS SELECT min(next_attempt_at) FROM outbox.outbox_message WHERE published_at IS NULL AND next_attempt_at IS NOT NULL;
PREPARE first_due AS SELECT min(d.id) FROM (SELECT id FROM outbox.outbox_message WHERE published_at IS NULL AND next_attempt_at IS NOT NULL AND next_attempt_at <= pg_catalog.now() OFFSET 0) d;
SELECT count(*) AS scans, bool_or(index = 'ix_outbox_message_unpublished') AS walks_the_backlog
  FROM pg_temp.scans($$EXECUTE next_retry$$);
SELECT count(*) AS scans, bool_or(index = 'ix_outbox_message_unpublished') AS walks_the_backlog
  FROM pg_temp.scans($$EXECUTE first_due$$);
TRUNCATE outbox.outbox_message;
-- The inbox handler's statements also run with sorts off (its claim has
-- one right plan: the topic's index, in order).
SET enable_sort = off;
SET enable_incremental_sort = off;
PREPARE inbox_claim(int, text, int, int, text[]) AS SELECT m, m.event_id, m.key FROM outbox.inbox_message m WHERE NOT m.processed AND m.topic = $2 AND m.parked_at IS NULL AND (m.next_attempt_at IS NULL OR m.next_attempt_at <= pg_catalog.now()) AND (pg_catalog.hashtext(coalesce(m.key, m.event_id::text)) & 2147483647) % $3 = $4 AND (m.key IS NULL OR m.key <> ALL($5)) ORDER BY m.received_at, m.seq LIMIT $1 FOR UPDATE SKIP LOCKED;
EXPLAIN (COSTS OFF) EXECUTE inbox_claim(100, 'payments', 1, 0, '{}');
-- The same claim on a table that holds a burst of one topic: 100,000
-- records stored by batches of 5,000 (one received_at each), analysed.
-- The claim must still walk the topic's index in order, not sort a batch
-- (an incremental sort on received_at) or the whole topic per claim.
INSERT INTO outbox.inbox_message (event_id, received_at, topic, key, payload)
SELECT gen_random_uuid(), '2026-01-01'::timestamptz + (i / 5000) * interval '1 second',
       'payments', 'k' || (i % 1000), jsonb_build_object('id', i, 'pad', repeat('x', 175))
  FROM generate_series(1, 100000) AS i;
ANALYZE outbox.inbox_message;
EXPLAIN (COSTS OFF) EXECUTE inbox_claim(100, 'payments', 1, 0, '{}');
TRUNCATE outbox.inbox_message;
PREPARE inbox_done(uuid[], text) AS UPDATE outbox.inbox_message SET processed = true, processed_at = pg_catalog.clock_timestamp(), next_attempt_at = NULL WHERE event_id = ANY($1) AND topic = $2;
EXPLAIN (COSTS OFF) EXECUTE inbox_done('{00000000-0000-7000-8000-000000000001}', 'payments');
RESET enable_sort;
RESET enable_incremental_sort;
RESET search_path;
DROP EXTENSION outbox;
